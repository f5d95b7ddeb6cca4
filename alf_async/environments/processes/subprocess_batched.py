"""Several SubprocessEnvs as one batched environment, and the driver's env
constructor over them.

``BatchedSubprocessEnv(envs)``
    A batched ``PyEnvironment`` over several ``SubprocessEnv``: one step sends
    every action first, then receives every result (no thread pool per step).
``subprocess_env_constructor(env_constructor, num_envs=1, ...)``
    The driver's env constructor: a thread-safe zero-arg callable returning a
    ``TFPyEnvironment`` over ``num_envs`` fresh ``SubprocessEnv``.

Threads: a BatchedSubprocessEnv follows SubprocessEnv's rules (one owner
thread; ``close()`` from any thread); the constructor may be called from
several threads at once.
"""

import itertools
import threading
from typing import Any, Callable, List, Optional, Sequence

import cloudpickle
from tf_agents.environments import py_environment, tf_py_environment
from tf_agents.utils import nest_utils

from alf_async.environments.capabilities import BlockingStep, Restartable
from alf_async.environments.processes.subprocess_env import (SubprocessEnv, close_subprocess_envs,
                                                             create_subprocess_envs)


class BatchedSubprocessEnv(py_environment.PyEnvironment, Restartable, BlockingStep):
    """A batched PyEnvironment over SubprocessEnvs, stepped concurrently.

    ``step(actions)`` sends each environment its action, then receives every
    result, so the children step in parallel without threads. If some
    environments raise, the others' replies are still received (the pipes stay
    in sync) and the first error is raised. Owns its environments: ``close()``
    closes them all, together. Same threading rules as SubprocessEnv.
    """


    def __init__(self, envs: Sequence[SubprocessEnv]):
        super().__init__(handle_auto_reset=False)
        if not envs:
            raise ValueError("BatchedSubprocessEnv needs at least one environment")
        self._envs = list(envs)
        first = self._envs[0]
        for env in self._envs[1:]:
            if (env.time_step_spec() != first.time_step_spec()
                    or env.action_spec() != first.action_spec()):
                raise ValueError(f"specs of {env!r} differ from those of {first!r}")

    @property
    def batched(self) -> bool:
        return True

    @property
    def batch_size(self) -> int:
        return len(self._envs)

    @property
    def envs(self) -> List[SubprocessEnv]:
        return list(self._envs)

    @property
    def restarts(self) -> int:
        """Total restarts of all children."""
        return sum(env.restarts for env in self._envs)

    @property
    def restarts_per_env(self) -> List[int]:
        return [env.restarts for env in self._envs]

    @property
    def pids(self) -> List[Optional[int]]:
        return [env.pid for env in self._envs]

    def observation_spec(self):
        return self._envs[0].observation_spec()

    def action_spec(self):
        return self._envs[0].action_spec()

    def reward_spec(self):
        return self._envs[0].reward_spec()

    def discount_spec(self):
        return self._envs[0].discount_spec()

    def time_step_spec(self):
        return self._envs[0].time_step_spec()

    def _reset(self):
        return self._all([env.reset_async for env in self._envs])

    def _step(self, actions):
        actions = nest_utils.unstack_nested_arrays(actions)
        if len(actions) != len(self._envs):
            raise ValueError(f"got {len(actions)} actions for {len(self._envs)} environments")
        return self._all([lambda env=env, a=a: env.step_async(a)
                          for env, a in zip(self._envs, actions)])

    def _all(self, sends):
        """Calls every `send` (each returns its `receive`), then every receive."""
        receives, error = [], None
        for send in sends:
            try:
                receives.append(send())
            except BaseException as e:
                error = e
                break
        results = []
        for receive in receives:  # always drain every request that went out
            try:
                results.append(receive())
            except BaseException as e:
                if error is None:
                    error = e
        if error is not None:
            raise error
        return nest_utils.stack_nested_arrays(results)

    def close(self) -> None:
        close_subprocess_envs(self._envs)


class _SubprocessEnvConstructor:
    """The zero-arg env constructor returned by ``subprocess_env_constructor``;
    thread-safe."""

    def __init__(self, env_constructor, num_envs, first_env_index, kwargs):
        self._env_constructor = env_constructor
        self._num_envs = num_envs
        self._kwargs = kwargs
        self._counter = itertools.count(first_env_index)
        self._lock = threading.Lock()

    def __call__(self) -> tf_py_environment.TFPyEnvironment:
        with self._lock:  # each call gets its own block of env indices
            indices = [next(self._counter) for _ in range(self._num_envs)]
        envs = create_subprocess_envs([self._env_constructor] * self._num_envs,
                                      env_indices=indices, **self._kwargs)
        try:
            return tf_py_environment.TFPyEnvironment(BatchedSubprocessEnv(envs))
        except BaseException:
            close_subprocess_envs(envs)
            raise

    def __repr__(self):
        return (f"subprocess_env_constructor({self._env_constructor!r}, "
                f"num_envs={self._num_envs})")


def subprocess_env_constructor(env_constructor: Callable[[], Any], num_envs: int = 1, *,
                               first_env_index: int = 0, **kwargs) -> Callable[[], Any]:
    """The driver's env constructor for environments in child processes.

    Returns a zero-arg callable; each call starts ``num_envs`` new children
    (in parallel, see ``create_subprocess_envs``) and returns a
    ``TFPyEnvironment`` over a ``BatchedSubprocessEnv`` of them (batch size
    ``num_envs``). The callable is thread-safe: the driver may call it from
    several env threads at once. The environments it makes get the indices
    ``first_env_index, first_env_index + 1, ...`` in call order (one block of
    ``num_envs`` per call), readable in the child with ``current_env_index()``.

    The returned TFPyEnvironment's ``pyenv`` is the BatchedSubprocessEnv
    (``restarts``, ``restarts_per_env``, ``pids``, ``envs``), and its
    ``close()`` stops the children.

    Args:
      env_constructor: zero-arg picklable callable returning a PyEnvironment
        or a gym / gymnasium environment, called in each child; see
        subprocess_env.py.
      num_envs: environments per TFEnvironment (its batch size).
      first_env_index: the first env index handed out.
      **kwargs: SubprocessEnv options (step_timeout, init_timeout,
        max_restarts, restart_window_secs, close_timeout, gin_config,
        start_method).
    """
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    if "start" in kwargs or "env_index" in kwargs:
        raise TypeError("subprocess_env_constructor sets start and env_index itself")
    cloudpickle.dumps(env_constructor)  # fail now, not in the driver's env thread
    return _SubprocessEnvConstructor(env_constructor, num_envs, first_env_index, kwargs)

