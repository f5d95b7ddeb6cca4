"""Play CartPole episodes against a policy server: the client side of serving.

What it shows: `PolicyClient` (alf_async.serving.client), the five
episode calls a program of yours makes to a server that acts and learns.
The server is examples/serve_cartpole.py or the CLI's serving job:

    python examples/serve_cartpole.py --port 8900
    alf-async-train --root_dir runs/serving --gin_file gin_configs/dqn_cartpole_serving.gin

Run it from the repository's root, while the server runs:

    python examples/cartpole_client.py [--address http://127.0.0.1:8900]
        [--address_file runs/serving/server_address] [--clients 4] [--episodes 10]
        [--token TOKEN] [--inference_mode remote|local] [--verbose]

Each client thread runs its own gym CartPole and plays whole episodes:
start_episode, then get_action (carrying the previous step's reward: one
round trip per step) / step until done, then the last reward and
end_episode. Remote mode needs only the standard library, numpy and gym
(no TensorFlow).

It prints, for each client, its episodes and their returns, then the
steps the clients played in all (one action from the server each: a
CartPole step's reward is 1) (examples/expected/cartpole_client.txt;
docs/guides/examples.md shows a whole session). Exit codes: 0 when every
client played its episodes; 1, with one line on stderr
(`cartpole_client: error: ...`), when the server cannot be reached,
refuses the client (a wrong or missing token) or fails a request.
"""

import argparse
import sys
import threading
import time

from alf_async import quiet

quiet.quiet(verbose="--verbose" in sys.argv[1:])  # before gym is imported

import gym  # noqa: E402

from alf_async.serving.client import PolicyClient  # noqa: E402
from alf_async.serving.protocol import PolicyServerError  # noqa: E402

PROG = "cartpole_client"


def play_episodes(client, num_episodes, seed):
    """Plays episodes with `client`; returns their returns."""
    env = gym.make("CartPole-v0")
    returns = []
    try:
        for i in range(num_episodes):
            obs = env.reset(seed=seed * 1000 + i)
            episode_id = client.start_episode()
            total, done, reward = 0.0, False, None
            while not done:
                # The previous step's reward rides along with the request.
                action = client.get_action(episode_id, obs, reward=reward)
                obs, reward, done, _ = env.step(int(action))
                total += reward
            client.log_returns(episode_id, reward)
            # A time-limit stop is reported as an end too (the learner then
            # treats it as a termination; CartPole-v0 stops at 200).
            client.end_episode(episode_id, obs)
            returns.append(total)
    finally:
        env.close()
    return returns


def main():
    """Runs the clients; returns the exit code."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--address", default="http://127.0.0.1:8900")
    parser.add_argument("--address_file", default=None,
                        help="read the address from this file (a serving job's "
                             "ROOT_DIR/server_address); overrides --address")
    parser.add_argument("--token", default=None)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--episodes", type=int, default=10, help="per client")
    parser.add_argument("--inference_mode", default="remote", choices=("remote", "local"),
                        help="remote: the server acts; local: the client pulls the policy "
                             "and acts itself (needs TensorFlow)")
    parser.add_argument("--verbose", action="store_true", help="show gym's notices")
    args = parser.parse_args()
    address = args.address
    if args.address_file is not None:
        try:
            with open(args.address_file, encoding="utf-8") as f:
                address = f.read().strip()
        except OSError as e:
            return _error(f"cannot read --address_file {args.address_file}: {e.strerror}")

    results, errors = {}, []

    def run_client(k):
        try:
            with PolicyClient(address, token=args.token, inference_mode=args.inference_mode,
                              update_interval=5.0) as client:
                results[k] = play_episodes(client, args.episodes, seed=k)
        except (ConnectionError, TimeoutError, PolicyServerError, ValueError) as e:
            errors.append(e)

    start = time.monotonic()
    threads = [threading.Thread(target=run_client, args=(k,)) for k in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    if errors:
        return _error(_describe(errors[0], address))
    steps = sum(sum(r) for r in results.values())
    for k in sorted(results):
        r = results[k]
        print(f"client {k}: {len(r)} episodes, mean return {sum(r) / len(r):6.1f}, "
              f"first {r[0]:.0f}, last {r[-1]:.0f}")
    print(f"{args.clients} clients ({args.inference_mode}): {steps:.0f} steps in "
          f"{elapsed:.1f} s, {steps / elapsed:.0f} steps/s")
    return 0


def _describe(error, address):
    if isinstance(error, PermissionError):   # 401: protocol.UnauthorizedError
        return f"refused by {address}: {error} (check --token)"
    if isinstance(error, ConnectionError):
        return f"cannot connect to {address}: {error.__cause__ or error}"
    return f"{type(error).__name__}: {error}"


def _error(message):
    print(f"{PROG}: error: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
