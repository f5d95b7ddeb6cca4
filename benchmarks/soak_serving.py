"""The HTTP half of benchmarks/soak.py: a DQN learner fed by HTTP clients.

Two process kinds, both started (and stopped with SIGINT) by soak.py:

- `--serve`: a PolicyServerEnv on loopback with `--slots` episode slots,
  an AsyncOffPolicyDriver over it (one env thread stepping every slot, the
  DQN collect policy; remote inference), a UniformReplayer and a Learner that trains
  DQN (QNetwork 64x64, Adam 1e-3, gamma 0.99, squared TD loss, soft target
  updates; 2 train steps per 8 env steps once 1,000 steps are in). Prints its address, then a JSON progress line every
  `--report_secs`: env steps, train steps, loss.
- `--clients ADDRESS`: `--num_clients` threads, each playing CartPole-v0
  episodes through a PolicyClient (start_episode, get_action + log_returns
  per step, end_episode), no TensorFlow in the process. Prints a JSON line
  every `--report_secs`: episodes, steps, errors, mean return of the last
  100 episodes.

    python benchmarks/soak_serving.py --serve --slots 4
    python benchmarks/soak_serving.py --clients http://127.0.0.1:PORT --num_clients 4
"""

import argparse
import collections
import json
import signal
import sys
import threading


def serve(slots, report_secs):
    # pylint: disable=import-outside-toplevel
    import gym
    import tensorflow as tf
    from alf_async import AsyncOffPolicyDriver
    from alf_async.learning import agents, replayers
    from alf_async.environments.external.external_env import specs_from_gym
    from alf_async.learning.learner import Learner
    from alf_async.serving import PolicyServerEnv
    from tf_agents.utils import common

    env = gym.make("CartPole-v0")
    action_spec, observation_spec = specs_from_gym(env.action_space, env.observation_space)
    env.close()
    server = PolicyServerEnv(action_spec, observation_spec, max_concurrent=slots,
                             episode_idle_timeout=30.0)
    agent = agents.dqn_agent(
        server.time_step_spec(), server.action_spec(), tf.Variable(0, dtype=tf.int64),
        fc_layer_params=(64, 64), learning_rate=1e-3, epsilon_greedy=0.1,
        agent_kwargs=dict(gamma=0.99, target_update_tau=0.005, target_update_period=1,
                          td_errors_loss_fn=common.element_wise_squared_loss))
    agent.initialize()
    replayer = replayers.UniformReplayer(agent.collect_data_spec, num_rows=slots,
                                         capacity_per_row=5000)
    # One env thread steps every slot (the serving job's layout).
    driver = AsyncOffPolicyDriver(server.env_constructor(slots_per_env=slots),
                                  agent.collect_policy, num_envs=1,
                                  unroll_length=8, learn_queue_cap=1,
                                  exp_observers=[replayer])
    # 2 train steps per 8 env steps (a batch is 8 steps of every slot) once
    # 1,000 env steps are in.
    learner = Learner(agent, driver, replayer, train_steps_per_iteration=2 * slots,
                      sample_batch_size=64, initial_collect_steps=1000)

    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    errors = []

    def learn():
        # Not the main thread: run_async blocks in TF, where no signal handler runs.
        try:
            learner.run()
        except Exception as e:  # pylint: disable=broad-except
            errors.append(repr(e))
            stop.set()

    def loss():
        return float("nan") if learner.loss is None else float(learner.loss.loss)

    print(json.dumps({"address": server.address}), flush=True)
    thread = threading.Thread(target=learn, name="learner")
    thread.start()
    try:
        while not stop.wait(report_secs):
            print(json.dumps({"env_steps": learner.env_steps,
                              "train_steps": learner.train_step, "loss": loss()}),
                  flush=True)
    finally:
        try:
            learner.stop()
        except Exception as e:  # pylint: disable=broad-except
            errors.append(repr(e))
        thread.join(30)
        server.close()
    print(json.dumps({"stopped": True, "env_steps": learner.env_steps, "errors": errors}),
          flush=True)
    if errors or thread.is_alive():
        raise SystemExit(1)


def clients(address, num_clients, report_secs):
    # pylint: disable=import-outside-toplevel
    import gym
    import numpy as np
    from alf_async.serving.client import PolicyClient
    assert "tensorflow" not in sys.modules

    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    lock = threading.Lock()
    totals = dict(episodes=0, steps=0, errors=0)
    returns = collections.deque(maxlen=100)
    last_error = []

    def play(k):
        env = gym.make("CartPole-v0")
        env.seed(k)
        with PolicyClient(address) as client:
            while not stop.is_set():
                try:
                    obs, done, total = env.reset(), False, 0.0
                    eid = client.start_episode()
                    while not done and not stop.is_set():
                        action = client.get_action(eid, np.asarray(obs).tolist())
                        obs, reward, done, _ = env.step(int(action))
                        client.log_returns(eid, float(reward))
                        total += reward
                        with lock:
                            totals["steps"] += 1
                    client.end_episode(eid, np.asarray(obs).tolist())
                    with lock:
                        totals["episodes"] += 1
                        returns.append(total)
                except Exception as e:  # pylint: disable=broad-except
                    with lock:
                        totals["errors"] += 1
                        last_error[:] = [repr(e)]
                    if stop.wait(1.0):
                        break
        env.close()

    threads = [threading.Thread(target=play, args=(k,), daemon=True) for k in range(num_clients)]
    for t in threads:
        t.start()
    while not stop.wait(report_secs):
        with lock:
            print(json.dumps(dict(totals, mean_return=float(np.mean(returns)) if returns else None,
                                  last_error=last_error[:1])), flush=True)
    for t in threads:
        t.join(10)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--clients", metavar="ADDRESS")
    parser.add_argument("--num_clients", type=int, default=4)
    parser.add_argument("--report_secs", type=float, default=5.0)
    args = parser.parse_args()
    if args.serve:
        serve(args.slots, args.report_secs)
    elif args.clients:
        clients(args.clients, args.num_clients, args.report_secs)
    else:
        parser.error("--serve or --clients ADDRESS")


if __name__ == "__main__":
    main()
