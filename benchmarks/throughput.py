"""Collection throughput: alf_async's driver vs tf-agents' DynamicStepDriver.

Same process, alternating rounds, the same 64 CartPole-v0 environments' worth
of gym envs and the same DQN collect policy (QNetwork 64x64). Rows:

  tf-agents  DynamicStepDriver, TFPyEnvironment(BatchedPyEnvironment(64 suite_gym))  <- baseline
  alf_async  4 env threads x BatchedGymEnv(16), 2 actor queues x cap 2, unroll 16  <- target row
  alf_async  4 env threads x BatchedPyEnvironment(16 suite_gym)  (same env stack as the baseline)
  tf-agents  DynamicStepDriver over BatchedGymEnv(64)            (our env layer, their driver)

The driver's learner only dequeues (run_async, no training); the
DynamicStepDriver collects with no observers. Absolute rates drift on a
shared machine; the ratios within one run are the figure.

    python benchmarks/throughput.py [--rounds 3] [--seconds 5]
"""

import argparse
import statistics
import time

import gym
from tf_agents.drivers import dynamic_step_driver
from tf_agents.environments import batched_py_environment, suite_gym, tf_py_environment
from tf_agents.utils import common

from alf_async import AsyncOffPolicyDriver
from alf_async.environments.gym_batch import BatchedGymEnv
from alf_async.testing.policies import dqn_collect_policy

ENV = "CartPole-v0"
NUM_ENVS, ENV_THREADS = 64, 4


def make_policy():
    return dqn_collect_policy(tf_py_environment.TFPyEnvironment(suite_gym.load(ENV)))


def tf_agents_envs(n):
    return tf_py_environment.TFPyEnvironment(batched_py_environment.BatchedPyEnvironment(
        [suite_gym.load(ENV) for _ in range(n)], multithreading=(n == NUM_ENVS)))


def gym_batch_envs(n):
    return tf_py_environment.TFPyEnvironment(
        BatchedGymEnv([gym.make(ENV) for _ in range(n)]))


def dynamic_step_round(policy, tf_env, seconds):
    steps_per_run = NUM_ENVS * 25
    driver = dynamic_step_driver.DynamicStepDriver(tf_env, policy, num_steps=steps_per_run)
    run = common.function(driver.run)
    time_step, policy_state = run()  # trace + warm up
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        time_step, policy_state = run(time_step, policy_state)
        steps += steps_per_run
    return steps / (time.perf_counter() - start)


def async_round(policy, env_f, seconds):
    per_thread = NUM_ENVS // ENV_THREADS
    driver = AsyncOffPolicyDriver(lambda: env_f(per_thread), policy,
                                  num_envs=ENV_THREADS, num_actor_queues=2,
                                  actor_queue_cap=2, learn_queue_cap=ENV_THREADS,
                                  unroll_length=16)
    driver.start()
    try:
        for _ in range(3):  # warm up
            driver.run_async()
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            steps += driver.run_async()
        rate = steps / (time.perf_counter() - start)
        stats = driver.get_perf_stats()
    finally:
        driver.stop()
    return rate, stats


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    policy = make_policy()
    rows = {
        "tf-agents DynamicStepDriver, BatchedPyEnvironment(64)": [],
        "alf_async 4x16 BatchedGymEnv, 2 actors": [],
        "alf_async 4x16 BatchedPyEnvironment, 2 actors": [],
        "tf-agents DynamicStepDriver, BatchedGymEnv(64)": [],
    }
    names = list(rows)
    batch_sizes = []
    for r in range(args.rounds):
        rows[names[0]].append(dynamic_step_round(policy, tf_agents_envs(NUM_ENVS), args.seconds))
        rate, stats = async_round(policy, gym_batch_envs, args.seconds)
        rows[names[1]].append(rate)
        batch_sizes.append(stats["actor_rows"] / max(1, stats["actor_batches"]))
        rows[names[2]].append(async_round(policy, tf_agents_envs, args.seconds)[0])
        rows[names[3]].append(dynamic_step_round(policy, gym_batch_envs(NUM_ENVS), args.seconds))
        print(f"round {r + 1}: " + ", ".join(f"{v[-1]:.0f}" for v in rows.values()), flush=True)
    base = statistics.median(rows[names[0]])
    print(f"\n{'collector':58s} {'steps/s (median)':>16s} {'vs baseline':>12s}")
    for name in names:
        med = statistics.median(rows[name])
        print(f"{name:58s} {med:16.0f} {med / base:11.2f}x")
    ratio = statistics.median(a / b for a, b in zip(rows[names[1]], rows[names[0]]))
    print(f"\nratio alf_async (target row) / DynamicStepDriver, median of per-round ratios: "
          f"{ratio:.2f}x (target >= 3x); mean actor batch {statistics.mean(batch_sizes):.0f} rows")


if __name__ == "__main__":
    main()
