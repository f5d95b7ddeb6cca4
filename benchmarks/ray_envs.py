"""Steps/s with environments in Ray actors vs SubprocessEnvs vs in-process.

The driver (4 env threads, each a TFEnvironment of 4 environments, one actor
queue of capacity 2, unroll 16, DQN collect policy) collects from:

  in-process      BatchedGymEnv of 4 gym envs in the env thread
  subprocess      4 SubprocessEnvs, each row stepped as soon as its child answers
  ray 4 actors    4 Ray actors of 1 env each, called concurrently
  ray 1 actor     1 Ray actor of 4 envs, one remote call per batch step

for CartPole-v0 (a ~4 us step) and CartPole-v0 whose step sleeps 5 ms (a
simulated simulator), on a local Ray. The learner only dequeues.
SubprocessEnv and Ray environments declare blocking_step, so their env
threads step them off TF's inter-op pool; the in-process rows step inside
the graph, where each step holds an inter-op thread (--inter_op_threads,
0 = TF's default, one per core).

    RAY_AUTH_MODE=disabled python benchmarks/ray_envs.py [--seconds 5] [--inter_op_threads 0]
"""

import argparse
import functools
import os
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import tensorflow as tf  # noqa: E402
from tf_agents.environments import tf_py_environment  # noqa: E402

from alf_async import AsyncOffPolicyDriver  # noqa: E402
from alf_async.environments.processes import ray_env  # noqa: E402
from alf_async.environments.suites.gym_batch import BatchedGymEnv  # noqa: E402
from alf_async.environments import subprocess_env_constructor  # noqa: E402
from alf_async.testing.envs import cartpole, slow_cartpole  # noqa: E402
from alf_async.testing.policies import dqn_collect_policy  # noqa: E402

ENV_THREADS, ENVS_PER_THREAD = 4, 4


def rate(env_constructor, policy, seconds):
    driver = AsyncOffPolicyDriver(env_constructor, policy, num_envs=ENV_THREADS,
                                  actor_queue_cap=2, learn_queue_cap=2, unroll_length=16)
    driver.start()
    try:
        for _ in range(2):
            driver.run_async()
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            steps += driver.run_async()
        return steps / (time.perf_counter() - start)
    finally:
        driver.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--inter_op_threads", type=int, default=0)
    args = parser.parse_args()
    if args.inter_op_threads:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)
    policy = dqn_collect_policy(tf_py_environment.TFPyEnvironment(
        BatchedGymEnv([cartpole() for _ in range(ENVS_PER_THREAD)])))
    make_envs = {"CartPole-v0": cartpole,
                 "CartPole-v0 + 5 ms step": functools.partial(slow_cartpole, 0.005)}
    rows = []
    for env_name, make_env in make_envs.items():
        kinds = {
            "in-process": lambda: tf_py_environment.TFPyEnvironment(
                BatchedGymEnv([make_env() for _ in range(ENVS_PER_THREAD)])),
            "subprocess": subprocess_env_constructor(make_env, num_envs=ENVS_PER_THREAD),
            "ray 4 actors x 1 env": ray_env.ray_env_constructor(
                make_env, envs_per_actor=1, actors_per_env=ENVS_PER_THREAD, num_cpus=2),
            "ray 1 actor x 4 envs": ray_env.ray_env_constructor(
                make_env, envs_per_actor=ENVS_PER_THREAD, actors_per_env=1, num_cpus=2),
        }
        for kind, env_constructor in kinds.items():
            r = rate(env_constructor, policy, args.seconds)
            rows.append((env_name, kind, r))
            print(f"{env_name:26s} {kind:22s} {r:9.0f} steps/s", flush=True)
    ray_env.shutdown()
    print(f"\n{ENV_THREADS} env threads x {ENVS_PER_THREAD} envs, local Ray, "
          f"{os.cpu_count()} CPUs, TF inter-op threads: "
          f"{args.inter_op_threads or 'default'}")
    print(f"{'environment':26s} {'where':22s} {'steps/s':>9s}")
    for env_name, kind, r in rows:
        print(f"{env_name:26s} {kind:22s} {r:9.0f}")


if __name__ == "__main__":
    main()
