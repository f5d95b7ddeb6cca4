"""Scalar summaries written many at a time, in one graph call.

A hook's summaries are a few dozen scalars (the driver's metrics, its
health). Written one `tf.summary.scalar` at a time, each is an eager op run
from Python on the learner's thread, which holds the GIL the env threads
need; `ScalarSummaries.write` writes them all in one call of a function
traced once. Its points are TensorBoard's scalars, as `tf.summary.scalar`
writes them (tests read them back with `tf.compat.v1.train.summary_iterator`).

Threads: a `ScalarSummaries` is used by one thread at a time (the learner's).
"""

import tensorflow as tf
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tf_agents.utils import common


def metric_points(metrics, step_metrics, train_step):
    """The points tf-agents' `TFStepMetric.tf_summaries` writes, as data.

    Not `tf_summaries` itself: it reads `metric.result()` where it is called,
    which inside a traced function would be the value at tracing.

    Args:
        metrics: the TFStepMetrics to write (`driver.get_metrics()`).
        step_metrics: the metrics to plot them against too
            (`driver.get_step_metrics()`).
        train_step: the train step of `<prefix>/<name>`.

    Returns:
        A dict of (value, step) by tag, `<prefix>/<name>` at `train_step`
            and `<prefix>_vs_<step metric>/<name>` at the step metric's value
            (for every step metric but the metric itself).
    """
    steps = {m.name: int(m.result()) for m in step_metrics}
    points = {}
    for metric in metrics:
        value = float(metric.result())
        prefix = metric._prefix   # private in tf-agents; its tf_summaries reads it so
        points[common.join_scope(prefix, metric.name)] = (value, train_step)
        for name, step in steps.items():
            if name != metric.name:
                points[f"{prefix + '_' if prefix else ''}vs_{name}/{metric.name}"] = (value, step)
    return points


class ScalarSummaries(object):
    """Writes scalar summaries to `writer`, whatever the default writer and
    `tf.summary.record_if` around the call.

    Args:
        writer: a `tf.summary.SummaryWriter`.
    """

    def __init__(self, writer):
        self._writer = writer
        self._metadata = scalar_metadata.create_summary_metadata(
            display_name=None, description=None).SerializeToString()
        # One trace for every set of tags: tags, values and steps are inputs.
        self._write = tf.function(self._write_graph, autograph=False, input_signature=[
            tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.float32),
            tf.TensorSpec([None], tf.int64)])

    def write(self, points):
        """Writes `points`, a dict of (value, step) by tag, in one graph call
        (none if empty)."""
        if not points:
            return
        tags = list(points)
        self._write(tf.constant(tags, tf.string),
                    tf.constant([float(points[t][0]) for t in tags], tf.float32),
                    tf.constant([int(points[t][1]) for t in tags], tf.int64))

    def warm_up(self):
        """Traces and instantiates the write function by a call with no
        points (it writes nothing): the first `write` then costs what any does."""
        self._write(tf.constant([], tf.string), tf.constant([], tf.float32),
                    tf.constant([], tf.int64))

    def flush(self):
        self._writer.flush()

    def _write_graph(self, tags, values, steps):
        with self._writer.as_default(), tf.summary.record_if(True):

            def body(i):
                written = tf.summary.write(tags[i], values[i], step=steps[i],
                                           metadata=self._metadata)
                with tf.control_dependencies([written]):
                    return [i + 1]

            tf.while_loop(lambda i: i < tf.size(tags), body, [tf.constant(0)])
