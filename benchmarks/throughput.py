"""Collection throughput: alf_async's driver vs tf-agents' DynamicStepDriver.

Same process, alternating rounds, the same DQN collect policy (QNetwork
64x64) and 64 CartPole-v0 environments on both sides of each comparison:

  same env layer (BatchedGymEnv):
    tf-agents  DynamicStepDriver over BatchedGymEnv(64)               <- baseline A
    alf_async  --layouts env threads x BatchedGymEnv(n), 1 actor (cap: all rows)
  tf-agents' suite_gym stack:
    tf-agents  DynamicStepDriver over BatchedPyEnvironment(64 suite_gym)  <- baseline B
    alf_async  2 env threads x BatchedPyEnvironment(32 suite_gym), 1 actor

The driver's learner only dequeues (run_async, no training); the
DynamicStepDriver collects with no observers. The "environment alone" rows
step the same batched environment in a plain Python loop with random
actions and no TF: a Python environment's step holds the GIL, so no
collector in one process can step it faster (the ceiling). Each row prints steps/s, CPU
us and context switches per env step (whole process) and its median
per-round ratio to its baseline. Absolute rates drift on a shared machine;
the ratios within one run are the figure.

    python benchmarks/throughput.py [--rounds 3] [--seconds 5] [--layouts 1x64 2x32 4x16 8x8]
"""

import argparse
import statistics

import gym
from tf_agents.environments import batched_py_environment, suite_gym, tf_py_environment

from alf_async import AsyncOffPolicyDriver
from alf_async.environments.gym_batch import BatchedGymEnv
from alf_async.testing.policies import dqn_collect_policy
from usage import measure_driver, measure_dynamic_step_driver, measure_env_only  # benchmarks/ is this script's directory

ENV = "CartPole-v0"
NUM_ENVS = 64


def make_policy():
    return dqn_collect_policy(tf_py_environment.TFPyEnvironment(suite_gym.load(ENV)))


def tf_agents_envs(n):
    return tf_py_environment.TFPyEnvironment(batched_py_environment.BatchedPyEnvironment(
        [suite_gym.load(ENV) for _ in range(n)], multithreading=False))


def gym_batch_envs(n):
    return tf_py_environment.TFPyEnvironment(
        BatchedGymEnv([gym.make(ENV) for _ in range(n)]))


def dynamic_step_round(policy, tf_env, seconds):
    return measure_dynamic_step_driver(tf_env, policy, NUM_ENVS * 25, seconds)


def async_round(policy, env_constructor, layout, seconds):
    threads, per_thread = layout
    return measure_driver(AsyncOffPolicyDriver(
        lambda: env_constructor(per_thread), policy, num_envs=threads, num_actor_queues=1,
        actor_queue_cap=threads, learn_queue_cap=threads, unroll_length=16), seconds)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--layouts", nargs="+", default=["1x64", "2x32", "4x16", "8x8"])
    args = parser.parse_args()
    layouts = [tuple(int(x) for x in text.split("x")) for text in args.layouts]
    policy = make_policy()
    base_a = "tf-agents DynamicStepDriver, BatchedGymEnv(64)"
    base_b = "tf-agents DynamicStepDriver, BatchedPyEnvironment(64)"
    rows = {base_a: []}
    for t, b in layouts:
        rows[f"alf_async {t}x{b} BatchedGymEnv"] = []
    ceiling_a = "environment alone (no TF), BatchedGymEnv(64)"
    rows[ceiling_a] = []
    rows[base_b] = []
    rows["alf_async 2x32 BatchedPyEnvironment"] = []
    ceiling_b = "environment alone (no TF), BatchedPyEnvironment(64)"
    rows[ceiling_b] = []
    baseline_of = {name: (base_b if "BatchedPyEnvironment" in name else base_a) for name in rows}
    for r in range(args.rounds):
        rows[base_a].append(dynamic_step_round(policy, gym_batch_envs(NUM_ENVS), args.seconds))
        for layout in layouts:
            rows[f"alf_async {layout[0]}x{layout[1]} BatchedGymEnv"].append(
                async_round(policy, gym_batch_envs, layout, args.seconds))
        rows[ceiling_a].append(measure_env_only(gym_batch_envs(NUM_ENVS).pyenv, args.seconds))
        rows[base_b].append(dynamic_step_round(policy, tf_agents_envs(NUM_ENVS), args.seconds))
        rows["alf_async 2x32 BatchedPyEnvironment"].append(
            async_round(policy, tf_agents_envs, (2, 32), args.seconds))
        rows[ceiling_b].append(measure_env_only(tf_agents_envs(NUM_ENVS).pyenv, args.seconds))
        print(f"round {r + 1}: " + ", ".join(f"{v[-1]['rate']:.0f}" for v in rows.values()),
              flush=True)
    print(f"\n{'collector':52s} {'steps/s':>8s} {'vs base':>8s} {'CPU us/step':>11s} "
          f"{'cs/step':>8s} {'batch':>6s}")
    for name, results in rows.items():
        med = {k: statistics.median(x[k] for x in results) for k in results[0]}
        ratio = statistics.median(a["rate"] / b["rate"]
                                  for a, b in zip(results, rows[baseline_of[name]]))
        print(f"{name:52s} {med['rate']:8.0f} {ratio:7.2f}x {med['cpu_us']:11.1f} "
              f"{med['cs']:8.2f} {med.get('batch', 0):6.1f}")


if __name__ == "__main__":
    main()
