"""train(): the gin-configurable wiring of a training run.

    train(root_dir, env_name='CartPole-v0', agent_fn=agents.dqn_agent, ...)

builds (tf-agents train_eval style) the environments (`suites`), a tf-agents
agent (`agent_fn`: `agents.dqn_agent`, `agents.sac_agent`, or any callable
returning a TFAgent), a replayer (`replayers`), the AsyncOffPolicyDriver
acting with `agent.collect_policy` and feeding the replayer, the
checkpointer, and a `learner.Learner` with its hooks (summaries, evaluation,
checkpoints, progress lines, the operative config), then runs the learner
until `num_iterations`, `num_env_steps`, `stop_at_eval_return` or
`stop_event`. Everything lives under `root_dir`:

    root_dir/train/   checkpoints (agent + optimizers, replay buffer, metrics,
                      counters) and training summaries
    root_dir/eval/    evaluation summaries
    root_dir/replay/  Reverb's checkpoints of the replay table (ReverbReplayer)
    root_dir/operative_config-<global step>.gin

With `num_collectors > 0` the run is a learner fed by that many collector
processes (or Ray actors; `train.collector_launcher`) through a Reverb server in
this process, and steps no environment itself but the evaluation's (see
alf_async.distributed.learner_role); it also writes root_dir/replay_address,
root_dir/collector_config.gin and root_dir/collectors/<i>/ (each
collector's summaries and log.txt).

Running again on the same root_dir restores the latest checkpoint: the
global (train) step, the iteration and env-step counters and the metrics go
on where they were; `num_iterations` / `num_env_steps` are totals. A run
that is finished (a limit reached, or solved) returns at once, building
nothing. Changed settings apply on resume (the learning rates too, over the
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

from alf_async import kernels
from alf_async.learning import checkpoint_files
from alf_async.learning import agents  # registers dqn_agent, sac_agent, ppo_agent, impala_agent
from alf_async.learning import pixel_replayer, policy_lag, replayers  # pixel_replayer: @PixelReplayer
from alf_async import resume
from alf_async.serving import job
from alf_async.driver import AsyncOffPolicyDriver, DriverStoppedError
from alf_async.driver import layout as layout_lib
from alf_async.environments import suites
from alf_async.learning.background_evaluation import BackgroundEvaluationHook, PolicySnapshot
from alf_async.learning.evaluation import Evaluator, eval_policy
from alf_async.learning.learner import Learner, LearnerCounters
from alf_async.learning.hooks import (CheckpointHook, EvaluationHook, ProgressHook, SolvedRecord,
                                     StopWaker, SummaryHook)
from alf_async.learning.random_start import RandomStartPolicy
from alf_async.train_checks import (ConfigError, IncompatibleCheckpointError, check_args,
                                    check_unroll_agent)

TrainResult = collections.namedtuple("TrainResult", [
    "global_step", "env_steps", "iterations", "stopped_by", "evaluations", "solved_secs"])
TrainResult.__doc__ = """What `train()` did.

global_step / env_steps / iterations: the totals at exit (resumed runs included).
stopped_by: 'num_iterations', 'num_env_steps', 'stop_at_eval_return', 'stop_event', or
    'already_finished' (root_dir's run was finished before: nothing ran).
evaluations: [(seconds since the loop started, global step, env steps,
    average return, average episode length)] of this run.
solved_secs: seconds from the loop's start to the first evaluation whose
    average return reached `stop_at_eval_return` (None if none did).
"""


def one_line(error):
    """An error message on one line, without gin's "In call to configurable" lines
    (the message already names the binding)."""
    return " | ".join(line.strip() for line in str(error).splitlines()
                      if line.strip() and not line.strip().startswith("In call to configurable"))


def _print_flush(line):
    print(line, flush=True)


def _set_threads(inter_op_threads, intra_op_threads):
    """Sizes TF's thread pools; only possible before TF runs its first op."""
    threading_config = tf.config.threading
    for name, value, get, set_ in (
            ("inter_op_threads", inter_op_threads,
             threading_config.get_inter_op_parallelism_threads,
             threading_config.set_inter_op_parallelism_threads),
            ("intra_op_threads", intra_op_threads,
             threading_config.get_intra_op_parallelism_threads,
             threading_config.set_intra_op_parallelism_threads)):
        if value is None or get() == value:
            continue
        try:
            set_(value)
        except RuntimeError:
            raise ConfigError(
                f"train.{name} = {value} cannot be applied: TensorFlow already ran ops in "
                f"this process (call train() before anything else uses TensorFlow)") from None


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
          layout=None,
          layout_budget_secs=20.0,
          unroll_length=8,
          learn_queue_cap=1,
          batches_ahead=None,
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
          inter_op_threads=None,
          intra_op_threads=None,
          seed=None,
          stop_event=None,
          print_fn=None,
          random_initial_collect=False,
          greedy_eval=False,
          eval_epsilon=None,
          eval_env_kwargs=None,
          async_eval=False,
          num_collectors=0,
          collector_launcher="local",
          kernel_choice="auto"):
    """Trains `agent_fn`'s agent on `env_name` with the AsyncOffPolicyDriver.

    Args:
        root_dir: where checkpoints, summaries and the operative config go.
        env_name: the environment's name in `suite` ('CartPole-v0').
        agent_fn: callable(time_step_spec, action_spec, train_step_counter)
            -> TFAgent (`dqn_agent`, `sac_agent`, ...).
        suite: the environment suite (see `suites.load`).
        make_env_constructor: callable(suite, env_name, batch_size, seed) ->
            the driver's env constructor (`suites.make_env_constructor`,
            `make_subprocess_env_constructor`, `make_ray_env_constructor`).
        replayer_fn: callable(data_spec, num_rows) -> replayer
            (`replayers.UniformReplayer`, `pixel_replayer.PixelReplayer`,
            `replayers.OneTimeReplayer`,
            `reverb_replayer.ReverbReplayer`: also given
            checkpoint_dir=root_dir/replay, checkpointed with the agent,
            its rate limiter checked against this schedule, closed at exit).
        num_envs: env threads of the driver (one environment each).
        env_batch_size: environments batched in each env thread's environment.
        num_actor_queues: actor threads; 0: none, each env thread acts
            itself (no actor queue round trip; see docs/performance.md).
        actor_queue_cap: at most this many env threads' requests per batched
            forward pass (an actor takes what is waiting, up to the cap).
        layout: None: the four settings above as bound. 'auto': this run's
            environments and collect policy are measured for up to 20 s at
            its start in candidate layouts of the same num_envs x
            env_batch_size rows (`alf_async.driver.layout.choose_layout`,
            child processes among them for suite_gym, suite_gymnasium and
            suite_atari with the default `make_env_constructor`); the fastest
            runs, one line names it with the runner-up's rate, the operative
            config binds train.layout to it, and a resumed run reuses it
            without measuring. Or a layout as that line names it ('2x8, 1
            actor queue (cap 2), in process'), run as given. A learner batch
            keeps its learn_queue_cap x env_batch_size rows: learn_queue_cap
            follows the layout's env_batch_size.
        layout_budget_secs: seconds `layout = 'auto'` measures for at most.
        unroll_length: steps per unroll.
        learn_queue_cap: unrolls per learner batch; one iteration brings
            learn_queue_cap * env_batch_size * unroll_length env steps.
        batches_ahead: None: the env threads collect whenever the learn
            queue has room. k >= 1: they begin at most k batches the learner
            has not taken, which caps the policy lag at k batches' train
            steps (`AsyncOffPolicyDriver`'s batches_ahead; for PPO, see
            docs/training.md). Needs num_envs <= k * learn_queue_cap.
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
        inter_op_threads: TF's inter-op thread pool size (None: TF's default,
            one per core); each graph-mode env thread's Python step and
            each actor thread hold one while they run.
        intra_op_threads: TF's intra-op thread pool size (None: TF's default).
        seed: seeds TF's global generator and the environments (None: unseeded).
        stop_event: a `threading.Event`; once set, the loop stops cleanly
            (checkpoint written) at the end of the iteration, or at once
            if it is waiting for experience (a serving job without clients).
        print_fn: callable(str) for the progress lines (default: print to stdout,
            flushed).
        random_initial_collect: act with uniform random actions until the
            first train step (`random_start.RandomStartPolicy`), so the
            `initial_collect_steps` are random ones as in published SAC
            results; False acts with `agent.collect_policy` from the start.
        greedy_eval: evaluate tf-agents' `GreedyPolicy(agent.policy)` (the
            mode of the action distribution: SacAgent's `policy` samples);
            False evaluates `agent.policy` itself (greedy already for DQN).
        eval_epsilon: if set, evaluation acts uniformly at random with this
            probability (epsilon-greedy around the evaluated policy), as
            published Atari evaluations do (0.001 in Dopamine, 0.05 in Mnih
            et al. 2015): a fully greedy Breakout agent may never serve the
            ball again. None: no random actions.
        eval_env_kwargs: more keyword arguments of `suites.load` for the
            evaluation environments only (e.g. Mnih et al. 2015's 5-minute
            evaluation games: {'max_num_frames_per_episode': 18000} for
            suite_atari). None: the training environments' settings.
        async_eval: evaluate on a thread of its own while the learner
            trains on (ALF's async_eval; `background_evaluation.
            BackgroundEvaluationHook`), a snapshot of the policy taken at
            each `eval_interval`; False: on the learner's thread, training
            paused meanwhile.
        num_collectors: collector processes that feed this learner through
            a Reverb server here (0, the default: this process collects
            itself). With K > 0 this process only learns and evaluates
            (needs `replayer_fn = @ReverbReplayer`; see learner_role.py).
        collector_launcher: how the K collectors start: 'local' (child
            processes), 'ray' (Ray actors) or 'none' (by hand, with
            alf-async-collect); see distributed/launcher.py.
        kernel_choice: 'auto' (the fastest kernels this CPU has, chosen for
            the run's networks) or 'off' (TensorFlow's defaults; 'auto'
            torsos compute in float32): see `alf_async.kernels`. TensorFlow
            reads its kernels when it is imported, so alf-async-train (and
            alf-async-collect) read this binding from the gin files before
            importing it; a Python program calls
            `kernels.apply(kernels.choose_for_gin(gin_files))` before its
            first TensorFlow import. train() itself checks the value, and
            prints the line of the choice applied (`kernels.start_line`)
            once the run is built.

    Returns:
        A `TrainResult`.

    Raises:
        ConfigError: a bad argument (before anything is built).
        Exception: the first error of any driver thread, with its type,
            after every thread was stopped.
    """
    check_args(**{k: v for k, v in locals().items()})
    _set_threads(inter_op_threads, intra_op_threads)
    print_fn = print_fn or _print_flush
    root_dir = os.path.expanduser(root_dir)
    done = resume.finished(root_dir, num_iterations, num_env_steps, stop_at_eval_return)
    if done is not None:
        print_fn(f"[alf_async] {root_dir} is finished: {done.reason} (iteration "
                 f"{done.iterations}, train step {done.global_step}, env steps "
                 f"{done.env_steps}); nothing to do. Raise the limit to train on, or use a "
                 f"new --root_dir to start fresh")
        return TrainResult(done.global_step, done.env_steps, done.iterations,
                           "already_finished", [], None)
    try:
        built = _build(root_dir, env_name, agent_fn, suite, make_env_constructor, replayer_fn,
                       num_envs, env_batch_size, num_actor_queues, actor_queue_cap,
                       unroll_length, learn_queue_cap, num_eval_episodes, seed,
                       random_initial_collect, num_collectors, collector_launcher,
                       train_steps_per_iteration * sample_batch_size, print_fn,
                       eval_env_kwargs, train_steps_per_iteration, initial_collect_steps,
                       layout, layout_budget_secs, stop_event, batches_ahead)
    except ConfigError:
        raise
    except DriverStoppedError:
        if stop_event is None or not stop_event.is_set():
            raise
        # Stopped while measuring layouts: nothing was trained or written.
        print_fn("[alf_async] stopped (stop_event) while measuring layouts; nothing was run")
        return TrainResult(0, 0, 0, "stop_event", [], None)
    except (ValueError, TypeError) as e:
        # Nothing has started yet: a bad name, spec or queue configuration.
        raise ConfigError(one_line(e)) from e
    agent, driver, replayer, eval_env, env_constructor, checkpointer, counters, solved, \
        changed, chosen = built
    distributed = env_constructor if num_collectors else None
    try:
        if hasattr(replayer, "check_schedule") and not distributed:  # Reverb, in one process
            try:
                replayer.check_schedule(train_steps_per_iteration * sample_batch_size,
                                        learn_queue_cap * env_batch_size * unroll_length)
            except ValueError as e:
                raise ConfigError(one_line(e)) from e
        if kernels.start_line():   # what alf-async-train chose before TensorFlow loaded
            print_fn(kernels.start_line())
        if checkpointer.checkpoint_exists:
            print_fn(f"[alf_async] resumed from {checkpointer.manager.latest_checkpoint}: "
                     f"global step {int(agent.train_step_counter)}, env steps "
                     f"{int(counters.env_steps)}, iteration {int(counters.iterations)}")
        for line in changed:
            print_fn(f"[alf_async] the config's value applies: {line}")
        evaluation = _evaluation_hook(
            agent, agent_fn, eval_env, root_dir, async_eval, greedy_eval, eval_epsilon,
            eval_interval, stop_at_return=stop_at_eval_return, print_fn=print_fn,
            solved=solved) if num_eval_episodes else None
        hooks = [resume.OperativeConfigHook(root_dir,
                                            layout=chosen if layout == "auto" else None),
                 SummaryHook(summary_interval), evaluation,
                 CheckpointHook(checkpointer, checkpoint_interval,
                                replay=replayer if hasattr(replayer, "checkpoint") else None),
                 ProgressHook(print_fn, log_interval_secs)]
        if isinstance(env_constructor, job.ServingEnvConstructor):
            hooks.append(job.ServingAnnouncement(env_constructor, root_dir, print_fn))
        if distributed:
            hooks.extend(distributed.hooks)
        if stop_event is not None:
            hooks.append(StopWaker(stop_event))   # the last: begins once every other hook has
        learner = Learner(
            agent, driver, replayer, train_steps_per_iteration=train_steps_per_iteration,
            sample_batch_size=sample_batch_size, initial_collect_steps=initial_collect_steps,
            hooks=[h for h in hooks if h is not None], counters=counters,
            summary_writer=tf.summary.create_file_writer(os.path.join(root_dir, "train")),
            summary_interval=summary_interval, stop_event=stop_event)
    except BaseException:
        driver.stop()
        _close_envs(eval_env, env_constructor)
        _close(replayer)
        raise
    try:
        stopped_by = learner.run(num_iterations=num_iterations, num_env_steps=num_env_steps)
    finally:
        _close_envs(eval_env, env_constructor)
        _close(replayer)
    print_fn(f"[alf_async] stopped ({stopped_by}) at iteration {learner.iterations}, train "
             f"step {learner.train_step}, env steps {learner.env_steps}; checkpoint in "
             f"{checkpointer.manager.directory}")
    return TrainResult(learner.train_step, learner.env_steps, learner.iterations, stopped_by,
                       evaluation.evaluations if evaluation else [],
                       evaluation.solved_secs if evaluation else None)


def _evaluation_hook(agent, agent_fn, eval_env, root_dir, async_eval, greedy, epsilon,
                     interval, **kwargs):
    """The evaluation's hook: on the learner's thread, or with `async_eval`
    on its own, evaluating a second agent of `agent_fn` that takes a
    snapshot of `agent.policy`'s variables."""
    name = "greedy policy" if epsilon is None else f"epsilon-greedy policy ({epsilon:g})"
    writer = tf.summary.create_file_writer(os.path.join(root_dir, "eval"))
    if not async_eval:
        return EvaluationHook(Evaluator(eval_env, eval_policy(agent.policy, greedy, epsilon)),
                              writer, interval, policy_name=name, **kwargs)
    shadow = agent_fn(eval_env.time_step_spec(), eval_env.action_spec(),
                      tf.Variable(0, dtype=tf.int64, trainable=False, name="eval_step"))
    return BackgroundEvaluationHook(
        Evaluator(eval_env, eval_policy(shadow.policy, greedy, epsilon)),
        PolicySnapshot(agent.policy, shadow.policy), writer, interval, policy_name=name,
        **kwargs)


def _close(replayer):
    """Closes a replayer that owns resources (a Reverb server)."""
    if hasattr(replayer, "close"):
        replayer.close()


def _build(root_dir, env_name, agent_fn, suite, make_env_constructor, replayer_fn, num_envs,
           env_batch_size, num_actor_queues, actor_queue_cap, unroll_length, learn_queue_cap,
           num_eval_episodes, seed, random_initial_collect=False, num_collectors=0,
           collector_launcher="local", samples_per_iteration=None, print_fn=None,
           eval_env_kwargs=None, train_steps_per_iteration=1, initial_collect_steps=0,
           layout=None, layout_budget_secs=20.0, stop_event=None, batches_ahead=None):
    """Environments, agent, replayer, driver (not started), the restored
    checkpoint, the hyperparameters whose config value replaced the
    checkpoint's (see alf_async.resume), and the layout `layout` gave (its
    name; None without one). With `num_collectors` the driver is a
    `learner_role.ReplayFeed` and the env constructor's place holds the
    learner role's pieces (`learner_role.Built`)."""
    if seed is not None:
        tf.random.set_seed(seed)
    # The specs come from the evaluation environment.
    eval_seed = None if seed is None else seed + 1000003
    eval_env = suites.load(suite, env_name, batch_size=max(1, num_eval_episodes or 0),
                           seed=eval_seed, **(eval_env_kwargs or {}))
    replayer = None
    env_constructor = None
    chosen = None
    try:
        global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        agent = agent_fn(eval_env.time_step_spec(), eval_env.action_spec(), global_step)
        agent.initialize()
        if agents.trains_on_unrolls(agent):
            check_unroll_agent(agent, replayer_fn, train_steps_per_iteration,
                                random_initial_collect, num_collectors, initial_collect_steps)
        if num_collectors:
            from alf_async.distributed import learner_role  # pylint: disable=import-outside-toplevel
            env_constructor = learner_role.build(
                root_dir, agent, replayer_fn, num_envs * env_batch_size, num_collectors,
                collector_launcher, samples_per_iteration, seed, print_fn,
                unroll_length=unroll_length, batch_rows=learn_queue_cap * env_batch_size)
            replayer, driver = env_constructor.replayer, env_constructor.feed
        else:
            if layout is not None:
                run_layout = _run_layout(
                    root_dir, layout, suite, env_name, seed, make_env_constructor,
                    agent.collect_policy, num_envs * env_batch_size,
                    learn_queue_cap * env_batch_size, unroll_length, layout_budget_secs,
                    stop_event, print_fn)
                chosen = layout_lib.format_layout(run_layout)
                learn_queue_cap = learn_queue_cap * env_batch_size // run_layout.env_batch_size
                num_envs, env_batch_size, num_actor_queues, actor_queue_cap = run_layout[:4]
                if run_layout.processes:
                    make_env_constructor = suites.make_subprocess_env_constructor
                if run_layout.recv_batch_size is not None:
                    make_env_constructor = functools.partial(
                        make_env_constructor, recv_batch_size=run_layout.recv_batch_size)
            replayer, driver, env_constructor = _build_collection(
                root_dir, env_name, agent, suite, make_env_constructor, replayer_fn, num_envs,
                env_batch_size, num_actor_queues, actor_queue_cap, unroll_length,
                learn_queue_cap, seed, random_initial_collect, global_step, batches_ahead)
    except BaseException:
        _close_envs(eval_env, env_constructor)
        _close(replayer)
        raise
    try:
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
                ckpt_dir=ckpt_dir, max_to_keep=2, agent=agent,
                global_step=global_step, counters=counters, replay_buffer=replayer,
                metrics=metric_utils.MetricsGroup(driver.get_metrics(), "train_metrics"),
                solved=solved)
            checkpointer.initialize_or_restore()
        except (ValueError, TypeError, AssertionError, tf.errors.OpError) as e:
            raise IncompatibleCheckpointError(resume.incompatible_message(
                root_dir, e, gin.operative_config_str())) from e
        changed = resume.apply_config(configured)
    except BaseException:
        driver.stop()
        _close_envs(eval_env, env_constructor)
        _close(replayer)
        raise
    return (agent, driver, replayer, eval_env, env_constructor, checkpointer, counters, solved,
            changed, chosen)


def _run_layout(root_dir, layout, suite, env_name, seed, make_env_constructor, policy, rows,
                batch_rows, unroll_length, budget_secs, stop_event, print_fn):
    """The `layout_lib.Layout` this run runs (see `train`'s `layout`): the one
    given, the one 'auto' chose when root_dir's run started, or the fastest
    measured now.

    Raises:
        ValueError: a layout that does not fit this run (`layout_lib.check_layout`).
        DriverStoppedError: `stop_event` was set while measuring.
    """
    processes = (make_env_constructor is suites.make_env_constructor and
                 suite in suites.SINGLE_ENV_SUITES)
    saved = resume.saved_layout(root_dir) if layout == "auto" else None
    if saved is not None:
        print_fn(f"[alf_async] layout {saved}: chosen when this run started "
                 f"(train.layout = 'auto'), not measured again")
    if layout != "auto" or saved is not None:
        run_layout = layout_lib.parse_layout(saved or layout)
    else:
        print_fn(f"[alf_async] train.layout = 'auto': measuring layouts of {rows} environments "
                 f"for up to {budget_secs:g} s")
        in_process = suites.sized_env_constructor(make_env_constructor, suite, env_name, seed)
        in_children = suites.sized_env_constructor(suites.make_subprocess_env_constructor,
                                                   suite, env_name, seed)
        choice = layout_lib.choose_layout(
            in_process, policy, rows,
            process_env_constructor=in_children if processes else None,
            budget_secs=budget_secs, unroll_length=unroll_length, batch_rows=batch_rows,
            stop_event=stop_event)
        print_fn(f"[alf_async] {layout_lib.describe_choice(choice)} (train.layout = 'auto')")
        run_layout = choice.layout
    layout_lib.check_layout(run_layout, rows, batch_rows, processes)
    return run_layout


def _build_collection(root_dir, env_name, agent, suite, make_env_constructor, replayer_fn,
                      num_envs, env_batch_size, num_actor_queues, actor_queue_cap, unroll_length,
                      learn_queue_cap, seed, random_initial_collect, global_step,
                      batches_ahead=None):
    """The single-process run's replayer, driver (not started) and env
    constructor; closes what it built if a later piece fails."""
    env_constructor = replayer = None
    try:
        env_constructor = make_env_constructor(suite, env_name, batch_size=env_batch_size,
                                               seed=seed)
        replayer_args = {}
        if getattr(replayer_fn, "takes_checkpoint_dir", False):
            # Replay storage outside TF's checkpoint (Reverb's own checkpointer).
            replayer_args["checkpoint_dir"] = os.path.join(root_dir, "replay")
        if getattr(replayer_fn, "takes_batch_rows", False):
            # Its batch variables made now: the learner traces its train
            # iteration while the driver collects the first batch.
            replayer_args["batch_rows"] = learn_queue_cap * env_batch_size
        collect_policy = agent.collect_policy
        unrolls = agents.trains_on_unrolls(agent)
        if unrolls:
            # Each step records the train step it was acted at (the policy lag).
            collect_policy = policy_lag.TrainStepStampedPolicy(collect_policy, global_step)
        replayer = replayer_fn(data_spec=collect_policy.trajectory_spec,
                               num_rows=num_envs * env_batch_size, **replayer_args)
        if unrolls:
            replayer = policy_lag.PolicyLag(replayer, global_step)
        if random_initial_collect:
            collect_policy = RandomStartPolicy(collect_policy, global_step)
        driver = AsyncOffPolicyDriver(
            env_constructor, collect_policy, num_envs=num_envs,
            num_actor_queues=num_actor_queues, unroll_length=unroll_length,
            learn_queue_cap=learn_queue_cap, actor_queue_cap=actor_queue_cap,
            batches_ahead=batches_ahead,
            exp_observers=[replayer])
    except BaseException:
        if isinstance(env_constructor, job.ServingEnvConstructor):
            env_constructor.close()
        _close(replayer)
        raise
    return replayer, driver, env_constructor


def _close_envs(eval_env, env_constructor):
    """Closes the evaluation environment, and a serving job's server (after the
    driver stopped; a server whose driver never started is only bound) or
    the learner role's collectors and Reverb server."""
    eval_env.close()
    if isinstance(env_constructor, job.ServingEnvConstructor) or \
            getattr(env_constructor, "is_learner_role", False):
        env_constructor.close()
