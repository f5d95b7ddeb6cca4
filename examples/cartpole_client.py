"""Play CartPole episodes against a policy server (examples/serve_cartpole.py).

Each client thread runs its own gym CartPole and plays whole episodes:
start_episode, then get_action / step / log_returns until done, end_episode.
Several clients at once, remote or local inference:

    python examples/cartpole_client.py --address http://127.0.0.1:8900 --clients 4
    python examples/cartpole_client.py --address ... --inference-mode local

Remote mode needs only the standard library, numpy and gym (no TensorFlow).
"""

import argparse
import threading
import time

import gym

from alf_async.serving.client import PolicyClient


def play_episodes(client, num_episodes, seed):
    """Plays episodes with `client`; returns their returns."""
    env = gym.make("CartPole-v0")
    returns = []
    try:
        for i in range(num_episodes):
            obs = env.reset(seed=seed * 1000 + i)
            episode_id = client.start_episode()
            total, done = 0.0, False
            while not done:
                action = client.get_action(episode_id, obs)
                obs, reward, done, _ = env.step(int(action))
                client.log_returns(episode_id, reward)
                total += reward
            # A time-limit stop is reported as an end too (the learner then
            # treats it as a termination; CartPole-v0 stops at 200).
            client.end_episode(episode_id, obs)
            returns.append(total)
    finally:
        env.close()
    return returns


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--address", default="http://127.0.0.1:8900")
    parser.add_argument("--token", default=None)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--episodes", type=int, default=10, help="per client")
    parser.add_argument("--inference-mode", default="remote", choices=("remote", "local"))
    args = parser.parse_args()

    results = {}

    def run_client(k):
        with PolicyClient(args.address, token=args.token,
                          inference_mode=args.inference_mode, update_interval=5.0) as client:
            results[k] = play_episodes(client, args.episodes, seed=k)

    start = time.monotonic()
    threads = [threading.Thread(target=run_client, args=(k,)) for k in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    steps = sum(sum(r) for r in results.values())
    for k in sorted(results):
        r = results[k]
        print(f"client {k}: {len(r)} episodes, mean return {sum(r) / len(r):6.1f}, "
              f"first {r[0]:.0f}, last {r[-1]:.0f}")
    print(f"{args.clients} clients ({args.inference_mode}): {steps:.0f} steps in "
          f"{elapsed:.1f} s, {steps / elapsed:.0f} steps/s")


if __name__ == "__main__":
    main()
