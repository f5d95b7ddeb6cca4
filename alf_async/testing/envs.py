"""Tiny deterministic environments whose observations say where they come from.

`CountingEnv` observes [env_index, counter, step_in_episode] (int32):
  - env_index: fixed per environment,
  - counter: +1 for every time step the env emits (resets included), so a
    row of consecutive transitions has consecutive counters,
  - step_in_episode: 0 at FIRST, then 1, 2, ... up to episode_length (LAST).
Each step gives reward 1.0; an episode has exactly `episode_length` rewarded
steps, so its return and its length are both `episode_length`.
"""

import itertools
import threading
import time

import gym
import numpy as np
from tf_agents.environments import batched_py_environment, py_environment, tf_py_environment
from tf_agents.specs import array_spec
from tf_agents.trajectories import time_step as ts

OBS_ENV, OBS_COUNTER, OBS_STEP = 0, 1, 2
NUM_ACTIONS = 1000


class CountingEnv(py_environment.PyEnvironment):
    """See module docstring.

    Args:
        env_index: the value of observation[0].
        episode_length: rewarded steps per episode.
        raise_on_step: if set, `step()` raises `error` on this (1-based) call.
        raise_on_reset: if set, `reset()` raises `error` on this (1-based) call.
        error: the exception instance to raise.
        check_action: if set, a callable(observation, action) -> expected
            action; a different action raises AssertionError (routing check).
    """

    def __init__(self, env_index=0, episode_length=5, raise_on_step=None, error=None,
                 check_action=None, raise_on_reset=None):
        super().__init__(handle_auto_reset=True)
        self._index = env_index
        self._episode_length = episode_length
        self._raise_on_step = raise_on_step
        self._raise_on_reset = raise_on_reset
        self._num_resets = 0
        self._error = error or ValueError(f"CountingEnv {env_index}: injected failure")
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
        if self._raise_on_reset is not None and self._num_resets >= self._raise_on_reset:
            raise self._error
        self._step_in_episode = 0
        return ts.restart(self._observe())

    def _step(self, action):
        self._num_steps += 1
        if self._raise_on_step is not None and self._num_steps >= self._raise_on_step:
            raise self._error
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

    def close(self):
        self.closed = True


class CountingEnvFactory(object):
    """A thread-safe env_f: each call builds a TFEnvironment of `batch_size`
    CountingEnvs with fresh env indices (0, 1, 2, ... in call order).

    `episode_length` may be a callable(env_index) -> int to desynchronise envs.
    `created` keeps every TFEnvironment built (to check they get closed).
    """

    def __init__(self, batch_size=1, episode_length=5, **env_kwargs):
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
            envs.append(CountingEnv(env_index=i, episode_length=length, **self._env_kwargs))
        tf_env = tf_py_environment.TFPyEnvironment(
            batched_py_environment.BatchedPyEnvironment(envs, multithreading=False))
        tf_env.counting_envs = envs
        with self._lock:
            self.created.append(tf_env)
        return tf_env


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
