"""`FeedHealth`: the health scalars of a learner fed by collectors (the
replay table's size and rates, the collectors' restarts and variable age),
which `SummaryHook` writes for a `ReplayFeed`.
"""

import time

import numpy as np

from alf_async.distributed.reverb_replayer import REPLAY_TABLE
from alf_async.driver.health import RateInterval


class FeedHealth(object):
    """`SummaryHook`'s health scalars for a `ReplayFeed`: Replay/size,
    Replay/inserts_per_sec, Replay/samples_per_sec, Replay/samples_per_insert
    (observed over the interval since the previous call at an earlier train
    step, `RateInterval`; a call at the same train step has none),
    Collectors/restarts, and with reports of the variables' train step,
    Collectors/variable_age (their mean over collectors, `variable_ages`)
    and Collectors/variable_age_max. `scalars` runs on the learner's thread
    and blocks for one `server_info` call at most."""

    def __init__(self, client, collectors, variable_ages=dict):
        self._client = client
        self._collectors = collectors
        self._variable_ages = variable_ages
        self._interval = RateInterval()

    def scalars(self, train_step):
        """Returns `{tag: value}` at `train_step`."""
        table = self._client.server_info(timeout=10)[REPLAY_TABLE]
        limiter = table.rate_limiter_info
        counts = (limiter.insert_stats.completed, limiter.sample_stats.completed)
        interval = self._interval.since(time.monotonic(), train_step, counts)
        scalars = {"Replay/size": table.current_size}
        if interval is not None:
            dt, _, old = interval
            inserts, samples = counts[0] - old[0], counts[1] - old[1]
            scalars["Replay/inserts_per_sec"] = inserts / dt
            scalars["Replay/samples_per_sec"] = samples / dt
            if inserts > 0:
                scalars["Replay/samples_per_insert"] = samples / inserts
        scalars["Collectors/restarts"] = self._collectors.restarts
        ages = list(self._variable_ages().values())
        if ages:
            scalars["Collectors/variable_age"] = float(np.mean(ages))
            scalars["Collectors/variable_age_max"] = max(ages)
        return scalars
