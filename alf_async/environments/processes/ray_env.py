"""Environments in Ray actors, seen by the driver as TFEnvironments.

`ray_env_constructor(env_constructor, envs_per_actor, actors_per_env,
address)` is an env constructor for `AsyncOffPolicyDriver`: each call
returns a `TFPyEnvironment` over a `RayBatchedEnv`, whose sub-environments live inside `actors_per_env` Ray
actors of `envs_per_actor` environments each. One step is one remote call
per actor for its whole batch (a remote call costs far more than a cheap
environment step, so one per environment step would be the bottleneck;
docs/guides/environments.md, "Ray"); the actors of one env are called
all at once and awaited together.

- `address=None` starts a local Ray (`ray.init(num_cpus=..., include_dashboard=
  False)`) when `ray_env_constructor` is called; with an address ("auto", "head:6379",
  "ray://head:10001") it joins that cluster. Closing an environment kills its
  actors; Ray itself runs until `shutdown()` or the end of the process.
- An actor that dies (its node lost, `ray.kill`, the process crashed) or does
  not answer within `step_timeout` (`init_timeout` for a new actor's first
  call, which includes starting its worker process) is replaced, like a
  SubprocessEnv crash
  (recovery.py): its environments' episodes in flight end as truncations
  (LAST, discount 1, reward 0, the last observation), the next step returns
  the new actor's FIRST, and the restart is counted (`restarts`). A restart
  that would make more than `max_restarts` within `restart_window_secs`
  raises `RayEnvCrashError`, as does every later step.
- An exception raised by the environment's own code is not a crash: it is
  raised in the caller with its own type (Ray's `as_instanceof_cause()`),
  not retried.

Threads: a `RayBatchedEnv` is stepped by one thread (its env thread);
`close()` may be called from any thread and makes a blocked step fail fast.
`ray_env_constructor`'s callable may be called from several threads at once.

Install with `pip install -e '.[ray]'` (Ray core: `ray[default]`'s dashboard
needs typing-extensions >= 4.14, which tf-agents 0.19's pin forbids).
"""

import itertools
import logging
import threading

import numpy as np
import ray
import tensorflow as tf
from ray import exceptions as ray_exceptions
from tf_agents.environments import py_environment, tf_py_environment

from alf_async.environments.capabilities import BlockingStep, Restartable
from alf_async.environments.processes.recovery import CrashRecovery

_ACTOR_LOST = (ray_exceptions.RayActorError, ray_exceptions.GetTimeoutError)


class RayEnvCrashError(RuntimeError):
    """Ray actors died more often than `max_restarts` within the window."""


_RAY_LOCK = threading.Lock()


def ensure_ray(address=None, num_cpus=None):
    """Starts a local Ray (address None) or joins a cluster, once per process.

    Two notices of `ray.init` are silenced (`_RAY_NOTICES`), both harmless
    here: Ray installs a SIGTERM handler (exit at once) when it starts on
    the main thread and says so when it does not; alf-async-train starts Ray
    on its trainer thread, and its own SIGTERM handler (stop, then
    checkpoint) is the one to keep. And a new local Ray announces that it
    uses token authentication, its default, when `RAY_AUTH_MODE` is unset
    (set it to choose; Ray reads it at import). The Ray started here runs
    until `shutdown()` or the end of the process (Ray stops it at exit).
    """
    with _RAY_LOCK:
        if ray.is_initialized():
            return
        loggers = [logging.getLogger(name) for name in _RAY_NOTICES]
        for logger in loggers:
            logger.addFilter(_not_a_ray_notice)
        try:
            if address is None:
                ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                         configure_logging=False)
            else:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
        finally:
            for logger in loggers:
                logger.removeFilter(_not_a_ray_notice)


# {Ray's logger: the start of the notice `ensure_ray` silences on it}.
_RAY_NOTICES = {
    "ray._private.worker": "SIGTERM handler is not set because current thread is not the main",
    "ray._private.authentication.authentication_token_setup":
        "Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled",
}


def _not_a_ray_notice(record):
    """A logging filter: False for the notices of `_RAY_NOTICES`."""
    return not record.getMessage().startswith(_RAY_NOTICES.get(record.name, "\0"))


def shutdown():
    """Stops (or disconnects from) Ray; its environments must be closed first."""
    with _RAY_LOCK:
        if ray.is_initialized():
            ray.shutdown()


class _EnvActor(object):
    """Runs inside a Ray actor: `n` environments built by `env_constructor`,
    stepped as a batch."""

    def __init__(self, env_constructor, n, first_index=0):
        from alf_async.environments.suites.adapters import as_batched_py_environment
        from alf_async.environments.processes.env_index import building_env
        envs = []
        for i in range(n):
            # The constructor may read its index with current_env_index(), as
            # in a SubprocessEnv child (e.g. for its own seed).
            with building_env(first_index + i):
                envs.append(env_constructor())
        self._env = as_batched_py_environment(envs)

    def specs(self):
        return self._env.time_step_spec(), self._env.action_spec()

    def reset(self):
        return self._env.reset()

    def step(self, action):
        return self._env.step(action)

    def close(self):
        self._env.close()


_RemoteEnvActor = ray.remote(_EnvActor)


class RayBatchedEnv(py_environment.PyEnvironment, Restartable, BlockingStep):
    """A batched PyEnvironment over environments living in Ray actors.

    Args:
        env_constructor: zero-arg picklable callable returning a gym /
            gymnasium env or an unbatched tf-agents PyEnvironment; called
            inside the actors.
        envs_per_actor: environments per actor (stepped serially there).
        actors_per_env: actors behind this environment (stepped concurrently).
        address: a Ray cluster address, or None for a local Ray.
        num_cpus: CPUs of a local Ray (None: Ray's default).
        step_timeout: seconds an actor may take for one step before it is
            treated as lost and replaced.
        init_timeout: seconds a new actor may take to answer its first call
            (Ray starts a worker process, which imports the environment's
            modules: tens of seconds on a loaded machine), as
            SubprocessEnv's `init_timeout`.
        max_restarts: more than `max_restarts` actor restarts within
            `restart_window_secs` raise RayEnvCrashError.
        restart_window_secs: see `max_restarts`.
        first_env_index: environment i of actor k gets the index
            first_env_index + k * envs_per_actor + i (`current_env_index()`).
        actor_options: Ray actor options (default {"num_cpus": 0}: env actors
            are scheduled whatever the CPU count; on a cluster, ask for CPUs
            to spread them over nodes, e.g. {"num_cpus": 1}).
    """


    def __init__(self, env_constructor, envs_per_actor=1, actors_per_env=1, address=None,
                 num_cpus=None, step_timeout=60.0, init_timeout=120.0, max_restarts=10,
                 restart_window_secs=600.0, actor_options=None, first_env_index=0):
        super().__init__(handle_auto_reset=False)
        self._closed = False
        self._recovery = CrashRecovery(
            f"RayBatchedEnv(first_env_index={first_env_index})", "a Ray env actor",
            max_restarts, restart_window_secs, RayEnvCrashError)
        ensure_ray(address, num_cpus)
        self._env_constructor = env_constructor
        self._actor_options = dict(actor_options or {"num_cpus": 0})
        self._n = envs_per_actor
        self._first_index = first_env_index
        self._step_timeout = step_timeout
        self._init_timeout = init_timeout
        self._last = None  # the last TimeStep returned, for truncations
        try:
            self._actors = [self._new_actor(k) for k in range(actors_per_env)]
            self._time_step_spec, self._action_spec = ray.get(
                self._actors[0].specs.remote(), timeout=init_timeout)
        except BaseException:
            self.close()
            raise

    def _new_actor(self, k):
        return _RemoteEnvActor.options(**self._actor_options).remote(
            self._env_constructor, self._n, self._first_index + k * self._n)

    @property
    def restarts(self):
        """Actors replaced so far."""
        return self._recovery.restarts

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
        self._recovery.forget()
        return self._gather([a.reset.remote() for a in self._actors], reset=True)

    def _step(self, action):
        refs = []
        for k, actor in enumerate(self._actors):
            if self._recovery.owes(k):  # its replacement's FIRST is owed
                refs.append(None)
            else:
                refs.append(actor.step.remote(_rows(action, k * self._n, (k + 1) * self._n)))
        return self._gather(refs)

    def _gather(self, refs, reset=False):
        self._recovery.check()
        parts = []
        for k, ref in enumerate(refs):
            if ref is None:
                parts.append(self._recovery.take(k))
                continue
            try:
                parts.append(ray.get(ref, timeout=self._step_timeout))
            except ray_exceptions.RayTaskError as e:
                raise e.as_instanceof_cause() from None
            except _ACTOR_LOST as e:
                if self._closed:
                    raise RuntimeError("RayBatchedEnv was closed during a step") from e
                parts.append(self._replace_actor(k, e, reset))
        time_step = _concat(parts)
        self._last = time_step
        return time_step

    def _replace_actor(self, k, error, reset):
        """Replaces actor k; returns what its rows answer the interrupted call with."""
        try:
            self._recovery.charge(repr(error))
        except RayEnvCrashError as crash:
            raise crash from error
        try:
            ray.kill(self._actors[k])
        except Exception:  # already gone
            pass
        self._actors[k] = self._new_actor(k)
        first = ray.get(self._actors[k].reset.remote(), timeout=self._init_timeout)
        last = None if self._last is None else _rows(self._last, k * self._n, (k + 1) * self._n)
        return self._recovery.recover(first, last, reset=reset, key=k)

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
    return tf.nest.map_structure(lambda x: x[start:stop], nest)


def _concat(time_steps):
    if len(time_steps) == 1:
        return time_steps[0]
    return tf.nest.map_structure(lambda *xs: np.concatenate(xs), *time_steps)


def ray_env_constructor(env_constructor, envs_per_actor=1, actors_per_env=1, address=None,
                        num_cpus=None, **kwargs):
    """The driver's env constructor for environments in Ray actors.

    Starts or joins Ray now, in the calling thread (see `ensure_ray`). The
    environments get indices 0, 1, 2, ... in call order (`current_env_index()`
    inside `env_constructor`). Each call of the returned constructor gives a
    `TFPyEnvironment` over a `RayBatchedEnv` (batch size
    `envs_per_actor * actors_per_env`); its `pyenv.restarts` counts actor
    restarts. See `RayBatchedEnv` for the other arguments.
    """
    ensure_ray(address, num_cpus)
    indices = itertools.count(0, envs_per_actor * actors_per_env)
    lock = threading.Lock()

    def constructor():
        with lock:
            first = next(indices)
        env = RayBatchedEnv(env_constructor, envs_per_actor=envs_per_actor,
                            actors_per_env=actors_per_env, address=address,
                            num_cpus=num_cpus, first_env_index=first, **kwargs)
        return tf_py_environment.TFPyEnvironment(env)

    return constructor
