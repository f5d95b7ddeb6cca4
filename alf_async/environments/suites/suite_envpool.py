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
cores are the limit: 16 Breakout games on 2 env threads acting themselves
collected 1.15x tf-agents' lockstep driver (row by row: 0.97x at best),
and PPO on Pong, with a learner beside the games on 2 cores, 1.07x the
env steps/s (docs: performance, "Atari" and "Pong (`ppo_pong.gin`)").

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
import threading

import gin
import numpy as np
from tf_agents.environments import py_environment, tf_py_environment
from tf_agents.specs import array_spec
from tf_agents.trajectories import time_step as ts

from alf_async.environments import capabilities
from alf_async.environments.rows.envpool_rows import EnvPoolRows, default_recv_batch_size

INSTALL_HINT = "suite_envpool needs envpool: pip install -e '.[envpool]'"
ATARI_KNOBS = ("repeat_action_probability", "max_num_frames_per_episode", "noop_max",
               "frame_skip", "screen_size", "stack_size", "terminal_on_life_loss",
               "full_action_space", "fire_reset", "zero_discount_on_life_loss")
KNOBS = ("stepping", "num_threads", "recv_batch_size", "max_episode_steps") + ATARI_KNOBS
STEPPINGS = ("rows", "lockstep")
NO_TIME_LIMIT = 2 ** 30   # EnvPool's "no limit": it has none of its own
_FIRST, _MID, _LAST = (np.int32(t) for t in (ts.StepType.FIRST, ts.StepType.MID,
                                             ts.StepType.LAST))


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


def _import_envpool():
    try:
        import envpool  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise ValueError(INSTALL_HINT) from None
    return envpool


def check_task(env_name):
    """Raises ValueError (one line, naming `env_name`) unless it is an EnvPool
    task id; returns whether it is an Atari game."""
    envpool = _import_envpool()
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


class LockstepEnvPoolEnv(py_environment.PyEnvironment, capabilities.GilFreeStep):
    """One EnvPool pool of `batch_size` environments as a batched PyEnvironment,
    stepped in lockstep by `reset()` / `step(actions)` (an EnvPool pool in
    synchronous mode). See the module docstring for the semantics, and `load`
    to build one (`stepping='lockstep'`).

    Its steps wait, GIL released, on EnvPool's C++ threads for about one step
    of the environment: the driver steps it as it steps in-process games (in
    the env thread's graph loop, on one of TF's inter-op threads), without
    the step token (`capabilities.GilFreeStep`): two env threads' pools
    step at once.

    Threads: one thread at a time steps it (the env thread that owns it, or
    whoever calls `step`); every pool call is made under a lock, so
    `close()` may be called from any thread: it waits for a pool call in
    progress (EnvPool's receive waits for the steps in flight: about one step
    of the environment) and then frees the pool, whose destructor joins its
    C++ threads; a later call raises RuntimeError (the env thread of a
    stopping driver leaves quietly on it).
    """

    def __init__(self, env_name, batch_size, seed, settings, num_threads, recv_batch_size,
                 observation_spec, action_spec, channels_last, atari,
                 zero_discount_on_life_loss=False):
        """Use `load` (or `make_env`), which checks the arguments."""
        super().__init__(handle_auto_reset=False)
        self._env_name = env_name
        self._batch_size = batch_size
        self._seed = seed
        self._settings = dict(settings, seed=seed, num_envs=batch_size, num_threads=num_threads)
        self._recv_batch_size = recv_batch_size
        self._observation_spec = observation_spec
        self._action_spec = action_spec
        self._channels_last = channels_last
        self._game_over_info = atari   # Atari pools report the game's own game over
        # EnvPool's episodic life starts the episode after a lost life
        # without refilling the frame stack; rows' steps since their FIRST,
        # to refill it as every other reset does.
        self._stack = settings["stack_num"] if settings.get("episodic_life") else None
        self._episode_steps = np.zeros(batch_size, np.int64)
        # Each row's lives after its last time step, to give the step that
        # loses one discount 0 (zero_discount_on_life_loss).
        self._zero_discount_on_life_loss = bool(zero_discount_on_life_loss)
        self._lives = np.zeros(batch_size, np.int64)
        self._all_rows = np.arange(batch_size, dtype=np.int32)
        # Rows whose last time step was LAST (or that have not started): their
        # next time step is the FIRST of a new episode.
        self._ended = np.ones(batch_size, bool)
        self._lock = threading.Lock()
        self._pool = None
        self._pool_recv_batch = None   # the batch size of the pool's receives
        self._mode = None
        self._closed = False

    # ------------------------------------------------------------ the spec side

    @property
    def batched(self):
        return True

    @property
    def batch_size(self):
        return self._batch_size

    @property
    def env_name(self):
        return self._env_name

    @property
    def settings(self):
        """EnvPool's `make()` keyword arguments for this pool (a copy; the
        mode's batch_size is added when the pool is made)."""
        return dict(self._settings)

    @property
    def mode(self):
        """How the pool was last used: 'lockstep' (`reset`/`step`, EnvPool's
        synchronous mode) or 'rows' (a row stepper, asynchronous mode; with
        batch_size 1 both are the same pool); None before the pool is made
        and after `close()`."""
        return None if self._pool is None else self._mode

    @property
    def num_threads(self):
        """EnvPool's C++ threads per pool."""
        return self._settings["num_threads"]

    @property
    def recv_batch_size(self):
        """How many rows one receive of the row stepper's pool returns."""
        return self._recv_batch_size

    def observation_spec(self):
        return self._observation_spec

    def action_spec(self):
        return self._action_spec

    # ------------------------------------------------------------- lockstep

    def _reset(self):
        with self._lock:
            pool = self._pool_for(self._batch_size, "lockstep")
            obs, info = pool.reset(self._all_rows)
            rows = np.asarray(info["env_id"])
            if self._zero_discount_on_life_loss:
                self._lives[rows] = info["lives"]
            obs = self._observations(obs, rows, np.ones(len(rows), bool))
            if not np.array_equal(rows, self._all_rows):
                obs = obs[np.argsort(rows)]
            self._ended[:] = False
        B = self._batch_size
        return ts.TimeStep(np.full(B, _FIRST), np.zeros(B, np.float32), np.ones(B, np.float32),
                           obs)

    def _step(self, action):
        with self._lock:
            pool = self._pool_for(self._batch_size, "lockstep")
            pool.send(np.asarray(action), self._all_rows)
            rows, time_step = self._time_steps(pool.recv())
        if not np.array_equal(rows, self._all_rows):
            time_step = [x[np.argsort(rows)] for x in time_step]
        return ts.TimeStep(*time_step)

    # ------------------------------------------------------------- internals

    def _open_pool(self):
        if self._pool is None:
            raise RuntimeError(f"suite_envpool: the {self._env_name} pool is "
                               f"{'closed' if self._closed else 'not started'}")
        return self._pool

    def _pool_for(self, recv_batch, mode):
        """The pool, made (or remade) to receive `recv_batch` rows at a time,
        for a use in `mode`; under the lock."""
        if self._closed:
            raise RuntimeError(f"suite_envpool: the {self._env_name} pool is closed")
        if self._pool is None or self._pool_recv_batch != recv_batch:
            self._free_pool()
            envpool = _import_envpool()
            self._pool = envpool.make(self._env_name, env_type="gymnasium",
                                      batch_size=recv_batch, **self._settings)
            self._pool_recv_batch = recv_batch
            self._ended[:] = True   # a fresh pool resets each row at its first step
        self._mode = mode
        return self._pool

    def _free_pool(self):
        pool, self._pool, self._pool_recv_batch = self._pool, None, None
        if pool is not None:
            pool.close()
            del pool   # the last reference: EnvPool's destructor joins its threads

    def _observations(self, obs, rows, first):
        """`obs` of `rows` (`first`: which start an episode) as the spec has them."""
        if self._stack is not None:
            steps = np.where(first, 0, self._episode_steps[rows] + 1)
            self._episode_steps[rows] = steps
            for j in np.flatnonzero(steps < self._stack - 1):
                # Frames older than the episode's first become that frame.
                oldest = self._stack - 1 - steps[j]
                obs[j, :oldest] = obs[j, oldest]
        return np.moveaxis(obs, 1, -1) if self._channels_last else obs

    def _time_steps(self, received):
        """The rows of one receive and their time step fields; under the lock."""
        obs, reward, terminated, truncated, info = received
        rows = np.asarray(info["env_id"])
        first = self._ended[rows]
        done = (np.asarray(terminated) | np.asarray(truncated)) & ~first
        game_over = np.asarray(terminated, bool)
        if self._game_over_info:
            # EnvPool calls a game over on the time limit's last step a truncation.
            game_over = game_over | (np.asarray(info["terminated"]) != 0)
        game_over &= done
        if self._zero_discount_on_life_loss:
            lives = np.asarray(info["lives"])
            game_over |= ~first & (lives < self._lives[rows])   # a training boundary
            self._lives[rows] = lives
        self._ended[rows] = done
        step_type = np.where(first, _FIRST, np.where(done, _LAST, _MID)).astype(np.int32)
        reward = np.where(first, 0.0, reward).astype(np.float32)
        discount = np.where(game_over, 0.0, 1.0).astype(np.float32)
        return rows, [step_type, reward, discount, self._observations(obs, rows, first)]

    def close(self):
        """Frees the pool (waiting for a pool call in progress); idempotent,
        from any thread."""
        with self._lock:
            self._closed = True
            self._free_pool()


class EnvPoolEnv(LockstepEnvPoolEnv, capabilities.RowStepping, capabilities.BlockingStep):
    """A `LockstepEnvPoolEnv` that the driver steps row by row through
    `make_row_stepper` (an asynchronous pool; envpool_rows.py); `reset()` /
    `step(actions)` still step it in lockstep. `load`'s default
    (`stepping='rows'`).

    It is a `capabilities.BlockingStep`: the driver steps it off TF's
    inter-op pool (row by row, as a RowStepping batch) and closes it at once
    when it stops. Threads: as LockstepEnvPoolEnv's.
    """

    # ------------------------------------------------------------ row by row

    def make_row_stepper(self, on_rows):
        """An `envpool_rows.EnvPoolRows` over this environment's rows (the env
        thread's; see capabilities.RowStepping)."""
        return EnvPoolRows(self, on_rows)

    def reset_rows(self):
        """Resets every row of an asynchronous pool; each comes back from
        `recv_rows` (the row stepper's `start`)."""
        with self._lock:
            self._pool_for(self._recv_batch_size, "rows").async_reset()
            self._ended[:] = True

    def send_rows(self, rows, actions):
        """Sends `rows` (int32 [n]) their `actions` ([n, ...]); returns at once."""
        with self._lock:
            self._open_pool().send(actions, rows)

    def recv_rows(self):
        """Waits until `recv_batch_size` rows in flight are done (EnvPool's
        receive has no timeout: call it only with that many rows in flight).

        Returns:
            (rows int32 [k], [step_type, reward, discount, observation] each [k, ...]).
        """
        with self._lock:
            return self._time_steps(self._open_pool().recv())


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
    envpool = _import_envpool()
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
