"""ScalarSummaries writes exactly the points it is given, and metric_points
exactly what tf-agents' tf_summaries writes."""

import numpy as np
import tensorflow as tf

from alf_async.driver import metrics as metrics_lib
from alf_async.learning.scalar_summaries import ScalarSummaries, metric_points
from test_metrics import episode_stream, make_traj  # noqa: E402  (tests/ is on sys.path)
from test_trainer import read_scalars  # noqa: E402


def updated_metrics():
    rng = np.random.default_rng(3)
    streams = [episode_stream(rng, 24) for _ in range(3)]
    traj = make_traj(*[np.stack([s[k] for s in streams]) for k in range(3)])
    metrics = [metrics_lib.NumberOfEpisodes(), metrics_lib.EnvironmentSteps(),
               metrics_lib.AverageReturn(), metrics_lib.AverageEpisodeLength()]
    for metric in metrics:
        metric(traj, np.arange(3))
    return metrics, metrics[:2]


def test_metric_points_are_what_tf_agents_tf_summaries_writes(tmp_path):
    metrics, step_metrics = updated_metrics()
    assert int(step_metrics[0].result()) > 0 and float(metrics[2].result()) != 0
    writer = tf.summary.create_file_writer(str(tmp_path / "tf_agents"))
    with writer.as_default():
        for metric in metrics:
            metric.tf_summaries(train_step=tf.constant(7, tf.int64), step_metrics=step_metrics)
    writer.flush()
    ours = ScalarSummaries(tf.summary.create_file_writer(str(tmp_path / "ours")))
    ours.write(metric_points(metrics, step_metrics, 7))
    ours.flush()
    theirs = read_scalars(str(tmp_path / "tf_agents"))
    assert len(theirs) == 4 + 4 * 2 - 2   # no metric against itself
    assert read_scalars(str(tmp_path / "ours")) == theirs
    episodes = int(step_metrics[0].result())
    assert theirs["Metrics_vs_NumberOfEpisodes/AverageReturn"] == [
        (episodes, float(metrics[2].result()))]


def test_scalar_summaries_write_to_their_writer_whatever_the_context(tmp_path):
    summaries = ScalarSummaries(tf.summary.create_file_writer(str(tmp_path / "ours")))
    other = tf.summary.create_file_writer(str(tmp_path / "other"))
    with other.as_default(), tf.summary.record_if(False):
        summaries.write({"a": (1.5, 10), "b": (2, 3)})
        summaries.write({})
        summaries.write({"a": (-4.0, 20)})   # another set of tags
    summaries.flush()
    other.flush()
    assert read_scalars(str(tmp_path / "ours")) == {"a": [(10, 1.5), (20, -4.0)],
                                                     "b": [(3, 2.0)]}
    assert read_scalars(str(tmp_path / "other")) == {}


def test_warm_up_writes_nothing_and_later_writes_are_the_points(tmp_path):
    summaries = ScalarSummaries(tf.summary.create_file_writer(str(tmp_path / "ours")))
    summaries.warm_up()
    summaries.flush()
    assert read_scalars(str(tmp_path / "ours")) == {}
    summaries.write({"a": (0.5, 4)})
    summaries.flush()
    assert read_scalars(str(tmp_path / "ours")) == {"a": [(4, 0.5)]}
