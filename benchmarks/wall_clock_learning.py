"""Learning against the wall clock: alf_async's trainer vs tf-agents' synchronous loop,
SAC on MuJoCo and DQN on Atari Breakout.

    python benchmarks/wall_clock_learning.py --task HalfCheetah-v5 --seeds 0 1 2 \
        --minutes 15 --eval_every_steps 10000 --out_dir runs/wall_clock
    python benchmarks/wall_clock_learning.py --task Breakout-v5 --seeds 0 1 2 --minutes 30 \
        --eval_every_steps 4000 --report_minutes 10 20 30 --out_dir runs/wall_clock

Needs pip install -e '.[bench]' (MuJoCo and matplotlib) and, for Breakout,
'.[atari]' ('Breakout-v5': gin_configs/dqn_breakout.gin) or '.[envpool]'
('Breakout-v5-envpool': gin_configs/dqn_breakout_envpool.gin).

Breakout: both sides build the gin file's DQN agent (Nature CNN, RMSprop,
rewards clipped for training only), step the same environments
(`suites.load` of the gin's suite, 16 games), keep the same PixelReplayer
(1M steps) and train a step of 32 per 4 env steps; the evaluation is
epsilon-greedy with the gin's `Evaluation.epsilon` on games of at most
`Evaluation.env_kwargs` frames (Mnih et al. 2015's protocol: 0.05, 5
minutes) and reports game scores. Rows add frames (4 per env step) and the run's peak
resident memory.

MuJoCo: both sides read the task's gin file (sac_halfcheetah.gin,
sac_hopper.gin): the same SAC agent, environments and train steps per
iteration (a train step per env step), sample batch size, replay capacity,
initial random collection, and the same greedy evaluation
(evaluation.Evaluator over `GreedyPolicy(agent.policy)`, one episode on each
of Evaluation.episodes environments, every --eval_every_steps train steps).

- alf_async: `alf_async.trainer.train()` (the AsyncOffPolicyDriver collects
  while the learner trains), stopped by a timer after --minutes.
- tf-agents: its synchronous loop, as in its SAC train_eval: a
  DynamicStepDriver collects one iteration's env steps into a
  TFUniformReplayBuffer (RandomTFPolicy for the initial steps), then the
  iteration's train steps on the buffer's dataset, alternating. `--sync_env
  gymnasium` (default) steps a TFPyEnvironment over tf-agents'
  BatchedPyEnvironment of suite_gymnasium environments, the stack a tf-agents
  user writes; `--sync_env gym_batch` gives it alf_async's BatchedGymEnv, to
  separate the driver's gain from the environment layer's.

The clock of each run starts when its loop starts (agent and environments
built) and includes tracing, the initial random collection and the
evaluations; the alf_async run's timer starts before train() builds, so it
gets slightly less loop time than the budget. Each run is its own process,
one at a time (runs side by side on 2 cores spoil each other's clocks).

After its timed loop each run measures, in the same process, the raw train
step rate of the same networks with no collection: alf_async's learner graph
(`Learner.train`, one graph call of many steps) on a replayer filled with
random steps, tf-agents' train step on the run's own filled buffer. That is
the learner's physical limit; the learner duty cycle is

    train steps / (loop seconds - evaluation seconds) / raw train steps/s

so a learner never starved by collection scores ~1 (evaluation time is
measured on both sides and taken out).

What it prints and draws: benchmarks/README.md; the flags: --help.
`--from_json` merges earlier invocations (one seed each, say) and refuses
runs whose parsed gin configs differ; `--sides alf_async` runs one side only
(to set dqn_breakout.gin against dqn_breakout_envpool.gin, say).

Kernels: both sides run under the kernels alf-async-train chooses for the
task's gin file (`alf_async.kernels`); `--host_kind` emulates another host
kind, `--kernel_choice off` keeps TensorFlow's defaults. Each record's host
says what ran.
"""

import argparse
import dataclasses
import json
import os
import shutil
import resource
import subprocess
import sys
import threading
import time

import unroll_sync  # benchmarks/ is this script's directory (imports no TensorFlow)
from host_info import add_kernel_flags, choose_kernels, host

from alf_async.testing.bench.wall_clock_report import SIDES, algorithm, load_records, report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIN_FILES = {
    "HalfCheetah-v5": os.path.join(REPO, "gin_configs", "sac_halfcheetah.gin"),
    "Hopper-v5": os.path.join(REPO, "gin_configs", "sac_hopper.gin"),
    "Breakout-v5": os.path.join(REPO, "gin_configs", "dqn_breakout.gin"),
    "Breakout-v5-envpool": os.path.join(REPO, "gin_configs", "dqn_breakout_envpool.gin"),
    "Pong-v5-ppo": os.path.join(REPO, "gin_configs", "ppo_pong.gin"),
    "Breakout-v5-ppo": os.path.join(REPO, "gin_configs", "ppo_breakout.gin"),
    "Pong-v5-impala": os.path.join(REPO, "gin_configs", "impala_pong.gin"),
    "Hopper-v5-ppo": os.path.join(REPO, "gin_configs", "ppo_hopper.gin"),
}


def _cpu_secs():
    """CPU seconds (user + system) of this process so far, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _peak_rss_mb():
    """This process's peak resident memory (VmHWM), in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


# ---------------------------------------------------------------- child runs

def _parse_gin(task, extra):
    # alf-async-train's own parsing (it imports the trainer, which registers the
    # configurables): an `include` (dqn_breakout_envpool.gin's) resolves beside the file.
    from alf_async.bin.train import parse_gin
    parse_gin([GIN_FILES[task]], extra)


def _timed_evaluator_class(log):
    """An alf_async Evaluator that appends (start, end) monotonic times of each call to `log`."""
    from alf_async.learning.evaluation import Evaluator

    class TimedEvaluator(Evaluator):

        def __call__(self):
            start = time.monotonic()
            try:
                return super().__call__()
            finally:
                log.append((start, time.monotonic()))

    return TimedEvaluator


def _raw_rate(train_calls, steps_per_call, secs):
    """Train steps/s of `train_calls(k)` (k calls of `steps_per_call` steps),
    after one warm-up call, timed for at least `secs`."""
    train_calls(1)
    calls, start = 0, time.monotonic()
    while time.monotonic() - start < secs:
        train_calls(1)
        calls += 1
    return calls * steps_per_call / (time.monotonic() - start)


def run_alf_async(seed, seconds, root_dir, raw_secs):
    """One trainer.train() run, then the learner graph's raw rate; returns the record."""
    import gin
    import numpy as np
    import tensorflow as tf
    from tf_agents.specs import tensor_spec

    from alf_async.learning import agents, replayers

    from alf_async import trainer
    from alf_async import settings
    from alf_async.environments import suites
    from alf_async.learning.learner import Learner

    eval_times = []
    trainer.Evaluator = _timed_evaluator_class(eval_times)  # instrument, same class otherwise
    episodes = unroll_sync.TrainingEpisodes()
    logged = ({"task": settings.Task(
        replayer_fn=unroll_sync.logged_one_time_replayer(episodes))}
              if unroll_sync.is_unroll_task() else {})
    stop = threading.Event()
    timer = threading.Timer(seconds, stop.set)
    timer_start = time.monotonic()
    cpu_start = _cpu_secs()
    timer.start()
    try:
        # Evaluations on the learner's thread, as the synchronous side's:
        # their time is taken out of both sides' clocks.
        result = trainer.train(root_dir, evaluation=settings.Evaluation(in_background=False),
                               runtime=settings.Runtime(seed=seed), stop_event=stop, **logged)
    finally:
        timer.cancel()
    cpu_secs = _cpu_secs() - cpu_start
    wall_secs = time.monotonic() - timer_start
    evaluations = []
    loop_start = timer_start
    for (secs, train_step, env_steps, average_return, _), (start, end) in zip(
            result.evaluations, eval_times):
        # `secs` (since the loop started) is taken right after the evaluation
        # ends; the policy evaluated is the one at its start.
        loop_start = end - secs
        evaluations.append((secs - (end - start), env_steps, train_step, average_return))
    # The loop ends at the end of the iteration in which the timer fired.
    loop_secs = timer_start + seconds - loop_start

    peak_rss_mb = _peak_rss_mb()
    # The raw rate: a fresh agent of the same gin config, a replayer of random steps.
    q = gin.query_parameter
    env = suites.load(q("Task.suite"), q("Task.env_name"), batch_size=1)
    step = tf.Variable(0, dtype=tf.int64)
    agent = _agent(env, step)
    env.close()
    num_rows = q("Layout.env_threads") * q("Layout.rows_per_env_thread")
    lags = None
    if unroll_sync.is_unroll_task():
        # A batch of the learner's shape: learn_queue_cap unrolls of env_batch_size rows.
        num_rows = q("Schedule.rows_per_batch")
        replayer = replayers.OneTimeReplayer()
        replayer(_random_experience(agent.collect_data_spec, num_rows,
                                    q("Schedule.unroll_length"), seed),
                 np.arange(num_rows, dtype=np.int32))
        lags = [v for _, v in _scalars(os.path.join(root_dir, "train"), "Learner/policy_lag")]
    else:
        replayer = _replayer_class(agent)(agent.collect_data_spec, num_rows,
                                          capacity_per_row=1000)
        replayer(_random_experience(agent.collect_data_spec, num_rows, 1000, seed),
                 np.arange(num_rows, dtype=np.int32))
    calls_per_train = q("Schedule.train_steps_per_iteration")
    learner = Learner(agent, driver=None, replayer=replayer,
                      sample_batch_size=_query("Schedule.sample_batch_size", {
                          field.name: field.default
                          for field in dataclasses.fields(settings.Schedule)}["sample_batch_size"]))

    def train_calls(k):
        for _ in range(k):
            learner.train(calls_per_train)

    # Train steps per call: an unroll agent counts its gradient steps (PPO's
    # epochs x minibatches per train call).
    before = int(step.numpy())
    learner.train(calls_per_train)
    raw = _raw_rate(train_calls, int(step.numpy()) - before, raw_secs)
    return dict(evaluations=evaluations, training_episodes=episodes.since(loop_start),
                env_steps=result.env_steps, train_steps=result.global_step, loop_secs=loop_secs,
                eval_secs=sum(end - start for start, end in eval_times), raw_rate=raw,
                peak_rss_mb=peak_rss_mb, cores=cpu_secs / wall_secs,
                policy_lag=None if not lags else sum(lags) / len(lags))


def _scalars(directory, tag):
    """[(step, value)] of `tag` in the event files of `directory`."""
    import glob

    import tensorflow as tf
    found = []
    for path in sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == tag:
                    found.append((event.step, float(tf.make_ndarray(value.tensor))))
    return found


def _agent(env, global_step):
    """The gin-configured agent of the task (DQN, SAC, PPO or IMPALA)."""
    return unroll_sync.gin_agent_fn()(env.time_step_spec(), env.action_spec(), global_step)


def _replayer_class(agent):
    """PixelReplayer for image stacks (as the Atari gin files bind), else UniformReplayer."""
    import tensorflow as tf

    from alf_async.learning import pixel_replayer, replayers
    obs = agent.collect_data_spec.observation
    return (pixel_replayer.PixelReplayer if getattr(obs, "dtype", None) == tf.uint8
            else replayers.UniformReplayer)


def _random_experience(data_spec, num_rows, steps, seed):
    """[num_rows, steps] random mid-episode steps of `data_spec`; image stacks
    (uint8 [H, W, S]) are random frames stacked as an environment stacks them,
    from a FIRST step whose older channels repeat its frame."""
    import numpy as np
    import tensorflow as tf
    import tree  # dm-tree, tensorflow-probability's dependency
    from tf_agents.specs import tensor_spec
    exp = tensor_spec.sample_spec_nest(data_spec, outer_dims=(num_rows, steps), seed=seed)
    exp = exp._replace(step_type=tf.ones_like(exp.step_type),
                       next_step_type=tf.ones_like(exp.next_step_type),
                       discount=tf.ones_like(exp.discount),
                       reward=tf.random.normal(tf.shape(exp.reward)),
                       # A Gaussian behaviour policy sampled from its
                       # (unbounded) spec has locations near +-1e38 and
                       # scales <= 0, whose log-probabilities NaN the
                       # agent's weights: a unit Gaussian instead.
                       policy_info=tree.map_structure_with_path(_unit_gaussian,
                                                                exp.policy_info))
    spec = data_spec.observation
    if spec.dtype != tf.uint8:
        return exp._replace(observation=tf.random.normal(tf.shape(exp.observation),
                                                         dtype=spec.dtype))
    h, w, s = spec.shape.as_list()
    frames = np.random.default_rng(seed).integers(0, 256, (num_rows, steps, h, w),
                                                   dtype=np.uint8)
    padded = np.concatenate([np.repeat(frames[:, :1], s - 1, axis=1), frames], axis=1)
    stacks = np.stack([padded[:, k:k + steps] for k in range(s)], axis=-1)
    step_type = np.ones((num_rows, steps), np.int32)
    step_type[:, 0] = 0  # FIRST
    return exp._replace(observation=tf.constant(stacks),
                        step_type=tf.constant(step_type, dtype=exp.step_type.dtype))


def _unit_gaussian(path, t):
    """`tree.map_structure_with_path`'s function: a Gaussian's parameters
    (`.../loc`, `.../scale_diag`) those of a unit Gaussian, others kept."""
    import tensorflow as tf
    if path[-1:] == ("scale_diag",):
        return tf.ones_like(t)
    return tf.zeros_like(t) if path[-1:] == ("loc",) else t


def _sync_envs(sync_env, suite, env_name, num_rows, seed):
    from tf_agents.environments import batched_py_environment, tf_py_environment

    from alf_async.environments import suites
    from alf_async.environments.suites import suite_gymnasium
    if sync_env == "gymnasium" and suite == "suite_gymnasium":
        py_envs = [suite_gymnasium.load(env_name, seed=seed + i) for i in range(num_rows)]
        return tf_py_environment.TFPyEnvironment(
            batched_py_environment.BatchedPyEnvironment(py_envs, multithreading=False))
    # Atari (suite_atari, suite_envpool): the same environment layer on both sides.
    return suites.load(suite, env_name, batch_size=num_rows, seed=seed)


def _query(name, default):
    import gin
    try:
        return gin.query_parameter(name)
    except ValueError:  # not bound: the settings' default
        return default


def _eval_policy(agent):
    """What train() evaluates: Evaluation.greedy and Evaluation.epsilon as bound."""
    from alf_async.learning.evaluation import eval_policy
    return eval_policy(agent.policy, _query("Evaluation.greedy", False),
                       _query("Evaluation.epsilon", None))


def set_train_threads():
    """TF's thread pools as train() sizes them from the gin file (before TF
    runs its first op; a second call with the same sizes does nothing)."""
    from alf_async import settings
    from alf_async.trainer import _set_threads
    _set_threads(settings.Runtime(inter_op_threads=_query("Runtime.inter_op_threads", None),
                                  intra_op_threads=_query("Runtime.intra_op_threads", None)))


def run_unroll_sync(seed, seconds, sync_env, raw_secs, **kwargs):
    """The synchronous side for an unroll agent (PPO, IMPALA):
    `unroll_sync.learning_run` on the gin file's environments, with train()'s
    thread pools; `kwargs` are learning_run's (num_env_steps, exp_observers).
    Returns its record."""
    import gin
    q = gin.query_parameter
    set_train_threads()
    env = _sync_envs(sync_env, q("Task.suite"), q("Task.env_name"),
                     q("Layout.env_threads") * q("Layout.rows_per_env_thread"), seed)
    episodes = unroll_sync.TrainingEpisodes()
    kwargs["exp_observers"] = list(kwargs.get("exp_observers", ())) + [episodes]
    record = unroll_sync.learning_run(seed, seconds, raw_secs, env, _eval_policy, _raw_rate,
                                      _cpu_secs, _peak_rss_mb, **kwargs)
    record["training_episodes"] = episodes.since(record.pop("loop_start"))
    return record


def run_tf_agents(seed, seconds, sync_env, raw_secs):
    """tf-agents' synchronous loop with the same gin-configured agent and
    settings; then its train step's raw rate on its own replay.

    SAC (MuJoCo) keeps tf-agents' TFUniformReplayBuffer and its dataset. DQN
    on pixels trains from the same PixelReplayer as alf_async (a 1M-step
    TFUniformReplayBuffer of whole stacks would take 28 GB): each
    iteration's steps are staged in a TFUniformReplayBuffer of one
    iteration, then written to the replayer, and a train step samples it.
    """
    import gin
    import numpy as np
    import tensorflow as tf
    from tf_agents.drivers import dynamic_step_driver
    from tf_agents.policies import random_tf_policy
    from tf_agents.replay_buffers import tf_uniform_replay_buffer
    from tf_agents.utils import common

    from alf_async.learning import evaluation
    from alf_async.environments import suites

    q = gin.query_parameter
    if unroll_sync.is_unroll_task():
        return run_unroll_sync(seed, seconds, sync_env, raw_secs)
    suite, env_name = q("Task.suite"), q("Task.env_name")
    num_rows = q("Layout.env_threads") * q("Layout.rows_per_env_thread")
    steps_per_iteration = q("Schedule.rows_per_batch") * q(
        "Schedule.unroll_length")
    train_steps = q("Schedule.train_steps_per_iteration")
    eval_interval = q("Evaluation.interval")
    initial_collect_steps = q("Schedule.initial_collect_steps")
    batch = q("Schedule.sample_batch_size")

    tf.random.set_seed(seed)
    env = _sync_envs(sync_env, suite, env_name, num_rows, seed)
    eval_env = suites.load(suite, env_name, batch_size=q("Evaluation.episodes"),
                           seed=seed + 1000003, **(_query("Evaluation.env_kwargs", None) or {}))
    global_step = tf.Variable(0, dtype=tf.int64, trainable=False)
    agent = _agent(env, global_step)
    agent.initialize()
    replayer_class = _replayer_class(agent)
    pixels = replayer_class.__name__ == "PixelReplayer"
    if pixels:
        replayer = replayer_class(agent.collect_data_spec, num_rows,
                                  capacity_per_row=q("PixelReplayer.capacity_per_row"))
        # DynamicStepDriver does not count the LAST -> FIRST steps, so an
        # iteration may take a few more than steps_per_iteration / rows per
        # row: room for 4x, and a check that none was overwritten.
        staging = 4 * (steps_per_iteration // num_rows)
        buffer = tf_uniform_replay_buffer.TFUniformReplayBuffer(
            agent.collect_data_spec, batch_size=num_rows, max_length=staging)
        row_ids = np.arange(num_rows, dtype=np.int32)
        added = tf.Variable(0, dtype=tf.int64)   # batches added since the last flush
        observers = [buffer.add_batch, lambda _: added.assign_add(1)]

        def flush():  # the iteration's [rows, T] steps into the replayer
            if int(added) > staging:
                raise RuntimeError("an iteration overflowed the staging buffer")
            replayer(buffer.gather_all(), row_ids)
            buffer.clear()
            added.assign(0)
    else:
        buffer = tf_uniform_replay_buffer.TFUniformReplayBuffer(
            agent.collect_data_spec, batch_size=num_rows,
            max_length=q("UniformReplayer.capacity_per_row"))
        observers = [buffer.add_batch]

        def flush():
            pass
    random_policy = random_tf_policy.RandomTFPolicy(env.time_step_spec(), env.action_spec())
    # Initial collection in whole iterations, like the alf_async learner counts it.
    initial_iterations = -(-initial_collect_steps // steps_per_iteration)
    initial_collect = common.function(dynamic_step_driver.DynamicStepDriver(
        env, random_policy, observers=observers, num_steps=steps_per_iteration).run)
    collect = common.function(dynamic_step_driver.DynamicStepDriver(
        env, agent.collect_policy, observers=observers, num_steps=steps_per_iteration).run)
    evaluator = evaluation.Evaluator(eval_env, _eval_policy(agent))
    if pixels:
        def train_step_graph():
            return agent.train(replayer.sample(batch, agent.train_sequence_length))

        one_train_step = common.function(train_step_graph)
    else:
        dataset = buffer.as_dataset(num_parallel_calls=3, sample_batch_size=batch,
                                    num_steps=agent.train_sequence_length).prefetch(3)
        train_step = common.function(agent.train)
        iterator = None

        def one_train_step():
            nonlocal iterator
            iterator = iterator or iter(dataset)
            experience, _ = next(iterator)
            return train_step(experience)

    evaluations, eval_secs = [], 0.0
    start = time.monotonic()
    time_step, policy_state = None, None
    for _ in range(initial_iterations):
        time_step, policy_state = initial_collect(time_step, policy_state)
        flush()
    env_steps = initial_iterations * steps_per_iteration
    while time.monotonic() - start < seconds:
        time_step, policy_state = collect(time_step, policy_state)
        flush()
        env_steps += steps_per_iteration
        before = int(global_step)
        for _ in range(train_steps):
            one_train_step()
        after = int(global_step)
        if after // eval_interval > before // eval_interval:
            t = time.monotonic()
            average_return, _ = evaluator()
            eval_secs += time.monotonic() - t
            evaluations.append((t - start, env_steps, after, average_return))
    loop_secs = time.monotonic() - start
    train_steps_reached = int(global_step)
    peak_rss_mb = _peak_rss_mb()

    def train_calls(k):
        for _ in range(k * train_steps):
            one_train_step()

    raw = _raw_rate(train_calls, train_steps, raw_secs)
    env.close()
    eval_env.close()
    return dict(evaluations=evaluations, env_steps=env_steps, train_steps=train_steps_reached,
                loop_secs=loop_secs, eval_secs=eval_secs, raw_rate=raw, peak_rss_mb=peak_rss_mb)


def one_run(args):
    machine = host()  # before TensorFlow and the games load
    bindings = [f"Evaluation.interval = {args.eval_every_steps}",
                "Outputs.checkpoint_interval = 1000000000",  # only at exit, after the clock
                "Schedule.num_env_steps = 1000000000"]        # the clock stops the run
    _parse_gin(args.task, bindings + list(args.gin_bindings))
    seconds = args.minutes * 60.0
    import gin
    config = gin.config_str()  # the parsed bindings, before the run adds its own
    if args.one == "alf_async":
        record = run_alf_async(args.seed, seconds, args.root_dir, args.raw_secs)
    else:
        set_train_threads()   # the same TF thread pools as train() sets
        record = run_tf_agents(args.seed, seconds, args.sync_env, args.raw_secs)
    record["gin_config"] = config
    record["host"] = machine
    print(json.dumps(record), flush=True)


# ---------------------------------------------------------------- the parent

def spawn(side, seed, args, root_dir, log_path):
    cmd = [sys.executable, os.path.abspath(__file__), "--one", side, "--seed", str(seed),
           "--task", args.task, "--minutes", str(args.minutes),
           "--eval_every_steps", str(args.eval_every_steps), "--sync_env", args.sync_env,
           "--raw_secs", str(args.raw_secs), "--root_dir", root_dir,
           "--gin_bindings", *args.gin_bindings]
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                              timeout=args.minutes * 60 + args.raw_secs + 600)
        log.write(proc.stdout)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"{side} run for seed {seed} failed (exit {proc.returncode}); "
                       f"see {log_path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=sorted(GIN_FILES), default="HalfCheetah-v5")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--minutes", type=float, default=15.0, help="wall-clock budget per run")
    parser.add_argument("--eval_every_steps", type=int, default=10000,
                        help="train steps (= env steps after the random ones) between evaluations")
    parser.add_argument("--out_dir", default="/tmp/alf_async_wall_clock")
    parser.add_argument("--report_minutes", type=float, nargs="+", default=[5, 10, 15])
    parser.add_argument("--sync_env", choices=["gymnasium", "gym_batch"], default="gymnasium")
    parser.add_argument("--sides", choices=SIDES, nargs="+", default=list(SIDES),
                        help="which sides to run (e.g. only alf_async, to compare two "
                             "gin files of one task)")
    parser.add_argument("--raw_secs", type=float, default=20.0,
                        help="seconds of the raw train-step rate measurement per run")
    parser.add_argument("--gin_bindings", nargs="*", default=[],
                        help="more gin bindings for both sides, after the task's gin file "
                             "(e.g. 'SacAgent.reward_scale_factor = 0.1')")
    parser.add_argument("--from_json", nargs="+", metavar="JSON",
                        help="run nothing: print the table and draw the picture of the "
                             "runs in these wall_clock_<task>.json files (earlier "
                             "invocations, e.g. one per seed), merged")
    parser.add_argument("--one", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--root_dir", help=argparse.SUPPRESS)
    add_kernel_flags(parser)
    args = parser.parse_args()
    if args.one:
        return one_run(args)

    os.makedirs(args.out_dir, exist_ok=True)
    if args.from_json:
        try:
            records = load_records(args.from_json)
        except ValueError as e:
            print(f"wall_clock_learning.py: {e}", file=sys.stderr)
            return 2
        return report(args.task, records, args.report_minutes, args.minutes * 60.0, args.out_dir)
    # Kernels as alf-async-train chooses them, for both sides' children.
    args.gin_bindings = choose_kernels(args, [GIN_FILES[args.task]], args.gin_bindings)
    records = {}
    print(f"{algorithm(args.task)} {args.task}: {GIN_FILES[args.task]}, seeds {args.seeds}, {args.minutes:g} min "
          f"per run, eval every {args.eval_every_steps} train steps, sync env {args.sync_env}, "
          f"sides {' '.join(args.sides)}"
          + "".join(f"; {b}" for b in args.gin_bindings), flush=True)
    for seed in args.seeds:
        for side in args.sides:
            root_dir = os.path.join(args.out_dir, f"{args.task}_{side}_{seed}")
            shutil.rmtree(root_dir, ignore_errors=True)  # a left-over run would be resumed
            log_path = os.path.join(args.out_dir, f"{args.task}_{side}_{seed}.log")
            started = time.monotonic()
            record = spawn(side, seed, args, root_dir, log_path)
            shutil.rmtree(root_dir, ignore_errors=True)
            records[(side, seed)] = record
            last = record["evaluations"][-1][3] if record["evaluations"] else float("nan")
            print(f"  seed {seed} {side:9s}: {record['env_steps']} env steps, "
                  f"{record['train_steps']} train steps, last eval return {last:.1f} "
                  f"({time.monotonic() - started:.0f} s with start-up and raw rate)", flush=True)
    report(args.task, records, args.report_minutes, args.minutes * 60.0, args.out_dir)


if __name__ == "__main__":
    sys.exit(main())
