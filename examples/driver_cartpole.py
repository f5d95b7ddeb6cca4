"""Run the AsyncOffPolicyDriver on CartPole and print collection steps/s.

The driver alone, no training: 4 env threads of 16 CartPole-v0 each, 2
batched actors over a DQN collect policy (QNetwork 64x64), a learner loop
that only takes batches. For a training run, see the README's main command.

    python examples/driver_cartpole.py [--seconds 10]
"""

import argparse
import time

import tensorflow as tf
from tf_agents.agents.dqn import dqn_agent
from tf_agents.environments import tf_py_environment
from tf_agents.networks import q_network

from alf_async import AsyncOffPolicyDriver
from alf_async.environments.gym_batch import load_batched


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()

    def env_f():
        return tf_py_environment.TFPyEnvironment(load_batched("CartPole-v0", 16))

    spec_env = env_f()
    q_net = q_network.QNetwork(spec_env.observation_spec(), spec_env.action_spec(),
                               fc_layer_params=(64, 64))
    agent = dqn_agent.DqnAgent(spec_env.time_step_spec(), spec_env.action_spec(),
                               q_network=q_net, optimizer=tf.keras.optimizers.Adam(1e-3))
    agent.initialize()
    spec_env.close()

    driver = AsyncOffPolicyDriver(env_f, agent.collect_policy, num_envs=4,
                                  num_actor_queues=2, actor_queue_cap=2,
                                  learn_queue_cap=4, unroll_length=16)
    driver.start()
    try:
        steps, start, last_print = 0, time.perf_counter(), 0.0
        while time.perf_counter() - start < args.seconds:
            steps += driver.run_async()
            elapsed = time.perf_counter() - start
            if elapsed - last_print >= 1.0:
                last_print = elapsed
                episodes, env_steps, avg_return, _ = [m.result().numpy()
                                                      for m in driver.get_metrics()]
                print(f"{elapsed:5.1f} s  {steps / elapsed:8.0f} steps/s  "
                      f"episodes {episodes}  AverageReturn {avg_return:.1f}", flush=True)
    finally:
        driver.stop()
    print(f"collected {steps} steps in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
