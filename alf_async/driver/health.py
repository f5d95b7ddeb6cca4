"""The driver's health (Perf/, Queues/, Env/) as scalars for summaries."""

import time

import numpy as np

from alf_async.environments.capabilities import restarts_of


class RateInterval(object):
    """The interval a rate is observed over: from the previous call at an
    earlier train step to this one. A call at the same train step as the
    previous one (a run's final write right after an interval's) has no
    interval of its own, and the next interval starts from the previous
    point, so a rate is never taken over an empty interval.

    Threads: one thread calls `since` (the learner's).
    """

    def __init__(self):
        self._last = None

    def since(self, now, train_step, counts):
        """Ends an interval at (`now`, `train_step`) with `counts` (whatever
        the caller takes differences of) and starts the next there, unless
        `train_step` repeats the previous call's.

        Returns:
            (seconds, train steps, the counts at its start) of the interval
                ending here, or None: the first call, a repeated train step,
                or no time passed.
        """
        train_step = int(train_step)
        last = self._last
        if last is None or train_step > last[1]:
            self._last = (now, train_step, counts)
        if last is not None and train_step > last[1] and now > last[0]:
            return now - last[0], train_step - last[1], last[2]
        return None


class DriverHealth(object):
    """The driver's health as scalars to write at a train step: rates over
    the interval since the previous call at an earlier train step (Perf/...,
    `RateInterval`; a call at the same train step has none), queue occupancy
    (Queues/...), environment restarts (Env/..., of `Restartable`
    environments).

    Args:
        driver: the AsyncOffPolicyDriver (its perf stats, queues, environments).
        clock: a zero-arg callable returning seconds.
    """

    def __init__(self, driver, clock=time.monotonic):
        self._driver = driver
        self._clock = clock
        self._interval = RateInterval()

    def scalars(self, train_step):
        """Returns `{tag: value}` at `train_step` (the learner's thread calls it)."""
        stats = self._driver.get_perf_stats()
        interval = self._interval.since(self._clock(), train_step, stats)
        scalars = {}
        if interval is not None:
            dt, train_steps, old = interval
            batches = stats["actor_batches"] - old["actor_batches"]
            scalars["Perf/env_steps_per_sec"] = (stats["env_steps"] - old["env_steps"]) / dt
            scalars["Perf/train_steps_per_sec"] = train_steps / dt
            # Share of the env threads' time spent waiting for an action.
            scalars["Perf/action_wait_fraction"] = (
                stats["action_wait_secs"] - old["action_wait_secs"]) / (dt * self._driver.num_envs)
            if batches > 0:
                scalars["Perf/actor_inference_ms_per_batch"] = 1000.0 * (
                    stats["actor_inference_secs"] - old["actor_inference_secs"]) / batches
                scalars["Perf/actor_batch_size"] = (
                    stats["actor_rows"] - old["actor_rows"]) / batches
        queues = self._driver.queues
        scalars["Queues/learn_queue_occupancy"] = (
            stats["learn_queue_size"] / queues.learn_queue.capacity)
        if queues.actor_queues:   # none where env threads act themselves
            scalars["Queues/actor_queue_occupancy"] = float(np.mean([
                size / q.capacity for size, q in zip(stats["actor_queue_sizes"],
                                                      queues.actor_queues)]))
        scalars["Queues/log_queue_size"] = stats["log_queue_size"]
        restarts = [r for r in map(restarts_of, self._driver.environments) if r is not None]
        if restarts:
            scalars["Env/restarts"] = sum(restarts)
        return scalars

