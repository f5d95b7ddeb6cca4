"""Summaries of the driver's health (Perf/, Queues/, Env/)."""

import time

import numpy as np
import tensorflow as tf

from alf_async.environments.capabilities import restarts_of


class DriverHealth(object):
    """Writes the driver's health as summaries: rates over the interval since
    the previous write at an earlier train step (Perf/...; a write at the same
    train step writes none), queue occupancy (Queues/...), environment
    restarts (Env/..., of `Restartable` environments).

    Args:
        driver: the AsyncOffPolicyDriver (its perf stats, queues, environments).
        clock: a zero-arg callable returning seconds.
    """

    def __init__(self, driver, clock=time.monotonic):
        self._driver = driver
        self._clock = clock
        self._last = None

    def write(self, train_step):
        """Writes the summaries at `train_step` (call under a default writer)."""
        stats = self._driver.get_perf_stats()
        now = self._clock()
        last = self._last
        step = tf.constant(train_step, tf.int64)
        # Rates are points against the train step: a write at the step of the
        # previous one (the run's final write right after an interval's) has no
        # interval of its own, so it writes no rates and the next interval
        # starts from the previous point.
        if last is None or int(train_step) > last[1]:
            self._last = (now, int(train_step), stats)
        if last is not None and int(train_step) > last[1] and now > last[0]:
            dt = now - last[0]
            old = last[2]
            batches = stats["actor_batches"] - old["actor_batches"]
            scalars = {
                "Perf/env_steps_per_sec": (stats["env_steps"] - old["env_steps"]) / dt,
                "Perf/train_steps_per_sec": (int(train_step) - last[1]) / dt,
                # Share of the env threads' time spent waiting for an action.
                "Perf/action_wait_fraction":
                    (stats["action_wait_secs"] - old["action_wait_secs"]) /
                    (dt * self._driver.num_envs),
            }
            if batches > 0:
                scalars["Perf/actor_inference_ms_per_batch"] = 1000.0 * (
                    stats["actor_inference_secs"] - old["actor_inference_secs"]) / batches
                scalars["Perf/actor_batch_size"] = (
                    stats["actor_rows"] - old["actor_rows"]) / batches
            for tag, value in scalars.items():
                tf.summary.scalar(tag, value, step=step)
        queues = self._driver.queues
        tf.summary.scalar("Queues/learn_queue_occupancy",
                          stats["learn_queue_size"] / queues.learn_queue.capacity, step=step)
        tf.summary.scalar("Queues/actor_queue_occupancy", float(np.mean([
            size / q.capacity for size, q in zip(stats["actor_queue_sizes"],
                                                  queues.actor_queues)])), step=step)
        tf.summary.scalar("Queues/log_queue_size", stats["log_queue_size"], step=step)
        restarts = [r for r in map(restarts_of, self._driver.environments) if r is not None]
        if restarts:
            tf.summary.scalar("Env/restarts", sum(restarts), step=step)

