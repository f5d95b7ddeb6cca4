"""Serve a CartPole DQN policy over HTTP and train it on what clients play.

The server is a PolicyServerEnv: every client episode (examples/cartpole_client.py,
any number at once) is one of the driver's slots; the learner loop takes the
driver's batches through the server's ExperienceFilter into a uniform replay
buffer and trains a DQN agent. Clients in inference_mode="local" pull the
collect policy from the server and report their own actions.

    python examples/serve_cartpole.py --port 8900 --seconds 60 &
    python examples/cartpole_client.py --address http://127.0.0.1:8900 --clients 4

(A plain loop of run_async + agent.train; the gin-configured trainer is
alf_async/trainer.py's business.)
"""

import argparse
import logging
import signal
import threading
import time

import gym
import tensorflow as tf
from tf_agents.agents.dqn import dqn_agent
from tf_agents.networks import q_network
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts
from tf_agents.utils import common

from alf_async import AsyncOffPolicyDriver, DriverStoppedError
from alf_async.environments.external_env import specs_from_gym
from alf_async.replayers import UniformReplayer


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


class Learner(object):
    """The learner loop: driver batches -> ExperienceFilter -> replay -> agent.train.

    Threads: `run()` on the thread that calls it (the learner's); `stop()`
    from any thread ends it (the driver's run_async() then raises
    DriverStoppedError).
    """

    def __init__(self, ext, agent, num_slots, unroll_length=8, learn_queue_cap=1,
                 batch_size=64, train_steps_per_batch=1, capacity_per_row=20000):
        self.agent = agent
        self.replayer = UniformReplayer(agent.collect_data_spec, num_rows=num_slots,
                                        capacity_per_row=capacity_per_row)
        self.filter = ext.experience_filter(observers=[self.replayer])
        self.driver = AsyncOffPolicyDriver(
            ext.tf_env_factory(), agent.collect_policy, num_envs=num_slots,
            unroll_length=unroll_length, learn_queue_cap=learn_queue_cap, actor_queue_cap=1,
            exp_observers=[self.filter])
        self.filter.bind(self.driver)
        self._batch_size = batch_size
        self._train_steps = train_steps_per_batch
        self._train = common.function(
            lambda: agent.train(self.replayer.sample(batch_size, 2)).loss)
        self.losses = []

    def run(self, on_progress=None, max_train_steps=None):
        """Trains until stopped (or max_train_steps); returns the reason it ended."""
        self.driver.start()
        try:
            while max_train_steps is None or len(self.losses) < max_train_steps:
                self.driver.run_async()
                if not self.replayer.can_sample(2):
                    continue
                for _ in range(self._train_steps):
                    self.losses.append(float(self._train()))
                if on_progress is not None:
                    on_progress(self)
            return "max_train_steps"
        except DriverStoppedError:
            return "stopped"
        finally:
            self.driver.stop()

    def stop(self):
        self.driver.stop()

    def metrics(self):
        episodes, steps, avg_return, avg_length = [m.result().numpy()
                                                   for m in self.driver.get_metrics()]
        return dict(episodes=int(episodes), env_steps=int(steps),
                    average_return=float(avg_return), average_length=float(avg_length))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8900)
    parser.add_argument("--token", default=None)
    parser.add_argument("--slots", type=int, default=8,
                        help="episodes served at once (the driver's num_envs)")
    parser.add_argument("--seconds", type=float, default=60.0, help="then stop")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    from alf_async.serving import PolicyServerEnv  # pylint: disable=import-outside-toplevel

    action_spec, observation_spec = cartpole_specs()
    agent = build_dqn(action_spec, observation_spec)
    server = PolicyServerEnv(action_spec, observation_spec, host=args.host, port=args.port,
                             token=args.token, policy=agent.collect_policy,
                             max_concurrent=4 * args.slots, episode_idle_timeout=30.0)
    learner = Learner(server, agent, num_slots=args.slots)
    print(f"serving CartPole on {server.address} for {args.seconds:.0f} s", flush=True)

    last = [time.monotonic()]

    def progress(lrn):
        if time.monotonic() - last[0] >= 5.0:
            last[0] = time.monotonic()
            m = lrn.metrics()
            recent = lrn.losses[-100:]
            print(f"train steps {len(lrn.losses):6d}  loss {sum(recent) / len(recent):7.4f}  "
                  f"episodes {m['episodes']:5d}  env steps {m['env_steps']:7d}  "
                  f"AverageReturn {m['average_return']:6.1f}", flush=True)

    done = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: done.set())
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    thread = threading.Thread(target=learner.run, args=(progress,), name="learner")
    thread.start()
    try:
        done.wait(args.seconds)
    finally:
        learner.stop()
        thread.join()
        server.close()
    print(f"stopped: {learner.metrics()}, {len(learner.losses)} train steps")


if __name__ == "__main__":
    main()
