"""alf-async-train as users run it: a subprocess per test."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import tensorflow as tf

from conftest import signal_when_ready  # tests/ is on sys.path

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
SMOKE_GIN = os.path.join(REPO, "gin_configs", "smoke.gin")


def cli(*args):
    return [sys.executable, "-m", "alf_async.bin.train"] + list(args)


def run(args, timeout=60):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def error_line(proc):
    lines = [line for line in proc.stderr.splitlines() if "alf-async-train: error:" in line]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("param, named", [
    ("nosuch.param = 1", "No configurable matching 'nosuch'"),
    ("train.nosuch = 1", "'train' doesn't have a parameter named 'nosuch'"),
    ("Schedule.num_iterations = -5", "Schedule.num_iterations must be"),
])
def test_bad_bindings_fail_at_once_with_one_line(tmp_path, param, named):
    proc = run(cli("--root_dir", str(tmp_path), "--gin_file", SMOKE_GIN, "--gin_param", param))
    assert proc.returncode == 2
    assert named in error_line(proc)
    assert not os.path.exists(tmp_path / "train" / "checkpoint")


def test_missing_gin_file_fails_naming_it(tmp_path):
    missing = str(tmp_path / "nope.gin")
    proc = run(cli("--root_dir", str(tmp_path), "--gin_file", missing))
    assert proc.returncode == 2
    assert missing in error_line(proc)


def test_root_dir_is_required():
    proc = run(cli("--gin_file", SMOKE_GIN))
    assert proc.returncode == 2
    assert "--root_dir" in proc.stderr


def _console_script():
    script = os.path.join(os.path.dirname(sys.executable), "alf-async-train")
    return [script] if os.path.exists(script) else cli()[:3]


# SIGTERM here; SIGINT takes the same handler, and the runs of
# test_unroll_training.py, test_checkpoint_files.py and test_distributed.py
# stop on it mid-training with the same checks.
@pytest.mark.parametrize("sig", [signal.SIGTERM])
def test_signal_stops_writes_a_checkpoint_and_exits_0(tmp_path, sig):
    proc = subprocess.Popen(
        _console_script() + ["--root_dir", str(tmp_path), "--gin_file", SMOKE_GIN,
                             "--gin_param", "Schedule.num_iterations = 1000000",
                             "--gin_param", "Outputs.log_interval_secs = 0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    # Once the learner trains (a progress line with a loss).
    output, elapsed, _ = signal_when_ready(
        proc, lambda line: "[alf_async] iteration" in line and "loss -" not in line, sig=sig,
        ready_secs=60, exit_secs=10)
    assert proc.returncode == 0, output[-3000:]
    assert elapsed < 10
    assert "stopped (stop_event)" in output
    assert tf.train.latest_checkpoint(str(tmp_path / "train")) is not None


def test_signals_while_a_finished_run_exits_change_nothing(tmp_path):
    # The run ends by itself (smoke.gin's 40 iterations); from its last line
    # on, SIGINT every 0.1 s until the process has exited: TensorFlow's
    # teardown takes a while, and a signal in it once ended the run with
    # the signal's own status (-2) where it had finished cleanly.
    proc = subprocess.Popen(
        _console_script() + ["--root_dir", str(tmp_path), "--gin_file", SMOKE_GIN],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("[alf_async] stopped ("):
                break
        assert lines and lines[-1].startswith("[alf_async] stopped (num_iterations)"), lines
        rest = []
        reader = threading.Thread(target=lambda: rest.extend(proc.stdout), daemon=True)
        reader.start()
        sent, deadline = 0, time.monotonic() + 60
        time.sleep(0.05)
        while proc.poll() is None and time.monotonic() < deadline:
            proc.send_signal(signal.SIGINT)
            sent += 1
            time.sleep(0.1)
        proc.wait(timeout=10)
        reader.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert sent >= 1
    assert proc.returncode == 0, (sent, "".join(lines[-3:] + rest)[-3000:])
    assert "".join(rest).strip() == ""     # no "stopping", no traceback
    # The checkpoint the run wrote at its end is the latest.
    latest = tf.train.latest_checkpoint(str(tmp_path / "train"))
    step = lines[-1].split("train step ")[1].split(",")[0]
    assert latest is not None and latest.endswith(f"ckpt-{step}"), (latest, lines[-1])


def test_crash_exits_nonzero_with_the_original_error(tmp_path):
    # A gin `import` registers a suite whose environments fail after 50 steps.
    helper = tmp_path / "failing_suite.py"
    helper.write_text(
        "import gym\n"
        "from tf_agents.environments import tf_py_environment\n"
        "from alf_async.environments import suites\n"
        "from alf_async.environments.suites import gym_batch\n"
        "class Failing(gym.Wrapper):\n"
        "    steps = 0\n"
        "    def step(self, action):\n"
        "        self.steps += 1\n"
        "        if self.steps >= 50:\n"
        "            raise KeyError('injected env failure')\n"
        "        return self.env.step(action)\n"
        "suites.register_suite('failing_gym', lambda name, batch_size, seed: "
        "tf_py_environment.TFPyEnvironment(gym_batch.BatchedGymEnv("
        "[Failing(gym.make(name)) for _ in range(batch_size)], seed=seed)))\n")
    config = tmp_path / "failing.gin"
    config.write_text("import failing_suite\nTask.suite = 'failing_gym'\n"
                      "Evaluation.episodes = 0\nSchedule.num_iterations = 1000000\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    proc = subprocess.run(
        cli("--root_dir", str(tmp_path / "run"), "--gin_file", SMOKE_GIN, "--gin_file",
            str(config)), capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "KeyError: 'injected env failure'" in proc.stderr
