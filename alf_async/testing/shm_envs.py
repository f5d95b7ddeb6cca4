"""Tiny deterministic environments for the tests of the shared-memory
transport of SubprocessEnv (tests/test_subprocess_shared_memory.py).

`EchoEnv` observes where it is and what it was told, so a row given another
row's action, or a time step written into another row's slot, shows:

- flat: observation float64 [env_index, counter, step_in_episode, last
  action, sum of the actions of the episode]; action an int32 in [0, 9];
- nested: observation {"counts": int64 [env_index, counter,
  step_in_episode], "echo": float32 [last move + force[0], sum of the
  moves of the episode]}; action {"move": int32 in [0, 9], "force": float32
  (2,) in [-1, 1]}.

The counter is +1 for every time step emitted (resets included). Episodes
last ``3 + env_index % 3`` steps, so rows end their episodes at different
times; the reward and the discount depend on the action and the step.

`UnsupportedDtypeEnv` has an observation spec of a dtype shared memory
cannot hold (object or string); `WrongObservationEnv` returns observations
that do not match their spec.

Every factory here is a top-level class: it pickles by reference and is
imported in a child process.
"""

import numpy as np
from tf_agents.environments import py_environment
from tf_agents.specs import array_spec
from tf_agents.trajectories import time_step as ts

from alf_async.environments.processes.env_index import current_env_index

NUM_MOVES = 10


def episode_length(env_index):
    """Steps of each episode of EchoEnv `env_index`."""
    return 3 + env_index % 3


class EchoEnv(py_environment.PyEnvironment):
    """See module docstring.

    Args:
        nested: a dict observation and a dict action (else flat arrays).
        env_index: the index observed (None: `current_env_index()`, or 0).
    """

    def __init__(self, nested=False, env_index=None):
        super().__init__(handle_auto_reset=True)
        if env_index is None:
            env_index = current_env_index() or 0
        self._nested = bool(nested)
        self._index = int(env_index)
        self._length = episode_length(self._index)
        self._counter = -1
        self._in_episode = 0
        self._last = np.zeros(2, np.float32)
        self._total = 0.0

    def observation_spec(self):
        if self._nested:
            return {"counts": array_spec.ArraySpec((3,), np.int64, name="counts"),
                    "echo": array_spec.ArraySpec((2,), np.float32, name="echo")}
        return array_spec.ArraySpec((5,), np.float64, name="observation")

    def action_spec(self):
        if self._nested:
            return {"move": array_spec.BoundedArraySpec((), np.int32, 0, NUM_MOVES - 1,
                                                         name="move"),
                    "force": array_spec.BoundedArraySpec((2,), np.float32, -1.0, 1.0,
                                                         name="force")}
        return array_spec.BoundedArraySpec((), np.int32, 0, NUM_MOVES - 1, name="action")

    def _observe(self):
        self._counter += 1
        if self._nested:
            return {"counts": np.array([self._index, self._counter, self._in_episode], np.int64),
                    "echo": np.array([self._last[0], self._total], np.float32)}
        return np.array([self._index, self._counter, self._in_episode, self._last[0], self._total],
                        np.float64)

    def _reset(self):
        self._in_episode, self._total = 0, 0.0
        self._last = np.zeros(2, np.float32)
        return ts.restart(self._observe())

    def _step(self, action):
        if self._nested:
            move = int(action["move"])
            force = np.asarray(action["force"], np.float32)
            self._last = np.array([move + force[0], force[1]], np.float32)
            reward = np.float32(move * 0.25 + float(force.sum()))
        else:
            move = int(action)
            self._last = np.array([move, 0.0], np.float32)
            reward = np.float32(move * 0.5)
        self._total += move
        self._in_episode += 1
        observation = self._observe()
        if self._in_episode >= self._length:
            return ts.termination(observation, reward)
        discount = np.float32(1.0 - 0.125 * self._in_episode)
        return ts.transition(observation, reward, discount=discount)


def nested_echo_env():
    """A nested EchoEnv."""
    return EchoEnv(nested=True)


class UnsupportedDtypeEnv(py_environment.PyEnvironment):
    """An observation spec of `dtype` ("object" or "str"): shared memory
    refuses it, the pickled pipe carries it."""

    def __init__(self, dtype="object"):
        super().__init__(handle_auto_reset=True)
        self._dtype = np.dtype(dtype)
        self._count = 0

    def observation_spec(self):
        return array_spec.ArraySpec((), self._dtype, name="observation")

    def action_spec(self):
        return array_spec.BoundedArraySpec((), np.int32, 0, 1, name="action")

    def _observe(self):
        self._count += 1
        return np.array(f"observation {self._count}", self._dtype)

    def _reset(self):
        return ts.restart(self._observe())

    def _step(self, action):
        return ts.transition(self._observe(), np.float32(1.0))


class WrongObservationEnv(py_environment.PyEnvironment):
    """Its spec says an int32 observation of shape (3,); it returns one of
    `shape` and `dtype` instead, at the reset (`on_step` None) or at its
    `on_step`-th step (1-based), and a right one otherwise."""

    def __init__(self, shape=(2,), dtype="int32", on_step=None):
        super().__init__(handle_auto_reset=True)
        self._shape = tuple(shape)
        self._dtype = np.dtype(dtype)
        self._on_step = on_step
        self._steps = 0

    def observation_spec(self):
        return array_spec.ArraySpec((3,), np.int32, name="observation")

    def action_spec(self):
        return array_spec.BoundedArraySpec((), np.int32, 0, 1, name="action")

    def _observation(self, bad):
        if bad:
            return np.zeros(self._shape, self._dtype)
        return np.array([0, self._steps, 0], np.int32)

    def _reset(self):
        return ts.restart(self._observation(self._on_step is None))

    def _step(self, action):
        self._steps += 1
        return ts.transition(self._observation(self._steps == self._on_step), np.float32(1.0))


class PythonNumbersEnv(py_environment.PyEnvironment):
    """Time steps as a loose environment writes them: the step type, reward
    and discount as Python numbers and a float64 observation, where the specs
    say int32, float32, float32 and float32. Observation: [steps, action]."""

    def __init__(self):
        super().__init__(handle_auto_reset=True)
        self._steps = 0

    def observation_spec(self):
        return array_spec.ArraySpec((2,), np.float32, name="observation")

    def action_spec(self):
        return array_spec.BoundedArraySpec((), np.int32, 0, 3, name="action")

    def _reset(self):
        self._steps = 0
        return ts.TimeStep(0, 0.0, 1.0, np.zeros(2, np.float64))

    def _step(self, action):
        self._steps += 1
        return ts.TimeStep(1, 0.5 * self._steps, 1.0,
                           np.array([self._steps, int(action)], np.float64))
