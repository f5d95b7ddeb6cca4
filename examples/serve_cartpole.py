"""Serve a CartPole DQN policy over HTTP and train it on what clients play.

The server is a PolicyServerEnv: every client episode (examples/cartpole_client.py,
any number at once) is one of the driver's slots (all of them rows of one env
thread's environment, stepped whichever have a client step ready, one
request to the actor for all of them); the learner loop takes the
driver's batches (which hold the clients' logged actions: the server's slots
report them to the driver) into a uniform replay buffer and trains a DQN agent. Clients in inference_mode="local" pull the
collect policy from the server and report their own actions.

    python examples/serve_cartpole.py --port 8900 --seconds 60 &
    python examples/cartpole_client.py --address http://127.0.0.1:8900 --clients 4

(alf_async's Learner with pieces built in Python; the gin-configured
trainer is alf_async/trainer.py's business.)
"""

import argparse
import logging
import signal
import threading
import sys
import time

from alf_async import quiet

quiet.quiet(verbose="--verbose" in sys.argv[1:])  # before TensorFlow and gym are imported

import gym  # noqa: E402
import tensorflow as tf  # noqa: E402
from tf_agents.agents.dqn import dqn_agent  # noqa: E402
from tf_agents.networks import q_network  # noqa: E402
from tf_agents.specs import tensor_spec  # noqa: E402
from tf_agents.trajectories import time_step as ts  # noqa: E402
from tf_agents.utils import common  # noqa: E402

from alf_async import AsyncOffPolicyDriver  # noqa: E402
from alf_async.environments.external.external_env import specs_from_gym  # noqa: E402
from alf_async.learning.learner import Hook, Learner  # noqa: E402
from alf_async.driver.metrics import by_name  # noqa: E402
from alf_async.learning.replayers import UniformReplayer  # noqa: E402


def cartpole_specs():
    """(action_spec, observation_spec) array specs of gym's CartPole."""
    env = gym.make("CartPole-v0")
    try:
        return specs_from_gym(env.action_space, env.observation_space)
    finally:
        env.close()


def build_dqn(action_spec, observation_spec, gamma=0.99, learning_rate=1e-3,
              target_update_period=100):
    """A DQN agent (QNetwork 64x64, Huber TD loss) for array specs."""
    time_step_spec = tensor_spec.from_spec(ts.time_step_spec(observation_spec))
    action_spec = tensor_spec.from_spec(action_spec)
    q_net = q_network.QNetwork(time_step_spec.observation, action_spec,
                               fc_layer_params=(64, 64))
    agent = dqn_agent.DqnAgent(
        time_step_spec, action_spec, q_network=q_net,
        optimizer=tf.keras.optimizers.Adam(learning_rate), epsilon_greedy=0.1,
        gamma=gamma, target_update_period=target_update_period,
        td_errors_loss_fn=common.element_wise_huber_loss,
        train_step_counter=tf.Variable(0, dtype=tf.int64))
    agent.initialize()
    return agent


class LossLog(Hook):
    """Keeps each iteration's loss (its last train step's) and prints a line
    every `print_secs` seconds (None: never)."""

    def __init__(self, print_secs=None):
        self.losses = []
        self._print_secs = print_secs
        self._last = time.monotonic()

    def after_iteration(self, learner, train_step_before, train_step):
        if train_step > train_step_before:
            self.losses.append(float(learner.loss.loss))
        if self._print_secs is not None and time.monotonic() - self._last >= self._print_secs:
            self._last = time.monotonic()
            m = metrics(learner.driver)
            recent = self.losses[-100:] or [float("nan")]
            print(f"train steps {learner.train_step:6d}  loss {sum(recent) / len(recent):7.4f}  "
                  f"episodes {m['episodes']:5d}  env steps {m['env_steps']:7d}  "
                  f"AverageReturn {m['average_return']:6.1f}", flush=True)


def build_learner(ext, agent, num_slots, unroll_length=8, learn_queue_cap=1, batch_size=64,
                  train_steps_per_iteration=1, capacity_per_row=20000, hooks=()):
    """The learner of an ExternalEnv's episodes: driver batches -> a uniform
    replay buffer -> agent.train.

    Returns the learner. Run `learner.run()` on a thread of
    its own; `learner.stop()` from any thread ends it.
    """
    replayer = UniformReplayer(agent.collect_data_spec, num_rows=num_slots,
                               capacity_per_row=capacity_per_row)
    # One env thread, its environment's rows the slots (slots_per_env): the
    # learner's batch is learn_queue_cap x num_slots unrolls.
    driver = AsyncOffPolicyDriver(
        ext.env_constructor(slots_per_env=num_slots), agent.collect_policy, num_envs=1,
        unroll_length=unroll_length, learn_queue_cap=learn_queue_cap, actor_queue_cap=1,
        exp_observers=[replayer])
    learner = Learner(agent, driver, replayer,
                      train_steps_per_iteration=train_steps_per_iteration,
                      sample_batch_size=batch_size, hooks=hooks)
    return learner


def metrics(driver):
    """The driver's standard metrics, by name."""
    m = {name: metric.result().numpy() for name, metric in by_name(driver.get_metrics()).items()}
    return dict(episodes=int(m["NumberOfEpisodes"]), env_steps=int(m["EnvironmentSteps"]),
                average_return=float(m["AverageReturn"]),
                average_length=float(m["AverageEpisodeLength"]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8900)
    parser.add_argument("--token", default=None)
    parser.add_argument("--slots", type=int, default=8,
                        help="episodes served at once (slots of the one env thread)")
    parser.add_argument("--seconds", type=float, default=60.0, help="then stop")
    parser.add_argument("--verbose", action="store_true",
                        help="show third-party output (TensorFlow's banner, gym's notices)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    from alf_async.serving import PolicyServerEnv  # pylint: disable=import-outside-toplevel

    action_spec, observation_spec = cartpole_specs()
    agent = build_dqn(action_spec, observation_spec)
    server = PolicyServerEnv(action_spec, observation_spec, host=args.host, port=args.port,
                             token=args.token, policy=agent.collect_policy,
                             max_concurrent=4 * args.slots, episode_idle_timeout=30.0)
    learner = build_learner(server, agent, num_slots=args.slots, hooks=[LossLog(5.0)])
    print(f"serving CartPole on {server.address} for {args.seconds:.0f} s", flush=True)

    done = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: done.set())
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    # Not the main thread: run_async blocks in TF, where no signal handler runs.
    thread = threading.Thread(target=learner.run, name="learner")
    thread.start()
    try:
        done.wait(args.seconds)
    finally:
        learner.stop()
        thread.join()
        server.close()
    print(f"stopped: {metrics(learner.driver)}, {learner.train_step} train steps")


if __name__ == "__main__":
    main()
