"""Test hosts: network namespaces that a test makes on this machine, links
on one switch, and removes after it.

    with TestHosts(["learner", "collector0"]) as hosts:
        proc = hosts.popen("learner", [sys.executable, "-m", "alf_async.bin.train", ...])
        hosts.address("learner")      # e.g. '10.213.7.1', reachable from the hosts only
        hosts.cut("collector0")       # a partition: its link down ...
        hosts.heal("collector0")      # ... and up again

Each host is a namespace of its own, with loopback and one veth interface
(`eth0`) whose other end sits on a bridge in a namespace of its own (the
switch), so that cutting one host's link leaves the others talking. The
hosts' addresses are in one /24 of 10.213.0.0/16 (`subnet`), a private
range that exists only between these namespaces. The machine's own
namespace gets no interface and no address in it, only a blackhole route
for the /24 while the hosts exist: its default route would otherwise send
a stray connection to a host's address off the machine (measured: `ip
route get` gave the default gateway). Reach the hosts only from inside one
(`popen`, `run`). Namespace names carry this process's id, so two test
runs never share one.

It needs root and iproute2's `ip` with network namespaces; `unavailable()`
says in one line why a test must skip. `tc netem` (latency, loss) is often
missing from the kernel; delays and drops come from a userspace relay
instead (relay.py).

Threads: one thread makes, changes and removes the hosts; `popen` may be
called from any thread once `start()` returned.
"""

import os
import shutil
import subprocess

PREFIX = "10.213"


def _ip(*args):
    done = subprocess.run(["ip"] + list(args), capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")


def unavailable():
    """None where test hosts can be made here, else the reason, one line."""
    if os.geteuid() != 0:
        return "test hosts (ip netns) need root"
    if shutil.which("ip") is None:
        return "test hosts need iproute2's ip"
    probe = f"alf{os.getpid()}probe"
    try:
        _ip("netns", "add", probe)
    except OSError as e:
        return f"network namespaces unavailable: {e}"
    try:
        _ip("netns", "del", probe)
    except OSError:
        pass
    return None


class TestHosts(object):
    """Namespaced hosts on one switch (see the module docstring).

    Args:
        names: the hosts' names; host k (from 1, in this order) gets
            address `subnet`.k.
    """

    def __init__(self, names):
        if len(set(names)) != len(names) or not 0 < len(names) < 250:
            raise ValueError(f"TestHosts: 1 to 249 distinct host names, got {list(names)}")
        self.names = list(names)
        self._prefix = f"alf{os.getpid()}"
        self._switch = f"{self._prefix}-switch"
        self._made = []
        self.subnet = None        # 'A.B.C' of the hosts' /24, once started
        self._blackhole = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()

    def namespace(self, name):
        """The namespace of host `name` (for `ip netns exec`)."""
        return f"{self._prefix}-{self.names.index(name) + 1}"

    def address(self, name):
        """Host `name`'s address."""
        return f"{self.subnet}.{self.names.index(name) + 1}"

    def _port(self, name):
        return f"p{self.names.index(name) + 1}"

    def start(self):
        """Makes the switch and the hosts; removes what it made if it fails."""
        try:
            # A /24 no other run holds (its blackhole route is the claim).
            for third in range(os.getpid() % 250, os.getpid() % 250 + 250):
                subnet = f"{PREFIX}.{third % 250}"
                try:
                    _ip("route", "add", "blackhole", f"{subnet}.0/24")
                except OSError as e:
                    if "File exists" in str(e):
                        continue        # another run's
                    raise
                self.subnet, self._blackhole = subnet, f"{subnet}.0/24"
                break
            else:
                raise OSError(f"TestHosts: every /24 of {PREFIX}.0.0/16 is in use")
            _ip("netns", "add", self._switch)
            self._made.append(self._switch)
            _ip("-n", self._switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self._switch, "link", "set", "br0", "up")
            for name in self.names:
                ns, port = self.namespace(name), self._port(name)
                _ip("netns", "add", ns)
                self._made.append(ns)
                _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", port,
                    "netns", self._switch)
                _ip("-n", ns, "addr", "add", f"{self.address(name)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", self._switch, "link", "set", port, "master", "br0")
                _ip("-n", self._switch, "link", "set", port, "up")
        except BaseException:
            self.close()
            raise

    def popen(self, name, argv, **kwargs):
        """`subprocess.Popen(argv, **kwargs)` inside host `name`."""
        return subprocess.Popen(["ip", "netns", "exec", self.namespace(name)] + list(argv),
                                **kwargs)

    def run(self, name, argv, **kwargs):
        """`subprocess.run(argv, **kwargs)` inside host `name`."""
        return subprocess.run(["ip", "netns", "exec", self.namespace(name)] + list(argv),
                              **kwargs)

    def cut(self, name):
        """Takes host `name`'s link down at the switch (a partition)."""
        _ip("-n", self._switch, "link", "set", self._port(name), "down")

    def heal(self, name):
        """Brings host `name`'s link back up."""
        _ip("-n", self._switch, "link", "set", self._port(name), "up")

    def bytes_from(self, name):
        """Bytes host `name` has sent that reached the switch (its port's
        receive counter): what gets through its link."""
        done = subprocess.run(["ip", "netns", "exec", self._switch, "cat",
                               f"/sys/class/net/{self._port(name)}/statistics/rx_bytes"],
                              capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise OSError(f"TestHosts.bytes_from({name!r}): {done.stderr.strip()}")
        return int(done.stdout)

    def close(self):
        """Removes every namespace made (their interfaces go with them); idempotent."""
        while self._made:
            try:
                _ip("netns", "del", self._made.pop())
            except OSError:
                pass
        if self._blackhole is not None:
            try:
                _ip("route", "del", "blackhole", self._blackhole)
            except OSError:
                pass
            self._blackhole = None
