"""suite_atari: Atari 2600 games (gymnasium + ale-py) with Machado et al.'s
preprocessing, as batched tf-agents environments.

    env = suites.load('suite_atari', 'ALE/Breakout-v5', batch_size=8, seed=1)
    # observation uint8 [84, 84, 4] (channels last), action int64 0..n-1

Each game is `gymnasium.make(id, frameskip=1, ...)` wrapped in gymnasium's
own `AtariPreprocessing` and `FrameStackObservation`, then its
`TransformObservation` moves the stack axis last (gymnasium stacks on a new
first axis; convolutional policies here take channels last). The
batch is a `gym_batch.BatchedGymEnv` (row b seeded `seed + b`; termination
-> LAST with discount 0, truncation -> LAST with discount 1, FIRST after
LAST).

The preprocessing and where each default comes from. Machado et al. 2018
("Revisiting the Arcade Learning Environment") set the protocol that
gymnasium's ALE v5 ids register; gymnasium's `AtariPreprocessing` follows
them and Mnih et al. 2015 (DQN) for the rest:

| knob | default | from |
|---|---|---|
| repeat_action_probability | 0.25 | sticky actions: Machado et al.; ALE v5 |
| max_num_frames_per_episode | 108000 | 30 min at 60 fps, then truncation: ALE v5 |
| noop_max | 30 | 1..30 no-ops at reset: Mnih et al.; AtariPreprocessing |
| frame_skip | 4 | action repeated 4 frames: Machado et al.; ALE v5 |
|  |  | the max of the last two frames: Mnih et al. |
| screen_size | 84 | 84x84 grayscale (INTER_AREA): Mnih et al. |
| stack_size | 4 | the last 4 observations, oldest first: Mnih et al. |
| terminal_on_life_loss | False | Machado et al. advise against it |
| full_action_space | False | the game's minimal action set: ALE v5 |

Frames count against `max_num_frames_per_episode` from the reset, no-ops
included. With `terminal_on_life_loss` a lost life ends the episode as a
termination and the next episode starts a new game (gymnasium's
semantics). Rewards are the game score, unclipped: clipping is the
learner's business. Against OpenAI baselines' wrappers (the published PPO
and A2C curves), Pong's observations are the same pixel for pixel but at
a game over (tests/test_atari_preprocessing.py); no FIRE is pressed at a
reset (baselines' `FireResetEnv`: Pong serves by itself).

gin: the knobs are bound as `suite_atari.<knob>` (the configurable
`preprocessing`, registered under the name 'suite_atari' so as not to clash
with `suites.load` or tf-agents' `suite_atari.load`); explicit keyword
arguments of `load` win over gin bindings. `suites` imports this module,
so gin files read by alf-async-train bind `suite_atari.*` directly (ale-py
and gymnasium are imported only when a game loads). SubprocessEnv children and Ray
actors get the knobs resolved by their parent (`suites` passes them as
`env_kwargs`).

Install with `pip install -e '.[atari]'` (ale-py ships the ROMs in its
wheel; opencv resizes): nothing is downloaded at run time.
"""

import numbers
import os

import gin
import numpy as np
from tf_agents.environments import tf_py_environment

from alf_async.environments.suites import gym_batch

INSTALL_HINT = "suite_atari needs ale-py and opencv: pip install -e '.[atari]'"
_gymnasium = None
# The arguments of `preprocessing`.
KNOBS = ("repeat_action_probability", "max_num_frames_per_episode", "noop_max", "frame_skip",
         "screen_size", "stack_size", "terminal_on_life_loss", "full_action_space")


@gin.configurable("suite_atari")
def preprocessing(repeat_action_probability=0.25, max_num_frames_per_episode=108_000,
                  noop_max=30, frame_skip=4, screen_size=84, stack_size=4,
                  terminal_on_life_loss=False, full_action_space=False):
    """The knobs (see the module docstring) as a dict: gin's configurable
    'suite_atari'. Call `knob_values`, which checks them.

    `max_num_frames_per_episode=0` lifts the time limit; `noop_max=0` and
    `repeat_action_probability=0` turn no-ops and sticky actions off.
    """
    return dict(repeat_action_probability=repeat_action_probability,
                max_num_frames_per_episode=max_num_frames_per_episode, noop_max=noop_max,
                frame_skip=frame_skip, screen_size=screen_size, stack_size=stack_size,
                terminal_on_life_loss=terminal_on_life_loss,
                full_action_space=full_action_space)


def knob_values(**knobs):
    """Every knob: those given, else gin's `suite_atari.*` bindings, else the defaults.

    Raises:
        ValueError: an unknown knob, or one out of range. (Checked here, not
            in the configurable: gin adds a second line to its errors.)
    """
    unknown = sorted(set(knobs) - set(KNOBS))
    if unknown:
        raise ValueError(f"suite_atari: unknown preprocessing knob(s) {unknown}; known: "
                         f"{list(KNOBS)}")
    values = preprocessing(**knobs)
    rap = values["repeat_action_probability"]
    if not isinstance(rap, numbers.Real) or not 0.0 <= rap <= 1.0:
        raise ValueError(f"suite_atari: repeat_action_probability must be in [0, 1], got "
                         f"{rap!r}")
    for name, least in (("max_num_frames_per_episode", 0), ("noop_max", 0), ("frame_skip", 1),
                        ("screen_size", 1), ("stack_size", 1)):
        if not isinstance(values[name], numbers.Integral) or values[name] < least:
            raise ValueError(f"suite_atari: {name} must be an int >= {least}, got "
                             f"{values[name]!r}")
    return values


def _import_gymnasium():
    """gymnasium with ale-py's games registered (once); ValueError naming the
    extra if ale-py, gymnasium or opencv is missing."""
    global _gymnasium
    if _gymnasium is None:
        try:
            import ale_py
            import cv2  # pylint: disable=unused-import  (AtariPreprocessing resizes with it)
            import gymnasium
        except ImportError:
            raise ValueError(INSTALL_HINT) from None
        if os.environ.get("ALF_ASYNC_QUIET") == "1":
            # The emulator's banner, printed when the first game is made
            # (alf_async.quiet sets ALF_ASYNC_QUIET).
            ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
        gymnasium.register_envs(ale_py)
        _gymnasium = gymnasium
    return _gymnasium


def check_game(env_name):
    """Raises ValueError (one line, naming `env_name`) unless it is a registered
    ale-py game id with screen observations, e.g. 'ALE/Breakout-v5'."""
    gymnasium = _import_gymnasium()
    try:
        spec = gymnasium.spec(env_name)
    except gymnasium.error.Error as e:
        reason = " ".join(str(e).split())
        raise ValueError(f"suite_atari: unknown Atari game id {env_name!r} ({reason}); "
                         f"ids look like 'ALE/Breakout-v5'") from None
    if not str(spec.entry_point).startswith("ale_py"):
        raise ValueError(f"suite_atari: {env_name!r} is not an Atari game (ale-py) id; "
                         f"ids look like 'ALE/Breakout-v5'")
    if spec.kwargs.get("obs_type") == "ram":
        raise ValueError(f"suite_atari: {env_name!r} observes the console's RAM; suite_atari "
                         f"preprocesses screens (use the id without '-ram')")


def make_env(env_name, **knobs):
    """One preprocessed game as a gymnasium environment (unseeded: seed its reset).

    Args:
        env_name: an ale-py game id, e.g. 'ALE/Breakout-v5'.
        **knobs: any of `preprocessing`'s arguments; unset ones take gin's
            `suite_atari.*` bindings, then the defaults.

    Returns:
        A gymnasium.Env with observations uint8 [screen_size, screen_size,
            stack_size] and the game's Discrete actions.

    Raises:
        ValueError: ale-py or opencv missing, an unknown id, an unknown knob
            or one out of range.
    """
    options = knob_values(**knobs)
    check_game(env_name)
    gymnasium = _import_gymnasium()
    wrappers = gymnasium.wrappers
    env = gymnasium.make(
        env_name, frameskip=1,
        repeat_action_probability=options["repeat_action_probability"],
        max_num_frames_per_episode=options["max_num_frames_per_episode"],
        full_action_space=options["full_action_space"],
        # AtariPreprocessing reads the screen from the ALE itself and drops
        # the frames step() returns: grayscale ones cost a third of RGB ones.
        obs_type="grayscale")
    env = wrappers.AtariPreprocessing(
        env, noop_max=options["noop_max"], frame_skip=options["frame_skip"],
        screen_size=options["screen_size"],
        terminal_on_life_loss=options["terminal_on_life_loss"], grayscale_obs=True)
    env = wrappers.FrameStackObservation(env, options["stack_size"])
    size, stack = options["screen_size"], options["stack_size"]
    # FrameStackObservation stacks on a new first axis [stack, h, w]; the
    # policies take channels last. Its observations are fresh copies, so a
    # view is safe to return.
    return wrappers.TransformObservation(
        env, lambda obs: np.moveaxis(obs, 0, -1),
        gymnasium.spaces.Box(0, 255, (size, size, stack), np.uint8))


def load(env_name, batch_size=1, seed=None, **knobs):
    """`batch_size` preprocessed games as one batched TFEnvironment.

    Args:
        env_name: an ale-py game id, e.g. 'ALE/Breakout-v5'.
        batch_size: number of games, stepped in one loop (`BatchedGymEnv`).
        seed: game b is first reset with `seed + b` (None: unseeded).
        **knobs: any of `preprocessing`'s arguments (gin: `suite_atari.*`).

    Returns:
        A TFPyEnvironment: observation BoundedArraySpec uint8 [84, 84, 4]
            in [0, 255] with the defaults, action int64 scalar in [0, n - 1].

    Raises:
        ValueError: see `make_env`.
    """
    return tf_py_environment.TFPyEnvironment(gym_batch.BatchedGymEnv(
        [make_env(env_name, **knobs) for _ in range(batch_size)], seed=seed))
