"""Atari collection throughput: alf_async's driver vs tf-agents' DynamicStepDriver
with the Nature-CNN DQN collect policy, the workload asynchronous drivers exist for.

Same process, alternating rounds, the same collect policy (dqn_agent with the
Nature CNN, epsilon 0.1) and 16 Breakout games on both sides of each
comparison, for three environment layers:

  inprocess   suite_atari (gymnasium + ale-py) stepped in this process:
              DynamicStepDriver over one BatchedGymEnv(16)        <- baseline
              the driver, env threads x games (--layouts; 'x:0' acting in
              the env threads, num_actor_queues=0)
  subprocess  every game in its own child process:
              DynamicStepDriver over tf-agents' ParallelPyEnvironment(16) <- baseline
              the driver over SubprocessEnvs (rows stepped as they answer)
  envpool     suite_envpool, EnvPool's C++ threads (no GIL):
              DynamicStepDriver over one pool of 16 in lockstep    <- baseline
              the driver, each env thread one pool in EnvPool's async mode
              (--envpool_stepping rows, the default) or one lockstep pool
              stepped in its graph loop (--envpool_stepping lockstep)

Per layer, "environment alone" steps the same games with random actions and
no TF in a plain Python loop (in-process and EnvPool: their own batch step;
child processes: ParallelPyEnvironment's lockstep); "inference alone" runs
the collect policy on batches of stacked frames, no environment. "CPU bound"
is what 2 cores allow if the environment's and the inference's CPU per step
simply add up (2 / (env CPU + inference CPU at batch 16) per step): a
collector can beat it only by spending less CPU than the two alone.

The driver's learner only dequeues (run_async, no training). Each row prints
steps/s, its median per-round ratio to its layer's baseline, its share of
the environment-alone rate, CPU us and context switches per env step (this
process and its children) and the actors' mean batch in rows.

    python benchmarks/atari_throughput.py [--rounds 3] [--seconds 10]
        [--layers inprocess subprocess envpool] [--layouts 1x16 2x8 4x4 2x8:0]
        [--inter_op_threads 0] [--envpool_stepping rows]
"""

import argparse
import functools
import statistics
import time

import numpy as np
import tensorflow as tf
from tf_agents.environments import parallel_py_environment, tf_py_environment
from tf_agents.system import system_multiprocessing
from tf_agents.utils import common

from alf_async import AsyncOffPolicyDriver
from alf_async.environments import suites
from alf_async.learning import agents
from usage import (Usage, measure_driver, measure_dynamic_step_driver,  # benchmarks/ is this script's directory
                   measure_env_only, parse_layout)

NUM_ENVS = 16
GAMES = {"inprocess": "ALE/Breakout-v5", "subprocess": "ALE/Breakout-v5",
         "envpool": "Breakout-v5"}
SUITES = {"inprocess": "suite_atari", "subprocess": "suite_atari", "envpool": "suite_envpool"}
NATURE_CNN = dict(conv_layer_params=((32, 8, 4), (64, 4, 2), (64, 3, 1)), fc_layer_params=(512,))


def collect_policy(tf_env):
    """A fresh Nature-CNN DQN agent's collect policy (epsilon 0.1)."""
    agent = agents.dqn_agent(tf_env.time_step_spec(), tf_env.action_spec(),
                             tf.Variable(0, dtype=tf.int64), epsilon_greedy=0.1, **NATURE_CNN)
    agent.initialize()
    return agent.collect_policy


def lockstep_env(layer, seed):
    """The baseline's TFEnvironment of 16 games."""
    if layer == "subprocess":
        return tf_py_environment.TFPyEnvironment(parallel_py_environment.ParallelPyEnvironment(
            [functools.partial(suites.make_single_env, "suite_atari", GAMES[layer], seed + i)
             for i in range(NUM_ENVS)], start_serially=False))
    return suites.load(SUITES[layer], GAMES[layer], batch_size=NUM_ENVS, seed=seed)


def env_constructor(layer, per_thread, seed, recv_batch_size=None, stepping="rows"):
    if layer == "subprocess":
        return suites.make_subprocess_env_constructor("suite_atari", GAMES[layer],
                                                      batch_size=per_thread, seed=seed)
    kwargs = {}
    if layer == "envpool":
        kwargs["stepping"] = stepping
        if recv_batch_size and stepping == "rows":
            kwargs["recv_batch_size"] = min(recv_batch_size, per_thread)
    return suites.make_env_constructor(SUITES[layer], GAMES[layer], batch_size=per_thread,
                                       seed=seed, **kwargs)


def lockstep_round(policy, layer, seconds, seed):
    env = lockstep_env(layer, seed)
    try:
        return measure_dynamic_step_driver(env, policy, NUM_ENVS * 8, seconds)
    finally:
        env.close()


def async_round(policy, layer, layout, seconds, seed, recv_batch_size=None, stepping="rows"):
    threads, per_thread, queues = layout
    return measure_driver(AsyncOffPolicyDriver(
        env_constructor(layer, per_thread, seed, recv_batch_size, stepping), policy,
        num_envs=threads,
        num_actor_queues=queues, actor_queue_cap=threads, learn_queue_cap=threads,
        unroll_length=8), seconds)


def env_alone_round(layer, seconds, seed):
    env = lockstep_env(layer, seed)
    try:
        return measure_env_only(env.pyenv, seconds, seed=seed)
    finally:
        env.close()


def inference_round(policy, spec, batch, seconds):
    """The collect policy alone on `batch` rows of random frames: rows/s and CPU per row."""
    from tf_agents.trajectories import time_step as ts  # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(0)
    obs = tf.constant(rng.integers(0, 256, size=(batch,) + tuple(spec.shape), dtype=np.uint8))
    step = ts.TimeStep(step_type=tf.ones([batch], tf.int32), reward=tf.zeros([batch]),
                       discount=tf.ones([batch]), observation=obs)
    action = common.function(lambda t: policy.action(t).action)
    action(step).numpy()  # trace
    rows, usage = 0, Usage()
    while usage.elapsed() < seconds:
        action(step).numpy()
        rows += batch
    return usage.per_step(rows)


def layout_name(layout):
    threads, per_thread, queues = layout
    return f"alf_async {threads}x{per_thread}" + (" acting itself" if queues == 0 else "")


def summarise(name, results, baseline, ceiling):
    med = {k: statistics.median(x[k] for x in results) for k in results[0]}
    ratio = (statistics.median(a["rate"] / b["rate"] for a, b in zip(results, baseline))
             if baseline else float("nan"))
    share = med["rate"] / ceiling if ceiling else float("nan")
    return (f"{name:44s} {med['rate']:9.0f} {ratio:8.2f}x {share:8.0%} {med['cpu_us']:9.0f} "
            f"{med['cs']:8.2f} {med.get('batch', float('nan')):6.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--layers", nargs="+", default=["inprocess", "subprocess", "envpool"],
                        choices=["inprocess", "subprocess", "envpool"])
    parser.add_argument("--layouts", nargs="+", default=["1x16", "2x8", "4x4"])
    parser.add_argument("--inference_batches", nargs="+", type=int, default=[4, 8, 16])
    parser.add_argument("--inter_op_threads", type=int, default=0,
                        help="TF's inter-op threads (0: TF's default, one per core); "
                             "in-process env threads step inside that pool")
    parser.add_argument("--envpool_recv_batch_size", type=int, default=0,
                        help="rows an env thread receives from its pool at once "
                             "(0: suite_envpool's default, half the pool)")
    parser.add_argument("--envpool_stepping", default="rows", choices=["rows", "lockstep"],
                        help="how the driver's env threads step their EnvPool pools "
                             "(suite_envpool.stepping); the baseline is always lockstep")
    args = parser.parse_args()
    tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)
    layouts = [parse_layout(x) for x in args.layouts]
    for threads, per_thread, _ in layouts:
        if threads * per_thread != NUM_ENVS:
            parser.error(f"layout {threads}x{per_thread} is not {NUM_ENVS} environments")
    probe = suites.load("suite_atari", GAMES["inprocess"], batch_size=1, seed=0)
    policy, obs_spec = collect_policy(probe), probe.observation_spec()
    probe.close()
    rows = {}
    started = time.monotonic()
    for r in range(args.rounds):
        seed = 1000 * r
        for b in args.inference_batches:
            rows.setdefault(("inference", b), []).append(
                inference_round(policy, obs_spec, b, args.seconds / 2))
        for layer in args.layers:
            rows.setdefault((layer, "lockstep"), []).append(
                lockstep_round(policy, layer, args.seconds, seed))
            rows.setdefault((layer, "alone"), []).append(env_alone_round(layer, args.seconds, seed))
            for layout in layouts:
                rows.setdefault((layer, layout), []).append(
                    async_round(policy, layer, layout, args.seconds, seed,
                                args.envpool_recv_batch_size, args.envpool_stepping))
        print(f"round {r + 1} done ({time.monotonic() - started:.0f} s): " + ", ".join(
            f"{k[0]} {k[1] if not isinstance(k[1], tuple) else layout_name(k[1])[len('alf_async '):]} "
            f"{v[-1]['rate']:.0f}" for k, v in rows.items()), flush=True)

    header = (f"{'collector (16 Breakout games, Nature-CNN DQN)':44s} {'steps/s':>9s} "
              f"{'vs sync':>9s} {'of env':>8s} {'CPU us':>9s} {'cs/step':>8s} {'batch':>6s}")
    inference = {b: statistics.median(x["cpu_us"] for x in rows[("inference", b)])
                 for b in args.inference_batches}
    print(f"\ninference alone (rows/s, CPU us per row):")
    for b in args.inference_batches:
        print(f"  batch {b:3d}: " + summarise("", rows[("inference", b)], None, None).strip())
    for layer in args.layers:
        alone = statistics.median(x["rate"] for x in rows[(layer, "alone")])
        env_cpu = statistics.median(x["cpu_us"] for x in rows[(layer, "alone")])
        base = rows[(layer, "lockstep")]
        print(f"\n[{layer}] {SUITES[layer]} {GAMES[layer]}")
        print(header)
        print(summarise(f"tf-agents DynamicStepDriver (lockstep)", base, base, alone))
        for layout in layouts:
            print(summarise(layout_name(layout), rows[(layer, layout)], base,
                            alone))
        print(summarise("environment alone (no TF)", rows[(layer, "alone")], base, alone))
        largest = max(args.inference_batches)
        bound = 2e6 / (env_cpu + inference[largest])
        best = max(statistics.median(x["rate"] for x in rows[(layer, layout)])
                   for layout in layouts)
        print(f"{'CPU bound (env + inference CPU, 2 cores)':44s} {bound:9.0f}   "
              f"best layout at {best / bound:.0%} of it")


if __name__ == "__main__":
    # ParallelPyEnvironment's children need tf-agents' multiprocessing set up
    # (handle_main would parse our flags with absl).
    system_multiprocessing.enable_interactive_mode()
    main()
