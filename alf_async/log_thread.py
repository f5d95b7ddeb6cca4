"""LogThread: drains the log queue into metrics and observers.

Every unroll an env thread ships is counted here: the metrics get it as
numpy arrays with the global env id of each row, the observers as a
batch-major `Trajectory` of tensors [B, T, ...].

The thread does not stop when stop is requested: it stops when the log queue
is closed *and empty*, so after `stop()` every unroll that reached the queue
has been counted (the driver closes the queue on stop; a closed queue still
hands out what it holds).

Threads: `run()` is this thread. Blocks on the log queue (dequeue) and in
the observers; closing the queue wakes the wait.
"""

import threading

import tensorflow as tf

from alf_async.env_thread import QUEUE_CLOSED_ERRORS


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
        self.unrolls = 0

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
        trajectory, env_ids = self._queue.dequeue()
        numpy_trajectory = tf.nest.map_structure(lambda t: t.numpy(), trajectory)
        env_ids = env_ids.numpy()
        for metric in self._metrics:
            metric(numpy_trajectory, env_ids)
        for observer in self._observers:
            observer(trajectory)
        self.unrolls += 1
