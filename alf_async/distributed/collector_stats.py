"""What a collector reports to the learner: its episode metrics and the
train step of the variables it acts with, one item in the server's
`collector_stats` queue table (`stats_table`) per report, which the
learner's replay feed drains into its own NumberOfEpisodes /
EnvironmentSteps / AverageReturn / AverageEpisodeLength.
"""

import numpy as np
import reverb
import tensorflow as tf

from alf_async.distributed.server_link import CONNECTION_ERRORS


STATS_TABLE = "collector_stats"
STATS_QUEUE_SIZE = 10000


STATS_SIGNATURE = {
    "collector": tf.TensorSpec([], tf.int64),        # collect.collector_id
    "episodes": tf.TensorSpec([], tf.int64),         # finished since the last report
    "env_steps": tf.TensorSpec([], tf.int64),        # since the last report
    "average_return": tf.TensorSpec([], tf.float32),  # of the collector's last 10 episodes
    "average_length": tf.TensorSpec([], tf.float32),
    "policy_step": tf.TensorSpec([], tf.int64),      # train step of the variables it acts with
}


def stats_table(max_size=STATS_QUEUE_SIZE):
    """The queue of collectors' metric reports (`StatsReporter`), drained by the learner."""
    return reverb.Table.queue(STATS_TABLE, max_size, signature=STATS_SIGNATURE)


class StatsReporter(object):
    """Sends the collector's metrics to the learner's `collector_stats` table:
    episodes and env steps since the last report, the current averages, and
    the train step of the variables the collector acts with (`train_step`,
    which its pulls assign; the learner reports the variable age from it).
    `report` runs on the pull's helper thread and does not block: a full
    queue drops the report, as the learner only reads the latest values
    anyway."""

    def __init__(self, client, collector_id, driver_metrics, train_step):
        self._client = client
        self._id = int(collector_id)
        self._metrics = {m.name: m for m in driver_metrics}
        self._train_step = train_step
        self._sent = {"NumberOfEpisodes": 0, "EnvironmentSteps": 0}

    def report(self):
        totals = {name: int(self._metrics[name].result()) for name in self._sent}
        if totals["NumberOfEpisodes"] == self._sent["NumberOfEpisodes"] and \
                totals["EnvironmentSteps"] == self._sent["EnvironmentSteps"]:
            return
        item = {
            "collector": np.int64(self._id),
            "episodes": np.int64(totals["NumberOfEpisodes"] - self._sent["NumberOfEpisodes"]),
            "env_steps": np.int64(totals["EnvironmentSteps"] - self._sent["EnvironmentSteps"]),
            "average_return": np.float32(self._metrics["AverageReturn"].result()),
            "average_length": np.float32(self._metrics["AverageEpisodeLength"].result()),
            "policy_step": np.int64(self._train_step.numpy()),
        }
        try:
            table = self._client.server_info(timeout=5)[STATS_TABLE]
            if table.current_size >= STATS_QUEUE_SIZE - 1:
                return  # nobody drains it (a learner that stopped): drop, never block
            # A learner resumed from a replay checkpoint keeps the stats
            # table's signature from that checkpoint, which may predate a field.
            self._client.insert({k: v for k, v in item.items() if k in table.signature},
                                {STATS_TABLE: 1.0})
        except CONNECTION_ERRORS:
            return  # the server is gone: ServerWatch says when to give up
        self._sent = totals
