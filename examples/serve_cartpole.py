"""Serve a CartPole DQN policy over HTTP and train it on what its clients play.

What it shows: a `PolicyServerEnv` (alf_async.serving), an ExternalEnv
whose episodes are played by clients in other processes
(examples/cartpole_client.py: each runs its own gym CartPole and asks the
server for every action). Each open client episode is one of the driver's
slots: the rows of one env thread's environment, stepped whichever have a
client step ready, one actor request for all of them. The learner takes
the driver's batches (8 slots' unrolls of 8 steps) into a uniform replay
buffer and trains a DQN agent; clients with `--inference_mode local` pull
the collect policy from the server and send only what they did.

Run it from the repository's root, then a client in another terminal:

    python examples/serve_cartpole.py [--port 8900] [--slots 8] [--address_file PATH]
        [--token TOKEN] [--seconds S] [--verbose]
    python examples/cartpole_client.py --address http://127.0.0.1:8900 --clients 2

It prints where it serves, a line every 5 seconds while it trains, and
when stopped (Ctrl-C, SIGTERM or --seconds) what reached the learner
(examples/expected/serve_cartpole.txt; docs/guides/examples.md shows a
whole session). The same server from the CLI: gin_configs/dqn_cartpole_serving.gin.
"""

import argparse
import os
import signal
import sys
import threading
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
from alf_async.driver.metrics import by_name  # noqa: E402
from alf_async.environments.external.external_env import specs_from_gym  # noqa: E402
from alf_async.learning import Learner, UniformReplayer  # noqa: E402
from alf_async.learning.learner import Hook  # noqa: E402
from alf_async.serving import PolicyServerEnv  # noqa: E402

UNROLL_LENGTH = 8   # a batch: every slot's unroll of 8 steps


def cartpole_specs():
    """(action_spec, observation_spec) array specs of gym's CartPole."""
    env = gym.make("CartPole-v0")
    try:
        return specs_from_gym(env.action_space, env.observation_space)
    finally:
        env.close()


def build_dqn(action_spec, observation_spec, gamma=0.99, learning_rate=1e-3,
              target_update_period=100):
    """A DQN agent (QNetwork 64x64, Huber TD loss, epsilon 0.1) for array specs."""
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


def metrics(driver):
    """The driver's standard metrics, by name."""
    m = {name: metric.result().numpy() for name, metric in by_name(driver.get_metrics()).items()}
    return dict(episodes=int(m["NumberOfEpisodes"]), env_steps=int(m["EnvironmentSteps"]),
                average_return=float(m["AverageReturn"]))


class Announce(Hook):
    """Says where the server is once the driver serves (and writes it to `address_file`)."""

    def __init__(self, server, slots, address_file):
        self._server, self._slots, self._address_file = server, slots, address_file

    def begin(self, learner):
        if self._address_file:   # written whole, then renamed: a reader never sees half
            with open(self._address_file + ".tmp", "w", encoding="utf-8") as f:
                f.write(self._server.address + "\n")
            os.replace(self._address_file + ".tmp", self._address_file)
        print(f"serving CartPole on {self._server.address} ({self._slots} slots); Ctrl-C stops",
              flush=True)


class PrintEvery(Hook):
    """A line every `seconds` seconds, once training started."""

    def __init__(self, seconds):
        self._seconds = seconds
        self._last = time.monotonic()

    def after_iteration(self, learner, train_step_before, train_step):
        if train_step > 0 and time.monotonic() - self._last >= self._seconds:
            self._last = time.monotonic()
            m = metrics(learner.driver)
            print(f"train steps {learner.train_step}, loss {float(learner.loss.loss):.4g}, "
                  f"clients' episodes {m['episodes']}, AverageReturn "
                  f"{m['average_return']:.1f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8900, help="0: any free port")
    parser.add_argument("--token", default=None, help="clients then need --token TOKEN")
    parser.add_argument("--slots", type=int, default=8,
                        help="client episodes stepped at once (the env thread's rows)")
    parser.add_argument("--address_file", default=None,
                        help="also write the address to this file (for the client's "
                             "--address_file)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="stop after this many seconds (default: at Ctrl-C or SIGTERM)")
    parser.add_argument("--verbose", action="store_true",
                        help="show third-party output (TensorFlow's banner, gym's notices)")
    args = parser.parse_args()

    action_spec, observation_spec = cartpole_specs()
    agent = build_dqn(action_spec, observation_spec)
    # Binds the port now (a port in use raises here); serves once the driver starts.
    server = PolicyServerEnv(action_spec, observation_spec, host=args.host, port=args.port,
                             token=args.token, policy=agent.collect_policy,
                             max_concurrent=4 * args.slots, episode_idle_timeout=30.0)
    replayer = UniformReplayer(agent.collect_data_spec, num_rows=args.slots,
                               capacity_per_row=20000)
    # One env thread whose environment's rows are the slots; a batch is one
    # unroll of each row (a fast client's slot may give two of its own).
    driver = AsyncOffPolicyDriver(server.env_constructor(slots_per_env=args.slots),
                                  agent.collect_policy, num_envs=1, num_actor_queues=1,
                                  unroll_length=UNROLL_LENGTH, exp_observers=[replayer])
    learner = Learner(agent, driver, replayer, train_steps_per_iteration=1,
                      sample_batch_size=64,
                      hooks=[Announce(server, args.slots, args.address_file), PrintEvery(5.0)])
    done = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: done.set())
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    # Not on the main thread: the learner waits for clients inside
    # TensorFlow, where no signal handler runs.
    thread = threading.Thread(target=learner.run, name="learner")
    thread.start()
    try:
        done.wait(args.seconds)
    finally:
        learner.stop()
        thread.join()
        server.close()
    m = metrics(driver)
    # The driver's metrics count the steps of the unrolls it shipped, 8 whole
    # ones at a time: the clients' last steps may not be among them yet.
    print(f"stopped at iteration {learner.iterations}: {learner.train_step} train steps on "
          f"{learner.env_steps} env steps (the clients' steps in whole unrolls: "
          f"{m['env_steps']}, in {m['episodes']} whole episodes)")


if __name__ == "__main__":
    main()
