"""Collection throughput: alf_async's driver vs tf-agents' DynamicStepDriver.

Same process, alternating rounds, the same DQN collect policy (QNetwork
64x64) and 64 CartPole-v0 environments on both sides of each comparison:

  same env layer (BatchedGymEnv):
    tf-agents  DynamicStepDriver over BatchedGymEnv(64)               <- baseline A
    alf_async  --layouts env threads x BatchedGymEnv(n), 1 actor (cap: all rows),
               or with ':0' acting in the env threads (num_actor_queues=0)
  tf-agents' suite_gym stack:
    tf-agents  DynamicStepDriver over BatchedPyEnvironment(64 suite_gym)  <- baseline B
    alf_async  --stack_layouts env threads x BatchedPyEnvironment(n suite_gym), likewise

The driver's learner only dequeues (run_async, no training); the
DynamicStepDriver collects with no observers. The "environment alone" rows
step the same batched environment in a plain Python loop with random
actions and no TF: a Python environment's step holds the GIL, so no
collector in one process can step it faster (the ceiling). Each row prints steps/s, CPU
us and context switches per env step (whole process) and its median
per-round ratio to its baseline. Absolute rates drift on a shared machine;
the ratios within one run are the figure.

    python benchmarks/throughput.py [--rounds 3] [--seconds 5]
        [--layouts 1x64 1x64:0 2x32 2x32:0 4x16 8x8] [--stack_layouts 2x32 1x64:0]
"""

import argparse
import json
import statistics

import gym
from tf_agents.environments import batched_py_environment, suite_gym, tf_py_environment

from alf_async import AsyncOffPolicyDriver
from alf_async.environments.suites.gym_batch import BatchedGymEnv
from alf_async.testing.policies import dqn_collect_policy
import host_info  # benchmarks/ is this script's directory
from usage import measure_driver, measure_dynamic_step_driver, measure_env_only, parse_layout

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
    threads, per_thread, queues = layout
    return measure_driver(AsyncOffPolicyDriver(
        lambda: env_constructor(per_thread), policy, num_envs=threads, num_actor_queues=queues,
        actor_queue_cap=threads, learn_queue_cap=threads, unroll_length=16), seconds)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--layouts", nargs="+",
                        default=["1x64", "1x64:0", "2x32", "2x32:0", "4x16", "8x8"])
    parser.add_argument("--stack_layouts", nargs="+", default=["2x32", "1x64:0"])
    parser.add_argument("--json", default=None, help="write the rounds and the host here")
    args = parser.parse_args()
    layouts = [parse_layout(text) for text in args.layouts]
    stack_layouts = [parse_layout(text) for text in args.stack_layouts]
    policy = make_policy()
    base_a = "tf-agents DynamicStepDriver, BatchedGymEnv(64)"
    base_b = "tf-agents DynamicStepDriver, BatchedPyEnvironment(64)"

    def name(layout, env):
        t, b, q = layout
        return f"alf_async {t}x{b}{' acting itself' if q == 0 else ''} {env}"
    rows = {base_a: []}
    for layout in layouts:
        rows[name(layout, "BatchedGymEnv")] = []
    ceiling_a = "environment alone (no TF), BatchedGymEnv(64)"
    rows[ceiling_a] = []
    rows[base_b] = []
    for layout in stack_layouts:
        rows[name(layout, "BatchedPyEnvironment")] = []
    ceiling_b = "environment alone (no TF), BatchedPyEnvironment(64)"
    rows[ceiling_b] = []
    baseline_of = {row: (base_b if "BatchedPyEnvironment" in row else base_a) for row in rows}
    for r in range(args.rounds):
        rows[base_a].append(dynamic_step_round(policy, gym_batch_envs(NUM_ENVS), args.seconds))
        for layout in layouts:
            rows[name(layout, "BatchedGymEnv")].append(
                async_round(policy, gym_batch_envs, layout, args.seconds))
        rows[ceiling_a].append(measure_env_only(gym_batch_envs(NUM_ENVS).pyenv, args.seconds))
        rows[base_b].append(dynamic_step_round(policy, tf_agents_envs(NUM_ENVS), args.seconds))
        for layout in stack_layouts:
            rows[name(layout, "BatchedPyEnvironment")].append(
                async_round(policy, tf_agents_envs, layout, args.seconds))
        rows[ceiling_b].append(measure_env_only(tf_agents_envs(NUM_ENVS).pyenv, args.seconds))
        print(f"round {r + 1}: " + ", ".join(f"{v[-1]['rate']:.0f}" for v in rows.values()),
              flush=True)
    machine = host_info.host()
    print(f"\n{host_info.describe(machine)}")
    print(f"{'collector':52s} {'steps/s':>8s} {'vs base':>8s} {'CPU us/step':>11s} "
          f"{'cs/step':>8s} {'batch':>6s}")
    table = {}
    for row, results in rows.items():
        med = {k: statistics.median(x[k] for x in results) for k in results[0]}
        ratio = statistics.median(a["rate"] / b["rate"]
                                  for a, b in zip(results, rows[baseline_of[row]]))
        table[row] = dict(med, ratio=ratio, rounds=results)
        print(f"{row:52s} {med['rate']:8.0f} {ratio:7.2f}x {med['cpu_us']:11.1f} "
              f"{med['cs']:8.2f} {med.get('batch', 0):6.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(host=machine, args=vars(args), table=table), f, indent=1)


if __name__ == "__main__":
    main()
