"""What the learner does besides training, as `Hook`s (tf-agents' triggers):

- `SummaryHook(interval)`: the driver's metrics (tf-agents' tags), for
  unroll agents the policy lag of the latest batch (Learner/...) and the
  driver's health (Perf/, Queues/, Env/) every `interval` train steps and
  at the end, to the learner's summary writer, all in one graph call
  (`ScalarSummaries`). The losses are the agent's own summaries
  (tf-agents' `Losses/...`), written inside its train step.
- `EvaluationHook(evaluator, writer, interval, stop_at_return, solved)`: the
  greedy policy's average return every `interval` train steps (its graph is
  traced on the learner's helper thread once training starts); stops the
  learner once it reaches `stop_at_return`, noting it in `solved` (a
  `SolvedRecord`, checkpointed with the run so that a rerun knows).
- `CheckpointHook(checkpointer, interval)`: a checkpoint every `interval`
  train steps and at the end.
- `ProgressHook(print_fn, interval_secs)`: a progress line every
  `interval_secs` seconds and at the end.
- `StopWaker(stop_event)`: stops a learner that waits for experience once
  `stop_event` is set.

Threads: every method runs on the learner's thread; `evaluations` and
`solved_secs` may be read once `run()` returned.
"""

import threading
import time

import tensorflow as tf

from alf_async.driver import metrics as metrics_lib
from alf_async.learning import checkpoint_files
from alf_async.learning.learner import Hook, crossed
from alf_async.learning.scalar_summaries import ScalarSummaries, metric_points


class SummaryHook(Hook):
    """Training summaries every `interval` train steps and at the end (under
    the learner's summary writer, which must be set)."""

    def __init__(self, interval):
        self._interval = interval
        self._health = None
        self._summaries = None

    def begin(self, learner):
        if learner.summary_writer is None:
            raise ValueError("SummaryHook needs a Learner with a summary_writer")
        self._summaries = ScalarSummaries(learner.summary_writer)
        self._summaries.warm_up()   # while the driver collects its first batch
        self._health = learner.driver.health()   # a roles.BatchSource's

    def after_iteration(self, learner, train_step_before, train_step):
        if crossed(train_step_before, train_step, self._interval):
            self._write(learner, train_step)

    def end(self, learner, stopped_by):
        self._write(learner, learner.train_step)
        self._summaries.flush()

    def _write(self, learner, step):
        driver = learner.driver
        points = metric_points(driver.get_metrics(), driver.get_step_metrics(), step)
        lag = learner.replayer.policy_lag() if learner.replayer is not None else None
        if lag is not None:
            points["Learner/policy_lag"] = (lag[0], step)
            points["Learner/policy_lag_max"] = (lag[1], step)
        points.update((tag, (value, step)) for tag, value in self._health.scalars(step).items())
        self._summaries.write(points)


class SolvedRecord(tf.Module):
    """The first evaluation that reached `stop_at_eval_return`, kept in the
    checkpoint (under `solved`) so that a rerun of a solved job knows it.

    Attributes:
        step: its train step (-1: not solved).
        average_return: its average return (-inf: not solved).
    """

    def __init__(self):
        super().__init__(name="solved")
        self.step = tf.Variable(-1, dtype=tf.int64, trainable=False, name="step")
        self.average_return = tf.Variable(float("-inf"), dtype=tf.float64, trainable=False,
                                          name="average_return")


class EvaluationHook(Hook):
    """Evaluates every `interval` train steps with `evaluator`
    (`alf_async.learning.evaluation.Evaluator`); writes `Metrics/AverageReturn`,
    `Metrics/AverageEpisodeLength` and `Metrics_vs_EnvironmentSteps/
    AverageReturn` to `writer`, prints a line, and stops the learner
    ('stop_at_eval_return') once an average return reaches `stop_at_return`,
    noting that evaluation in `solved` (a `SolvedRecord`) if given. Its
    lines name the policy evaluated as `policy_name`.

    Attributes:
        evaluations: [(seconds since the loop started, train step, env
            steps, average return, average episode length)].
        solved_secs: seconds from the loop's start to the first evaluation
            that reached `stop_at_return` (None if none did).
    """

    def __init__(self, evaluator, writer, interval, stop_at_return=None, print_fn=print,
                 solved=None, policy_name="greedy policy"):
        self._evaluator = evaluator
        self._policy_name = policy_name
        self._solved = solved
        self._summaries = ScalarSummaries(writer)
        self._interval = interval
        self._stop_at_return = stop_at_return
        self._print = print_fn
        self.evaluations = []
        self.solved_secs = None

    def begin(self, learner):
        # Built while the driver collects its first batch (and the helper
        # thread instantiates the train iteration), not after it.
        self._trace()
        self._summaries.warm_up()

    def _trace(self):
        self._evaluator.trace()

    def after_iteration(self, learner, train_step_before, train_step):
        if crossed(train_step_before, train_step, self._interval):
            self._evaluate(learner, train_step)

    def end(self, learner, stopped_by):
        self._summaries.flush()

    def _evaluate(self, learner, step):
        average_return, average_length = self._evaluator()
        self._record(learner, time.monotonic() - learner.start_time, step, learner.env_steps,
                     average_return, average_length)

    def _record(self, learner, secs, step, env_steps, average_return, average_length):
        """Writes, prints and keeps the evaluation of the policy of train
        step `step` (`env_steps` dequeued then) that ended `secs` into the
        loop; stops the learner if it reached `stop_at_return`."""
        self.evaluations.append((secs, step, env_steps, average_return, average_length))
        self._summaries.write({
            "Metrics/AverageReturn": (average_return, step),
            "Metrics/AverageEpisodeLength": (average_length, step),
            "Metrics_vs_EnvironmentSteps/AverageReturn": (average_return, env_steps)})
        self._print(f"[alf_async] eval at train step {step} ({secs:.1f} s, {env_steps} env "
                    f"steps): {self._policy_name} AverageReturn {average_return:.1f} over "
                    f"{self._evaluator.num_episodes} episodes, AverageEpisodeLength "
                    f"{average_length:.1f}")
        if (self._stop_at_return is not None and self.solved_secs is None and
                average_return >= self._stop_at_return):
            self.solved_secs = secs
            if self._solved is not None:
                self._solved.step.assign(step)
                self._solved.average_return.assign(average_return)
            learner.request_stop("stop_at_eval_return")


class CheckpointHook(Hook):
    """Saves `checkpointer` (a tf-agents `common.Checkpointer`) every
    `interval` train steps and at the end; with `replay` (an object with a
    `checkpoint()` method, e.g. a `ReverbReplayer`, whose storage lives
    outside TF's checkpoint), checkpoints it at the same moments."""

    def __init__(self, checkpointer, interval, replay=None):
        self._checkpointer = checkpointer
        self._interval = interval
        self._replay = replay

    def after_iteration(self, learner, train_step_before, train_step):
        if crossed(train_step_before, train_step, self._interval):
            self._save(learner)

    def end(self, learner, stopped_by):
        self._save(learner)

    def _save(self, learner):
        if self._replay is not None:
            # Replay first: a restored agent never trained on items the
            # restored table lacks.
            self._replay.checkpoint()
        # Marked in progress: a stop that cannot wait for it removes what it
        # left (checkpoint_files.WRITES.finish_or_remove).
        with checkpoint_files.WRITES.writing(self._checkpointer.manager.directory):
            self._checkpointer.save(global_step=learner.agent.train_step_counter)


class ProgressHook(Hook):
    """A progress line every `interval_secs` seconds and at the end:

        [alf_async] iteration 40 | env steps 320 (1234/s) | train steps 66 (250/s)
            | collect policy AverageReturn 21.3 | loss 0.513 [| policy lag 2.5]

    (the driver's AverageReturn metric: the exploring collect policy's
    episodes; the evaluation's lines say "greedy policy AverageReturn"; the
    policy lag, mean over the latest batch, where the replayer measures it).
    """

    def __init__(self, print_fn=print, interval_secs=10.0):
        self._print = print_fn
        self._interval = interval_secs
        self._last = None
        self._printed_iteration = None

    def begin(self, learner):
        self._last = (learner.start_time, learner.env_steps, learner.train_step)

    def after_iteration(self, learner, train_step_before, train_step):
        now = time.monotonic()
        if now - self._last[0] >= self._interval:
            self._print_line(learner, now)

    def end(self, learner, stopped_by):
        # The end line, unless an iteration's line just said the same.
        if self._printed_iteration != learner.iterations:
            self._print_line(learner, time.monotonic())

    def _print_line(self, learner, now):
        t0, env0, step0 = self._last
        env_steps, step = learner.env_steps, learner.train_step
        dt = max(now - t0, 1e-9)
        average_return = float(metrics_lib.by_name(
            learner.driver.get_metrics())["AverageReturn"].result())
        loss = "-" if learner.loss is None else f"{float(learner.loss.loss):.4g}"
        lag = learner.replayer.policy_lag() if learner.replayer is not None else None
        self._print(
            f"[alf_async] iteration {learner.iterations} | env steps {env_steps} "
            f"({(env_steps - env0) / dt:.0f}/s) | train steps {step} ({(step - step0) / dt:.0f}/s)"
            f" | collect policy AverageReturn {average_return:.1f} | loss {loss}" +
            ("" if lag is None else f" | policy lag {lag[0]:.1f}"))
        self._last = (now, env_steps, step)
        self._printed_iteration = learner.iterations


class StopWaker(Hook):
    """Calls `learner.stop()` once `stop_event` is set: the event alone ends the
    loop only at the end of an iteration, and a learner waiting for
    experience that never comes (a serving job without clients) would wait
    for ever.

    Threads: `begin` (the learner's thread, after every other hook began:
    this one is the last) starts a daemon thread that polls the event every
    0.1 s; `close` (the learner's thread, on every exit path, after every
    hook's `end`) ends and joins it.
    """

    def __init__(self, stop_event):
        self._stop_event = stop_event
        self._closed = threading.Event()
        self._thread = None

    def begin(self, learner):
        self._thread = threading.Thread(target=self._run, args=(learner,), name="stop_waker",
                                        daemon=True)
        self._thread.start()

    def _run(self, learner):
        while not self._closed.wait(0.1):
            if self._stop_event.is_set():
                try:
                    learner.stop()
                except Exception:  # pylint: disable=broad-except  (learner.run raises it)
                    pass
                return

    def close(self, learner):
        self._closed.set()
        if self._thread is not None:
            self._thread.join()
