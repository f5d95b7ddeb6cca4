"""Run the AsyncOffPolicyDriver on CartPole and print collection steps/s.

The driver alone, no training: 4 env threads of 16 CartPole-v0 each, 2
batched actors over a DQN collect policy (QNetwork 64x64), a Learner
without an agent that only takes batches. For a training run, see the README's main command.

    python examples/driver_cartpole.py [--seconds 10]
"""

import argparse
import sys
import time

from alf_async import quiet

quiet.quiet(verbose="--verbose" in sys.argv[1:])  # before TensorFlow and gym are imported

import tensorflow as tf  # noqa: E402
from tf_agents.agents.dqn import dqn_agent  # noqa: E402
from tf_agents.environments import tf_py_environment  # noqa: E402
from tf_agents.networks import q_network  # noqa: E402

from alf_async import AsyncOffPolicyDriver  # noqa: E402
from alf_async.environments.suites.gym_batch import load_batched  # noqa: E402
from alf_async.learning.learner import Hook, Learner  # noqa: E402
from alf_async.driver.metrics import by_name  # noqa: E402


class Rate(Hook):
    """Prints collection steps/s every second; stops the learner after `seconds`."""

    def __init__(self, seconds):
        self._seconds = seconds
        self._last_print = 0.0

    def after_iteration(self, learner, train_step_before, train_step):
        elapsed = time.monotonic() - learner.start_time
        if elapsed - self._last_print >= 1.0:
            self._last_print = elapsed
            m = by_name(learner.driver.get_metrics())
            print(f"{elapsed:5.1f} s  {learner.env_steps / elapsed:8.0f} steps/s  "
                  f"episodes {int(m['NumberOfEpisodes'].result())}  "
                  f"AverageReturn {float(m['AverageReturn'].result()):.1f}", flush=True)
        if elapsed >= self._seconds:
            learner.request_stop("seconds")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--verbose", action="store_true",
                        help="show third-party output (TensorFlow's banner, gym's notices)")
    args = parser.parse_args()

    def env_constructor():
        return tf_py_environment.TFPyEnvironment(load_batched("CartPole-v0", 16))

    spec_env = env_constructor()
    q_net = q_network.QNetwork(spec_env.observation_spec(), spec_env.action_spec(),
                               fc_layer_params=(64, 64))
    agent = dqn_agent.DqnAgent(spec_env.time_step_spec(), spec_env.action_spec(),
                               q_network=q_net, optimizer=tf.keras.optimizers.Adam(1e-3))
    agent.initialize()
    spec_env.close()

    driver = AsyncOffPolicyDriver(env_constructor, agent.collect_policy, num_envs=4,
                                  num_actor_queues=2, actor_queue_cap=2,
                                  learn_queue_cap=4, unroll_length=16)
    # A learner without an agent only takes the batches.
    learner = Learner(None, driver, hooks=[Rate(args.seconds)])
    learner.run()
    print(f"collected {learner.env_steps} steps in "
          f"{time.monotonic() - learner.start_time:.1f} s")


if __name__ == "__main__":
    main()
