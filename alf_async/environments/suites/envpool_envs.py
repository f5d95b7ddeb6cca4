"""The environments suite_envpool makes: one EnvPool pool as a batched
PyEnvironment, stepped in lockstep (`LockstepEnvPoolEnv`) or row by row
(`EnvPoolEnv`, a `capabilities.RowStepping` batch whose rows
`rows.envpool_rows.EnvPoolRows` steps). Their semantics (FIRST steps,
truncations, lives, the frame stack) are in suite_envpool's docstring;
`suite_envpool.make_env` / `load` check the arguments and build them.
"""

import threading

import numpy as np
from tf_agents.environments import py_environment
from tf_agents.trajectories import time_step as ts

from alf_async.environments import capabilities
from alf_async.environments.rows.envpool_rows import EnvPoolRows

INSTALL_HINT = "suite_envpool needs envpool: pip install -e '.[envpool]'"

_FIRST, _MID, _LAST = (np.int32(t) for t in (ts.StepType.FIRST, ts.StepType.MID,
                                             ts.StepType.LAST))


def import_envpool():
    """The envpool module; ValueError (`INSTALL_HINT`) when it is not installed."""
    try:
        import envpool  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise ValueError(INSTALL_HINT) from None
    return envpool


class LockstepEnvPoolEnv(py_environment.PyEnvironment, capabilities.GilFreeStep):
    """One EnvPool pool of `batch_size` environments as a batched PyEnvironment,
    stepped in lockstep by `reset()` / `step(actions)` (an EnvPool pool in
    synchronous mode). See suite_envpool's module docstring for the semantics,
    and `suite_envpool.load` to build one (`stepping='lockstep'`).

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
        """Use `suite_envpool.load` (or `make_env`), which checks the arguments."""
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
            envpool = import_envpool()
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
    `step(actions)` still step it in lockstep. `suite_envpool.load`'s default
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
