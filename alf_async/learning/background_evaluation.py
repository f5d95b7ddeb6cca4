"""Evaluation beside training: `BackgroundEvaluationHook` (`Evaluation.in_background`).

`EvaluationHook` evaluates on the learner's thread: while the evaluation's
episodes play, nothing trains, and once the learn queue is full nothing
collects either. `BackgroundEvaluationHook` plays them on a thread of its
own, on a copy of the policy's variables taken at the train step it is for
(`PolicySnapshot`), while the learner trains on: ALF's `async_eval`, Acme's
evaluator actor, here in one process.

    shadow = agent_fn(time_step_spec, action_spec, tf.Variable(0, tf.int64))
    snapshot = PolicySnapshot(agent.policy, shadow.policy)
    hook = BackgroundEvaluationHook(Evaluator(eval_env, shadow.policy), snapshot,
                                    writer, interval=64, stop_at_return=195.0)

Its evaluations are those `EvaluationHook` makes, with two differences:

- An evaluation is recorded (written, printed, kept; the learner stopped if
  it reached `stop_at_return`) at the first iteration that ends after it
  did, at the train step of its snapshot; its seconds are when it ended.
- One evaluation runs at a time. An evaluation due while one runs is not
  made; the last line of the run says how many were not. None starts at
  the iteration that records one reaching `stop_at_return`.

Threads: the learner's thread calls the hook (and so takes every snapshot,
between iterations: no train step runs meanwhile) and records every
evaluation; the evaluation thread ("alf_async_evaluation") only plays
episodes. Its error is raised on the learner's thread, with its type, at the
next iteration's end. At a clean stop the running evaluation is finished
and recorded (a stop by the stop event cancels it: it ends within one step
of its environments); at an error it is cancelled.
"""

import concurrent.futures
import time

from tf_agents.utils import common

from alf_async.learning.hooks import EvaluationHook


class PolicySnapshot(object):
    """Copies `source`'s variables into `target`'s, in one graph call.

    `target` is a policy built as `source` was (the policy of a second agent
    of the same agent function): the same variables in the same order.

    Args:
        source: the TFPolicy that trains (e.g. `agent.policy`).
        target: the TFPolicy evaluated (e.g. `shadow_agent.policy`).

    Raises:
        ValueError: the two policies' variables differ in number, shape or dtype.
    """

    def __init__(self, source, target):
        source_vars, target_vars = list(source.variables()), list(target.variables())
        if len(source_vars) != len(target_vars):
            raise ValueError(f"the evaluated policy has {len(target_vars)} variables and the "
                             f"agent's {len(source_vars)}: build both with the same agent function")
        for s, t in zip(source_vars, target_vars):
            if s.shape != t.shape or s.dtype != t.dtype:
                raise ValueError(f"the evaluated policy's variable {t.name} {t.shape} "
                                 f"{t.dtype.name} does not match the agent's {s.name} {s.shape} "
                                 f"{s.dtype.name}: build both with the same agent function")
        def copy():
            common.soft_variables_update(source_vars, target_vars, tau=1.0)

        self._copy = common.function(copy, autograph=False)

    def trace(self):
        """Builds the copy's graph without running it."""
        self._copy.get_concrete_function()

    def __call__(self):
        """Copies every variable; call it while nothing trains `source`."""
        self._copy()


class BackgroundEvaluationHook(EvaluationHook):
    """`EvaluationHook`'s evaluations on a thread of their own (see module
    docstring).

    Args:
        evaluator: an `alf_async.learning.evaluation.Evaluator` of the
            policy `snapshot` copies into.
        snapshot: a `PolicySnapshot` (or any callable copying the training
            policy's variables into the evaluated one's), called on the
            learner's thread between iterations.
        writer: the `tf.summary.SummaryWriter` of the evaluations.
        interval: evaluate every this many train steps.
        stop_at_return: stop the learner once an average return is >= this.
        print_fn: callable(str) for the evaluation lines.
        solved: a `SolvedRecord` noting the first evaluation that reached
            `stop_at_return`, or None.
        policy_name: how the lines name the evaluated policy.

    Attributes:
        evaluations: as `EvaluationHook`'s (seconds: when each ended).
        solved_secs: as `EvaluationHook`'s.
        not_made: evaluations due while one ran, so not made.
    """

    def __init__(self, evaluator, snapshot, writer, interval, stop_at_return=None,
                 print_fn=print, solved=None, policy_name="greedy policy"):
        super().__init__(evaluator, writer, interval, stop_at_return=stop_at_return,
                         print_fn=print_fn, solved=solved, policy_name=policy_name)
        self._snapshot = snapshot
        self._executor = None
        self._running = None   # (future, train step, env steps)
        self.not_made = 0

    def after_iteration(self, learner, train_step_before, train_step):
        solved_before = self.solved_secs
        self._record_finished(learner, wait=False)
        if solved_before is None and self.solved_secs is not None:
            return   # the learner stops at this iteration's end: no evaluation starts
        super().after_iteration(learner, train_step_before, train_step)

    def end(self, learner, stopped_by):
        if stopped_by == "stop_event":
            self._cancel()
        else:
            self._record_finished(learner, wait=True)
        if self.not_made:
            self._print(f"[alf_async] {self.not_made} evaluations were due while one ran, and "
                        f"were not made (Evaluation.in_background)")
        super().end(learner, stopped_by)

    def close(self, learner):
        self._cancel()

    def _trace(self):
        self._evaluator.trace()
        self._snapshot.trace()

    def _evaluate(self, learner, step):
        """Starts the evaluation due at `step` on the thread, unless one runs."""
        if self._running is not None:
            self.not_made += 1
            return
        self._snapshot()
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="alf_async_evaluation")
        start_time = learner.start_time

        def evaluate():
            average_return, average_length = self._evaluator()
            return time.monotonic() - start_time, average_return, average_length

        self._running = (self._executor.submit(evaluate), step, learner.env_steps)

    def _record_finished(self, learner, wait):
        """Records the running evaluation if it ended (with `wait`: once it
        ends); raises its error, with its type."""
        if self._running is None:
            return
        future, step, env_steps = self._running
        if not wait and not future.done():
            return
        self._running = None
        secs, average_return, average_length = future.result()
        self._record(learner, secs, step, env_steps, average_return, average_length)

    def _cancel(self):
        """Cancels the running evaluation (if any) and ends the thread."""
        if self._executor is None:
            return
        self._evaluator.cancel()
        self._executor.shutdown(wait=True)
        self._executor = None
        self._running = None
