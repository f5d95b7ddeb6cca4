"""Driver lifecycle and fault trials: tests/stress/test_driver_stress.py runs
them in reduced counts, reliability.py at full counts.

Each trial builds a driver on CountingEnvs, drives it into one state, stops
it, and reports what a user would check: how long stop() took, which driver
threads are still alive, which TF queues are still open, and for fault
trials whether the injected error reached the learner with its type and a
new driver works afterwards.
"""

import threading
import time

import numpy as np
import tensorflow as tf

from alf_async import AsyncOffPolicyDriver, DriverStoppedError
from alf_async.testing.envs import CountingEnvConstructor
from alf_async.testing.policies import CountingPolicy, FailingPolicy

DRIVER_THREAD_PREFIXES = ("env", "actor", "log", "queue_closer")
LIFECYCLE_STATES = ("never_started", "warm_up", "running", "learner_blocked",
                    "after_env_error", "actor_queues_full")
FAULT_SITES = ("env_step", "env_reset", "policy", "observer")


class InjectedFault(Exception):
    """Raised by fault trials' observers (a type the driver does not know)."""


def live_driver_threads(driver):
    return [t.name for t in driver.threads if t.is_alive()]


def open_queues(driver):
    return [q.name for q in driver.queues.all_queues() if not q.is_closed()]


def _specs():
    env = CountingEnvConstructor()()
    return env.time_step_spec(), env.action_spec()


class _SlowPolicy(CountingPolicy):
    """Sleeps in every forward pass, so requests pile up in the actor queues."""

    def _action(self, time_step, policy_state, seed):
        slept = tf.numpy_function(lambda: time.sleep(0.05) or np.int32(0), [], tf.int32,
                                  stateful=True)
        with tf.control_dependencies([slept]):
            return super()._action(time_step, policy_state, seed)


def lifecycle_trial(rng):
    """One driver life stopped in a random state; returns a result dict."""
    state = LIFECYCLE_STATES[rng.integers(len(LIFECYCLE_STATES))]
    kwargs = dict(num_envs=int(rng.integers(1, 5)), unroll_length=int(rng.integers(1, 5)))
    env_kwargs = {}
    policy_cls = CountingPolicy
    if state == "learner_blocked":
        kwargs["learn_queue_cap"] = 10_000
    if state == "after_env_error":
        env_kwargs = dict(raise_on_step=int(rng.integers(1, 20)))
    if state == "actor_queues_full":
        policy_cls = _SlowPolicy
        kwargs["num_envs"] = 4
    driver = AsyncOffPolicyDriver(CountingEnvConstructor(batch_size=int(rng.integers(1, 3)),
                                                     **env_kwargs),
                                  policy_cls(*_specs()), **kwargs)
    learner = None
    error = None
    if state != "never_started":
        driver.start()
    if state == "running":
        for _ in range(int(rng.integers(1, 6))):
            driver.run_async()
    elif state == "learner_blocked":
        learner = threading.Thread(target=_run_until_stopped, args=(driver,), daemon=True)
        learner.start()
        time.sleep(rng.uniform(0.0, 0.3))
    elif state == "after_env_error":
        try:
            for _ in range(1000):
                driver.run_async()
        except ValueError as e:
            error = e
    elif state in ("warm_up", "actor_queues_full"):
        time.sleep(rng.uniform(0.0, 0.3))
    start = time.perf_counter()
    try:
        driver.stop()
    except ValueError as e:  # an env error the learner had not seen yet
        error = error or e
    stop_secs = time.perf_counter() - start
    if learner is not None:
        learner.join(5)
    return dict(state=state, stop_secs=stop_secs, threads_left=live_driver_threads(driver),
                queues_open=open_queues(driver),
                learner_left=bool(learner is not None and learner.is_alive()),
                error_seen=(state != "after_env_error") or isinstance(error, ValueError))


def _run_until_stopped(driver):
    try:
        while True:
            driver.run_async()
    except DriverStoppedError:
        pass


def fault_trial(rng):
    """Injects one fault at a random site and moment; returns a result dict."""
    site = FAULT_SITES[rng.integers(len(FAULT_SITES))]
    at = int(rng.integers(1, 30))
    env_kwargs, observers = {}, []
    policy = CountingPolicy(*_specs())
    expected = ValueError
    if site == "env_step":
        env_kwargs = dict(raise_on_step=at, error=ValueError(f"env step {at}"))
    elif site == "env_reset":
        # reset 1 is the env thread's first; later ones are auto-resets.
        env_kwargs = dict(raise_on_reset=1 + at % 3, error=ValueError(f"env reset {at}"),
                          episode_length=2)
    elif site == "policy":
        policy = FailingPolicy(*_specs(), fail_at=at)
        expected = tf.errors.InvalidArgumentError
    else:
        calls = []

        def observer(traj):
            calls.append(1)
            if len(calls) >= at:
                raise InjectedFault(f"observer call {at}")

        observers = [observer]
        expected = InjectedFault
    driver = AsyncOffPolicyDriver(CountingEnvConstructor(**env_kwargs), policy,
                                  num_envs=int(rng.integers(1, 4)), unroll_length=2,
                                  observers=observers)
    driver.start()
    raised, start = None, time.perf_counter()
    try:
        for _ in range(10_000):
            driver.run_async()
    except Exception as e:  # pylint: disable=broad-except
        raised = e
    surfaced_secs = time.perf_counter() - start
    stop_start = time.perf_counter()
    driver.stop()
    stop_secs = time.perf_counter() - stop_start
    fresh = AsyncOffPolicyDriver(CountingEnvConstructor(), CountingPolicy(*_specs()), num_envs=1,
                                 unroll_length=2)
    fresh.start()
    try:
        fresh_steps = fresh.run_async()
    finally:
        fresh.stop()
    return dict(site=site, expected=expected.__name__,
                raised=type(raised).__name__ if raised else None,
                type_ok=isinstance(raised, expected), surfaced_secs=surfaced_secs,
                stop_secs=stop_secs, threads_left=live_driver_threads(driver),
                queues_open=open_queues(driver), fresh_driver_ok=fresh_steps == 2)
