"""train(): the gin-configurable wiring of a training run.

    train(root_dir)    # every setting from gin: Task, Layout, Schedule, ...
    train(root_dir, schedule=Schedule(num_iterations=10))

builds (tf-agents train_eval style) the environments (`suites`), a tf-agents
agent (`Task.agent_fn`), a replayer (`Task.replayer_fn`), what the learner
pulls batches from (one small wiring function per mode of running:
`_in_process`, the AsyncOffPolicyDriver here, serving clients too when
`Task.make_env_constructor` is a serving one; `_with_collectors`, a Reverb
feed filled by collector processes), the checkpointer, and a
`learner.Learner` with its hooks (summaries, evaluation, checkpoints,
progress lines, the operative config), then runs the learner until the
schedule's limit, `Evaluation.stop_at_return` or `stop_event`. The settings
are the groups of `alf_async.settings`. Everything lives under `root_dir`:

    root_dir/train/   checkpoints (agent + optimizers, replay buffer, metrics,
                      counters) and training summaries
    root_dir/eval/    evaluation summaries
    root_dir/replay/  Reverb's checkpoints of the replay table (ReverbReplayer)
    root_dir/operative_config-<global step>.gin

With `Collectors.count > 0` the run is a learner fed by that many collector
processes (or Ray actors; `Collectors.launcher`) through a Reverb server in
this process, and steps no environment itself but the evaluation's (see
alf_async.distributed.learner_role); it also writes root_dir/replay_address,
root_dir/collector_config.gin and root_dir/collectors/<i>/ (each
collector's summaries and log.txt).

Running again on the same root_dir restores the latest checkpoint: the
global (train) step, the iteration and env-step counters and the metrics go
on where they were; the schedule's limits are totals. A run that is
finished (a limit reached, or solved) returns at once, building nothing.
Changed settings apply on resume (the learning rates too, over the
checkpoint's); settings that shape the checkpoint cannot change (see
alf_async.resume).

Threads: `train()` runs on the caller's thread, which becomes the learner's
(see `Learner` for what runs where and what blocks).
"""

import collections
import functools
import os

import gin
import tensorflow as tf
from tf_agents.eval import metric_utils
from tf_agents.utils import common

from alf_async import kernels, resume, roles
from alf_async.driver import AsyncOffPolicyDriver, DriverStoppedError
from alf_async.driver import layout as layout_lib
from alf_async.environments import suites
from alf_async.errors import ConfigError, IncompatibleCheckpointError  # noqa: F401 (re-exported)
from alf_async.learning import agents  # registers dqn_agent, sac_agent, ppo_agent, impala_agent
from alf_async.learning import checkpoint_files
from alf_async.learning import pixel_replayer, policy_lag, replayers  # pixel_replayer: @PixelReplayer
from alf_async.learning.background_evaluation import BackgroundEvaluationHook, PolicySnapshot
from alf_async.learning.evaluation import Evaluator, eval_policy
from alf_async.learning.hooks import (CheckpointHook, EvaluationHook, ProgressHook, SolvedRecord,
                                      StopWaker, SummaryHook)
from alf_async.learning.learner import Learner, LearnerCounters
from alf_async.learning.random_start import RandomStartPolicy
from alf_async.serving import job
from alf_async.settings import (Collectors, Evaluation, Layout, Outputs, Runtime, Schedule,
                                Task, check_together)
from alf_async.train_checks import check_unroll_agent

del pixel_replayer  # imported for its gin registration only

TrainResult = collections.namedtuple("TrainResult", [
    "global_step", "env_steps", "iterations", "stopped_by", "evaluations", "solved_secs"])
TrainResult.__doc__ = """What `train()` did.

global_step / env_steps / iterations: the totals at exit (resumed runs included).
stopped_by: 'num_iterations', 'num_env_steps', 'stop_at_eval_return', 'stop_event', or
    'already_finished' (root_dir's run was finished before: nothing ran).
evaluations: [(seconds since the loop started, global step, env steps,
    average return, average episode length)] of this run.
solved_secs: seconds from the loop's start to the first evaluation whose
    average return reached `Evaluation.stop_at_return` (None if none did).
"""

Collection = collections.namedtuple("Collection", ["source", "replayer", "hooks", "close"])
Collection.__doc__ = """What a mode of running wires: the `roles.BatchSource` the
learner pulls from, the replayer it samples, the hooks the mode adds, and a
callable that closes what the mode owns (called after the source stopped)."""


def one_line(error):
    """An error message on one line, without gin's "In call to configurable" lines
    (the message already names the binding)."""
    return " | ".join(line.strip() for line in str(error).splitlines()
                      if line.strip() and not line.strip().startswith("In call to configurable"))


def _print_flush(line):
    print(line, flush=True)


@gin.configurable
def train(root_dir, task=None, layout=None, schedule=None, evaluation=None, outputs=None,
          runtime=None, collectors=None, stop_event=None, print_fn=None):
    """Trains `task`'s agent on its environment with the AsyncOffPolicyDriver.

    Each settings group not given is built from gin (`Task()`, `Layout()`, ...).

    Args:
        root_dir: where checkpoints, summaries and the operative config go.
        task: a `settings.Task`: the environment, agent and replayer.
        layout: a `settings.Layout`: env threads, rows, actor queues (or its
            `choice`: 'auto' measures them).
        schedule: a `settings.Schedule`: batches, limits, train steps, pacing.
        evaluation: a `settings.Evaluation`.
        outputs: a `settings.Outputs`: summaries, checkpoints, progress lines.
        runtime: a `settings.Runtime`: TF's threads, the seed, the kernels.
        collectors: a `settings.Collectors`: collector processes (0: none).
        stop_event: a `threading.Event`; once set, the loop stops cleanly
            (checkpoint written) at the end of the iteration, or at once
            if it is waiting for experience (a serving job without clients).
        print_fn: callable(str) for the progress lines (default: print to
            stdout, flushed).

    Returns:
        A `TrainResult`.

    Raises:
        ConfigError: a bad setting (before anything is built).
        Exception: the first error of any driver thread, with its type,
            after every thread was stopped.
    """
    task, layout, schedule = task or Task(), layout or Layout(), schedule or Schedule()
    evaluation, outputs = evaluation or Evaluation(), outputs or Outputs()
    runtime, collectors = runtime or Runtime(), collectors or Collectors()
    check_together(layout, schedule, collectors)
    _set_threads(runtime)
    print_fn = print_fn or _print_flush
    root_dir = os.path.expanduser(root_dir)
    done = resume.finished(root_dir, schedule.num_iterations, schedule.num_env_steps,
                           evaluation.stop_at_return)
    if done is not None:
        print_fn(f"[alf_async] {root_dir} is finished: {done.reason} (iteration "
                 f"{done.iterations}, train step {done.global_step}, env steps "
                 f"{done.env_steps}); nothing to do. Raise the limit to train on, or use a "
                 f"new --root_dir to start fresh")
        return TrainResult(done.global_step, done.env_steps, done.iterations,
                           "already_finished", [], None)
    if runtime.seed is not None:
        tf.random.set_seed(runtime.seed)
    closers = []
    collection = None
    try:
        # The specs come from the evaluation environment.
        eval_env = suites.load(task.suite, task.env_name,
                               batch_size=max(1, evaluation.episodes),
                               seed=None if runtime.seed is None else runtime.seed + 1000003,
                               **(evaluation.env_kwargs or {}))
        closers.append(eval_env.close)
        global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        agent = task.agent_fn(eval_env.time_step_spec(), eval_env.action_spec(), global_step)
        agent.initialize()
        if agents.trains_on_unrolls(agent):
            check_unroll_agent(agent, task.replayer_fn, schedule, collectors)
        if collectors.count:
            collection, chosen = _with_collectors(root_dir, task, layout, schedule, runtime,
                                                  agent, collectors, print_fn), None
        else:
            collection, chosen = _in_process(root_dir, task, layout, schedule, runtime, agent,
                                             stop_event, print_fn)
        closers.insert(0, collection.close)
        checkpointer, counters, solved, changed = _restore(root_dir, agent, global_step,
                                                           collection, print_fn)
        evaluating = _evaluation_hook(agent, task.agent_fn, eval_env, root_dir, evaluation,
                                      print_fn, solved) if evaluation.episodes else None
        hooks = _hooks(root_dir, outputs, checkpointer, collection,
                       chosen if layout.choice == "auto" else None, evaluating, stop_event,
                       print_fn)
        _announce(print_fn, checkpointer, agent, counters, changed)
        learner = Learner(
            agent, collection.source, collection.replayer,
            train_steps_per_iteration=schedule.train_steps_per_iteration,
            sample_batch_size=schedule.sample_batch_size,
            initial_collect_steps=schedule.initial_collect_steps, hooks=hooks,
            counters=counters,
            summary_writer=tf.summary.create_file_writer(os.path.join(root_dir, "train")),
            summary_interval=outputs.summary_interval, stop_event=stop_event)
    except BaseException as e:
        if collection is not None:
            collection.source.stop()   # never started: stops nothing but its environments
        _close(closers)
        if isinstance(e, DriverStoppedError) and stop_event is not None and \
                stop_event.is_set():
            # Stopped while measuring layouts: nothing was trained or written.
            print_fn("[alf_async] stopped (stop_event) while measuring layouts; nothing was "
                     "run")
            return TrainResult(0, 0, 0, "stop_event", [], None)
        if isinstance(e, (ValueError, TypeError)) and not isinstance(e, ConfigError):
            # Nothing has started yet: a bad name, spec or queue configuration.
            raise ConfigError(one_line(e)) from e
        raise
    try:
        stopped_by = learner.run(num_iterations=schedule.num_iterations,
                                 num_env_steps=schedule.num_env_steps)
    finally:
        _close(closers)
    print_fn(f"[alf_async] stopped ({stopped_by}) at iteration {learner.iterations}, train "
             f"step {learner.train_step}, env steps {learner.env_steps}; checkpoint in "
             f"{checkpointer.manager.directory}")
    return TrainResult(learner.train_step, learner.env_steps, learner.iterations, stopped_by,
                       evaluating.evaluations if evaluating else [],
                       evaluating.solved_secs if evaluating else None)


def _set_threads(runtime):
    """Sizes TF's thread pools; only possible before TF runs its first op."""
    threading_config = tf.config.threading
    for name, value, get, set_ in (
            ("inter_op_threads", runtime.inter_op_threads,
             threading_config.get_inter_op_parallelism_threads,
             threading_config.set_inter_op_parallelism_threads),
            ("intra_op_threads", runtime.intra_op_threads,
             threading_config.get_intra_op_parallelism_threads,
             threading_config.set_intra_op_parallelism_threads)):
        if value is None or get() == value:
            continue
        try:
            set_(value)
        except RuntimeError:
            raise ConfigError(
                f"Runtime.{name} = {value} cannot be applied: TensorFlow already ran ops in "
                f"this process (call train() before anything else uses TensorFlow)") from None


def _in_process(root_dir, task, layout, schedule, runtime, agent, stop_event, print_fn):
    """The driver in this process: (a `Collection`, the name of the layout
    `Layout.choice` gave or None). A serving env constructor adds its
    announcement and closes its server."""
    batch_rows = layout.batch_rows(schedule)
    make_env_constructor = task.make_env_constructor
    chosen = None
    if layout.choice is not None:
        run_layout = _run_layout(root_dir, task, layout, batch_rows, schedule.unroll_length,
                                 runtime.seed, agent.collect_policy, stop_event, print_fn)
        chosen = layout_lib.format_layout(run_layout)
        if run_layout.processes:
            make_env_constructor = suites.make_subprocess_env_constructor
        if run_layout.recv_batch_size is not None:
            make_env_constructor = functools.partial(
                make_env_constructor, recv_batch_size=run_layout.recv_batch_size)
        layout = layout.chosen(run_layout)
    env_constructor = make_env_constructor(task.suite, task.env_name,
                                           batch_size=layout.rows_per_env_thread,
                                           seed=runtime.seed)
    serving = isinstance(env_constructor, job.ServingEnvConstructor)
    replayer = None

    def close():
        """Closes what this mode owns: a serving job's server, the replayer's resources."""
        if serving:
            env_constructor.close()
        _close_replayer(replayer)
    try:
        replayer_args = {}
        replayer_class = roles.factory_class(task.replayer_fn)
        if replayer_class and issubclass(replayer_class, roles.CheckpointedReplay):
            # Replay storage outside TF's checkpoint (Reverb's own checkpointer).
            replayer_args["checkpoint_dir"] = os.path.join(root_dir, "replay")
        if replayer_class and issubclass(replayer_class, replayers.OneTimeReplayer):
            # Its batch variables made now: the learner traces its train
            # iteration while the driver collects the first batch.
            replayer_args["batch_rows"] = batch_rows
        collect_policy = agent.collect_policy
        unrolls = agents.trains_on_unrolls(agent)
        if unrolls:
            # Each step records the train step it was acted at (the policy lag).
            collect_policy = policy_lag.TrainStepStampedPolicy(collect_policy,
                                                               agent.train_step_counter)
        replayer = task.replayer_fn(data_spec=collect_policy.trajectory_spec,
                                    num_rows=layout.rows, **replayer_args)
        if isinstance(replayer, roles.ScheduledReplay):   # Reverb, in one process
            replayer.check_schedule(
                schedule.train_steps_per_iteration * schedule.sample_batch_size,
                batch_rows * schedule.unroll_length)
        if unrolls:
            replayer = policy_lag.PolicyLag(replayer, agent.train_step_counter)
        if schedule.random_initial_collect:
            collect_policy = RandomStartPolicy(collect_policy, agent.train_step_counter)
        driver = AsyncOffPolicyDriver(env_constructor, collect_policy,
                                      exp_observers=[replayer],
                                      **layout.driver_args(schedule))
    except BaseException:
        close()
        raise
    hooks = [job.ServingAnnouncement(env_constructor, root_dir, print_fn)] if serving else []
    return Collection(driver, replayer, hooks, close), chosen


def _with_collectors(root_dir, task, layout, schedule, runtime, agent, collectors, print_fn):
    """A learner fed through Reverb by `collectors.count` collector
    processes: a `Collection`."""
    from alf_async.distributed import learner_role  # pylint: disable=import-outside-toplevel
    built = learner_role.build(
        root_dir, agent, task.replayer_fn, layout.rows, collectors.count, collectors.launcher,
        schedule.train_steps_per_iteration * schedule.sample_batch_size, runtime.seed,
        print_fn, unroll_length=schedule.unroll_length, batch_rows=layout.batch_rows(schedule))
    return Collection(built.feed, built.replayer, built.hooks, built.close)


def _run_layout(root_dir, task, layout, batch_rows, unroll_length, seed, policy, stop_event,
                print_fn):
    """The driver `layout_lib.Layout` this run runs (see `Layout.choice`):
    the one named, the one 'auto' chose when root_dir's run started, or the
    fastest measured now.

    Raises:
        ValueError: a layout that does not fit this run (`layout_lib.check_layout`).
        DriverStoppedError: `stop_event` was set while measuring.
    """
    processes = (task.make_env_constructor is suites.make_env_constructor and
                 task.suite in suites.SINGLE_ENV_SUITES)
    saved = resume.saved_layout(root_dir) if layout.choice == "auto" else None
    if saved is not None:
        print_fn(f"[alf_async] layout {saved}: chosen when this run started "
                 f"(Layout.choice = 'auto'), not measured again")
    if layout.choice != "auto" or saved is not None:
        run_layout = layout_lib.parse_layout(saved or layout.choice)
    else:
        print_fn(f"[alf_async] Layout.choice = 'auto': measuring layouts of {layout.rows} "
                 f"environments for up to {layout.auto_budget_secs:g} s")
        in_process = suites.sized_env_constructor(task.make_env_constructor, task.suite,
                                                  task.env_name, seed)
        in_children = suites.sized_env_constructor(suites.make_subprocess_env_constructor,
                                                   task.suite, task.env_name, seed)
        choice = layout_lib.choose_layout(
            in_process, policy, layout.rows,
            process_env_constructor=in_children if processes else None,
            budget_secs=layout.auto_budget_secs, unroll_length=unroll_length,
            batch_rows=batch_rows, stop_event=stop_event)
        print_fn(f"[alf_async] {layout_lib.describe_choice(choice)} (Layout.choice = 'auto')")
        run_layout = choice.layout
    layout_lib.check_layout(run_layout, layout.rows, batch_rows, processes)
    return run_layout


def _restore(root_dir, agent, global_step, collection, print_fn):
    """The checkpointer, restored from root_dir's latest checkpoint if there
    is one: (checkpointer, counters, solved record, the hyperparameters whose
    config value replaced the checkpoint's; see alf_async.resume)."""
    counters = LearnerCounters()
    solved = SolvedRecord()
    configured = resume.configured_values(agent)
    try:
        ckpt_dir = resume.checkpoint_dir(root_dir)
        left = checkpoint_files.remove_partial(ckpt_dir)
        if left:
            print_fn(f"[alf_async] removed what an unfinished checkpoint write left in "
                     f"{ckpt_dir}: {', '.join(left)}")
        checkpointer = common.Checkpointer(
            ckpt_dir=ckpt_dir, max_to_keep=2, agent=agent, global_step=global_step,
            counters=counters, replay_buffer=collection.replayer,
            metrics=metric_utils.MetricsGroup(collection.source.get_metrics(),
                                              "train_metrics"),
            solved=solved)
        checkpointer.initialize_or_restore()
    except (ValueError, TypeError, AssertionError, tf.errors.OpError) as e:
        raise IncompatibleCheckpointError(resume.incompatible_message(
            root_dir, e, gin.operative_config_str())) from e
    return checkpointer, counters, solved, resume.apply_config(configured)


def _hooks(root_dir, outputs, checkpointer, collection, chosen, evaluating, stop_event,
           print_fn):
    """The learner's hooks, in the order they run (`evaluating`: the
    evaluation's hook, or None)."""
    replay = collection.replayer
    hooks = [resume.OperativeConfigHook(root_dir, layout=chosen),
             SummaryHook(outputs.summary_interval), evaluating,
             CheckpointHook(checkpointer, outputs.checkpoint_interval,
                            replay=replay if isinstance(replay, roles.CheckpointedReplay)
                            else None),
             ProgressHook(print_fn, outputs.log_interval_secs)] + collection.hooks
    if stop_event is not None:
        hooks.append(StopWaker(stop_event))   # the last: begins once every other hook has
    return [h for h in hooks if h is not None]


def _evaluation_hook(agent, agent_fn, eval_env, root_dir, evaluation, print_fn, solved):
    """The evaluation's hook: on the learner's thread, or with
    `Evaluation.in_background` on its own, evaluating a second agent of
    `agent_fn` that takes a snapshot of `agent.policy`'s variables."""
    epsilon = evaluation.epsilon
    name = "greedy policy" if epsilon is None else f"epsilon-greedy policy ({epsilon:g})"
    writer = tf.summary.create_file_writer(os.path.join(root_dir, "eval"))
    kwargs = dict(policy_name=name, stop_at_return=evaluation.stop_at_return,
                  print_fn=print_fn, solved=solved)
    if not evaluation.in_background:
        return EvaluationHook(
            Evaluator(eval_env, eval_policy(agent.policy, evaluation.greedy, epsilon)),
            writer, evaluation.interval, **kwargs)
    shadow = agent_fn(eval_env.time_step_spec(), eval_env.action_spec(),
                      tf.Variable(0, dtype=tf.int64, trainable=False, name="eval_step"))
    return BackgroundEvaluationHook(
        Evaluator(eval_env, eval_policy(shadow.policy, evaluation.greedy, epsilon)),
        PolicySnapshot(agent.policy, shadow.policy), writer, evaluation.interval, **kwargs)


def _announce(print_fn, checkpointer, agent, counters, changed):
    """The start-up lines: the kernels chosen, a resume, changed settings."""
    if kernels.start_line():   # what alf-async-train chose before TensorFlow loaded
        print_fn(kernels.start_line())
    if checkpointer.checkpoint_exists:
        print_fn(f"[alf_async] resumed from {checkpointer.manager.latest_checkpoint}: "
                 f"global step {int(agent.train_step_counter)}, env steps "
                 f"{int(counters.env_steps)}, iteration {int(counters.iterations)}")
    for line in changed:
        print_fn(f"[alf_async] the config's value applies: {line}")


def _close_replayer(replayer):
    """Closes a replayer that owns resources (a Reverb server)."""
    if isinstance(replayer, roles.ClosableReplay):
        replayer.close()


def _close(closers):
    """Calls each closer in turn (the mode's first, the evaluation
    environment's last)."""
    for close in closers:
        close()
