"""Across a network: the learner's port and policy serving seen from
another host, a network namespace the test makes and removes
(alf_async.testing.netns; no other address is ever a target)."""

import json
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

reverb = pytest.importorskip("reverb")
psutil = pytest.importorskip("psutil")

from alf_async.distributed import learner_role  # noqa: E402
from alf_async.distributed.collector import STATS_TABLE, VARIABLE_TABLE  # noqa: E402
from alf_async.distributed.reverb_replayer import REPLAY_TABLE  # noqa: E402
from alf_async.testing import netns, replay_audit  # noqa: E402
from alf_async.testing.envs import COUNTING_ROWS  # noqa: E402
from alf_async.testing.distributed_jobs import (ENV, PROGRESS, RELAY_PORT, Learner,  # noqa: E402
                                             collector_on, relay_on, remote_learner,
                                             stop, stop_all, wait_until)
from test_serving_cli import CLIENT, REPO, trainer_args, wait_for_address  # noqa: E402

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


def serving_job(hosts, root_dir, *params):
    """The serving job (dqn_cartpole_serving.gin) on host 'server'; its
    stdout is read by a thread into the returned list."""
    proc = hosts.popen("server", trainer_args(
        root_dir, "make_serving_env_constructor.port = 0", "Evaluation.episodes = 0",
        "Outputs.log_interval_secs = 0.2", *params),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=ENV)
    lines = []
    threading.Thread(target=lambda: lines.extend(l.rstrip("\n") for l in proc.stdout),
                     daemon=True).start()
    return proc, lines


def client_run(hosts, *args):
    return hosts.run("client", [sys.executable, CLIENT] + list(args), capture_output=True,
                     text=True, timeout=90, cwd=REPO, env=ENV)


def test_serving_across_a_link_refuses_a_wrong_or_missing_token_and_learns_nothing(tmp_path):
    with netns.TestHosts(["server", "client"]) as hosts:
        root_dir = tmp_path / "run"
        proc, lines = serving_job(hosts, root_dir, "make_serving_env_constructor.token = 's3cret'",
                                  f"make_serving_env_constructor.host = "
                                  f"'{hosts.address('server')}'")
        try:
            address = wait_for_address(root_dir / "server_address", proc)
            assert address.startswith(f"http://{hosts.address('server')}:"), address
            for token in (["--token", "wrong"], []):
                refused = client_run(hosts, "--address", address, "--clients", "1", *token)
                assert refused.returncode == 1, refused.stderr[-2000:]
                assert refused.stderr == (
                    f"cartpole_client: error: refused by {address}: missing or wrong "
                    f"'Authorization: Bearer <token>' (HTTP 401) (check --token)\n")
        finally:
            stop(proc)
    assert proc.returncode == 0, proc.stderr.read()[-3000:]
    # Nothing of the refused requests reached the learner.
    assert any(re.fullmatch(r"\[alf_async\] stopped \(stop_event\) at iteration 0, train step "
                            r"0, env steps 0; checkpoint in .*", l) for l in lines), lines


# Run on the client host: an episode of 3 steps, then (the test cuts the
# link) a step that times out, then (healed, past the idle timeout) the
# same episode once more, then a new episode on the same PolicyClient.
PARTITIONED_CLIENT = """
import sys
import numpy as np
from alf_async.serving.client import PolicyClient
client = PolicyClient(sys.argv[1], token="s3cret", timeout=2.0)
obs = np.zeros(4, np.float32)
eid = client.start_episode()
for reward in (None, 1.0, 1.0):
    client.get_action(eid, obs, reward=reward)
print("mid-episode", flush=True)
for stage in ("partitioned", "healed"):
    sys.stdin.readline()
    try:
        client.get_action(eid, obs, reward=1.0)
        print(stage, "answered", flush=True)
    except Exception as e:
        print(stage, type(e).__name__, e, flush=True)
eid = client.start_episode()
for reward in (None, 1.0):
    client.get_action(eid, obs, reward=reward)
client.end_episode(eid, obs)
print("a new episode played", flush=True)
"""


def test_a_client_partitioned_mid_episode_times_out_its_episode_closes_and_it_plays_again(
        tmp_path):
    with netns.TestHosts(["server", "client"]) as hosts:
        proc, lines = serving_job(hosts, tmp_path / "run",
                                  "make_serving_env_constructor.token = 's3cret'",
                                  "make_serving_env_constructor.episode_idle_timeout = 1.0",
                                  f"make_serving_env_constructor.host = "
                                  f"'{hosts.address('server')}'")
        client = None
        try:
            address = wait_for_address(tmp_path / "run" / "server_address", proc)
            client = hosts.popen("client", [sys.executable, "-c", PARTITIONED_CLIENT, address],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, cwd=REPO, env=ENV)
            assert client.stdout.readline() == "mid-episode\n", client.stderr.read()[-2000:]
            hosts.cut("client")
            client.stdin.write("\n")
            client.stdin.flush()
            # The request waits for the client's timeout: no RST comes
            # through a link that is down.
            assert client.stdout.readline() == (
                f"partitioned TimeoutError policy server {address}: no response within "
                f"2.0 s\n")
            time.sleep(1.5)   # past the server's episode_idle_timeout
            hosts.heal("client")
            client.stdin.write("\n")
            client.stdin.flush()
            healed = client.stdout.readline()
            assert re.fullmatch(r"healed ServerValueError episode '[^']+' has already finished "
                                r"\(no call for 1 s \(episode_idle_timeout\)\) \(HTTP 400\)\n",
                                healed), healed
            assert client.stdout.readline() == "a new episode played\n"
            assert client.wait(30) == 0, client.stderr.read()[-2000:]
        finally:
            if client is not None and client.poll() is None:
                client.kill()
                client.wait()
            stop(proc)
    assert proc.returncode == 0, proc.stderr.read()[-3000:]


def test_serving_keeps_to_loopback_by_default(tmp_path):
    with netns.TestHosts(["server", "client"]) as hosts:
        root_dir = tmp_path / "run"
        proc, _ = serving_job(hosts, root_dir)
        try:
            address = wait_for_address(root_dir / "server_address", proc)
            port = int(address.rsplit(":", 1)[1])
            assert address == f"http://127.0.0.1:{port}"
            assert probe(hosts, "client", f"{hosts.address('server')}:{port}") == \
                "no connection: ConnectionRefusedError"
        finally:
            stop(proc)
    assert proc.returncode == 0


# The environments' observations are [row, counter, t] (envs.counting_rows),
# collector1's rows from 1001 on, and nothing is evicted: after the run the
# replay checkpoint's items are audited.
AUDITED = [f"Task.env_name = '{COUNTING_ROWS}'", f"collect/Task.env_name = '{COUNTING_ROWS}'",
           "replay_table.max_size = 2000000"]


# The learner checkpoints (its agent and the replay table) every 50 train
# steps, so that a learner SIGKILLed after the partition resumes from one.
CHECKPOINTS = ["Outputs.checkpoint_interval = 50"]


def test_a_partitioned_collector_comes_back_by_itself_and_the_learner_trains_from_the_other(
        tmp_path):
    """Then collector1's connections are reset, then the learner is
    SIGKILLed and resumed on the same root_dir, and both collectors, left
    running on their hosts, come back by themselves."""
    with netns.TestHosts(["learner", "collector0", "collector1"]) as hosts:
        learner, address = remote_learner(hosts, tmp_path, *AUDITED, *CHECKPOINTS)
        collectors, relays = [], []
        try:
            assert address.startswith(hosts.address("learner") + ":")
            collectors.append(collector_on(hosts, "collector0", address, *AUDITED))
            # collector1's link, through a relay, loses 5% of its chunks while
            # collector0 is cut off, and its connections are reset after.
            relays.append(relay_on(hosts, "collector1", address, "--impair_on_signal",
                                   "--loss", "0.05"))
            collectors.append(collector_on(hosts, "collector1", f"127.0.0.1:{RELAY_PORT}",
                                           *AUDITED, env={"ALF_ASYNC_FIRST_ROW": "1000"}))
            learner.wait_for(lambda l: (m := PROGRESS.match(l)) and int(m.group(1)) > 0, 120,
                             "training")
            hosts.cut("collector0")
            relays[0].send_signal(signal.SIGHUP)
            cut_step, cut_bytes = learner.train_step(), hosts.bytes_from("collector0")
            # The learner trains on from collector1 alone, and nothing of
            # collector0 gets through.
            wait_until(lambda: learner.train_step() >= cut_step + 20, 30,
                       "training from the other collector")
            time.sleep(2)
            assert hosts.bytes_from("collector0") == cut_bytes
            hosts.heal("collector0")
            relays[0].send_signal(signal.SIGHUP)
            healed = time.monotonic()
            # collector0 sends again by itself: its experience reaches the switch.
            back = wait_until(lambda: hosts.bytes_from("collector0") > cut_bytes + 20_000, 15,
                              "collector0 back within 15 s of the heal")
            assert back - healed < 15
            # A reset of collector1's connections (RST), refused for 1 s:
            # it reconnects by itself too.
            relays[0].send_signal(signal.SIGUSR1)
            time.sleep(1.0)
            sent = hosts.bytes_from("collector1")
            relays[0].send_signal(signal.SIGUSR2)
            healed = time.monotonic()
            back = wait_until(lambda: hosts.bytes_from("collector1") > sent + 20_000, 15,
                              "collector1 back within 15 s of the reset")
            assert back - healed < 15
            # The learner SIGKILLed once it checkpointed, and resumed at once.
            wait_until(lambda: (tmp_path / "train" / "checkpoint").exists(), 30, "a checkpoint")
            learner.kill()
            at_kill = {name: hosts.bytes_from(name) for name in ("collector0", "collector1")}
            learner, _ = remote_learner(hosts, tmp_path, *AUDITED, *CHECKPOINTS)
            listening = time.monotonic()
            for name, before in at_kill.items():
                back = wait_until(lambda n=name, b=before: hosts.bytes_from(n) > b + 20_000, 15,
                                  f"{name} back within 15 s of the resumed learner listening")
                assert back - listening < 15
            resumed = learner.wait_for(
                lambda l: re.match(r"\[alf_async\] resumed from \S+/ckpt-\d+: global step "
                                   r"(\d+), ", l), 30, "the resumed line")
            learner.wait_for(lambda l: (m := PROGRESS.match(l)) and int(m.group(1)) >
                             int(resumed.group(1)), 60, "training after the resume")
            assert all(c.poll() is None for c in collectors), [c.stderr.read() for c in collectors]
        finally:
            stop_all(collectors)
            stop(learner.process)
            stop_all(relays)
    assert learner.process.returncode == 0, learner.err[-20:]
    assert [c.returncode for c in collectors] == [0, 0]
    assert json.loads(relays[0].stdout.read().splitlines()[-1])["cuts"] >= 1
    # Every item is one row's consecutive steps. A row lost steps only once,
    # in one run: those the killed learner held after its last checkpoint,
    # and those in flight to it.
    audit = replay_audit.row_runs(replay_audit.read_checkpoint(
        str(tmp_path / "replay"), REPLAY_TABLE, [VARIABLE_TABLE, STATS_TABLE]))
    assert audit["items"] > 0 and audit["spliced"] == 0
    assert audit["rows"] == [1, 2, 1001, 1002]
    assert {row: gaps[-1] - gaps[0] + 1 - len(gaps) for row, gaps in audit["missing"].items()
            } == {row: 0 for row in audit["missing"]}, audit["missing"]
