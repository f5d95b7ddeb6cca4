"""LogThread: drains the log queue into metrics and observers.

Every unroll row an env thread ships is counted here. Each iteration takes
the rows that are waiting (at least one): the metrics get them as numpy
arrays [n, T, ...] with the global env id of each row, the observers as a
batch-major `Trajectory` of tensors [n, T, ...]. A row is one environment's
T consecutive transitions; rows of one environment arrive in order.

The thread does not stop when stop is requested: it stops when the log queue
is closed *and empty*, so after `stop()` every unroll that reached the queue
has been counted (the driver closes the queue on stop; a closed queue still
hands out what it holds).

Threads: `run()` is this thread. Blocks on the log queue (dequeue) and in
the observers; closing the queue wakes the wait.
"""

import threading

import numpy as np
import tensorflow as tf

from alf_async.driver.queues import QUEUE_CLOSED_ERRORS


class LogThread(threading.Thread):
    """Feeds every unroll to `metrics` and `observers`."""

    def __init__(self, name, coord, log_queue, metrics, observers):
        """
        Args:
            name: thread name.
            coord: the driver's `tf.train.Coordinator`.
            log_queue: the `NestFIFOQueue` of (trajectory, env_ids) unrolls.
            metrics: `AsyncStepMetric`s, called as metric(numpy_traj, env_ids).
            observers: callables(Trajectory of tensors [B, T, ...]).
        """
        super().__init__(name=name, daemon=True)
        self._coord = coord
        self._queue = log_queue
        self._metrics = list(metrics)
        self._observers = list(observers)
        self.rows = 0  # unroll rows counted so far

    def run(self):
        with self._coord.stop_on_exception():
            try:
                while True:
                    self._log_one()
            except QUEUE_CLOSED_ERRORS:
                # Closed and drained: the only way out but an error.
                if not self._coord.should_stop():
                    raise

    def _log_one(self):
        # One blocking dequeue, then what is waiting: one eager op per batch of
        # rows rather than per row.
        first = self._queue.dequeue()
        waiting = int(self._queue.size())
        flat = [t.numpy()[None] for t in tf.nest.flatten(first)]
        if waiting:
            rest = tf.nest.flatten(self._queue.dequeue_many(waiting))
            flat = [np.concatenate([f, r.numpy()]) for f, r in zip(flat, rest)]
        numpy_trajectory, env_ids = tf.nest.pack_sequence_as(self._queue.element_spec, flat)
        for rows in _in_order_per_env(env_ids):
            self._count(tf.nest.map_structure(lambda a: a[rows], numpy_trajectory),
                        env_ids[rows])

    def _count(self, numpy_trajectory, env_ids):
        for metric in self._metrics:
            metric(numpy_trajectory, env_ids)
        if self._observers:
            trajectory = tf.nest.map_structure(tf.convert_to_tensor, numpy_trajectory)
            for observer in self._observers:
                observer(trajectory)
        self.rows += len(env_ids)


def _in_order_per_env(env_ids):
    """Splits rows into groups with each env id at most once, keeping each
    env's rows in arrival order (group k holds every env's k-th row), so that
    metrics keeping one accumulator per environment see its rows in turn."""
    if len(np.unique(env_ids)) == len(env_ids):
        return [slice(None)]
    counts = {}
    nth = np.empty(len(env_ids), np.int64)  # how many earlier rows share the row's env id
    for row, env_id in enumerate(env_ids.tolist()):
        nth[row] = counts.get(env_id, 0)
        counts[env_id] = nth[row] + 1
    return [np.flatnonzero(nth == k) for k in range(nth.max() + 1)]
