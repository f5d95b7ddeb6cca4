"""Tiny deterministic, picklable environment factories for SubprocessEnv tests.

Every factory here is a top-level function or class, so it pickles by
reference and is imported in the child process.

``CountingEnv``: observation ``[env_index, step_in_episode]`` (int64), action a
scalar int32 in {0, 1} (ignored), reward 1.0 per step, ``LAST`` (discount 0)
after ``episode_length`` steps, then auto-reset. ``env_index`` defaults to
``current_env_index()`` of the child. Faults count steps since the env was
built (resets excluded), so a restarted child starts counting from 0 again.
"""

import os
import time

import gin
import gym
import numpy as np
from tf_agents.environments import py_environment
from tf_agents.specs import array_spec
from tf_agents.trajectories import time_step as ts

from alf_async.environments.subprocess_env import current_env_index


class CountingEnv(py_environment.PyEnvironment):
    """See the module docstring."""

    def __init__(self, episode_length=5, env_index=None, build_delay=0.0,
                 fail_at_step=None, hang_at_step=None, crash_at_step=None,
                 build_error=False):
        super().__init__(handle_auto_reset=True)
        if build_delay:
            time.sleep(build_delay)
        if build_error:
            raise ValueError("CountingEnv: injected build error")
        self._episode_length = int(episode_length)
        if env_index is None:
            env_index = current_env_index()
        self._env_index = -1 if env_index is None else int(env_index)
        self._fail_at_step = fail_at_step
        self._hang_at_step = hang_at_step
        self._crash_at_step = crash_at_step
        self._total_steps = 0
        self._t = 0
        self._observation_spec = array_spec.ArraySpec((2,), np.int64, name="observation")
        self._action_spec = array_spec.BoundedArraySpec((), np.int32, 0, 1, name="action")

    def observation_spec(self):
        return self._observation_spec

    def action_spec(self):
        return self._action_spec

    def _observation(self):
        return np.array([self._env_index, self._t], dtype=np.int64)

    def _reset(self):
        self._t = 0
        return ts.restart(self._observation())

    def _step(self, action):
        self._total_steps += 1
        if self._total_steps == self._fail_at_step:
            raise ValueError(f"CountingEnv: injected failure at step {self._total_steps}")
        if self._total_steps == self._hang_at_step:
            while True:
                time.sleep(3600)
        if self._total_steps == self._crash_at_step:
            os._exit(3)
        self._t += 1
        if self._t >= self._episode_length:
            return ts.termination(self._observation(), reward=np.float32(1.0))
        return ts.transition(self._observation(), reward=np.float32(1.0), discount=1.0)

    def get_info(self):
        return {"pid": os.getpid(), "total_steps": self._total_steps}

    def raise_unrebuildable(self):
        """Raises an exception whose type the parent cannot import (a local class)."""
        class LocalError(Exception):
            pass
        raise LocalError("CountingEnv: unimportable exception type")


def counting_env(episode_length=5):
    return CountingEnv(episode_length=episode_length)


def slow_counting_env(build_delay=1.0):
    """Takes `build_delay` seconds to build."""
    return CountingEnv(build_delay=build_delay)


def raising_env(fail_at_step=2):
    """Raises ValueError in its `fail_at_step`-th step."""
    return CountingEnv(fail_at_step=fail_at_step)


def hanging_env(hang_at_step=2):
    """Sleeps forever in its `hang_at_step`-th step."""
    return CountingEnv(hang_at_step=hang_at_step)


def crashing_env(crash_at_step=1):
    """The process exits (os._exit(3)) in its `crash_at_step`-th step."""
    return CountingEnv(crash_at_step=crash_at_step)


def build_error_env():
    """Raises ValueError while being built."""
    return CountingEnv(build_error=True)


@gin.configurable
def gin_counting_env(episode_length=5):
    """A CountingEnv whose episode length is set by gin."""
    return CountingEnv(episode_length=episode_length)


class CountingGymEnv(gym.Env):
    """The gym twin of CountingEnv: obs [env_index, t] (float32), done after episode_length."""

    def __init__(self, episode_length=3):
        self.observation_space = gym.spaces.Box(-1e6, 1e6, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._episode_length = episode_length
        index = current_env_index()
        self._index = -1 if index is None else index
        self._t = 0

    def _obs(self):
        return np.array([self._index, self._t], dtype=np.float32)

    def reset(self):
        self._t = 0
        return self._obs()

    def step(self, action):
        self._t += 1
        return self._obs(), 1.0, self._t >= self._episode_length, {}


def counting_gym_env(episode_length=3):
    return CountingGymEnv(episode_length=episode_length)
