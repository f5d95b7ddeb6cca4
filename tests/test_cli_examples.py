"""Quiet starts beyond the main job: the examples print nothing of
TensorFlow's or gym's; the by-hand example learns; --verbose shows the
third-party output again. (SubprocessEnv children: test_quiet_start's
*_subprocess.gin runs, whose whole output is alf_async's two lines.)"""

import os
import re
import subprocess
import sys
import tempfile

import pytest

pytestmark = pytest.mark.timeout(180)

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
ENV = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
ENV.pop("TF_CPP_MIN_LOG_LEVEL", None)  # the CLI must silence TF's banner by itself


def run(args, timeout=150):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env=ENV)


def test_the_by_hand_example_learns_quietly():
    proc = run([sys.executable, os.path.join(REPO, "examples", "train_dqn_cartpole.py"),
                "--by_hand"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""
    last = proc.stdout.splitlines()[-1]
    match = re.fullmatch(r"trained \d+ steps, last loss \S+; greedy policy AverageReturn "
                         r"(\d+\.\d) over 10 episodes", last)
    assert match, last
    # A random policy averages ~20 on CartPole; the by-hand loop used to end near 10.
    assert float(match.group(1)) >= 60.0, proc.stdout


def test_verbose_shows_the_third_party_output():
    with tempfile.TemporaryDirectory() as root_dir:
        proc = run([sys.executable, "-m", "alf_async.bin.train", "--verbose",
                    "--root_dir", root_dir,
                    "--gin_file", os.path.join(REPO, "gin_configs", "smoke.gin"),
                    "--gin_param", "Schedule.num_iterations = 1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert "Gym has been unmaintained since 2022" in output  # gym's import notice
    assert "[alf_async] stopped (num_iterations) at iteration 1, " in proc.stdout
