"""The run_async training loop: one gin-configurable wiring function, `train()`.

    train(root_dir, env_name='CartPole-v0', agent_fn=dqn_agent, ...)

builds (tf-agents train_eval style) the environments (`suites`), a tf-agents
agent (`agent_fn`: `dqn_agent`, `sac_agent`, or any callable returning a
TFAgent), the AsyncOffPolicyDriver acting with `agent.collect_policy`, and a
replayer (`replayers`), then loops

    run_async() -> replayer (an exp_observer) -> agent.train x K
                -> summaries / progress line / evaluation / checkpoint on their intervals

until `num_iterations`, `num_env_steps`, `stop_at_eval_return` or `stop_event`,
and stops the driver on every exit path. Everything lives under `root_dir`:

    root_dir/train/   checkpoints (agent + optimizers, replay buffer, metrics,
                      counters) and training summaries
    root_dir/eval/    evaluation summaries
    root_dir/operative_config-<global step>.gin

Running again on the same root_dir restores the latest checkpoint: the
global (train) step, the iteration and env-step counters and the metrics go
on where they were; `num_iterations` / `num_env_steps` are totals.

Threads: `train()` runs on the caller's thread (the learner); the driver's
threads act and collect meanwhile, and one helper thread builds graphs at
start-up (`_WarmUp`: the train iteration's dry call, the evaluation's trace).
It blocks in `run_async()` (until the learn queue is full), in
training/evaluation, and at most one trace or dry call long for the helper.
"""

import collections
import concurrent.futures
import logging
import os
import time

import gin
import tensorflow as tf
from tf_agents.eval import metric_utils
from tf_agents.utils import common

from alf_async import replayers
from alf_async.agents import dqn_agent, sac_agent  # noqa: F401  (gin configurables)
from alf_async.driver import AsyncOffPolicyDriver, DriverStoppedError
from alf_async.environments import suites
from alf_async.evaluation import Evaluator
from alf_async.health import DriverHealth, _write_loss

logger = logging.getLogger(__name__)

# -------------------------------------------------------------------- train


TrainResult = collections.namedtuple("TrainResult", [
    "global_step", "env_steps", "iterations", "stopped_by", "evaluations", "solved_secs"])
TrainResult.__doc__ = """What `train()` did.

global_step / env_steps / iterations: the totals at exit (resumed runs included).
stopped_by: 'num_iterations', 'num_env_steps', 'stop_at_eval_return' or 'stop_event'.
evaluations: [(seconds since the loop started, global step, env steps,
    average return, average episode length)] of this run.
solved_secs: seconds from the loop's start to the first evaluation whose
    average return reached `stop_at_eval_return` (None if none did).
"""


class _Counters(tf.Module):
    """The trainer's own checkpointed counters (the global step is the agent's)."""

    def __init__(self):
        super().__init__(name="trainer_counters")
        self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="iterations")
        # Env steps the learner dequeued (the EnvironmentSteps metric counts
        # non-boundary steps as the LogThread sees them).
        self.env_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="env_steps")


def one_line(error):
    """An error message on one line, without gin's "In call to configurable" lines
    (the message already names the binding)."""
    return " | ".join(line.strip() for line in str(error).splitlines()
                      if line.strip() and not line.strip().startswith("In call to configurable"))


class ConfigError(ValueError):
    """A bad `train()` argument, found before anything is built."""


def _check_args(**args):
    """Fails before anything is built on a bad value, naming the binding."""
    positive = ("num_envs", "env_batch_size", "num_actor_queues", "actor_queue_cap",
                "unroll_length", "learn_queue_cap", "train_steps_per_iteration",
                "sample_batch_size", "summary_interval", "checkpoint_interval",
                "eval_interval")
    for name in positive:
        value = args[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"train.{name} must be an int >= 1, got {value!r}")
    for name in ("num_iterations", "num_env_steps", "initial_collect_steps",
                 "num_eval_episodes"):
        value = args[name]
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or
                                  value < 0):
            raise ConfigError(f"train.{name} must be None or an int >= 0, got {value!r}")
    if args["num_iterations"] is None and args["num_env_steps"] is None:
        raise ConfigError("set train.num_iterations or train.num_env_steps (or both): "
                         "otherwise training never stops")
    for name in ("log_interval_secs",):
        value = args[name]
        if not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"train.{name} must be a number > 0, got {value!r}")
    if args["stop_at_eval_return"] is not None and args["num_eval_episodes"] in (0, None):
        raise ConfigError("train.stop_at_eval_return needs train.num_eval_episodes >= 1")
    if not callable(args["agent_fn"]):
        raise ConfigError(f"train.agent_fn must be callable, got {args['agent_fn']!r}")


def _print_flush(line):
    print(line, flush=True)


def _crossed(before, after, interval):
    return after // interval > before // interval


@gin.configurable
def train(root_dir,
          env_name=gin.REQUIRED,
          agent_fn=gin.REQUIRED,
          suite="suite_gym",
          make_env_constructor=suites.make_env_constructor,
          replayer_fn=replayers.UniformReplayer,
          num_envs=1,
          env_batch_size=1,
          num_actor_queues=1,
          actor_queue_cap=1,
          unroll_length=8,
          learn_queue_cap=1,
          num_iterations=None,
          num_env_steps=None,
          initial_collect_steps=0,
          train_steps_per_iteration=1,
          sample_batch_size=64,
          num_eval_episodes=10,
          eval_interval=1000,
          stop_at_eval_return=None,
          summary_interval=100,
          checkpoint_interval=10000,
          log_interval_secs=10.0,
          seed=None,
          stop_event=None,
          print_fn=None):
    """Trains `agent_fn`'s agent on `env_name` with the AsyncOffPolicyDriver.

    Args:
        root_dir: where checkpoints, summaries and the operative config go.
        env_name: the environment's name in `suite` ('CartPole-v0').
        agent_fn: callable(time_step_spec, action_spec, train_step_counter)
            -> TFAgent (`dqn_agent`, `sac_agent`, ...).
        suite: the environment suite (see `suites.load`).
        make_env_f: callable(suite, env_name, batch_size, seed) -> env_f, the
            driver's environment factory.
        replayer_fn: callable(data_spec, num_rows) -> replayer
            (`replayers.UniformReplayer`, `replayers.OneTimeReplayer`).
        num_envs: env threads of the driver (one environment each).
        env_batch_size: environments batched in each env thread's environment.
        num_actor_queues: actor threads.
        actor_queue_cap: env threads per batched forward pass.
        unroll_length: steps per unroll.
        learn_queue_cap: unrolls per learner batch; one iteration brings
            learn_queue_cap * env_batch_size * unroll_length env steps.
        num_iterations: stop after this many iterations in total (None: no limit).
        num_env_steps: stop once this many env steps were dequeued in total.
        initial_collect_steps: env steps collected before training starts.
        train_steps_per_iteration: agent.train calls per iteration.
        sample_batch_size: windows per train step (uniform replayer).
        num_eval_episodes: episodes per evaluation of the greedy policy
            (0: no evaluation).
        eval_interval: evaluate every this many train steps.
        stop_at_eval_return: stop once an evaluation's average return is >= this.
        summary_interval: write training summaries every this many train steps.
        checkpoint_interval: checkpoint every this many train steps (and at exit).
        log_interval_secs: seconds between progress lines.
        seed: seeds TF's global generator and the environments (None: unseeded).
        stop_event: a `threading.Event`; once set, the loop stops cleanly
            (checkpoint written) at the end of the iteration.
        print_fn: callable(str) for the progress lines (default: print to stdout,
            flushed).

    Returns:
        A `TrainResult`.

    Raises:
        ConfigError: a bad argument (before anything is built).
        The first error of any driver thread, with its type, after every
        thread was stopped.
    """
    _check_args(**{k: v for k, v in locals().items()})
    print_fn = print_fn or _print_flush
    root_dir = os.path.expanduser(root_dir)
    train_dir = os.path.join(root_dir, "train")
    eval_dir = os.path.join(root_dir, "eval")
    try:
        built = _build(root_dir, env_name, agent_fn, suite, make_env_constructor, replayer_fn, num_envs,
                       env_batch_size, num_actor_queues, actor_queue_cap, unroll_length,
                       learn_queue_cap, num_eval_episodes, seed)
    except (ValueError, TypeError) as e:
        # Nothing has started yet: a bad name, spec or queue configuration.
        raise ConfigError(one_line(e)) from e
    agent, driver, replayer, eval_env, checkpointer, counters, global_step = built
    try:
        if checkpointer.checkpoint_exists:
            print_fn(f"[alf_async] resumed from {checkpointer.manager.latest_checkpoint}: "
                     f"global step {int(global_step)}, env steps {int(counters.env_steps)}, "
                     f"iteration {int(counters.iterations)}")
        loop = _Loop(
            root_dir=root_dir, agent=agent, driver=driver, replayer=replayer,
            checkpointer=checkpointer, counters=counters, global_step=global_step,
            evaluator=Evaluator(eval_env, agent.policy) if num_eval_episodes else None,
            train_writer=tf.summary.create_file_writer(train_dir),
            eval_writer=tf.summary.create_file_writer(eval_dir),
            num_iterations=num_iterations, num_env_steps=num_env_steps,
            initial_collect_steps=initial_collect_steps or 0,
            train_steps_per_iteration=train_steps_per_iteration,
            sample_batch_size=sample_batch_size, eval_interval=eval_interval,
            stop_at_eval_return=stop_at_eval_return, summary_interval=summary_interval,
            checkpoint_interval=checkpoint_interval, log_interval_secs=log_interval_secs,
            stop_event=stop_event, print_fn=print_fn)
    except BaseException:
        driver.stop()
        eval_env.close()
        raise
    try:
        return loop.run()
    finally:
        eval_env.close()


def _build(root_dir, env_name, agent_fn, suite, make_env_constructor, replayer_fn, num_envs,
           env_batch_size, num_actor_queues, actor_queue_cap, unroll_length, learn_queue_cap,
           num_eval_episodes, seed):
    """Environments, agent, replayer, driver (not started) and the restored checkpoint."""
    if seed is not None:
        tf.random.set_seed(seed)
    # The specs come from the evaluation environment.
    eval_seed = None if seed is None else seed + 1000003
    eval_env = suites.load(suite, env_name, batch_size=max(1, num_eval_episodes or 0),
                           seed=eval_seed)
    try:
        global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        agent = agent_fn(eval_env.time_step_spec(), eval_env.action_spec(), global_step)
        agent.initialize()
        env_f = make_env_constructor(suite, env_name, batch_size=env_batch_size, seed=seed)
        replayer = replayer_fn(data_spec=agent.collect_data_spec,
                               num_rows=num_envs * env_batch_size)
        driver = AsyncOffPolicyDriver(
            env_f, agent.collect_policy, num_envs=num_envs, num_actor_queues=num_actor_queues,
            unroll_length=unroll_length, learn_queue_cap=learn_queue_cap,
            actor_queue_cap=actor_queue_cap, exp_observers=[replayer])
    except BaseException:
        eval_env.close()
        raise
    try:
        counters = _Counters()
        checkpointer = common.Checkpointer(
            ckpt_dir=os.path.join(root_dir, "train"), max_to_keep=2, agent=agent,
            global_step=global_step, counters=counters, replay_buffer=replayer,
            metrics=metric_utils.MetricsGroup(driver.get_metrics(), "train_metrics"))
        checkpointer.initialize_or_restore()
    except BaseException:
        driver.stop()
        eval_env.close()
        raise
    return agent, driver, replayer, eval_env, checkpointer, counters, global_step


class _WarmUp(object):
    """Graph builds the learner hands to one helper thread, to overlap them
    with its own work (see `_Loop._start_up`).

    Threads: the learner's thread calls every method; the helper thread
    ("alf_async_warm_up") runs the jobs in order. A job is one bounded call —
    a trace, or a graph call that waits on nothing — so `wait` and `close`
    block at most that long.
    """

    def __init__(self):
        self._executor = None
        self._jobs = {}

    def submit(self, name, fn, *args):
        """Queues `fn(*args)` on the helper thread as job `name`."""
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="alf_async_warm_up")
        self._jobs[name] = self._executor.submit(fn, *args)

    def wait(self, name):
        """Waits for job `name` (if submitted and not waited for yet); raises
        its error, with its type."""
        future = self._jobs.pop(name, None)
        if future is not None:
            future.result()

    def close(self, reraise=True):
        """Waits for every job and ends the thread; raises the first job's error
        unless `reraise` is False (an error is in flight already: it is logged)."""
        jobs, self._jobs = self._jobs, {}
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        for name, future in jobs.items():
            error = future.exception()
            if error is None:
                continue
            if reraise:
                raise error
            logger.error("warm-up job %r failed too", name, exc_info=error)


class _Loop(object):
    """The body of `train()` once everything is built (see `train` for the args)."""

    def __init__(self, root_dir, agent, driver, replayer, checkpointer, counters, global_step,
                 evaluator, train_writer, eval_writer, num_iterations, num_env_steps,
                 initial_collect_steps, train_steps_per_iteration, sample_batch_size,
                 eval_interval, stop_at_eval_return, summary_interval, checkpoint_interval,
                 log_interval_secs, stop_event, print_fn):
        self.__dict__.update({k: v for k, v in locals().items() if k != "self"})
        self._num_steps = agent.train_sequence_length
        # One sample + agent.train (traced once), and the iteration: that step
        # train_steps_per_iteration times in one graph call (see _train_graph).
        self._train_step = common.function(self._train_step_graph)
        self._train_iteration = common.function(
            self._train_graph, input_signature=[tf.TensorSpec([], tf.int32)])
        self._train_iteration_fn = None  # its ConcreteFunction (see _train_fn)
        self._steps_per_iteration = tf.constant(train_steps_per_iteration)
        self._training = False  # see _can_train
        self._warm_up = _WarmUp()
        self._health = DriverHealth(driver)
        self._evaluations = []
        self._solved_secs = None
        self._loss = None
        self._config_written = False

    def _train_step_graph(self):
        """One sample + agent.train (sampling reads the replayer's variables, so
        it sees every write)."""
        experience = self.replayer.sample(self.sample_batch_size, self._num_steps)
        return self.agent.train(experience)

    def _train_graph(self, num_steps):
        """`num_steps` train steps in one graph call; returns the last step's
        LossInfo (zeros if `num_steps` is 0).

        The step is traced once, as its own function, and called from a
        tf.while_loop: one call per iteration instead of one per train step
        spares the learner's thread ~0.2 ms of Python and a GIL hand-off per
        step (the env and actor threads need the GIL too).

        `num_steps` 0 is the dry call: it trains nothing but makes TF
        instantiate the whole graph (grappler, kernels), which it otherwise
        does inside the first real call, ~0.2 s on CartPole; `_start_up` makes
        it on a helper thread.
        """
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

    def _can_train(self):
        """Whether training may start (it then goes on: replayers only grow)."""
        self._training = (int(self.counters.env_steps) >= self.initial_collect_steps and
                          self.replayer.can_sample(self._num_steps or 1))
        if self._training and self.evaluator is not None:
            self._warm_up.submit("eval", self.evaluator.trace)
        return self._training

    def _train_fn(self):
        """The traced iteration, called as a ConcreteFunction: a tf.function's
        own dispatch (signature binding, cache lookup) costs ~70 us more."""
        if self._train_iteration_fn is None:
            self._train_iteration_fn = self._train_iteration.get_concrete_function()
        return self._train_iteration_fn

    def _should_stop(self):
        if self.stop_event is not None and self.stop_event.is_set():
            return "stop_event"
        if (self.num_iterations is not None and
                int(self.counters.iterations) >= self.num_iterations):
            return "num_iterations"
        if self.num_env_steps is not None and int(self.counters.env_steps) >= self.num_env_steps:
            return "num_env_steps"
        if self._solved_secs is not None:
            return "stop_at_eval_return"
        return None

    def run(self):
        self._start = time.monotonic()
        self._last_log = (self._start, int(self.counters.env_steps), int(self.global_step))
        try:
            stopped_by = self._run_driver()
        except BaseException:
            # Every error exit ends the helper thread too (its own error is
            # logged: the one in flight is reported).
            self._warm_up.close(reraise=False)
            raise
        self._warm_up.close()
        self._finish(stopped_by)
        return TrainResult(int(self.global_step), int(self.counters.env_steps),
                           int(self.counters.iterations), stopped_by, self._evaluations,
                           self._solved_secs)

    def _run_driver(self):
        """Starts the driver, runs the loop, stops the driver; returns why it stopped."""
        stopped_by = None
        try:
            # The agent's own summaries (tf-agents' Losses/...) every summary_interval.
            with tf.summary.record_if(
                    lambda: tf.equal(self.global_step % self.summary_interval, 0)):
                with self.train_writer.as_default():
                    self._start_up()
                    stopped_by = self._loop()
        except DriverStoppedError:
            if self.stop_event is None or not self.stop_event.is_set():
                raise
            stopped_by = "stop_event"
        except BaseException:
            # An error (or a second Ctrl-C): stop the threads, keep the last checkpoint.
            self._stop_driver_after_error()
            raise
        self.driver.stop()  # raises a driver thread's error not raised yet
        return stopped_by

    def _start_up(self):
        """Starts the driver and builds the graphs the loop runs first,
        overlapping what can overlap on a 2-core machine (done one after
        another, ~0.9 s of a ~2 s CartPole solve went by before the first
        train step).

        Tracing is Python and holds the GIL; TF's instantiation of a traced
        function (grappler, kernels) is C++ that mostly releases it. So this
        thread traces the train iteration first, the helper thread
        instantiates it by a dry call (`_train_graph` with 0 steps) while the
        env and actor threads trace their loops and this thread traces the
        replayer's write. The evaluation is traced on the helper thread once
        training starts (`_can_train`), off the way of the first unrolls.
        """
        if getattr(self.replayer, "traceable_before_data", False):
            self._warm_up.submit("train", self._train_fn(), tf.constant(0))
        self.driver.start()
        if hasattr(self.replayer, "trace"):
            self.replayer.trace()

    def _stop_driver_after_error(self):
        try:
            self.driver.stop()
        except Exception:  # the error in flight is the one to report
            logger.exception("stopping the driver after an error raised too")

    def _loop(self):
        while True:
            stopped_by = self._should_stop()
            if stopped_by is not None:
                return stopped_by
            steps = self.driver.run_async()
            self.counters.iterations.assign_add(1, read_value=False)
            self.counters.env_steps.assign_add(steps, read_value=False)
            before = int(self.global_step)
            if self._training or self._can_train():
                self._warm_up.wait("train")
                self._loss = self._train_fn()(self._steps_per_iteration)
                if not self._config_written:
                    self._write_operative_config()
            after = int(self.global_step)
            self._on_intervals(before, after)

    def _on_intervals(self, before, after):
        if after > before and _crossed(before, after, self.summary_interval):
            self._write_summaries(after)
        if after > before and self.evaluator is not None and _crossed(
                before, after, self.eval_interval):
            self._evaluate(after)
        if after > before and _crossed(before, after, self.checkpoint_interval):
            self.checkpointer.save(global_step=self.global_step)
        now = time.monotonic()
        if now - self._last_log[0] >= self.log_interval_secs:
            self._print_progress(now)

    def _write_summaries(self, step):
        with tf.summary.record_if(True):
            for metric in self.driver.get_metrics():
                metric.tf_summaries(train_step=self.global_step,
                                    step_metrics=self.driver.get_step_metrics())
            if self._loss is not None:
                _write_loss(self._loss, step)
            self._health.write(step)

    def _evaluate(self, step):
        self._warm_up.wait("eval")
        average_return, average_length = self.evaluator()
        secs = time.monotonic() - self._start
        env_steps = int(self.counters.env_steps)
        self._evaluations.append((secs, step, env_steps, average_return, average_length))
        with self.eval_writer.as_default(), tf.summary.record_if(True):
            tf.summary.scalar("Metrics/AverageReturn", average_return, step=step)
            tf.summary.scalar("Metrics/AverageEpisodeLength", average_length, step=step)
            tf.summary.scalar("Metrics_vs_EnvironmentSteps/AverageReturn", average_return,
                              step=env_steps)
        self.print_fn(f"[alf_async] eval at train step {step} ({secs:.1f} s, {env_steps} env "
                      f"steps): AverageReturn {average_return:.1f} over "
                      f"{self.evaluator.num_episodes} episodes, AverageEpisodeLength "
                      f"{average_length:.1f}")
        if (self.stop_at_eval_return is not None and self._solved_secs is None and
                average_return >= self.stop_at_eval_return):
            self._solved_secs = secs

    def _print_progress(self, now):
        t0, env0, step0 = self._last_log
        env_steps, step = int(self.counters.env_steps), int(self.global_step)
        dt = max(now - t0, 1e-9)
        average_return = float(self.driver.get_metrics()[2].result())
        loss = "-" if self._loss is None else f"{float(self._loss.loss):.4g}"
        self.print_fn(
            f"[alf_async] iteration {int(self.counters.iterations)} | env steps {env_steps} "
            f"({(env_steps - env0) / dt:.0f}/s) | train steps {step} ({(step - step0) / dt:.0f}/s)"
            f" | AverageReturn {average_return:.1f} | loss {loss}")
        self._last_log = (now, env_steps, step)

    def _write_operative_config(self):
        step = int(self.global_step)
        path = os.path.join(self.root_dir, f"operative_config-{step}.gin")
        tf.io.gfile.makedirs(self.root_dir)
        with tf.io.gfile.GFile(path, "w") as f:
            f.write(gin.operative_config_str())
        self._config_written = True

    def _finish(self, stopped_by):
        """After a clean stop (the driver is stopped): last summaries, checkpoint."""
        step = int(self.global_step)
        with self.train_writer.as_default():
            self._write_summaries(step)
        self.train_writer.flush()
        self.eval_writer.flush()
        if not self._config_written:
            self._write_operative_config()
        self.checkpointer.save(global_step=self.global_step)
        self._print_progress(time.monotonic())
        self.print_fn(f"[alf_async] stopped ({stopped_by}) at iteration "
                      f"{int(self.counters.iterations)}, train step {step}, env steps "
                      f"{int(self.counters.env_steps)}; checkpoint in "
                      f"{self.checkpointer.manager.directory}")
