"""Time to solve CartPole-v0: alf_async's trainer vs a synchronous tf-agents loop.

Both sides read the same gin file (default gin_configs/dqn_cartpole.gin;
gin_configs/ppo_cartpole.gin for PPO):
the same agent (agents.dqn_agent: network, optimizer, DqnAgent settings,
epsilon schedule), the same number of environments, env steps per
iteration, train steps per iteration, sample batch size, initial collection
and replay capacity, and the same evaluation protocol (evaluation.Evaluator:
the greedy policy, one episode on each of Evaluation.episodes envs,
every Evaluation.interval train steps). "Solved" is the first evaluation
with AverageReturn >= 195; the clock starts when the loop starts (agents and
environments built, nothing traced yet) and includes evaluations.

- async: `alf_async.trainer.train()` (the AsyncOffPolicyDriver collects
  while the learner trains; environments are BatchedGymEnv).
- sync: the tf-agents loop of its DQN tutorial: DynamicStepDriver collects
  num_envs * env_batch_size * unroll_length env steps into a
  TFUniformReplayBuffer, then train_steps_per_iteration train steps on its
  dataset, alternating. `--sync_env suite_gym` (default) steps
  TFPyEnvironment(BatchedPyEnvironment(suite_gym.load(...))), the stack a
  tf-agents user writes; `--sync_env gym_batch` gives it our BatchedGymEnv,
  to separate the driver's gain from the environment layer's; `--sync_env
  both` runs both baselines and prints both ratios. With an unroll agent
  (ppo_cartpole.gin) the loop is tf-agents' PPO example's
  (benchmarks/unroll_sync.py): DynamicStepDriver collects one learner
  batch's env steps, the agent trains on gather_all() once, the buffer is
  cleared.

Every run is its own process (one at a time; per seed async, then each
sync), capped at --cap seconds of loop time.

    python benchmarks/time_to_solve.py --seeds 1 2 3 4 5 6 7 8 [--cap 120] [--sync_env both] [--sync_prebuild both]

`--sync_prebuild` decides how the baseline's Adam gets its slot variables:
`no` (default) lazily in the first train step, as in tf-agents' examples
(a tf.function that creates variables is traced twice); `yes` before the
first trace, as alf_async's agent builders do (agents.build_optimizer);
`both` runs both baselines.

It also prints, for each env-step count at which runs solved, the median
time of each side's runs that solved there: the speed comparison without the
luck of which evaluation each side happened to solve at. Per side it prints
the median train steps to solve and seconds per 1,000 train steps of the
runs that solved: whether a side needs more updates or slower ones.

docs/results/learning.md renders the current figures and their
commands; benchmarks/results/HISTORY.md when and at which commit each was
measured.
"""

import argparse
import json
import os
import statistics
import sys
import threading
import time

from child_runs import json_result  # benchmarks/ is this script's directory
from host_info import add_kernel_flags, choose_kernels

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_GIN = os.path.join(REPO, "gin_configs", "dqn_cartpole.gin")
SOLVED = 195.0


def _parse_gin(gin_file, extra):
    # As alf-async-train parses: an overlay's `include` finds its base beside it.
    from alf_async import trainer  # noqa: F401  (registers the configurables)
    from alf_async.bin.train import parse_gin
    parse_gin([gin_file], extra)


def run_async(seed, cap, root_dir):
    """One trainer.train() run on the parsed gin config, stopped at the first
    evaluation >= SOLVED or after `cap` seconds; returns its TrainResult
    (`solved_secs` None if it did not solve within cap)."""
    from alf_async import trainer
    from alf_async import settings
    stop = threading.Event()
    timer = threading.Timer(cap, stop.set)
    timer.start()
    try:
        return trainer.train(root_dir, evaluation=settings.Evaluation(stop_at_return=SOLVED),
                             runtime=settings.Runtime(seed=seed), stop_event=stop,
                             print_fn=lambda line: None)
    finally:
        timer.cancel()


def run_sync(seed, cap, sync_env, prebuild):
    """The synchronous tf-agents loop with the same gin-configured agent and settings."""
    import gin
    import tensorflow as tf
    from tf_agents.drivers import dynamic_step_driver
    from tf_agents.environments import batched_py_environment, suite_gym, tf_py_environment
    from tf_agents.replay_buffers import tf_uniform_replay_buffer
    from tf_agents.utils import common

    import unroll_sync  # benchmarks/ is this script's directory

    from alf_async.learning import agents, evaluation
    from alf_async.environments.suites import gym_batch
    from alf_async.environments import suites

    q = gin.query_parameter
    env_name = q("Task.env_name")
    num_rows = q("Layout.env_threads") * q("Layout.rows_per_env_thread")
    steps_per_iteration = q("Schedule.rows_per_batch") * q(
        "Schedule.unroll_length")
    train_steps = q("Schedule.train_steps_per_iteration")
    eval_interval = q("Evaluation.interval")

    tf.random.set_seed(seed)
    if sync_env == "suite_gym":
        py_envs = [suite_gym.load(env_name) for _ in range(num_rows)]
        for i, e in enumerate(py_envs):
            e.seed(seed + i)
        env = tf_py_environment.TFPyEnvironment(
            batched_py_environment.BatchedPyEnvironment(py_envs, multithreading=False))
    else:
        env = tf_py_environment.TFPyEnvironment(
            gym_batch.load_batched(env_name, num_rows, seed=seed))
    eval_env = suites.load("suite_gym", env_name, batch_size=q("Evaluation.episodes"),
                           seed=seed + 1000003)
    global_step = tf.Variable(0, dtype=tf.int64, trainable=False)
    if unroll_sync.is_unroll_task():
        return _run_sync_unrolls(env, eval_env, global_step, cap, eval_interval)
    agent = agents.dqn_agent(env.time_step_spec(), env.action_spec(), global_step,
                             prebuild_optimizer=prebuild)
    agent.initialize()
    buffer = tf_uniform_replay_buffer.TFUniformReplayBuffer(
        agent.collect_data_spec, batch_size=num_rows,
        max_length=q("UniformReplayer.capacity_per_row"))
    driver = dynamic_step_driver.DynamicStepDriver(
        env, agent.collect_policy, observers=[buffer.add_batch], num_steps=steps_per_iteration)
    collect = common.function(driver.run)
    dataset = buffer.as_dataset(num_parallel_calls=3, sample_batch_size=q("Schedule.sample_batch_size"),
                                num_steps=agent.train_sequence_length).prefetch(3)
    train_step = common.function(agent.train)
    evaluator = evaluation.Evaluator(eval_env, agent.policy)

    start = time.monotonic()
    time_step, policy_state, env_steps = None, None, 0
    iterator = None
    while time.monotonic() - start < cap:
        time_step, policy_state = collect(time_step, policy_state)
        env_steps += steps_per_iteration
        if env_steps < q("Schedule.initial_collect_steps"):
            continue
        if iterator is None:
            iterator = iter(dataset)
        before = int(global_step)
        for _ in range(train_steps):
            experience, _ = next(iterator)
            train_step(experience)
        after = int(global_step)
        if after // eval_interval > before // eval_interval:
            average_return, _ = evaluator()
            if average_return >= SOLVED:
                return time.monotonic() - start, env_steps, int(global_step)
    return None, env_steps, int(global_step)


def _run_sync_unrolls(env, eval_env, global_step, cap, eval_interval):
    """PPO / IMPALA: tf-agents' synchronous collect-then-train loop
    (unroll_sync.SyncUnrollLoop) with the gin file's agent."""
    import unroll_sync

    from alf_async.learning import evaluation
    agent = unroll_sync.gin_agent_fn()(env.time_step_spec(), env.action_spec(), global_step)
    agent.initialize()
    loop = unroll_sync.SyncUnrollLoop(agent, env, unroll_sync.steps_per_batch())
    evaluator = evaluation.Evaluator(eval_env, agent.policy)
    start = time.monotonic()
    while time.monotonic() - start < cap:
        before = int(global_step)
        loop.iteration()
        after = int(global_step)
        if after // eval_interval > before // eval_interval:
            average_return, _ = evaluator()
            if average_return >= SOLVED:
                return time.monotonic() - start, loop.env_steps, int(global_step)
    return None, loop.env_steps, int(global_step)


def one_run(args):
    _parse_gin(args.gin_file, args.gin_param)
    if args.one == "async":
        result = run_async(args.seed, args.cap, args.root_dir)
        secs, env_steps, train_steps = result.solved_secs, result.env_steps, result.global_step
    else:
        secs, env_steps, train_steps = run_sync(args.seed, args.cap, args.sync_env,
                                                args.sync_prebuild == "yes")
    print(json.dumps({"secs": secs, "env_steps": env_steps, "train_steps": train_steps}),
          flush=True)


def spawn(kind, seed, args, root_dir):
    kind, _, variant = kind.partition(":")
    sync_env, _, prebuilt = variant.partition(":")
    cmd = [sys.executable, os.path.abspath(__file__), "--one", kind, "--seed", str(seed),
           "--cap", str(args.cap), "--gin_file", args.gin_file,
           "--sync_env", sync_env or "suite_gym", "--sync_prebuild", "yes" if prebuilt else "no",
           "--root_dir", root_dir] + sum((["--gin_param", p] for p in args.gin_param), [])
    return json_result(cmd, args.cap + 180, f"{kind} run for seed {seed}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--cap", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--gin_file", default=DEFAULT_GIN)
    parser.add_argument("--gin_param", action="append", default=[])
    parser.add_argument("--sync_env", choices=["suite_gym", "gym_batch", "both"],
                        default="suite_gym")
    parser.add_argument("--sync_prebuild", choices=["no", "yes", "both"], default="no",
                        help="give the sync baseline's optimizer its slots before the first "
                             "trace as alf_async's agent builders do (yes), leave them to the "
                             "first train step as tf-agents' examples do (no), or run both")
    parser.add_argument("--work_dir", default="/tmp/alf_async_time_to_solve")
    parser.add_argument("--one", choices=["async", "sync"], help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--root_dir", help=argparse.SUPPRESS)
    add_kernel_flags(parser)
    args = parser.parse_args()
    if args.one:
        return one_run(args)
    # Kernels as alf-async-train chooses them, for every run's child.
    args.gin_param = choose_kernels(args, [args.gin_file], args.gin_param)

    import shutil
    sync_envs = ["suite_gym", "gym_batch"] if args.sync_env == "both" else [args.sync_env]
    times = {"async": []}
    prebuilds = {"no": [""], "yes": [":prebuilt"], "both": ["", ":prebuilt"]}[args.sync_prebuild]
    times.update({f"sync:{e}{p}": [] for e in sync_envs for p in prebuilds})
    steps = {kind: [] for kind in times}
    trained = {kind: [] for kind in times}
    print(f"CartPole-v0 time to first eval AverageReturn >= {SOLVED:.0f}: {args.gin_file}, "
          f"seeds {args.seeds}, cap {args.cap:.0f} s per run, sync env {args.sync_env}",
          flush=True)
    for seed in args.seeds:
        for kind in times:
            root_dir = os.path.join(args.work_dir, f"{kind.replace(':', '_')}_{seed}")
            shutil.rmtree(root_dir, ignore_errors=True)
            result = spawn(kind, seed, args, root_dir)
            shutil.rmtree(root_dir, ignore_errors=True)
            times[kind].append(result["secs"])
            steps[kind].append(result["env_steps"])
            trained[kind].append(result["train_steps"])
            shown = "not solved" if result["secs"] is None else f"{result['secs']:.1f} s"
            print(f"  seed {seed:3d} {kind:24s}: {shown:>11s}  ({result['env_steps']} env steps, "
                  f"{result['train_steps']} train steps)", flush=True)
    medians = {}
    for kind, values in times.items():
        # An unsolved run counts as the cap (a lower bound of its time).
        capped = [args.cap if v is None else v for v in values]
        medians[kind] = statistics.median(capped)
        unsolved = sum(v is None for v in values)
        print(f"{kind:24s}: median {medians[kind]:.1f} s over {len(values)} runs, "
              f"{unsolved} not solved within {args.cap:.0f} s")
        # Time to solve = train steps to solve x seconds per train step:
        # whether a side needs more updates or slower ones.
        solved = [(v, n) for v, n in zip(values, trained[kind]) if v is not None]
        if solved:
            print(f"{'':24s}  solved runs: median {statistics.median(n for _, n in solved)} "
                  f"train steps, {statistics.median(1000 * v / n for v, n in solved):.1f} s "
                  f"per 1000 train steps")
    for kind in times:
        if kind != "async":
            print(f"ratio of medians async / {kind}: {medians['async'] / medians[kind]:.2f}")
    _print_at_equal_steps(times, steps)


def _print_at_equal_steps(times, steps):
    """Median seconds of the runs that solved at the same env-step count (the
    same evaluation), per side: the speed comparison without the luck of which
    evaluation each side happened to solve at."""
    print("at equal env steps to solve (median s, runs):")
    by_steps = {}
    for kind in times:
        for secs, env_steps in zip(times[kind], steps[kind]):
            if secs is not None:
                by_steps.setdefault(env_steps, {}).setdefault(kind, []).append(secs)
    for env_steps in sorted(by_steps):
        row = by_steps[env_steps]
        if "async" not in row or len(row) < 2:
            continue
        cells = []
        for kind in times:
            if kind in row:
                median = statistics.median(row[kind])
                ratio = "" if kind == "async" else \
                    f", async/this {statistics.median(row['async']) / median:.2f}"
                cells.append(f"{kind} {median:.1f} s ({len(row[kind])}{ratio})")
        print(f"  {env_steps:7d}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
