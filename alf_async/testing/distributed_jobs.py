"""The processes of a distributed run, as the tests and benchmarks/ start
them: the learner CLI (`Learner`), collectors and relays, on this host or on
a namespaced one (`netns.TestHosts`). The learner and collectors run
`DISTRIBUTED_GIN` with `TINY` bound (the tests prove the roles and the
faults, not learning), from the checkout, with its directory on PYTHONPATH.
"""

import functools
import os
import re
import signal
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GIN = os.path.join(REPO, "gin_configs")
DISTRIBUTED_GIN = os.path.join(GIN, "dqn_cartpole_distributed.gin")
ENV = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
# Tiny and quick: the tests prove the roles and the faults, not learning.
TINY = [
    "dqn_agent.fc_layer_params = (16,)",
    "replay_table.min_size = 100",
    "replay_table.error_buffer = 400.0",
    "collect/Layout.rows_per_env_thread = 2",
    "collect.unroll_length = 4",
    "collect.variable_update_interval = 0.5",
    "Evaluation.episodes = 2",
    "Evaluation.interval = 100000",
    "Evaluation.stop_at_return = None",
    "Outputs.summary_interval = 100",
    "Outputs.log_interval_secs = 0.5",
]
PROGRESS = re.compile(r"\[alf_async\] iteration \d+ \| env steps \d+ .*\| train steps (\d+) ")


class Learner(object):
    """The learner CLI as a process whose stdout is read line by line by a thread."""

    def __init__(self, root_dir, *params, host=None, gin_file=DISTRIBUTED_GIN, base=None):
        """`host`: (TestHosts, name) to run it on a namespaced host; `base`:
        the bindings before `params` (None: `TINY`, for `gin_file`'s default)."""
        args = [sys.executable, "-m", "alf_async.bin.train", "--root_dir", str(root_dir),
                "--gin_file", gin_file]
        for p in (TINY if base is None else base) + list(params):
            args += ["--gin_param", p]
        popen = subprocess.Popen if host is None else functools.partial(host[0].popen, host[1])
        self.process = popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=ENV, cwd=REPO, start_new_session=True)
        self.lines = []
        self.err = []
        self._threads = [threading.Thread(target=self._read, args=(s, l), daemon=True)
                         for s, l in ((self.process.stdout, self.lines),
                                      (self.process.stderr, self.err))]
        for t in self._threads:
            t.start()

    def _read(self, stream, lines):
        for line in stream:
            lines.append(line.rstrip("\n"))

    def wait_for(self, predicate, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                match = predicate(line)
                if match:
                    return match
            assert self.process.poll() is None, (what, self.lines, self.err[-30:])
            time.sleep(0.1)
        raise AssertionError(f"no {what} within {timeout} s: {self.lines[-10:]}")

    def train_step(self):
        steps = [int(m.group(1)) for m in map(PROGRESS.match, list(self.lines)) if m]
        return steps[-1] if steps else -1

    def collector_pids(self):
        import psutil
        try:
            children = psutil.Process(self.process.pid).children()
        except psutil.NoSuchProcess:
            return []
        return sorted(c.pid for c in children if "alf_async.bin.collect" in " ".join(
            _cmdline(c)))

    def finish(self, timeout):
        self.process.wait(timeout)
        for t in self._threads:
            t.join(5)

    def kill(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def _cmdline(process):
    import psutil
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def collector_on(hosts, name, address, *params, env=None):
    """alf-async-collect on host `name`, with TINY and `params` bound and
    `env` added to its environment; its stdout and stderr are pipes (read
    them once it exited)."""
    args = [sys.executable, "-m", "alf_async.bin.collect", "--replay_address", address,
            "--gin_file", DISTRIBUTED_GIN]
    for p in TINY + list(params):
        args += ["--gin_param", p]
    return hosts.popen(name, args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, env=dict(ENV, **(env or {})), cwd=REPO)


RELAY_PORT = 41999


def relay_on(hosts, name, target, *flags):
    """alf_async.testing.relay on host `name`, listening on its loopback's
    RELAY_PORT and relaying to `target` with `flags`; returns once it accepts."""
    relay = hosts.popen(name, [sys.executable, "-m", "alf_async.testing.relay", "--listen",
                               f"127.0.0.1:{RELAY_PORT}", "--target", target] + list(flags),
                        stdout=subprocess.PIPE, text=True)
    assert relay.stdout.readline().startswith("relay listening"), name
    return relay


def wait_until(predicate, secs, what):
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {secs} s")


def remote_learner(hosts, root_dir, *params):
    """The learner CLI on host 'learner' for collectors started by hand on
    other hosts; returns (Learner, the address it announced)."""
    learner = Learner(root_dir, "Collectors.launcher = 'none'",
                      f"LearnerServer.advertised_host = '{hosts.address('learner')}'",
                      *params, host=(hosts, "learner"))
    try:
        address = learner.wait_for(
            lambda l: re.match(r"\[alf_async\] collectors connect to (\S+:\d+) ", l), 90,
            "address line").group(1)
    except BaseException:
        stop(learner.process)
        raise
    return learner, address


def stop_all(procs):
    """SIGINT to each of `procs`, then waits up to 30 s each (kills what is left)."""
    for p in procs:
        p.send_signal(signal.SIGINT)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
