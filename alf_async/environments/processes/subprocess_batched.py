"""Several SubprocessEnvs as one batched environment, and the driver's env
constructor over them.

``create_subprocess_envs(env_constructors, ...)``
    SubprocessEnvs built in parallel, sharing one segment of shared slots.
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

import concurrent.futures
import functools
import itertools
import threading
from typing import Any, Callable, List, Optional, Sequence

import cloudpickle
import numpy as np
import tensorflow as tf
from tf_agents.environments import py_environment, tf_py_environment
from tf_agents.utils import nest_utils

from alf_async.environments.capabilities import BlockingStep, Restartable
from alf_async.environments.processes.subprocess_calls import IN_SLOT
from alf_async.environments.processes import subprocess_protocol as protocol
from alf_async.environments.processes.shared_slots import SharedSlots
from alf_async.environments.processes.subprocess_env import (SubprocessEnv,
                                                             close_subprocess_envs)


class BatchedSubprocessEnv(py_environment.PyEnvironment, Restartable, BlockingStep):
    """A batched PyEnvironment over SubprocessEnvs, stepped concurrently.

    ``step(actions)`` sends each environment its action, then receives every
    result, so the children step in parallel without threads. If some
    environments raise, the others' replies are still received (the pipes stay
    in sync) and the first error is raised. Owns its environments: ``close()``
    closes them all, together. Same threading rules as SubprocessEnv.

    Environments made by ``create_subprocess_envs`` share one segment of
    shared slots, in order: a step then writes every action, and reads every
    time step, with one numpy copy per leaf. A SubprocessEnv of several
    environments (``envs_per_process``) is as many rows of the batch.
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
        # Rows 0..n-1 of one shared segment, in order (create_subprocess_envs
        # makes them so): every action is written, and every time step read,
        # with one numpy copy per leaf, and each child gets a frame alone.
        self._sizes = [env.envs_per_process for env in self._envs]
        self._starts = list(itertools.accumulate([0] + self._sizes[:-1]))
        shared = first._shared   # pylint: disable=protected-access
        self._views = None
        if shared is not None and shared.num_slots == sum(self._sizes) and all(
                env._shared is shared and env._slot == start   # pylint: disable=protected-access
                for start, env in zip(self._starts, self._envs)):
            self._views = shared.views

    @property
    def batched(self) -> bool:
        return True

    @property
    def batch_size(self) -> int:
        return sum(self._sizes)

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
        if self._views is not None:  # raises ValueError for a wrong batch
            self._views.write_actions(0, actions, self.batch_size)
            return self._all([functools.partial(env.step_async, None, in_slot=True)
                              for env in self._envs])
        n = len(tf.nest.flatten(actions)[0])
        if n != self.batch_size:
            raise ValueError(f"expected actions for {self.batch_size} environments, got {n}")
        if self.batch_size == len(self._envs):
            pieces = nest_utils.unstack_nested_arrays(actions)
        else:   # a batch of envs_per_process rows for each
            pieces = [tf.nest.map_structure(lambda a, i=i, k=k: a[i:i + k], actions)
                      for i, k in zip(self._starts, self._sizes)]
        return self._all([functools.partial(env.step_async, a)
                          for env, a in zip(self._envs, pieces)])

    def _all(self, sends):
        """Calls every `send` (each returns its `receive`), then every receive."""
        receives, error = [], None
        for send in sends:
            try:
                receives.append(send())
            except BaseException as e:
                error = e
                break
        raw = self._views is not None
        results = []
        for receive in receives:  # always drain every request that went out
            try:
                results.append(receive(raw=raw))
            except BaseException as e:
                if error is None:
                    error = e
        if error is not None:
            raise error
        if not raw:
            if self.batch_size == len(self._envs):
                return nest_utils.stack_nested_arrays(results)
            return tf.nest.map_structure(lambda *a: np.concatenate(a), *results)
        # Every row's time step is in the segment, but for those answered
        # without their child (a crash's truncation, the FIRST owed after it).
        batch = self._views.time_steps(0, self.batch_size)
        for start, k, result in zip(self._starts, self._sizes, results):
            if result is not IN_SLOT:
                for array, value in zip(tf.nest.flatten(batch), tf.nest.flatten(result)):
                    array[start:start + k] = value
        for start, k, env in zip(self._starts, self._sizes, self._envs):
            env._record_row(batch, start if k == 1 else slice(start, start + k))   # pylint: disable=protected-access
        return batch

    def close(self) -> None:
        close_subprocess_envs(self._envs)


def _check_envs_per_process(k, num_envs):
    """Raises ValueError (one line) unless `k` is a positive divisor of `num_envs`."""
    if not isinstance(k, int) or k < 1 or num_envs % k:
        raise ValueError(f"envs_per_process must be a positive divisor of the number of "
                         f"environments ({num_envs}), got {k!r}")


def create_subprocess_envs(env_constructors: Sequence[Callable[[], Any]],
                           env_indices: Optional[Sequence[int]] = None,
                           envs_per_process: int = 1,
                           **kwargs) -> List[SubprocessEnv]:
    """Creates SubprocessEnvs for the env constructors, built in parallel:
    one per constructor, or one per `envs_per_process` of them.

    All children are started first (each starts building its envs at once),
    then all are initialised concurrently, so the total time is that of the
    slowest, not the sum. If any fails, all are closed and its error raised.
    With shared memory (the default transport) they share one segment, one
    row per environment in order.

    Args:
      env_constructors: zero-arg picklable callables (see the module docstring).
      env_indices: env_index of each (default: the process-wide counter);
        with `envs_per_process` > 1 a child's environments get its first's
        index and the next ones.
      envs_per_process: environments per child, consecutive constructors
        (a divisor of their number); each SubprocessEnv is then a batch of
        that many.
      **kwargs: passed to SubprocessEnv (step_timeout, max_restarts, ...).
    """
    env_constructors = list(env_constructors)
    if env_indices is None:
        env_indices = [None] * len(env_constructors)
    if len(env_indices) != len(env_constructors):
        raise ValueError("env_indices and env_constructors differ in length")
    k = envs_per_process
    _check_envs_per_process(k, len(env_constructors))
    kwargs = dict(kwargs, start=False)
    if kwargs.get("gin_config") is None:
        kwargs["gin_config"] = protocol.current_gin_config()
    # One shared segment for them all: a batch of them reads and writes
    # every row with one numpy copy per leaf (BatchedSubprocessEnv).
    shared = (SharedSlots(len(env_constructors), "create_subprocess_envs")
              if kwargs.get("transport", "shared_memory") == "shared_memory" else None)
    envs = []
    try:
        for i in range(0, len(env_constructors), k):
            slots = None if shared is None else (shared, i)
            env = SubprocessEnv(env_constructors[i:i + k], env_index=env_indices[i],
                                slots=slots, **kwargs)
            envs.append(env)
            env.start()
        if len(envs) == 1:
            envs[0].initialize()
        elif envs:
            with concurrent.futures.ThreadPoolExecutor(
                    len(envs), thread_name_prefix="SubprocessEnvInit") as pool:
                futures = [pool.submit(env.initialize) for env in envs]
                for future in futures:  # all finish (init_timeout bounds each)
                    future.exception()
            for future in futures:
                if future.exception() is not None:
                    raise future.exception()
    except BaseException:
        close_subprocess_envs(envs)
        raise
    return envs


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
        start_method, transport) and `envs_per_process` (environments per
        child, a divisor of `num_envs`; see SubprocessEnv).
    """
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    # Checked now, not in the driver's env thread (create_subprocess_envs
    # checks them again on each call).
    _check_envs_per_process(kwargs.get("envs_per_process", 1), num_envs)
    protocol.check_transport(kwargs.get("transport", "shared_memory"))
    if "start" in kwargs or "env_index" in kwargs:
        raise TypeError("subprocess_env_constructor sets start and env_index itself")
    cloudpickle.dumps(env_constructor)  # fail now, not in the driver's env thread
    return _SubprocessEnvConstructor(env_constructor, num_envs, first_env_index, kwargs)

