"""Across a network: the learner seen from another host, a network
namespace the test makes and removes (alf_async.testing.netns; no other
address is ever a target)."""

import re
import signal
import subprocess
import sys

import pytest

reverb = pytest.importorskip("reverb")
psutil = pytest.importorskip("psutil")

from alf_async.distributed import learner_role  # noqa: E402
from alf_async.testing import netns  # noqa: E402
from test_distributed import ENV, Learner  # noqa: E402  (tests/ is on sys.path)

UNAVAILABLE = netns.unavailable()
pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(UNAVAILABLE is not None, reason=UNAVAILABLE or "")]

# Run on the other host: what a stranger there gets from ADDRESS (argv[1]).
PROBE = """
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
try:
    socket.create_connection((host, int(port)), timeout=5).close()
except OSError as e:
    print("no connection:", type(e).__name__)
    sys.exit(0)
import reverb
info = reverb.Client(sys.argv[1]).server_info(timeout=10)
print("tables:", " ".join(sorted(info)))
"""


def probe(hosts, name, address):
    done = hosts.run(name, [sys.executable, "-c", PROBE, address], capture_output=True,
                     text=True, timeout=90, env=ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_local_collectors_port_is_open_to_another_host_and_the_start_says_so(tmp_path):
    with netns.TestHosts(["learner", "outsider"]) as hosts:
        learner = Learner(tmp_path, host=(hosts, "learner"))
        try:
            announced = learner.wait_for(
                lambda l: re.match(r"\[alf_async\] collectors connect to localhost:(\d+) "
                                   r"\(written", l), 90, "address line")
            port = int(announced.group(1))
            # One line says who can reach the port, before the address:
            # local collectors only, and the address announced is localhost.
            assert learner.lines[learner.lines.index(announced.string) - 1] == \
                learner_role.exposure_line(port, remote=False)
            with open(tmp_path / "replay_address") as f:
                assert f.read() == f"localhost:{port}\n"
            # It is as the line says: from the other host, Reverb at the
            # learner's address answers anyone ...
            assert probe(hosts, "outsider", f"{hosts.address('learner')}:{port}") == \
                "tables: collector_stats replay variables"
            # ... and the address announced leads nowhere there.
            assert probe(hosts, "outsider", f"localhost:{port}") == \
                "no connection: ConnectionRefusedError"
        finally:
            if learner.process.poll() is None:
                learner.process.send_signal(signal.SIGINT)
                try:
                    learner.process.wait(60)
                except subprocess.TimeoutExpired:
                    learner.process.kill()
                    learner.process.wait(10)
    assert learner.process.returncode == 0, learner.err[-20:]
