"""Soak: one long DQN training run on SubprocessEnvs, sampled for leaks.

Runs `alf-async-train` (gin_configs/dqn_cartpole.gin +
dqn_cartpole_subprocess.gin, scaled to 2 env threads x 4 child processes,
never stopping on its own) for `--minutes`, and every `--sample_secs`
samples from /proc: the trainer's RSS, thread count and open file
descriptors, its live descendant processes (SubprocessEnv children + the
fork server) and their total PSS (shared pages split between them), and env
steps/s from its progress lines.
At the end it sends SIGINT (the CLI stops, writes a checkpoint and exits),
checks that the exit is clean and no descendant is left, prints the table and
flags growth between the first sample after warm-up and the last one.

    python benchmarks/soak.py --minutes 30 --sample_secs 60   # the figure in docs/results/reliability.md
    python benchmarks/soak.py --minutes 4 --sample_secs 30    # what fits in a short slot

With `--http_clients N` (default 4) a second DQN learner runs beside it,
fed over HTTP: benchmarks/soak_serving.py's server process (PolicyServerEnv
with N slots, the driver, a learner) and its client process (N threads
playing CartPole-v0 through PolicyClient). Its RSS, threads and fds, the
clients' RSS, episodes and errors are sampled and flagged the same way.
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIN_FILES = [os.path.join(ROOT, "gin_configs", "dqn_cartpole.gin"),
             os.path.join(ROOT, "gin_configs", "dqn_cartpole_subprocess.gin")]
GIN_PARAMS = [
    "Layout.env_threads = 2",                      # env threads
    "Layout.rows_per_env_thread = 4",                # children per env thread: 8 in all
    "Schedule.rows_per_batch = 8",               # 8 rows x 16 = 128 env steps per iteration
    "Schedule.train_steps_per_iteration = 8",     # as the default's 16 per 256 env steps
    "Evaluation.stop_at_return = None",        # never stop on solving
    "Schedule.num_env_steps = 1000000000",
    "Outputs.checkpoint_interval = 2000",        # checkpoints during the soak, too
    "Outputs.log_interval_secs = 5.0",
]
_PROGRESS = re.compile(r"\[alf_async\] iteration (\d+) \| env steps (\d+) .*\| train steps (\d+)")
_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20


def _children_map():
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(name))
    return children


def descendants(pid):
    children, out, todo = _children_map(), [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def rss_mb(pid):
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE_MB
    except OSError:
        return 0.0


def pss_mb(pid):
    """Proportional set size: shared pages split between their users."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def threads(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


def sample(pid, progress):
    kids = descendants(pid)
    return dict(t=time.monotonic(), rss=rss_mb(pid), threads=threads(pid),
                fds=len(os.listdir(f"/proc/{pid}/fd")), children=len(kids),
                children_rss=sum(pss_mb(k) for k in kids), env_steps=progress["env_steps"],
                train_steps=progress["train_steps"], ptime=progress["t"])


class JsonProcess(object):
    """A child printing JSON lines; keeps the last one (and the address line)."""

    def __init__(self, cmd):
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, start_new_session=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.last, self.first = {}, None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith("{"):
                try:
                    value = json.loads(line)
                except ValueError:
                    continue
                if self.first is None:
                    self.first = value
                self.last = value

    def stop(self, timeout=60):
        """SIGINT, then the exit code (None: killed after `timeout`)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            rc = None
        self._reader.join(5)
        return rc


def start_serving(num_clients):
    """The server process, once it prints its address, and the client process."""
    script = os.path.join(ROOT, "benchmarks", "soak_serving.py")
    server = JsonProcess([sys.executable, script, "--serve", "--slots", str(num_clients)])
    deadline = time.monotonic() + 300
    while server.first is None and server.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if server.first is None:
        server.stop(10)
        raise RuntimeError("the soak's policy server did not start")
    clients = JsonProcess([sys.executable, script, "--clients", server.first["address"],
                           "--num_clients", str(num_clients)])
    return server, clients


def sample_serving(server, clients):
    return dict(srv_rss=rss_mb(server.proc.pid), srv_threads=threads(server.proc.pid),
                srv_fds=len(os.listdir(f"/proc/{server.proc.pid}/fd")),
                srv_env_steps=server.last.get("env_steps", 0),
                srv_train_steps=server.last.get("train_steps", 0),
                cl_rss=rss_mb(clients.proc.pid), episodes=clients.last.get("episodes", 0),
                client_errors=clients.last.get("errors", 0),
                mean_return=clients.last.get("mean_return"))


def flag_growth(samples):
    """Growth between the first sample after warm-up and the last one."""
    if len(samples) < 3:
        return ["too few samples to judge growth"]
    a, b = samples[1], samples[-1]
    flags = []
    if b["rss"] > a["rss"] * 1.10 + 20:
        flags.append(f"trainer RSS grew {a['rss']:.0f} -> {b['rss']:.0f} MB")
    if b["children_rss"] > a["children_rss"] * 1.10 + 20:
        flags.append(f"children PSS grew {a['children_rss']:.0f} -> {b['children_rss']:.0f} MB")
    for key in ("threads", "fds", "children"):
        if b[key] > a[key]:
            flags.append(f"{key} grew {a[key]} -> {b[key]}")
    if "srv_rss" in a:
        if b["srv_rss"] > a["srv_rss"] * 1.10 + 20:
            flags.append(f"policy server RSS grew {a['srv_rss']:.0f} -> {b['srv_rss']:.0f} MB")
        if b["cl_rss"] > a["cl_rss"] * 1.10 + 20:
            flags.append(f"HTTP client process RSS grew {a['cl_rss']:.0f} -> {b['cl_rss']:.0f} MB")
        for key in ("srv_threads", "srv_fds"):
            if b[key] > a[key]:
                flags.append(f"policy server {key[4:]} grew {a[key]} -> {b[key]}")
        if b["client_errors"]:
            flags.append(f"{b['client_errors']} HTTP client errors")
        if b["episodes"] <= a["episodes"]:
            flags.append("HTTP clients completed no episode after warm-up")
    rates = [s["rate"] for s in samples[1:] if s.get("rate")]
    if len(rates) >= 2 and rates[-1] < 0.7 * rates[0]:
        flags.append(f"steps/s fell {rates[0]:.0f} -> {rates[-1]:.0f}")
    return flags


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--sample_secs", type=float, default=60.0)
    parser.add_argument("--root_dir", default=None, help="default: a new temporary dir")
    parser.add_argument("--gin_param", action="append", default=[],
                        help="more gin bindings for the run")
    parser.add_argument("--http_clients", type=int, default=4,
                        help="HTTP clients (and server slots) of the second learner; 0: none")
    args = parser.parse_args()
    root_dir = args.root_dir or tempfile.mkdtemp(prefix="alf_async_soak_")
    cmd = [sys.executable, "-m", "alf_async.bin.train", "--root_dir", root_dir]
    for g in GIN_FILES:
        cmd += ["--gin_file", g]
    for p in GIN_PARAMS + args.gin_param:
        cmd += ["--gin_param", p]
    print("soak:", " ".join(cmd), flush=True)
    server = clients = None
    if args.http_clients:
        server, clients = start_serving(args.http_clients)
        print(f"soak: policy server at {server.first['address']}, {args.http_clients} HTTP "
              f"clients", flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    progress = dict(env_steps=0, train_steps=0, t=None)
    tail = []

    def read():
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            del tail[:-30]
            m = _PROGRESS.search(line)
            if m:
                progress.update(env_steps=int(m.group(2)), train_steps=int(m.group(3)),
                                t=time.monotonic())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    samples, all_pids = [], set()
    start = time.monotonic()
    try:
        # The clock starts at the first progress line (training under way).
        while progress["t"] is None and proc.poll() is None and time.monotonic() - start < 300:
            time.sleep(0.2)
        start = time.monotonic()
        end = start + args.minutes * 60
        next_sample = start
        while proc.poll() is None and time.monotonic() < end + 1e-3:
            now = time.monotonic()
            if now >= next_sample:
                s = sample(proc.pid, progress)
                if server is not None:
                    s.update(sample_serving(server, clients))
                all_pids.update(descendants(proc.pid))
                if samples and s["ptime"] and samples[-1]["ptime"] and \
                        s["ptime"] > samples[-1]["ptime"]:
                    s["rate"] = (s["env_steps"] - samples[-1]["env_steps"]) / (
                        s["ptime"] - samples[-1]["ptime"])
                samples.append(s)
                print(f"  sample {len(samples)} at {now - start:.0f} s: RSS {s['rss']:.0f} MB, "
                      f"threads {s['threads']}, fds {s['fds']}, children {s['children']}, "
                      f"env steps {s['env_steps']}" + (
                          f"; server RSS {s['srv_rss']:.0f} MB, threads {s['srv_threads']}, "
                          f"fds {s['srv_fds']}, episodes {s['episodes']}"
                          if server is not None else ""), flush=True)
                next_sample += args.sample_secs
            time.sleep(min(1.0, max(0.0, next_sample - time.monotonic())))
        crashed = proc.poll() is not None
        if not crashed:
            proc.send_signal(signal.SIGINT)  # stop, checkpoint, exit
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            rc = None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        serving_rcs = (clients.stop(), server.stop()) if server is not None else None
    reader.join(5)
    time.sleep(1.0)
    left = sorted(p for p in all_pids if os.path.exists(f"/proc/{p}") and
                  open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] != "Z")

    print(f"\nSoak: {args.minutes:g} min of DQN CartPole on 8 SubprocessEnvs "
          f"(2 env threads x 4 children), sampled every {args.sample_secs:g} s\n")
    print("| t (s) | trainer RSS MB | threads | open fds | child procs | children PSS MB "
          "| env steps | steps/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in samples:
        rate = f"{s['rate']:.0f}" if s.get("rate") else ""
        print(f"| {s['t'] - start:.0f} | {s['rss']:.0f} | {s['threads']} | {s['fds']} | "
              f"{s['children']} | {s['children_rss']:.0f} | {s['env_steps']} | {rate} |")
    if server is not None:
        print(f"\nThe HTTP-fed learner beside it: a PolicyServerEnv with {args.http_clients} "
              f"slots, {args.http_clients} client threads playing CartPole-v0 in another "
              f"process\n")
        print("| t (s) | server RSS MB | threads | open fds | env steps | train steps "
              "| client RSS MB | episodes | client errors | mean return (last 100) |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for s in samples:
            ret = "" if s["mean_return"] is None else f"{s['mean_return']:.1f}"
            print(f"| {s['t'] - start:.0f} | {s['srv_rss']:.0f} | {s['srv_threads']} | "
                  f"{s['srv_fds']} | {s['srv_env_steps']} | {s['srv_train_steps']} | "
                  f"{s['cl_rss']:.0f} | {s['episodes']} | {s['client_errors']} | {ret} |")
    flags = flag_growth(samples)
    if serving_rcs is not None and serving_rcs != (0, 0):
        flags.append(f"the HTTP clients / policy server did not exit cleanly on SIGINT "
                     f"(exit codes {serving_rcs})")
    if crashed:
        flags.append(f"the trainer exited by itself (rc {rc}): " + " / ".join(tail[-5:]))
    elif rc != 0:
        flags.append(f"the trainer did not exit cleanly on SIGINT (rc {rc}): "
                     + " / ".join(tail[-5:]))
    if left:
        flags.append(f"processes left after exit: {left}")
    if args.root_dir is None:
        shutil.rmtree(root_dir, ignore_errors=True)
    print(f"\nexit code {rc}; processes left {len(left)}")
    print("growth flags: " + ("; ".join(flags) if flags else "none"))
    raise SystemExit(1 if flags else 0)


if __name__ == "__main__":
    main()
