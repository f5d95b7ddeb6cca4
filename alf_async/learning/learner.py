"""The run_async training loop as an object: `Learner(agent, driver, replayer)`.

    learner = Learner(agent, driver, replayer, train_steps_per_iteration=16,
                      sample_batch_size=64, hooks=[CheckpointHook(checkpointer, 10000)])
    stopped_by = learner.run(num_env_steps=10**6)

`run()` starts the driver, then loops

    driver.run_async()       (experience -> the driver's exp_observers, e.g. the replayer)
    -> train_steps_per_iteration train steps, in one graph call
    -> every hook's after_iteration (summaries, evaluation, checkpoints, ...)

until a limit, the stop event or a hook's `request_stop`, and stops the
driver on every exit path. It is what `train()` runs once gin has built the
pieces, and what serving jobs, offline jobs, benchmarks and tests run with
pieces they built themselves (as tf-agents splits `train/learner.py` and
`triggers.py` from its wiring scripts). The driver is built by the caller,
with the replayer (or whatever feeds it) among its exp_observers. With `agent=None` the learner
trains nothing: it takes the driver's batches (for its exp_observers) until
stopped.

Hooks (`Hook`; hooks.py has the ones train() uses) are called on the learner's thread:
`begin` once the driver started, `training_started` at the first iteration
that trains, `after_iteration` after each iteration, `end` after a clean
stop (the driver stopped; e.g. the last summaries and checkpoint), `close`
as `run()` returns, whichever way (e.g. to end a hook's thread).

Performance. An iteration's train steps are one graph call: the step (one
replayer sample + `agent.train`) is traced once and run by a
`tf.while_loop`, which spares the learner's thread the Python and a GIL
hand-off of each step (the env and actor threads need the GIL too). At
start-up one helper thread (`WarmUp`) instantiates that graph with a dry
call (0 steps; otherwise TF does it inside the first real call) while the
driver collects its first batch and this thread traces the replayer's
write and the hooks build their graphs in `begin` (the evaluation, the
summaries' write); benchmarks/results/time_to_solve_ppo_cartpole_start_up.txt has what start-up costs a solve.

Threads: `run()` runs on the caller's thread (the learner's); the driver's
threads act and collect meanwhile. It blocks in `run_async()` (until the
learn queue is full), in training and hooks, and at most one trace or dry
call long for the helper. `stop()` may be called from any thread; the
counters and `loss` may be read from any thread (snapshots).
"""

import logging
import threading
import time

import tensorflow as tf
from tf_agents.utils import common

from alf_async import roles
from alf_async.driver import DriverStoppedError
from alf_async.learning.warm_up import WarmUp

logger = logging.getLogger(__name__)


def crossed(before, after, interval):
    """True if a multiple of `interval` lies in (before, after]."""
    return after // interval > before // interval


class Hook(object):
    """Something the learner does besides training (summaries, evaluation,
    checkpoints, progress lines): tf-agents' triggers, dopamine's runner
    phases. Subclass and override what you need; every method is called on
    the learner's thread and may call `learner.request_stop(reason)`.
    """

    def begin(self, learner):
        """The driver has started; no iteration ran yet."""

    def training_started(self, learner):
        """The first iteration that trains is about to (the replayer can sample)."""

    def after_iteration(self, learner, train_step_before, train_step):
        """An iteration ended; the global train step went from
        `train_step_before` to `train_step`."""

    def end(self, learner, stopped_by):
        """The loop stopped cleanly for `stopped_by` and the driver is stopped."""

    def close(self, learner):
        """`run()` is returning, after a clean stop (after every `end`) or
        an error: end what the hook started (a thread). An error it raises
        is logged, not raised."""


class LearnerCounters(tf.Module):
    """The learner's checkpointed counters (the global train step is the agent's)."""

    def __init__(self):
        super().__init__(name="learner_counters")
        self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="iterations")
        # Env steps the learner dequeued (the EnvironmentSteps metric counts
        # non-boundary steps as the LogThread sees them).
        self.env_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="env_steps")


class Learner(object):
    """Runs the driver and trains the agent on what it collects (see module docstring).

    Args:
        agent: a tf-agents TFAgent whose `collect_policy` the driver acts
            with; None trains nothing (the learner only takes batches).
        driver: the `roles.BatchSource` batches come from (the driver or a
            Reverb feed), not started; None: a learner that only trains.
        replayer: an `alf_async.learning.replayers.Replayer` the driver feeds (one of
            its exp_observers, directly or not); needed with an agent.
        train_steps_per_iteration: agent.train calls per iteration (one
            graph call).
        sample_batch_size: windows per train step.
        initial_collect_steps: env steps dequeued before training starts.
        hooks: `Hook`s, called in this order.
        counters: the `LearnerCounters` to count in (e.g. restored from a
            checkpoint: totals then go on); default new ones.
        summary_writer: if set, the loop runs under it as the default
            writer, recording (the agent's own summaries too) when the train
            step is a multiple of `summary_interval`.
        summary_interval: see `summary_writer`.
        stop_event: a `threading.Event`; once set, the loop stops at the
            end of its iteration (a clean stop).
    """

    def __init__(self, agent, driver, replayer=None, *, train_steps_per_iteration=1,
                 sample_batch_size=64, initial_collect_steps=0, hooks=(), counters=None,
                 summary_writer=None, summary_interval=100, stop_event=None):
        if agent is not None and replayer is None:
            raise ValueError("a Learner with an agent needs the replayer it samples from")
        if driver is not None and not isinstance(driver, roles.BatchSource):
            raise TypeError(f"a Learner's driver is a roles.BatchSource (the driver or a "
                            f"Reverb feed), got {type(driver).__name__}")
        self._agent = agent
        self._driver = driver
        self._replayer = replayer
        self._sample_batch_size = sample_batch_size
        self._initial_collect_steps = initial_collect_steps or 0
        self._hooks = list(hooks)
        self._counters = counters if counters is not None else LearnerCounters()
        self._summary_writer = summary_writer
        self._summary_interval = summary_interval
        self._stop_event = stop_event if stop_event is not None else threading.Event()
        self._warm_up = WarmUp()
        self._training = False
        self._requested = None
        self._loss = None
        self._start_time = None
        if agent is not None:
            self._train_step_counter = agent.train_step_counter
            self._num_steps = agent.train_sequence_length
            # One sample + agent.train (traced once), and the iteration: that
            # step train_steps_per_iteration times in one graph call.
            self._train_step = common.function(self._train_step_graph)
            self._train_iteration = common.function(
                self._train_graph, input_signature=[tf.TensorSpec([], tf.int32)])
            self._train_iteration_fn = None  # its ConcreteFunction (see _iteration_fn)
            self._steps_per_iteration = tf.constant(train_steps_per_iteration, tf.int32)
        else:
            self._train_step_counter = None

    # ------------------------------------------------------------ properties

    @property
    def agent(self):
        return self._agent

    @property
    def driver(self):
        return self._driver

    @property
    def replayer(self):
        return self._replayer

    @property
    def counters(self):
        return self._counters

    @property
    def summary_writer(self):
        """The `tf.summary.SummaryWriter` the loop runs under (None: none)."""
        return self._summary_writer

    @property
    def warm_up(self):
        """The helper thread's `WarmUp` (hooks may submit graph builds to it)."""
        return self._warm_up

    @property
    def train_step(self):
        """The global train step (the agent's train_step_counter; 0 without an agent)."""
        counter = self._train_step_counter
        return 0 if counter is None else int(counter.numpy())

    @property
    def iterations(self):
        return int(self._counters.iterations.numpy())

    @property
    def env_steps(self):
        """Env steps dequeued, in total (resumed runs included)."""
        return int(self._counters.env_steps.numpy())

    @property
    def loss(self):
        """The last iteration's LossInfo (its last train step's), None before training."""
        return self._loss

    @property
    def training(self):
        """True once training started (it then goes on: replayers only grow)."""
        return self._training

    @property
    def start_time(self):
        """`time.monotonic()` when `run()` started (None before)."""
        return self._start_time

    # ------------------------------------------------------------ control

    def request_stop(self, reason):
        """Ends the loop at the end of this iteration, stopped by `reason`
        (for hooks, on the learner's thread)."""
        self._requested = reason

    def stop(self):
        """Stops the loop cleanly from any thread: sets the stop event and
        stops the driver, which wakes a learner blocked in `run_async()`.

        Raises:
            Exception: the first error of a driver thread that nobody raised
                yet (see `AsyncOffPolicyDriver.stop`).
        """
        self._stop_event.set()
        self._driver.stop()

    def train(self, num_steps):
        """Runs `num_steps` train steps in one graph call; returns the last
        step's LossInfo (zeros if `num_steps` is 0, the dry call that only
        makes TF instantiate the graph)."""
        return self._iteration_fn()(tf.constant(num_steps, tf.int32))

    def run(self, num_iterations=None, num_env_steps=None, num_train_steps=None):
        """Starts the driver, trains until a limit or a stop, stops the driver.
        Call it once (a driver starts once).

        Args:
            num_iterations: stop once this many iterations ran in total
                (the counters' totals: resumed runs included).
            num_env_steps: stop once this many env steps were dequeued in total.
            num_train_steps: stop once the global train step reaches this.

        Returns:
            Why it stopped: 'num_iterations', 'num_env_steps',
                'num_train_steps', 'stop_event' or the reason a hook gave.

        Raises:
            Exception: the first error of any driver thread or hook, with its
                type, after every thread was stopped (no `end` hooks then).
        """
        self._limits = (num_iterations, num_env_steps, num_train_steps)
        self._start_time = time.monotonic()
        try:
            try:
                stopped_by = self._run_driver()
            except BaseException:
                # Every error exit ends the helper thread too (its own error is
                # logged: the one in flight is reported).
                self._warm_up.close(reraise=False)
                raise
            self._warm_up.close()
            with self._summary_context():
                for hook in self._hooks:
                    hook.end(self, stopped_by)
        finally:
            for hook in self._hooks:
                try:
                    hook.close(self)
                except Exception:  # pylint: disable=broad-except
                    logger.exception("closing hook %r raised", hook)
        return stopped_by

    # ------------------------------------------------------------ the loop

    def _summary_context(self):
        if self._summary_writer is None:
            return _NoContext()
        return _SummaryContext(self._summary_writer, self._train_step_counter,
                               self._summary_interval)

    def _run_driver(self):
        """Starts the driver, runs the loop, stops the driver; returns why it stopped."""
        stopped_by = None
        try:
            with self._summary_context():
                self._start_up()
                stopped_by = self._loop()
        except DriverStoppedError:
            if not self._stop_event.is_set():
                raise
            stopped_by = "stop_event"
        except BaseException:
            # An error (or a second Ctrl-C): stop the threads, keep the last checkpoint.
            try:
                self._driver.stop()
            except Exception:  # the error in flight is the one to report
                logger.exception("stopping the driver after an error raised too")
            raise
        self._driver.stop()  # raises a driver thread's error not raised yet
        return stopped_by

    def _start_up(self):
        """Starts the driver and builds the graphs the loop runs first,
        overlapping what can overlap on a 2-core machine (done one after
        another, they delay the first train step by a large part of a
        CartPole solve).

        Tracing is Python and holds the GIL; TF's instantiation of a traced
        function (grappler, kernels) is C++ that mostly releases it. So this
        thread traces the train iteration first (when the replayer can be
        sampled before data: a replay buffer, a `OneTimeReplayer` told its
        batch rows), then the helper thread instantiates it by a dry call
        while the env and actor threads collect the first batch and this
        thread traces the replayer's write and the hooks build their graphs
        (`begin`: the evaluation, the summaries' write).
        """
        if self._agent is not None and self._replayer.traceable_before_data:
            self._warm_up.submit("train", self._iteration_fn(), tf.constant(0))
        try:
            self._driver.start()
        except RuntimeError:
            if self._stop_event.is_set():  # stop() came first: nothing to run
                raise DriverStoppedError("the learner was stopped before it started")
            raise
        if self._replayer is not None:
            self._replayer.trace()
        for hook in self._hooks:
            hook.begin(self)

    def _should_stop(self):
        if self._stop_event.is_set():
            return "stop_event"
        num_iterations, num_env_steps, num_train_steps = self._limits
        if num_iterations is not None and self.iterations >= num_iterations:
            return "num_iterations"
        if num_env_steps is not None and self.env_steps >= num_env_steps:
            return "num_env_steps"
        if num_train_steps is not None and self.train_step >= num_train_steps:
            return "num_train_steps"
        return self._requested

    def _loop(self):
        counters, hooks = self._counters, self._hooks
        while True:
            stopped_by = self._should_stop()
            if stopped_by is not None:
                return stopped_by
            steps = self._driver.run_async()
            counters.iterations.assign_add(1, read_value=False)
            counters.env_steps.assign_add(steps, read_value=False)
            before = self.train_step
            if self._training or self._can_train():
                self._warm_up.wait("train")
                self._loss = self._iteration_fn()(self._steps_per_iteration)
            after = self.train_step
            for hook in hooks:
                hook.after_iteration(self, before, after)

    def _can_train(self):
        """Whether training may start (it then goes on: replayers only grow)."""
        if self._agent is None:
            return False
        self._training = (self.env_steps >= self._initial_collect_steps and
                          self._replayer.can_sample(self._num_steps or 1))
        if self._training:
            for hook in self._hooks:
                hook.training_started(self)
        return self._training

    # ------------------------------------------------------------ the graphs

    def _iteration_fn(self):
        """The traced iteration, called as a ConcreteFunction: a tf.function's
        own dispatch (signature binding, cache lookup) would cost more per call."""
        if self._train_iteration_fn is None:
            self._train_iteration_fn = self._train_iteration.get_concrete_function()
        return self._train_iteration_fn

    def _train_step_graph(self):
        """One sample + agent.train (sampling reads the replayer's variables, so
        it sees every write)."""
        experience = self._replayer.sample(self._sample_batch_size, self._num_steps)
        return self._agent.train(experience)

    def _train_graph(self, num_steps):
        """`num_steps` train steps in one graph call (a tf.while_loop around
        the step, traced once as its own function); returns the last step's
        LossInfo (zeros if `num_steps` is 0)."""
        step = self._train_step.get_concrete_function()
        # The loop carries the LossInfo's tensors (an agent may put None or
        # Python values in it, returned as they are), starting from zeros
        # shaped like them: unknown dimensions as 0, kept unknown by the
        # shape invariants.
        flat = tf.nest.flatten(step.structured_outputs)
        carried = [i for i, t in enumerate(flat) if isinstance(t, tf.Tensor)]
        zeros = [tf.zeros([d or 0 for d in flat[i].shape.as_list()], flat[i].dtype)
                 for i in carried]

        def body(i, _):
            outputs = tf.nest.flatten(step())
            return i + 1, [outputs[j] for j in carried]

        _, last = tf.while_loop(
            lambda i, _: i < num_steps, body, (tf.constant(0), zeros),
            shape_invariants=(tf.TensorShape([]), [flat[i].shape for i in carried]),
            parallel_iterations=1)
        for i, t in zip(carried, last):
            flat[i] = t
        return tf.nest.pack_sequence_as(step.structured_outputs, flat)


class _NoContext(object):

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _SummaryContext(object):
    """`writer` as the default writer, recording when the train step is a
    multiple of `interval` (tf-agents' summaries inside agent.train too)."""

    def __init__(self, writer, train_step_counter, interval):
        self._record = tf.summary.record_if(
            True if train_step_counter is None else
            lambda: tf.equal(train_step_counter % interval, 0))
        self._default = writer.as_default()

    def __enter__(self):
        self._record.__enter__()
        self._default.__enter__()
        return self

    def __exit__(self, *exc):
        self._default.__exit__(*exc)
        self._record.__exit__(*exc)
        return False
