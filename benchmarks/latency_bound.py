"""Slow environments: alf_async's driver vs tf-agents' lockstep collection.

N CartPole-v0 environments whose every step first sleeps a random time of
mean M (a remote or heavy simulator; seeded per environment). The latency
bound is N / M env steps per second: every environment stepping back to back
with no wait for actions.

  lockstep   DynamicStepDriver over TFPyEnvironment(BatchedPyEnvironment(
             N suite_gym envs, multithreading=True)): each batch step waits
             for the slowest of the N.
  alf_async  --layouts env threads x envs, the same suite_gym environments
             (declaring blocking_step = True, so env threads step them from
             Python), one actor with dynamic batching, unroll 8.

Same process, alternating rounds, the same DQN collect policy (QNetwork
64x64); the driver's learner only dequeues. Prints steps/s, CPU us and
context switches per env step (whole process), the ratio to lockstep and
the fraction of the bound.

    python benchmarks/latency_bound.py [--num_envs 32] [--mean_ms 1]
        [--dist exp|const|lognormal] [--layouts 32x1 8x4 4x8] [--rounds 3]
        [--seconds 5]
"""

import argparse
import statistics
import time

import gym
import numpy as np
from tf_agents.environments import batched_py_environment, suite_gym, tf_py_environment

from alf_async import AsyncOffPolicyDriver
from alf_async.testing.policies import dqn_collect_policy
from usage import measure_driver, measure_dynamic_step_driver  # benchmarks/ is this script's directory

ENV = "CartPole-v0"


class RandomLatency(gym.Wrapper):
    """Sleeps a seeded random time before each step."""

    def __init__(self, env, mean_secs, dist, seed):
        super().__init__(env)
        self._rng = np.random.default_rng(seed)
        self._mean, self._dist = mean_secs, dist

    def _latency(self):
        if self._dist == "const":
            return self._mean
        if self._dist == "lognormal":  # sigma 1, scaled to the mean
            return self._mean * self._rng.lognormal(-0.5, 1.0)
        return self._rng.exponential(self._mean)

    def step(self, action):
        time.sleep(self._latency())
        return self.env.step(action)


def slow_envs(seeds, mean_secs, dist):
    """A TFPyEnvironment over suite_gym environments that sleep; declares blocking_step."""
    envs = []
    for seed in seeds:
        env = suite_gym.wrap_env(RandomLatency(gym.make(ENV).env, mean_secs, dist, seed),
                                 max_episode_steps=200)
        env.blocking_step = True
        envs.append(env)
    return tf_py_environment.TFPyEnvironment(
        batched_py_environment.BatchedPyEnvironment(envs, multithreading=len(envs) > 1))


def lockstep_round(policy, args, seconds):
    env = slow_envs(range(args.num_envs), args.mean_ms / 1000, args.dist)
    try:
        return measure_dynamic_step_driver(env, policy, args.num_envs * 10, seconds)
    finally:
        env.close()


def async_round(policy, args, layout, seconds):
    threads, per_thread = layout
    seeds = iter(range(10_000, 20_000))
    return measure_driver(AsyncOffPolicyDriver(
        lambda: slow_envs([next(seeds) for _ in range(per_thread)], args.mean_ms / 1000,
                          args.dist),
        policy, num_envs=threads, num_actor_queues=1, actor_queue_cap=threads,
        learn_queue_cap=threads, unroll_length=8), seconds)


def parse_layout(text):
    threads, per_thread = (int(x) for x in text.split("x"))
    return threads, per_thread


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num_envs", type=int, default=32)
    parser.add_argument("--mean_ms", type=float, default=1.0)
    parser.add_argument("--dist", choices=["exp", "const", "lognormal"], default="exp")
    parser.add_argument("--layouts", nargs="+", default=["32x1", "8x4", "4x8"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    layouts = [parse_layout(x) for x in args.layouts]
    for threads, per_thread in layouts:
        if threads * per_thread != args.num_envs:
            parser.error(f"layout {threads}x{per_thread} is not {args.num_envs} environments")
    bound = args.num_envs / (args.mean_ms / 1000)
    policy = dqn_collect_policy(tf_py_environment.TFPyEnvironment(suite_gym.load(ENV)))
    names = ["lockstep"] + [f"alf_async {t}x{b}" for t, b in layouts]
    rows = {name: [] for name in names}
    for r in range(args.rounds):
        rows["lockstep"].append(lockstep_round(policy, args, args.seconds))
        for name, layout in zip(names[1:], layouts):
            rows[name].append(async_round(policy, args, layout, args.seconds))
        print(f"round {r + 1}: " + ", ".join(f"{n} {v[-1]['rate']:.0f}" for n, v in rows.items()),
              flush=True)
    print(f"\n{args.num_envs} envs, {args.dist} latency of mean {args.mean_ms} ms: "
          f"bound {bound:.0f} steps/s")
    print(f"{'collector':22s} {'steps/s':>9s} {'vs lockstep':>11s} {'of bound':>9s} "
          f"{'CPU us/step':>11s} {'cs/step':>8s} {'batch':>6s}")
    for name in names:
        med = {k: statistics.median(x[k] for x in rows[name])
               for k in rows[name][0]}
        ratio = statistics.median(a["rate"] / b["rate"]
                                  for a, b in zip(rows[name], rows["lockstep"]))
        print(f"{name:22s} {med['rate']:9.0f} {ratio:10.2f}x {med['rate'] / bound:8.0%} "
              f"{med['cpu_us']:11.1f} {med['cs']:8.2f} {med.get('batch', 0):6.1f}")


if __name__ == "__main__":
    main()
