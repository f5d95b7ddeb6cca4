"""The serving job from the CLI (gin_configs/dqn_cartpole_serving.gin) and
examples/cartpole_client.py, as users run them: real processes."""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
SERVING_GIN = os.path.join(REPO, "gin_configs", "dqn_cartpole_serving.gin")
CLIENT = os.path.join(REPO, "examples", "cartpole_client.py")
ENV = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))


def trainer_args(root_dir, *params):
    args = [sys.executable, "-m", "alf_async.bin.train", "--root_dir", str(root_dir),
            "--gin_file", SERVING_GIN]
    for param in params:
        args += ["--gin_param", param]
    return args


def run_client(*args, timeout=60):
    return subprocess.run([sys.executable, CLIENT] + list(args), capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, env=ENV)


def unused_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_address(path, proc, seconds=60):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        assert proc.poll() is None, "the trainer exited before serving"
        assert time.monotonic() < deadline, f"no {path} within {seconds} s"
        time.sleep(0.1)
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


@pytest.mark.timeout(120)
def test_serving_job_learns_from_a_client_and_stops_on_sigint(tmp_path):
    root_dir = tmp_path / "run"
    proc = subprocess.Popen(
        trainer_args(root_dir, "make_serving_env_constructor.port = 0",
                     "make_serving_env_constructor.token = 's3cret'",
                     "Schedule.initial_collect_steps = 256", "Evaluation.episodes = 0",
                     "Outputs.log_interval_secs = 0.2"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=ENV)
    lines, trained = [], threading.Event()

    def read_stdout():
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if re.search(r"\| train steps [1-9]", line):
                trained.set()

    reader = threading.Thread(target=read_stdout, daemon=True)
    reader.start()
    try:
        address = wait_for_address(root_dir / "server_address", proc)
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", address), address

        refused = run_client("--address", address, "--token", "wrong", "--clients", "1")
        assert refused.returncode == 1
        assert refused.stdout == ""
        assert refused.stderr == (f"cartpole_client: error: refused by {address}: "
                                  f"missing or wrong 'Authorization: Bearer <token>' (HTTP 401) "
                                  f"(check --token)\n")

        played = run_client("--address_file", str(root_dir / "server_address"),
                            "--token", "s3cret", "--clients", "2", "--episodes", "24")
        assert played.returncode == 0, played.stderr[-3000:]
        assert "Traceback" not in played.stderr
        assert re.search(r"^2 clients \(remote\): \d+ steps in", played.stdout, re.M), \
            played.stdout

        assert trained.wait(30), "no train step within 30 s of the clients' episodes"
        proc.send_signal(signal.SIGINT)
        stderr = proc.stderr.read()
        proc.wait(timeout=30)
        reader.join(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stdout = "\n".join(lines)
    assert proc.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr
    assert f"[alf_async] serving on {address} (written to {root_dir / 'server_address'})" \
        in stdout.splitlines()
    stopped = re.search(r"^\[alf_async\] stopped \(stop_event\) at iteration (\d+), train step "
                        r"(\d+), env steps (\d+); checkpoint in ", stdout, re.M)
    assert stopped, stdout
    iterations, train_step, env_steps = map(int, stopped.groups())
    # Each iteration is 16 slots' unrolls of 8 steps (1 env thread x 16
    # slots); training started, so >= 256 steps.
    assert iterations >= 3
    assert env_steps == 128 * iterations
    # 8 train steps per iteration once 256 env steps were collected.
    assert train_step == 8 * (iterations - 1)
    assert not os.path.exists(root_dir / "server_address")   # removed on a clean stop


@pytest.mark.timeout(30)
def test_client_without_a_server_exits_1_with_one_line():
    address = f"http://127.0.0.1:{unused_port()}"
    proc = run_client("--address", address, "--clients", "2", "--episodes", "1")
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr == (f"cartpole_client: error: cannot connect to {address}: "
                           f"[Errno 111] Connection refused\n")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("host, reason", [
    ("127.0.0.1", "Address already in use"),
    ("192.0.2.1", "Cannot assign requested address"),   # TEST-NET-1: no local interface
])
def test_a_port_in_use_or_a_bad_host_is_a_config_error(tmp_path, host, reason):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            trainer_args(tmp_path, f"make_serving_env_constructor.host = '{host}'",
                         f"make_serving_env_constructor.port = {port}"),
            capture_output=True, text=True, timeout=100, cwd=REPO, env=ENV)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "alf-async-train: error:" in line]
    assert errors == [f"alf-async-train: error: make_serving_env_constructor: cannot serve on "
                      f"{host}:{port}: {reason}"]
    assert not os.path.exists(tmp_path / "train" / "checkpoint")


@pytest.mark.timeout(60)
def test_sigint_stops_a_serving_job_that_no_client_ever_reached(tmp_path):
    # Its learner waits in TF for experience that never comes: SIGINT must still work.
    proc = subprocess.Popen(trainer_args(tmp_path, "make_serving_env_constructor.port = 0"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, env=ENV)
    try:
        wait_for_address(tmp_path / "server_address", proc)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr
    assert (f"[alf_async] stopped (stop_event) at iteration 0, train step 0, env steps 0; "
            f"checkpoint in {tmp_path / 'train'}") in stdout.splitlines()
    assert os.path.exists(tmp_path / "train" / "checkpoint")
