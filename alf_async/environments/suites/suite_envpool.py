"""suite_envpool: EnvPool's C++ environment pools as batched tf-agents environments.

    env = suites.load('suite_envpool', 'Breakout-v5', batch_size=8, seed=1)
    # one TFEnvironment over one pool of 8 games: observation uint8 [84, 84, 4]
    # (channels last), action int64 0..n-1, as suite_atari's 'ALE/Breakout-v5'
    env = suites.load('suite_envpool', 'HalfCheetah-v5', batch_size=8, seed=1)
    # the specs of suite_gymnasium's 'HalfCheetah-v5'

EnvPool steps its environments on C++ threads that do not hold the GIL.
Each `load` gives a TFPyEnvironment over one `EnvPoolEnv`, a batched
PyEnvironment over one pool of `batch_size` environments, which is stepped
either way:

- in lockstep (`step(actions)`, e.g. under tf-agents' DynamicStepDriver): a
  pool in EnvPool's synchronous mode (its batch size = its number of
  environments);
- row by row (`capabilities.RowStepping`; the driver's env thread does
  this): a pool in EnvPool's asynchronous mode, where each row is sent its
  action as soon as it has one and the rows whose steps are done come back
  whichever they are (envpool_rows.py, which also says how many rows one
  receive returns).

The knob `stepping` says which way the driver steps it: 'rows' (the
default: an `EnvPoolEnv`, a RowStepping batch) or 'lockstep' (a
`LockstepEnvPoolEnv`, which is not: the env thread steps the whole pool in
its graph loop, as it steps in-process games but with no step token, with
EnvPool's C++ threads stepping the rows in parallel while the GIL is free).
Row by row no row waits for a slower one, which pays when steps take
uneven time; lockstep costs less of the driver's CPU per step (one Python
call per batch, not eager queue ops per receive), which pays when the
cores are the limit, as on two cores, where lockstep pools collect faster
than tf-agents' lockstep driver and row by row does not
(docs/results/collection.md and not-paying.md have the rows).

The pool is made on first use in the mode of that use (an EnvPool pool's
mode is fixed when it is made); a use in the other mode replaces it with a
fresh pool of the same seed, whose rows start new episodes. Each row is a
continuous stream with tf-agents' semantics: a game over (terminated) is
LAST with discount 0, a time limit (truncated) LAST with discount 1, and
the step after a LAST is the FIRST of the row's next episode (reward 0,
discount 1; EnvPool resets the environment and ignores that action).

Seeds: EnvPool seeds environment b of a pool with `seed + b` (its own rule,
which matches `suites.load`'s); `seed=None` draws one at random. Two pools
of the same seed given the same actions produce the same observations, in
either mode (each environment has its own random generator, so the order in
which rows are stepped does not matter).

Atari games (EnvPool ids have no 'ALE/' prefix: 'Breakout-v5', 'Pong-v5')
get suite_atari's preprocessing, with EnvPool's own defaults changed to
match it (EnvPool's defaults in brackets):

| knob | default | EnvPool setting |
|---|---|---|
| repeat_action_probability | 0.25 | repeat_action_probability [0] |
| max_num_frames_per_episode | 108000 | max_episode_steps = ceil(frames / frame_skip) [27000] |
| noop_max | 30 | noop_max [30] |
| frame_skip | 4 | frame_skip [4], max of the last two frames |
| screen_size | 84 | img_height = img_width [84], gray_scale, INTER_AREA |
| stack_size | 4 | stack_num [4], moved to the last axis |
| terminal_on_life_loss | False | episodic_life [False] |
| full_action_space | False | full_action_space [False] |
| fire_reset | False | use_fire_reset [True] |
| zero_discount_on_life_loss | False | (lives counted here; EnvPool's knob of that name unused) |
| (none) |  | reward_clip, zero_discount_on_life_loss False [False] |

Two knobs give Breakout-like games (a life, then FIRE to serve) what
baselines' wrappers give them, with one game as one episode:
`fire_reset` presses FIRE once at each game's start (EnvPool's
use_fire_reset: the last of the reset's no-ops; only in games whose action
set has FIRE), and `zero_discount_on_life_loss` makes a lost life a
training boundary without ending the episode: the step whose frames lose a
life (EnvPool's `lives` falls) has discount 0, so returns and advantages do
not bootstrap across it, while the step type stays MID (LAST where the game
also ends there), so metrics and evaluations score whole games. After a
lost life the policy serves by itself (nothing presses FIRE for it, as
nothing does for Dopamine's agents with a terminal on life loss).
`terminal_on_life_loss` instead makes each life an episode of its own; the
two are refused together.

Where EnvPool still differs from suite_atari (gymnasium's
AtariPreprocessing): its time limit counts agent steps after the reset's
no-ops, where the ALE counts frames including them (so an episode may run up to
noop_max / frame_skip steps longer); `max_num_frames_per_episode=0` (no
limit) becomes a limit of 2**30 steps; `noop_max=0` becomes 1 (EnvPool
always plays at least one no-op at a reset); with `terminal_on_life_loss`
the episode after a lost life continues the same game (baselines'
EpisodicLifeEnv) where gymnasium starts a new one (its frame stack starts
afresh either way), and so does `reset()` unless the game is over. Rewards
are the game score, unclipped. A game over on the time limit's last step is
a termination (EnvPool's own flags call it a truncation; Atari pools report
the game over, other tasks' cannot).

Other tasks with one array observation (MuJoCo's 'HalfCheetah-v5',
'Hopper-v5', ...) get the specs suite_gymnasium gives the same id
(observations as EnvPool gives them, Box actions float32 as gymnasium's
MuJoCo spaces) and the knob `max_episode_steps` (None: EnvPool's
registered limit, gymnasium's too: 1000 for MuJoCo).

Pool knobs, for every task: `stepping` ('rows' or 'lockstep', above),
`num_threads`, EnvPool's C++ threads (None: min(batch_size, the cores this
process may run on); EnvPool's own default, min(its batch size, cores),
would give an asynchronous pool that receives one row at a time a single
thread), and `recv_batch_size` (envpool_rows.py; rows only).

gin: every knob is bound as `suite_envpool.<knob>` (the configurable
`options`); explicit keyword arguments of `load` win over gin bindings.
Install with `pip install -e '.[envpool]'` (the ROMs and MuJoCo assets come
with it: nothing is downloaded at run time).
"""

import difflib
import math
import numbers
import os
import random

import gin
import numpy as np
from tf_agents.environments import tf_py_environment
from tf_agents.specs import array_spec

from alf_async.environments.rows.envpool_rows import default_recv_batch_size
from alf_async.environments.suites.envpool_envs import (  # noqa: F401  (INSTALL_HINT: here too)
    INSTALL_HINT, EnvPoolEnv, LockstepEnvPoolEnv, import_envpool)

ATARI_KNOBS = ("repeat_action_probability", "max_num_frames_per_episode", "noop_max",
               "frame_skip", "screen_size", "stack_size", "terminal_on_life_loss",
               "full_action_space", "fire_reset", "zero_discount_on_life_loss")
KNOBS = ("stepping", "num_threads", "recv_batch_size", "max_episode_steps") + ATARI_KNOBS
STEPPINGS = ("rows", "lockstep")
NO_TIME_LIMIT = 2 ** 30   # EnvPool's "no limit": it has none of its own


@gin.configurable("suite_envpool")
def options(stepping="rows", num_threads=None, recv_batch_size=None, max_episode_steps=None,
            repeat_action_probability=0.25, max_num_frames_per_episode=108_000, noop_max=30,
            frame_skip=4, screen_size=84, stack_size=4, terminal_on_life_loss=False,
            full_action_space=False, fire_reset=False, zero_discount_on_life_loss=False):
    """The knobs (see the module docstring) as a dict: gin's configurable
    'suite_envpool'. Call `knob_values`, which checks them."""
    return dict(stepping=stepping, num_threads=num_threads, recv_batch_size=recv_batch_size,
                max_episode_steps=max_episode_steps,
                repeat_action_probability=repeat_action_probability,
                max_num_frames_per_episode=max_num_frames_per_episode, noop_max=noop_max,
                frame_skip=frame_skip, screen_size=screen_size, stack_size=stack_size,
                terminal_on_life_loss=terminal_on_life_loss,
                full_action_space=full_action_space, fire_reset=fire_reset,
                zero_discount_on_life_loss=zero_discount_on_life_loss)


def knob_values(**knobs):
    """Every knob: those given, else gin's `suite_envpool.*` bindings, else the
    defaults.

    Raises:
        ValueError: an unknown knob, or one out of range.
    """
    unknown = sorted(set(knobs) - set(KNOBS))
    if unknown:
        raise ValueError(f"suite_envpool: unknown knob(s) {unknown}; known: {list(KNOBS)}")
    values = options(**knobs)
    if values["stepping"] not in STEPPINGS:
        raise ValueError(f"suite_envpool: stepping must be one of {list(STEPPINGS)}, got "
                         f"{values['stepping']!r}")
    rap = values["repeat_action_probability"]
    if not isinstance(rap, numbers.Real) or not 0.0 <= rap <= 1.0:
        raise ValueError(f"suite_envpool: repeat_action_probability must be in [0, 1], got "
                         f"{rap!r}")
    for name, least, optional in (("num_threads", 1, True), ("recv_batch_size", 1, True),
                                  ("max_episode_steps", 1, True),
                                  ("max_num_frames_per_episode", 0, False),
                                  ("noop_max", 0, False), ("frame_skip", 1, False),
                                  ("screen_size", 1, False), ("stack_size", 1, False)):
        value = values[name]
        if optional and value is None:
            continue
        if (not isinstance(value, numbers.Integral) or isinstance(value, bool)
                or value < least):
            raise ValueError(f"suite_envpool: {name} must be an int >= {least}"
                             f"{' or None' if optional else ''}, got {value!r}")
    for name in ("terminal_on_life_loss", "full_action_space", "fire_reset",
                 "zero_discount_on_life_loss"):
        if not isinstance(values[name], (bool, np.bool_)):
            raise ValueError(f"suite_envpool: {name} must be True or False, got "
                             f"{values[name]!r}")
    if values["terminal_on_life_loss"] and values["zero_discount_on_life_loss"]:
        raise ValueError("suite_envpool: terminal_on_life_loss (each life an episode) and "
                         "zero_discount_on_life_loss (a lost life a boundary inside the "
                         "game's episode) exclude each other: set one")
    return values


def check_task(env_name):
    """Raises ValueError (one line, naming `env_name`) unless it is an EnvPool
    task id; returns whether it is an Atari game."""
    envpool = import_envpool()
    from envpool.registration import registry  # pylint: disable=import-outside-toplevel
    if env_name not in registry.specs:
        if isinstance(env_name, str) and env_name.startswith("ALE/"):
            hint = f"EnvPool ids have no 'ALE/' prefix: try {env_name[4:]!r}"
        else:
            close = difflib.get_close_matches(str(env_name), envpool.list_all_envs(), n=3)
            hint = (f"did you mean {' or '.join(map(repr, close))}?" if close else
                    "envpool.list_all_envs() lists the ids, e.g. 'Breakout-v5', "
                    "'HalfCheetah-v5'")
        raise ValueError(f"suite_envpool: unknown EnvPool task id {env_name!r}; {hint}")
    return registry.specs[env_name][0] == "envpool.atari"


def _default_threads(batch_size):
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(batch_size, cores))


def _pool_settings(env_name, atari, values, given):
    """EnvPool's make() keyword arguments for the task (mode-independent ones)."""
    if atari:
        if "max_episode_steps" in given:
            raise ValueError("suite_envpool: an Atari game's time limit is the knob "
                             "max_num_frames_per_episode (frames, as suite_atari's), not "
                             "max_episode_steps")
        frames, skip = values["max_num_frames_per_episode"], values["frame_skip"]
        return dict(
            repeat_action_probability=float(values["repeat_action_probability"]),
            max_episode_steps=math.ceil(frames / skip) if frames else NO_TIME_LIMIT,
            noop_max=max(1, values["noop_max"]), frame_skip=skip,
            img_height=values["screen_size"], img_width=values["screen_size"],
            stack_num=values["stack_size"], episodic_life=bool(values["terminal_on_life_loss"]),
            full_action_space=bool(values["full_action_space"]),
            use_fire_reset=bool(values["fire_reset"]),
            reward_clip=False, zero_discount_on_life_loss=False, gray_scale=True,
            use_inter_area_resize=True)
    atari_only = sorted(set(given) & set(ATARI_KNOBS))
    if atari_only:
        raise ValueError(f"suite_envpool: {atari_only} are Atari knobs; {env_name!r} is not "
                         f"an Atari game")
    if values["max_episode_steps"] is None:
        return {}
    return dict(max_episode_steps=values["max_episode_steps"])


def _specs(env_name, atari, pool_spec):
    """(observation spec, action spec, channels_last) from EnvPool's spaces."""
    # gymnasium comes with envpool (the 'envpool' extra): imported on use.
    # pylint: disable=import-outside-toplevel
    from gymnasium import spaces

    from alf_async.environments.suites.suite_gymnasium import spec_from_space
    obs_space, action_space = pool_spec.observation_space, pool_spec.action_space
    if atari:
        stack, height, width = obs_space.shape
        obs_space = spaces.Box(0, 255, (height, width, stack), np.uint8)
    elif isinstance(action_space, spaces.Box):
        # gymnasium's MuJoCo (and Box2D) action spaces are float32; EnvPool's float64.
        action_space = spaces.Box(action_space.low.astype(np.float32),
                                  action_space.high.astype(np.float32), action_space.shape,
                                  np.float32)
    try:
        observation_spec = spec_from_space(obs_space, name="observation")
        action_spec = spec_from_space(action_space, name="action")
    except ValueError as e:
        raise ValueError(f"suite_envpool: {env_name!r}: {e}") from None
    for what, spec in (("observation", observation_spec), ("action", action_spec)):
        if not isinstance(spec, array_spec.ArraySpec):
            raise ValueError(f"suite_envpool supports tasks with one array {what}; "
                             f"{env_name!r}'s is {spec!r}")
    return observation_spec, action_spec, atari


def make_env(env_name, batch_size=1, seed=None, **knobs):
    """One EnvPool pool of `batch_size` environments as a batched PyEnvironment.

    Args:
        env_name: an EnvPool task id, e.g. 'Breakout-v5' or 'HalfCheetah-v5'.
        batch_size: the pool's number of environments (its rows).
        seed: row b is seeded `seed + b` (EnvPool's rule); None: a random seed.
        **knobs: any of `options`' arguments; unset ones take gin's
            `suite_envpool.*` bindings, then the defaults.

    Returns:
        An `EnvPoolEnv`, or a `LockstepEnvPoolEnv` with `stepping='lockstep'`;
            its pool is made on first use.

    Raises:
        ValueError: envpool missing, an unknown id, an unknown knob or one
            out of range, an Atari knob for another task.
    """
    atari = check_task(env_name)   # envpool installed, the id known: before anything else
    values = knob_values(**knobs)
    if not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise ValueError(f"suite_envpool: batch_size must be an int >= 1, got {batch_size!r}")
    if seed is None:
        seed = random.SystemRandom().randrange(0, 2 ** 31 - batch_size)
    if not isinstance(seed, numbers.Integral) or not -2 ** 31 <= seed <= 2 ** 31 - batch_size:
        raise ValueError(f"suite_envpool: seed must be an int with seed + batch_size - 1 in "
                         f"EnvPool's int32 range, got {seed!r}")
    k = values["recv_batch_size"]
    if k is None:
        k = default_recv_batch_size(batch_size)
    elif k > batch_size:
        raise ValueError(f"suite_envpool: recv_batch_size {k} is more than batch_size "
                         f"{batch_size}")
    num_threads = values["num_threads"] or _default_threads(batch_size)
    settings = _pool_settings(env_name, atari, values, knobs)
    envpool = import_envpool()
    observation_spec, action_spec, channels_last = _specs(
        env_name, atari, envpool.make_spec(env_name, **settings))
    cls = EnvPoolEnv if values["stepping"] == "rows" else LockstepEnvPoolEnv
    return cls(env_name, int(batch_size), int(seed), settings, int(num_threads), int(k),
               observation_spec, action_spec, channels_last, atari,
               zero_discount_on_life_loss=atari and values["zero_discount_on_life_loss"])


def load(env_name, batch_size=1, seed=None, **knobs):
    """`batch_size` environments of one EnvPool pool as one batched TFEnvironment
    (`suites.load('suite_envpool', ...)` calls this).

    Args and raises: as `make_env`.

    Returns:
        A TFPyEnvironment over an `EnvPoolEnv`: for Atari games observation
            BoundedArraySpec uint8 [84, 84, 4] in [0, 255] with the defaults and
            action int64 scalar in [0, n - 1]; for other tasks suite_gymnasium's
            specs of the same id.
    """
    return tf_py_environment.TFPyEnvironment(make_env(env_name, batch_size, seed, **knobs))
