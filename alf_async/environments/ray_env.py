"""Environments in Ray actors, seen by the driver as TFEnvironments.

`ray_env_f(env_fn, envs_per_actor, actors_per_env, address)` is an `env_f`
for `AsyncOffPolicyDriver`: each call returns a `TFPyEnvironment` over a
`RayBatchedEnv`, whose sub-environments live inside `actors_per_env` Ray
actors of `envs_per_actor` environments each. One step is one remote call
per actor for its whole batch (a remote call costs ~1 ms, so one per
environment step would be the bottleneck); the actors of one env are called
all at once and awaited together.

- `address=None` starts a local Ray (`ray.init(num_cpus=..., include_dashboard=
  False)`) when `ray_env_f` is called; with an address ("auto", "head:6379",
  "ray://head:10001") it joins that cluster. Closing an environment kills its
  actors; Ray itself runs until `shutdown()` or the end of the process.
- An actor that dies (its node lost, `ray.kill`, the process crashed) or does
  not answer within `step_timeout` is replaced, like a SubprocessEnv crash:
  its environments' episodes in flight end as truncations (LAST, discount 1,
  reward 0, the last observation), the next step returns the new actor's
  FIRST, and the restart is counted (`restarts`). More than `max_restarts`
  within `restart_window_secs` raises `RayEnvCrashError`.
- An exception raised by the environment's own code is not a crash: it is
  raised in the caller with its own type (Ray's `as_instanceof_cause()`),
  not retried.

Threads: a `RayBatchedEnv` is stepped by one thread (its env thread);
`close()` may be called from any thread and makes a blocked step fail fast.
`ray_env_f`'s callable may be called from several threads at once.

Install with `pip install -e '.[ray]'` (Ray core: `ray[default]`'s dashboard
needs typing-extensions >= 4.14, which tf-agents 0.19's pin forbids).
"""

import collections
import itertools
import logging
import threading
import time

import numpy as np
import ray
from ray import exceptions as ray_exceptions
from tf_agents.environments import batched_py_environment, py_environment, tf_py_environment
from tf_agents.trajectories import time_step as ts

logger = logging.getLogger(__name__)

_ACTOR_LOST = (ray_exceptions.RayActorError, ray_exceptions.GetTimeoutError)


class RayEnvCrashError(RuntimeError):
    """Ray actors died more often than `max_restarts` within the window."""


_RAY_LOCK = threading.Lock()


def ensure_ray(address=None, num_cpus=None):
    """Starts a local Ray (address None) or joins a cluster, once per process.

    Call it from the main thread (`ray_env_f` does): Ray installs signal
    handlers when it starts. The Ray started here runs until `shutdown()` or
    the end of the process (Ray stops it at exit).
    """
    with _RAY_LOCK:
        if ray.is_initialized():
            return
        if address is None:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        else:
            ray.init(address=address, log_to_driver=False, configure_logging=False)


def shutdown():
    """Stops (or disconnects from) Ray; its environments must be closed first."""
    with _RAY_LOCK:
        if ray.is_initialized():
            ray.shutdown()


class _EnvActor(object):
    """Runs inside a Ray actor: `n` environments built by `env_fn`, stepped as a batch."""

    def __init__(self, env_fn, n, first_index=0):
        from alf_async.environments import subprocess_env
        from alf_async.environments.gym_batch import BatchedGymEnv
        envs = []
        for i in range(n):
            # env_fn may read its index with current_env_index(), as in a
            # SubprocessEnv child (e.g. for its own seed).
            subprocess_env._CURRENT_ENV_INDEX = first_index + i
            envs.append(env_fn())
        if all(isinstance(e, py_environment.PyEnvironment) for e in envs):
            self._env = batched_py_environment.BatchedPyEnvironment(envs, multithreading=False)
        else:  # gym / gymnasium environments: the cheap batched loop
            self._env = BatchedGymEnv(envs)

    def specs(self):
        return self._env.time_step_spec(), self._env.action_spec()

    def reset(self):
        return self._env.reset()

    def step(self, action):
        return self._env.step(action)

    def close(self):
        self._env.close()


_RemoteEnvActor = ray.remote(_EnvActor)


class RayBatchedEnv(py_environment.PyEnvironment):
    """A batched PyEnvironment over environments living in Ray actors.

    Args:
        env_fn: zero-arg picklable callable returning a gym/gymnasium env or an
            unbatched tf-agents PyEnvironment; called inside the actors.
        envs_per_actor: environments per actor (stepped serially there).
        actors_per_env: actors behind this environment (stepped concurrently).
        address: a Ray cluster address, or None for a local Ray.
        num_cpus: CPUs of a local Ray (None: Ray's default).
        step_timeout: seconds an actor may take for one step before it is
            treated as lost and replaced.
        max_restarts, restart_window_secs: more than `max_restarts` actor
            restarts within `restart_window_secs` raise RayEnvCrashError.
        first_env_index: environment i of actor k gets the index
            first_env_index + k * envs_per_actor + i (`current_env_index()`).
        actor_options: Ray actor options (default {"num_cpus": 0}: env actors
            are scheduled whatever the CPU count; on a cluster, ask for CPUs
            to spread them over nodes, e.g. {"num_cpus": 1}).
    """

    # Steps wait on remote actors: the driver steps it off TF's inter-op pool
    # and closes it at once on stop (close() is safe from any thread).
    blocking_step = True

    def __init__(self, env_fn, envs_per_actor=1, actors_per_env=1, address=None,
                 num_cpus=None, step_timeout=60.0, max_restarts=10,
                 restart_window_secs=600.0, actor_options=None, first_env_index=0):
        super().__init__(handle_auto_reset=False)
        ensure_ray(address, num_cpus)
        self._closed = False
        self._env_fn = env_fn
        self._actor_options = dict(actor_options or {"num_cpus": 0})
        self._n = envs_per_actor
        self._first_index = first_env_index
        self._step_timeout = step_timeout
        self._max_restarts = max_restarts
        self._window = restart_window_secs
        self._restart_times = collections.deque()
        self.restarts = 0
        try:
            self._actors = [self._new_actor(k) for k in range(actors_per_env)]
            self._time_step_spec, self._action_spec = ray.get(
                self._actors[0].specs.remote(), timeout=step_timeout)
        except BaseException:
            self.close()
            raise
        self._last = None            # the last TimeStep returned, for truncations
        self._pending_first = {}     # actor index -> FIRST TimeStep of its replacement

    def _new_actor(self, k):
        return _RemoteEnvActor.options(**self._actor_options).remote(
            self._env_fn, self._n, self._first_index + k * self._n)

    @property
    def batched(self):
        return True

    @property
    def batch_size(self):
        return self._n * len(self._actors)

    def observation_spec(self):
        return self._time_step_spec.observation

    def action_spec(self):
        return self._action_spec

    def time_step_spec(self):
        return self._time_step_spec

    def _reset(self):
        self._pending_first = {}
        return self._gather([a.reset.remote() for a in self._actors], action=None)

    def _step(self, action):
        refs = []
        for k, actor in enumerate(self._actors):
            if k in self._pending_first:
                refs.append(None)
            else:
                refs.append(actor.step.remote(_rows(action, k * self._n, (k + 1) * self._n)))
        return self._gather(refs, action)

    def _gather(self, refs, action):
        parts = []
        for k, ref in enumerate(refs):
            if ref is None:
                parts.append(self._pending_first.pop(k))
                continue
            try:
                parts.append(ray.get(ref, timeout=self._step_timeout))
            except ray_exceptions.RayTaskError as e:
                raise e.as_instanceof_cause() from None
            except _ACTOR_LOST as e:
                if self._closed:
                    raise RuntimeError("RayBatchedEnv was closed during a step") from e
                parts.append(self._replace_actor(k, e))
        time_step = _concat(parts)
        self._last = time_step
        return time_step

    def _replace_actor(self, k, error):
        """Replaces actor k; returns the truncation of its rows' episodes."""
        now = time.monotonic()
        self._restart_times.append(now)
        while self._restart_times and self._restart_times[0] < now - self._window:
            self._restart_times.popleft()
        if len(self._restart_times) > self._max_restarts:
            raise RayEnvCrashError(
                f"Ray env actors were lost {len(self._restart_times)} times within "
                f"{self._window:.0f} s (max_restarts={self._max_restarts}); last error: "
                f"{error!r}") from error
        self.restarts += 1
        logger.warning("Ray env actor %d lost (%r); replacing it (restart %d)", k, error,
                       self.restarts)
        try:
            ray.kill(self._actors[k])
        except Exception:  # already gone
            pass
        self._actors[k] = self._new_actor(k)
        self._pending_first[k] = ray.get(self._actors[k].reset.remote(),
                                         timeout=self._step_timeout)
        rows = slice(k * self._n, (k + 1) * self._n)
        if self._last is None:  # lost during the first reset: nothing to truncate
            return self._pending_first.pop(k)
        last = self._last
        return ts.TimeStep(
            step_type=np.full(self._n, ts.StepType.LAST, np.int32),
            reward=np.zeros_like(last.reward[rows]),
            discount=np.ones_like(last.discount[rows]),
            observation=_rows(last.observation, rows.start, rows.stop))

    def actor_handles(self):
        """The Ray actor handles (e.g. to kill one in a test)."""
        return list(self._actors)

    def close(self):
        if self._closed:
            return
        self._closed = True
        for actor in getattr(self, "_actors", []):
            try:
                ray.kill(actor)
            except Exception:  # pylint: disable=broad-except
                pass


def _rows(nest, start, stop):
    import tensorflow as tf
    return tf.nest.map_structure(lambda x: x[start:stop], nest)


def _concat(time_steps):
    import tensorflow as tf
    if len(time_steps) == 1:
        return time_steps[0]
    return tf.nest.map_structure(lambda *xs: np.concatenate(xs), *time_steps)


def ray_env_f(env_fn, envs_per_actor=1, actors_per_env=1, address=None, num_cpus=None,
              **kwargs):
    """The driver's env_f for environments in Ray actors.

    Starts or joins Ray now, in the calling thread (see `ensure_ray`). The
    environments get indices 0, 1, 2, ... in call order (`current_env_index()`
    inside env_fn). Each call of the returned env_f gives a `TFPyEnvironment` over a
    `RayBatchedEnv` (batch size `envs_per_actor * actors_per_env`);
    `tf_env.restarts` counts its actor restarts. See `RayBatchedEnv` for the
    other arguments.
    """
    ensure_ray(address, num_cpus)
    indices = itertools.count(0, envs_per_actor * actors_per_env)
    lock = threading.Lock()

    def env_f():
        with lock:
            first = next(indices)
        env = RayBatchedEnv(env_fn, envs_per_actor=envs_per_actor,
                            actors_per_env=actors_per_env, address=address,
                            num_cpus=num_cpus, first_env_index=first, **kwargs)
        tf_env = tf_py_environment.TFPyEnvironment(env)
        return tf_env

    return env_f
