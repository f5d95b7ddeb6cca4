"""Policy serving on loopback: get_action round-trip latency and requests/s.

One process runs a PolicyServerEnv with 16 slots (`--slots`; at least the
most clients), the driver (a DQN collect policy, QNetwork 64x64 on
CartPole's specs) and a learner thread that takes every batch (no
training: this measures serving). The slots are laid out as
`--slots_per_env` slots per env thread (default: all of them, i.e. one env
thread stepping whichever slots are ready, one actor, one request per
iteration of every ready slot); `--slots_per_env 1` is the other layout,
one slot per env thread and 2 actor queues of half the env threads each,
dynamically batched. In general: slots / slots_per_env env threads,
min(2, env threads) actor queues, each batching up to its share of them. For 1, 4 and 16 concurrent clients, a
separate client process (remote inference, no TensorFlow in it) runs that
many threads, each playing episodes of `--steps` steps: start_episode, then
per step one get_action carrying the previous step's reward (the combined
request), then log_returns + end_episode. Latency is the get_action round
trip as the client sees it.

With --in_process the clients are threads of the server's own process that
call the PolicyServerEnv's episode methods directly (no HTTP, no client
process): the floor under the HTTP figures, i.e. what the driver's path
from a client's get_action to the policy's answer costs by itself.

With --latency_ms L [L ...] (root and `ip netns` needed) the rows run
across a link: loopback's first, then per L the server on one test host
(a network namespace, alf_async.testing.netns) and the client process on
another, connecting through a relay on its own loopback that delays each
direction by L ms (alf_async.testing.relay), so RTT = 2 L; each row is
printed beside loopback's at its client count. With --stalled N each link's
rows run again while N more clients stall on the same link, from a process
of their own: half mid-episode (one get_action, then silence, holding a
slot), half mid-request (a get_action sent a byte per 100 ms, never
finished); the others must not slow down.

    python benchmarks/serving.py [--seconds 8] [--clients 1,4,16] [--slots N]
                                 [--slots_per_env K] [--in_process]
                                 [--latency_ms 5 20 [--stalled N]] [--json out.json]

Prints a markdown table: clients, get_action p50 and p99 (ms), get_action/s,
requests/s (all commands), client threads that failed (should be 0).
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------- clients


def play_clients(num_clients, seconds, steps, open_api, to_obs):
    """Plays episodes from `num_clients` threads for `seconds`: start_episode,
    then per step one get_action carrying the previous step's reward (the
    combined request), then log_returns + end_episode.

    Args:
        open_api: zero-arg callable returning a context manager that gives
            the episode API (a PolicyClient, or the PolicyServerEnv itself).
        to_obs: makes the API's observation from a float64 numpy array.

    Returns:
        dict(latencies=get_action round trips in seconds, requests=every
        command, elapsed=seconds, errors=repr of each thread's error).
    """
    latencies, requests, errors = [], [0], []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def play(k):
        rng = np.random.default_rng(k)
        mine, count = [], 0
        try:
            with open_api() as api:
                while time.monotonic() < deadline:
                    eid = api.start_episode()
                    count += 1
                    reward = None
                    for _ in range(steps):
                        obs = to_obs(rng.uniform(-0.05, 0.05, 4))
                        start = time.perf_counter()
                        api.get_action(eid, obs, reward=reward)
                        mine.append(time.perf_counter() - start)
                        reward = 1.0   # the step's reward rides on the next get_action
                        count += 1
                    api.log_returns(eid, reward)
                    api.end_episode(eid, obs)
                    count += 2
        except Exception as e:  # pylint: disable=broad-except
            errors.append(repr(e))
        with lock:
            latencies.extend(mine)
            requests[0] += count

    start = time.monotonic()
    threads = [threading.Thread(target=play, args=(k,)) for k in range(num_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"latencies": latencies, "requests": requests[0],
            "elapsed": time.monotonic() - start, "errors": errors}


def client_worker(address, num_clients, seconds, steps):
    """Runs in the client process: plays episodes from `num_clients` threads."""
    from alf_async.serving.client import PolicyClient  # pylint: disable=import-outside-toplevel
    assert "tensorflow" not in sys.modules
    json.dump(play_clients(num_clients, seconds, steps, lambda: PolicyClient(address),
                           lambda x: x.tolist()), sys.stdout)


def stalled_worker(address, num_stalled, seconds):
    """Runs in a client process of its own: `num_stalled` clients that stall
    for `seconds`, half of them mid-episode (start_episode and one
    get_action, then silence: the episode holds its slot), half mid-request
    (a get_action's bytes sent one every 100 ms, never finished)."""
    import socket   # pylint: disable=import-outside-toplevel
    from urllib.parse import urlsplit   # pylint: disable=import-outside-toplevel
    from alf_async.serving.client import PolicyClient  # pylint: disable=import-outside-toplevel
    deadline = time.monotonic() + seconds
    clients, sockets = [], []
    for _ in range(num_stalled - num_stalled // 2):
        client = PolicyClient(address)
        client.get_action(client.start_episode(), [0.0, 0.0, 0.0, 0.0])
        clients.append(client)
    url = urlsplit(address)
    body = b'{"command": "get_action", "episode_id": "x", "observation": [0, 0, 0, 0]}'
    request = (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    for _ in range(num_stalled // 2):
        sockets.append(socket.create_connection((url.hostname, url.port), timeout=5))
    print("stalled", flush=True)
    sent = 0
    while time.monotonic() < deadline and sent < len(request) - 1:
        for sock in sockets:
            try:
                sock.send(request[sent:sent + 1])
            except OSError:
                pass  # closed by the server's idle timeout: that is its defence
        sent += 1
        time.sleep(0.1)
    time.sleep(max(0.0, deadline - time.monotonic()))
    for sock in sockets:
        sock.close()
    for client in clients:
        client.close()


@contextlib.contextmanager
def stalled_clients(address, num_stalled, seconds, netns=None):
    """stalled_worker in a child process (in `netns`), for the block once
    its clients stall."""
    if not num_stalled:
        yield
        return
    cmd = [sys.executable, os.path.abspath(__file__), "--stalled_worker", "--address", address,
           "--stalled", str(num_stalled), "--seconds", str(seconds)]
    if netns is not None:
        cmd = ["ip", "netns", "exec", netns] + cmd
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)  # pylint: disable=consider-using-with
    try:
        if proc.stdout.readline().strip() != "stalled":
            raise RuntimeError(f"the stalled clients failed (exit code {proc.wait()})")
        yield
    finally:
        proc.kill()
        proc.wait()


def run_clients(address, num_clients, seconds, steps, netns=None):
    """Runs client_worker in a child process (inside network namespace
    `netns`, if given); returns its measurements."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--address", address,
           "--clients", str(num_clients), "--seconds", str(seconds), "--steps", str(steps)]
    if netns is not None:
        cmd = ["ip", "netns", "exec", netns] + cmd
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)  # pylint: disable=consider-using-with
    try:
        out, _ = proc.communicate(timeout=seconds + 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"client process failed with exit code {proc.returncode}")
    return json.loads(out)


def in_process_clients(server, num_clients, seconds, steps):
    """client_worker's episodes from threads of this process, calling `server`'s
    episode methods directly (no HTTP); returns the same measurements."""
    return play_clients(num_clients, seconds, steps, lambda: contextlib.nullcontext(server),
                        lambda x: x.astype(np.float32))


# ----------------------------------------------------------------- server


def driver_layout(slots, slots_per_env):
    """(num_envs, num_actor_queues, actor_queue_cap) for `slots` slots, K per env thread."""
    num_envs = slots // slots_per_env
    num_actor_queues = min(2, num_envs)
    return num_envs, num_actor_queues, max(1, num_envs // num_actor_queues)


def serve_and_measure(client_counts, seconds, steps, slots, slots_per_env, in_process=False,
                      host="127.0.0.1", port=0, client_netns=None, client_address=None,
                      stalled=0):
    """Serves on `host`:`port` and measures each client count in turn; the
    clients run in `client_netns` (None: this one) and connect to
    `client_address` (None: the server's own address), while `stalled`
    clients stall (`stalled_worker`). Returns rows of (clients, p50 ms, p99
    ms, get_action/s, requests/s, client errors)."""
    # pylint: disable=import-outside-toplevel
    import gym
    import tensorflow as tf
    from tf_agents.agents.dqn import dqn_agent
    from tf_agents.networks import q_network
    from alf_async import AsyncOffPolicyDriver
    from alf_async.environments.external.external_env import specs_from_gym
    from alf_async.learning.learner import Learner
    from alf_async.serving import PolicyServerEnv

    env = gym.make("CartPole-v0")
    action_spec, observation_spec = specs_from_gym(env.action_space, env.observation_space)
    env.close()
    server = PolicyServerEnv(action_spec, observation_spec, host=host, port=port,
                             max_concurrent=4 * slots)
    q_net = q_network.QNetwork(server.time_step_spec().observation, server.action_spec(),
                               fc_layer_params=(64, 64))
    agent = dqn_agent.DqnAgent(server.time_step_spec(), server.action_spec(), q_network=q_net,
                               optimizer=tf.keras.optimizers.Adam(1e-3))
    agent.initialize()
    num_envs, num_actor_queues, actor_queue_cap = driver_layout(slots, slots_per_env)
    driver = AsyncOffPolicyDriver(server.env_constructor(slots_per_env=slots_per_env),
                                  agent.collect_policy, num_envs=num_envs,
                                  num_actor_queues=num_actor_queues,
                                  actor_queue_cap=actor_queue_cap,   # batch whatever waits
                                  unroll_length=16, learn_queue_cap=1)

    # A learner without an agent: it takes every batch; it starts the driver.
    learner = Learner(None, driver)
    thread = threading.Thread(target=learner.run, name="learner", daemon=True)
    thread.start()
    rows = []
    try:
        # Warm-up: every slot serves a first episode before anything is measured.
        if in_process:
            def clients(n, secs):
                return in_process_clients(server, n, secs, steps)
        else:
            def clients(n, secs):
                return run_clients(client_address or server.address, n, secs, steps,
                                   client_netns)
        warm = clients(slots, 3.0)
        if warm["errors"]:
            print(f"warm-up client errors: {warm['errors']}", file=sys.stderr)
        for n in client_counts:
            with stalled_clients(client_address or server.address, stalled, seconds + 30,
                                 client_netns):
                r = clients(n, seconds)
            lat = np.asarray(r["latencies"]) * 1e3
            rows.append((n, np.percentile(lat, 50), np.percentile(lat, 99),
                         len(lat) / r["elapsed"], r["requests"] / r["elapsed"],
                         len(r["errors"])))
            if r["errors"]:
                print(f"{n} clients: errors {r['errors']}", file=sys.stderr)
    finally:
        learner.stop()
        thread.join(10)
        server.close()
    return rows


SERVER_PORT = 41998


def across_a_link(args):
    """--latency_ms: for loopback and then each latency (each without and
    then with --stalled clients, if any), runs this script again as the
    server (see main) and returns rows of (one-way latency ms or None for
    loopback, clients, p50, p99, get_action/s, requests/s, errors, stalled
    clients). Across a link the server is on test host 'server' and the
    clients, stalled ones too, on host 'client', connecting to a relay on
    their own loopback that adds the latency each way
    (alf_async.testing.relay)."""
    # pylint: disable=import-outside-toplevel
    import tempfile
    from alf_async.testing.distributed_jobs import RELAY_PORT, relay_on
    from alf_async.testing.netns import TestHosts, unavailable
    reason = unavailable()
    if reason:
        sys.exit(f"serving.py: error: --latency_ms: {reason}")
    base = [sys.executable, os.path.abspath(__file__), "--clients", args.clients,
            "--seconds", str(args.seconds), "--steps", str(args.steps),
            "--slots", str(args.slots), "--slots_per_env", str(args.slots_per_env)]
    rows = []
    runs = [(latency, stalled) for latency in [None] + list(args.latency_ms)
            for stalled in sorted({0, args.stalled})]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        for latency, stalled in runs:
            server = base + ["--stalled", str(stalled)]
            if latency is None:
                subprocess.run(server + ["--json", out], check=True, stdout=subprocess.DEVNULL)
            else:
                with TestHosts(["server", "client"]) as hosts:
                    target = f"{hosts.address('server')}:{SERVER_PORT}"
                    relay = relay_on(hosts, "client", target, "--delay_ms", str(latency))
                    try:
                        hosts.run("server", server + [
                            "--host", hosts.address("server"), "--port", str(SERVER_PORT),
                            "--client_netns", hosts.namespace("client"),
                            "--client_address", f"http://127.0.0.1:{RELAY_PORT}",
                            "--json", out], check=True, stdout=subprocess.DEVNULL)
                    finally:
                        relay.terminate()
                        relay.wait(30)
            with open(out) as f:
                rows += [[latency] + row + [stalled] for row in json.load(f)]
    return rows


def print_link_rows(rows):
    """The --latency_ms table: each row beside loopback's (without stalled
    clients) at its client count."""
    loopback = {row[1]: row for row in rows if row[0] is None and not row[7]}
    print("| one-way latency | stalled clients | clients | p50 (ms) | p99 (ms) | p99 - RTT (ms) "
          "| get_action/s | x loopback | client errors |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for latency, n, p50, p99, actions, _, errors, stalled in rows:
        where = "loopback" if latency is None else f"{latency:g} ms"
        over = p99 - 2 * (latency or 0.0)
        print(f"| {where} | {stalled} | {n:.0f} | {p50:.2f} | {p99:.2f} | {over:.2f} "
              f"| {actions:,.0f} | {actions / loopback[n][4]:.2f} | {errors:.0f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="per client count")
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--steps", type=int, default=50, help="steps per episode")
    parser.add_argument("--slots", type=int, default=0,
                        help="driver slots (episodes served at once); default max(16, most "
                             "clients)")
    parser.add_argument("--slots_per_env", type=int, default=0,
                        help="slots per env thread (a divisor of --slots); default: all of "
                             "them (one env thread); 1: one env thread per slot")
    parser.add_argument("--in_process", action="store_true",
                        help="clients are threads of this process calling the server "
                             "directly: no HTTP (the floor under the HTTP figures)")
    parser.add_argument("--latency_ms", type=float, nargs="+", default=None,
                        help="across a link (root and ip netns needed): loopback's rows, "
                             "then for each one-way latency the server on one test host "
                             "and the clients on another, behind a relay")
    parser.add_argument("--stalled", type=int, default=0,
                        help="with --latency_ms: each link's rows again while this many more "
                             "clients stall on it, half mid-episode, half mid-request")
    parser.add_argument("--json", default=None, help="write the rows here as JSON")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stalled_worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--host", default="127.0.0.1", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--client_netns", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--client_address", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        client_worker(args.address, int(args.clients), args.seconds, args.steps)
        return
    if args.stalled_worker:
        stalled_worker(args.address, args.stalled, args.seconds)
        return
    if args.stalled < 0:
        parser.error(f"--stalled must be >= 0, got {args.stalled}")
    counts = [int(c) for c in args.clients.split(",")]
    # The clients stalled mid-episode hold a slot each.
    slots = args.slots or max(16, max(counts)) + args.stalled - args.stalled // 2
    if max(counts) + args.stalled - args.stalled // 2 > slots:
        parser.error(f"at most {slots} clients (one slot each)")
    slots_per_env = args.slots_per_env or slots
    if slots_per_env < 1 or slots % slots_per_env:
        parser.error(f"--slots_per_env must be a divisor of --slots ({slots}) >= 1, "
                     f"got {args.slots_per_env}")
    if args.latency_ms is not None:
        args.slots, args.slots_per_env = slots, slots_per_env
        rows = across_a_link(args)
        import host_info   # pylint: disable=import-outside-toplevel  (benchmarks/)
        host = host_info.host()
        print(f"\nhost: {host_info.describe(host)}")
        print(f"\nget_action round trip across a link ({slots} slots, remote inference, "
              f"{args.seconds:g} s per row, episodes of {args.steps} steps; RTT = 2 x the "
              f"one-way latency):\n")
        print_link_rows(rows)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(host=host, args=vars(args), rows=rows), f, indent=1)
        return
    rows = serve_and_measure(counts, args.seconds, args.steps, slots, slots_per_env,
                             args.in_process, args.host, args.port, args.client_netns,
                             args.client_address, args.stalled)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([list(map(float, row)) for row in rows], f)
    num_envs, num_actor_queues, actor_queue_cap = driver_layout(slots, slots_per_env)
    where = ("in-process clients, no HTTP" if args.in_process else
             "on loopback, clients in another process")
    print(f"\nget_action round trip, {where} ({slots} slots: {num_envs} env threads x "
          f"{slots_per_env} slots, {num_actor_queues} actor queues of cap {actor_queue_cap}; "
          f"remote inference, "
          f"{args.seconds:g} s per row, episodes of {args.steps} steps):\n")
    print("| clients | get_action p50 (ms) | get_action p99 (ms) | get_action/s | requests/s "
          "| client errors |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n, p50, p99, actions, requests, errors in rows:
        print(f"| {n} | {p50:.2f} | {p99:.2f} | {actions:,.0f} | {requests:,.0f} | {errors} |")


if __name__ == "__main__":
    main()
