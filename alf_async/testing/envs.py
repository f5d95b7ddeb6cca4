"""Tiny deterministic environments whose observations say where they come from.

`CountingEnv` observes [env_index, counter, step_in_episode] (int32):
  - env_index: fixed per environment (by default `current_env_index()`,
    i.e. the index of a SubprocessEnv child or Ray actor slot, else 0),
  - counter: +1 for every time step the env emits (resets included), so a
    row of consecutive transitions has consecutive counters,
  - step_in_episode: 0 at FIRST, then 1, 2, ... up to episode_length (LAST).
Each step gives reward 1.0; an episode has exactly `episode_length` rewarded
steps, so its return and its length are both `episode_length`. Faults
(an exception, a hang, the process exiting) can be injected at a given
step; steps are counted since the environment was built (resets excluded),
so a restarted child starts counting again.

Every factory here is a top-level function or class: it pickles by
reference and is imported in a child process or Ray actor.
"""

import itertools
import os
import threading
import time

import gin
import gym
import numpy as np
from tf_agents.environments import batched_py_environment, py_environment, tf_py_environment
from tf_agents.specs import array_spec
from tf_agents.trajectories import time_step as ts

from alf_async.environments.processes.env_index import current_env_index

OBS_ENV, OBS_COUNTER, OBS_STEP = 0, 1, 2
NUM_ACTIONS = 1000


class CountingEnv(py_environment.PyEnvironment):
    """See module docstring.

    Args:
        env_index: the value of observation[0] (None: `current_env_index()`,
            or 0 outside a child process / Ray actor).
        episode_length: rewarded steps per episode.
        raise_on_step: if set, `step()` raises `error` on this (1-based) call.
        raise_on_reset: if set, `reset()` raises `error` on this (1-based) call.
        error: the exception instance to raise (default a ValueError).
        check_action: if set, a callable(observation, action) -> expected
            action; a different action raises AssertionError (routing check).
        hang_on_step: if set, this (1-based) `step()` call sleeps forever.
        exit_on_step: if set, this (1-based) `step()` call ends the process
            (`os._exit(3)`: a crashing simulator).
        build_delay: seconds the constructor sleeps (a slow simulator start).
        build_error: if True, the constructor raises ValueError.
    """

    def __init__(self, env_index=None, episode_length=5, raise_on_step=None, error=None,
                 check_action=None, raise_on_reset=None, hang_on_step=None, exit_on_step=None,
                 build_delay=0.0, build_error=False):
        super().__init__(handle_auto_reset=True)
        if build_delay:
            time.sleep(build_delay)
        if build_error:
            raise ValueError("CountingEnv: injected build error")
        if env_index is None:
            env_index = current_env_index() or 0
        self._index = int(env_index)
        self._episode_length = int(episode_length)
        self._raise_on_step = raise_on_step
        self._raise_on_reset = raise_on_reset
        self._hang_on_step = hang_on_step
        self._exit_on_step = exit_on_step
        self._num_resets = 0
        self._error = error or ValueError(
            f"CountingEnv {self._index}: injected failure at step {raise_on_step}")
        self._check_action = check_action
        self._counter = -1
        self._step_in_episode = 0
        self._num_steps = 0
        self._last_obs = None
        self.closed = False

    def observation_spec(self):
        return array_spec.ArraySpec((3,), np.int32, name="observation")

    def action_spec(self):
        return array_spec.BoundedArraySpec((), np.int32, 0, NUM_ACTIONS - 1, name="action")

    def _observe(self):
        self._counter += 1
        self._last_obs = np.array([self._index, self._counter, self._step_in_episode],
                                  np.int32)
        return self._last_obs

    def _reset(self):
        self._num_resets += 1
        if self._num_resets == self._raise_on_reset:
            raise self._error
        self._step_in_episode = 0
        return ts.restart(self._observe())

    def _step(self, action):
        self._num_steps += 1
        if self._num_steps == self._raise_on_step:
            raise self._error
        if self._num_steps == self._hang_on_step:
            while True:
                time.sleep(3600)
        if self._num_steps == self._exit_on_step:
            os._exit(3)
        if self._check_action is not None:
            expected = self._check_action(self._last_obs, action)
            if int(action) != int(expected):
                raise AssertionError(f"env {self._index} got action {action}, expected "
                                     f"{expected} for observation {self._last_obs}")
        self._step_in_episode += 1
        obs = self._observe()
        if self._step_in_episode >= self._episode_length:
            return ts.termination(obs, np.float32(1.0))
        return ts.transition(obs, np.float32(1.0), discount=np.float32(1.0))

    def get_info(self):
        return {"pid": os.getpid(), "total_steps": self._num_steps}

    def raise_unrebuildable(self):
        """Raises an exception whose type a parent process cannot import (a local class)."""
        class LocalError(Exception):
            pass
        raise LocalError("CountingEnv: unimportable exception type")

    def close(self):
        self.closed = True


class BlockingCountingEnv(CountingEnv):
    """A CountingEnv whose every step first sleeps, declaring `blocking_step`
    (a remote or heavy simulator), so the driver steps its rows one by one.

    Args:
        latency: seconds each step sleeps, or a callable(env_index, rng) ->
            seconds, `rng` a numpy Generator seeded with the env index.
        **kwargs: CountingEnv's.
    """

    blocking_step = True

    def __init__(self, latency=0.0, **kwargs):
        super().__init__(**kwargs)
        self._latency = latency
        self._rng = np.random.default_rng(self._index)

    def _step(self, action):
        secs = (self._latency(self._index, self._rng) if callable(self._latency)
                else self._latency)
        time.sleep(secs)
        return super()._step(action)


class CountingEnvConstructor(object):
    """A thread-safe env constructor for the driver: each call builds a
    TFEnvironment of `batch_size` CountingEnvs with fresh env indices
    (0, 1, 2, ... in call order).

    `episode_length` may be a callable(env_index) -> int to desynchronise envs.
    `env_cls` is CountingEnv or a subclass (e.g. BlockingCountingEnv), built
    with `env_kwargs`. `created` keeps every TFEnvironment built (to check
    they get closed).
    """

    def __init__(self, batch_size=1, episode_length=5, env_cls=CountingEnv, **env_kwargs):
        self._env_cls = env_cls
        self._batch_size = batch_size
        self._episode_length = episode_length
        self._env_kwargs = env_kwargs
        self._indices = itertools.count()
        self._lock = threading.Lock()
        self.created = []

    def __call__(self):
        with self._lock:
            indices = [next(self._indices) for _ in range(self._batch_size)]
        envs = []
        for i in indices:
            length = (self._episode_length(i) if callable(self._episode_length)
                      else self._episode_length)
            envs.append(self._env_cls(env_index=i, episode_length=length, **self._env_kwargs))
        tf_env = tf_py_environment.TFPyEnvironment(
            batched_py_environment.BatchedPyEnvironment(envs, multithreading=False))
        tf_env.counting_envs = envs
        with self._lock:
            self.created.append(tf_env)
        return tf_env


class CountingGymEnv(gym.Env):
    """The gym twin of CountingEnv: the same observation (float32), actions
    {0, 1}, done (a termination) after `episode_length` steps."""

    def __init__(self, episode_length=3, env_index=None):
        self.observation_space = gym.spaces.Box(-1e6, 1e6, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._episode_length = episode_length
        self._index = (current_env_index() or 0) if env_index is None else env_index
        self._counter = -1
        self._t = 0

    def _obs(self):
        self._counter += 1
        return np.array([self._index, self._counter, self._t], dtype=np.float32)

    def reset(self):
        self._t = 0
        return self._obs()

    def step(self, action):
        self._t += 1
        return self._obs(), 1.0, self._t >= self._episode_length, {}


# ----------------------------------------- constructors for child processes


def counting_env(episode_length=5):
    return CountingEnv(episode_length=episode_length)


def slow_counting_env(build_delay=1.0):
    """Takes `build_delay` seconds to build."""
    return CountingEnv(build_delay=build_delay)


def raising_env(raise_on_step=2):
    """Raises ValueError in its `raise_on_step`-th step (only that one)."""
    return CountingEnv(raise_on_step=raise_on_step)


def slow_to_build_env(build_secs=3.0):
    """A CountingEnv that takes `build_secs` to construct."""
    time.sleep(build_secs)
    return CountingEnv()


def hanging_env(hang_on_step=2):
    """Sleeps forever in its `hang_on_step`-th step."""
    return CountingEnv(hang_on_step=hang_on_step)


def first_env_hangs(hang_on_step=3):
    """Env index 0 sleeps forever in its `hang_on_step`-th step; the others never hang."""
    return CountingEnv(hang_on_step=hang_on_step if (current_env_index() or 0) == 0 else None)


def uniform_latency(env_index, rng):
    """A BlockingCountingEnv latency: uniform in [0, 3 ms), seeded per environment."""
    del env_index
    return rng.uniform(0.0, 0.003)


def straggler_latency(env_index, rng):
    """A BlockingCountingEnv latency: 0.25 s a step for env index 0, none for the others."""
    del rng
    return 0.25 if env_index == 0 else 0.0


def crashing_env(exit_on_step=1):
    """The process exits (os._exit(3)) in its `exit_on_step`-th step."""
    return CountingEnv(exit_on_step=exit_on_step)


def build_error_env():
    """Raises ValueError while being built."""
    return CountingEnv(build_error=True)


@gin.configurable
def gin_counting_env(episode_length=5):
    """A CountingEnv whose episode length is set by gin."""
    return CountingEnv(episode_length=episode_length)


def counting_gym_env(episode_length=3):
    return CountingGymEnv(episode_length=episode_length)


_ROWS_MADE = itertools.count()
COUNTING_ROWS = "alf_async.testing.envs:CountingRows-v0"


def counting_rows(episode_length=20):
    """A CountingGymEnv whose env_index is $ALF_ASYNC_FIRST_ROW (default 0)
    plus how many counting_rows this process made before it: each row of a
    batch of them has its own, and processes started with different
    $ALF_ASYNC_FIRST_ROW too (gym id `COUNTING_ROWS`, which imports this
    module; for checks that no item joins steps of two rows or across a
    gap, `replay_audit.row_runs`)."""
    first = int(os.environ.get("ALF_ASYNC_FIRST_ROW", "0"))
    return CountingGymEnv(episode_length=episode_length, env_index=first + next(_ROWS_MADE))


gym.register(id="CountingRows-v0", entry_point=counting_rows)


class _SlowStep(gym.Wrapper):
    """A gym env whose every step first sleeps `step_secs` (a simulated simulator)."""

    def __init__(self, env, step_secs):
        super().__init__(env)
        self._step_secs = step_secs

    def step(self, action):
        time.sleep(self._step_secs)
        return self.env.step(action)


def slow_cartpole(step_secs=0.005):
    """gym CartPole-v0 whose steps take `step_secs` longer; picklable by reference."""
    return _SlowStep(gym.make("CartPole-v0"), step_secs)


def cartpole():
    """gym CartPole-v0; picklable by reference (for SubprocessEnv and Ray)."""
    return gym.make("CartPole-v0")


class PixelCatchEnv(gym.Env):
    """Catch on pixels, the smallest convolutional task that learns in seconds.

    A ball falls one row a step down a `size` x `size` screen, from a random
    column of the top row; the paddle, on the bottom row, moves left, stays
    or moves right (actions 0, 1, 2). When the ball reaches the bottom row
    the episode ends (a termination) with reward +1 if the paddle is under
    it, else -1: a random policy scores about -0.6, the best +1. The
    observation is uint8 [size, size, 1], 255 where the ball and the paddle
    are, like an Atari screen's stack of one frame.
    """

    def __init__(self, size=8):
        self.observation_space = gym.spaces.Box(0, 255, (size, size, 1), np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self._size = size
        self._rng = np.random.default_rng()
        self._ball = self._paddle = None

    def _obs(self):
        obs = np.zeros((self._size, self._size, 1), np.uint8)
        obs[self._ball[0], self._ball[1], 0] = 255
        obs[self._size - 1, self._paddle, 0] = 255
        return obs

    def reset(self, seed=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._ball = [0, int(self._rng.integers(self._size))]
        self._paddle = int(self._rng.integers(self._size))
        return self._obs()

    def step(self, action):
        self._paddle = int(np.clip(self._paddle + int(action) - 1, 0, self._size - 1))
        self._ball[0] += 1
        done = self._ball[0] == self._size - 1
        reward = (1.0 if self._paddle == self._ball[1] else -1.0) if done else 0.0
        return self._obs(), reward, done, {}


def load_pixel_catch(env_name, batch_size=1, seed=None, size=8):
    """`batch_size` PixelCatchEnvs as one batched TFEnvironment (a suite's
    load function: `suites.register_suite('pixel_catch', load_pixel_catch)`;
    `env_name` is ignored)."""
    del env_name
    from alf_async.environments.suites import gym_batch  # pylint: disable=import-outside-toplevel
    return tf_py_environment.TFPyEnvironment(gym_batch.BatchedGymEnv(
        [PixelCatchEnv(size) for _ in range(batch_size)], seed=seed))
