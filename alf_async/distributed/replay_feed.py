"""`ReplayFeed`: the `roles.BatchSource` of a learner fed by collectors.

It takes the driver's place in the `Learner`: it starts and stops the
collectors, and its `run_async()` waits (polling the server,
interruptible by `stop()`) until the rate limiter will let one
iteration's samples through, so that the train step never blocks inside
TensorFlow. It returns the env steps the collectors reported meanwhile and
keeps the learner's NumberOfEpisodes / EnvironmentSteps / AverageReturn /
AverageEpisodeLength from their reports (`ReportedCount`,
`ReportedAverage`).
"""

import threading
import types

import numpy as np

from alf_async import roles
from alf_async.distributed.collector_stats import STATS_TABLE
from alf_async.distributed.feed_health import FeedHealth
from alf_async.distributed.reverb_replayer import REPLAY_TABLE, is_unroll_queue
from alf_async.driver import DriverStoppedError
from alf_async.driver import metrics as metrics_lib
from alf_async import quiet


class ReportedCount(metrics_lib.CounterMetric):
    """A count summed from the collectors' reports (checkpointed like the driver's)."""

    def add(self, n):
        with self._lock:
            self._count += int(n)


class ReportedAverage(metrics_lib.AsyncStepMetric):
    """The mean of each collector's latest reported average (over its last
    10 episodes); collectors that never finished an episode are left out."""

    def __init__(self, name):
        super().__init__(name)
        # In a namespace: a dict attribute of a tf.Module would be wrapped for tracking.
        self._state = types.SimpleNamespace(latest={})

    def set(self, collector_id, value):
        with self._lock:
            self._state.latest[str(int(collector_id))] = float(value)

    def _result(self):
        values = list(self._state.latest.values())
        return np.float32(np.mean(values)) if values else np.float32(0.0)

    def _reset(self):
        self._state.latest = {}

    def _get_state(self):
        return {"latest": dict(self._state.latest)}

    def _set_state(self, state):
        self._state.latest = {k: float(v) for k, v in state["latest"].items()}


class ReplayFeed(roles.BatchSource):
    """The driver's stand-in for a learner fed by collectors (module docstring).

    Args:
        client: a `reverb.Client` of the learner's server.
        samples_per_iteration: train_steps_per_iteration x sample_batch_size
            (from a queue of unrolls: the items of one batch).
        samples_in_flight: what the replayer's dataset may request ahead
            (from a queue: items it may already have taken out; the feed
            waits for them in the queue too, so the train step never does).
        collectors: the launcher (`launcher.LocalCollectors` or
            `RayCollectors`), not started.
        poll_secs: seconds between polls of the server while waiting.
        train_step: the learner's train step variable; with it, each report's
            `policy_step` gives that collector's variable age (train steps
            behind the learner when the report is read, `variable_ages`).

    Threads: `start`, `run_async`, `get_metrics`, `get_step_metrics`,
    `health` on the learner's thread; `stop()` from any thread (idempotent;
    a `run_async` waiting meanwhile raises `DriverStoppedError`).
    `run_async` blocks until the table can serve an iteration's samples,
    raising the launcher's error if collectors died beyond their budget.
    """

    def __init__(self, client, samples_per_iteration, samples_in_flight, collectors,
                 poll_secs=0.005, train_step=None):
        self._client = client
        self._needed = samples_per_iteration + samples_in_flight
        self._collectors = collectors
        self._poll = poll_secs
        self._stop = threading.Event()
        self._stop_lock = threading.Lock()
        self._stopped = False
        self._started = False
        self._pending_steps = 0
        self._last_samples = None
        self._episodes = ReportedCount("NumberOfEpisodes")
        self._env_steps = ReportedCount("EnvironmentSteps")
        self._return = ReportedAverage("AverageReturn")
        self._length = ReportedAverage("AverageEpisodeLength")
        self._train_step = train_step
        self._ages = {}  # {collector: train steps behind, at its latest report}

    @property
    def collectors(self):
        return self._collectors

    def check_schedule(self):
        """Raises ValueError unless the rate limiter's window (its error
        buffer on both sides) holds one iteration's samples plus those in
        flight: else the learner would wait for inserts the limiter refuses."""
        table = self._client.server_info(timeout=10)[REPLAY_TABLE]
        if is_unroll_queue(table):
            if table.max_size < self._needed:
                raise ValueError(
                    f"unroll_table.max_size {table.max_size} is too small for one batch: the "
                    f"learner waits for {self._needed} items (Schedule.rows_per_batch "
                    f"+ ReverbReplayer.max_in_flight_samples_per_worker); "
                    f"set unroll_table.max_size >= {self._needed}")
            return
        info = table.rate_limiter_info
        window = info.max_diff - info.min_diff
        if window < self._needed + info.samples_per_insert:
            raise ValueError(
                f"replay_table's error_buffer {window / 2:g} is too small for one iteration: "
                f"the learner needs {self._needed} samples (train_steps_per_iteration x "
                f"sample_batch_size + ReverbReplayer.max_in_flight_samples_per_worker) within "
                f"twice the error buffer; set replay_table.error_buffer >= "
                f"{(self._needed + info.samples_per_insert) / 2:g} or lower "
                f"Schedule.train_steps_per_iteration")

    def start(self):
        if self._stop.is_set():
            raise RuntimeError("the feed was stopped before it started")
        self._started = True
        self._collectors.start()

    def run_async(self):
        """Waits until one iteration's samples can be served; returns the
        env steps the collectors reported since the last call."""
        if self._last_samples is not None:
            # The learner did not sample last iteration (initial_collect_steps):
            # do not spin on the server.
            if self._samples() == self._last_samples:
                self._stop.wait(0.05)
        while True:
            if self._stop.is_set():
                raise DriverStoppedError("the learner's replay feed was stopped")
            self._collectors.check()
            info = self._client.server_info(timeout=10)
            self._drain(int(info[STATS_TABLE].current_size))
            if self._ready(info[REPLAY_TABLE]):
                steps, self._pending_steps = self._pending_steps, 0
                self._last_samples = info[REPLAY_TABLE].rate_limiter_info.sample_stats.completed
                return steps
            self._stop.wait(self._poll)

    def _samples(self):
        info = self._client.server_info(timeout=10)[REPLAY_TABLE]
        return info.rate_limiter_info.sample_stats.completed

    def _ready(self, table):
        limiter = table.rate_limiter_info
        if table.current_size < limiter.min_size_to_sample:
            return False
        diff = (limiter.insert_stats.completed * limiter.samples_per_insert -
                limiter.sample_stats.completed)
        return diff - self._needed >= limiter.min_diff

    def _drain(self, n):
        if n <= 0:
            return
        with quiet.reverb_info_dropped():  # a sampler's creation in the server's process
            samples = list(self._client.sample(STATS_TABLE, num_samples=n, emit_timesteps=False,
                                               unpack_as_table_signature=True))
        for sample in samples:
            report = {k: np.asarray(v).reshape(-1)[0] for k, v in sample.data.items()}
            self._episodes.add(report["episodes"])
            self._env_steps.add(report["env_steps"])
            self._pending_steps += int(report["env_steps"])
            if self._train_step is not None and "policy_step" in report:
                self._ages[int(report["collector"])] = (int(self._train_step.numpy()) -
                                                        int(report["policy_step"]))
            if report["episodes"] > 0 or report["average_return"] != 0:
                self._return.set(report["collector"], report["average_return"])
                self._length.set(report["collector"], report["average_length"])

    def variable_ages(self):
        """{collector id: how many train steps its variables were behind the
        learner's at its latest report} (empty without `train_step`)."""
        return dict(self._ages)

    def get_metrics(self):
        return [self._episodes, self._env_steps, self._return, self._length]

    def get_step_metrics(self):
        return [self._episodes, self._env_steps]

    def health(self):
        return FeedHealth(self._client, self._collectors, self.variable_ages)

    def stop(self):
        """Stops waiting and stops the collectors (blocks up to the launcher's
        grace period). Idempotent; any thread."""
        self._stop.set()
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
            if self._started:
                self._collectors.stop()
