"""alf-async-train with the unroll agents, as users run it: ppo_cartpole.gin
learns, the policy lag reaches TensorBoard and the progress lines, a replay
buffer (or several train calls per batch) is refused with one line, and a
PPO run stops on SIGINT with a checkpoint that a rerun resumes."""

import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf

from cli_runs import (GIN_CONFIGS, REPO, run_train_cli,  # tests/ is on sys.path
                      third_party_lines)
from conftest import signal_when_ready  # noqa: E402
from test_trainer import read_scalars  # noqa: E402

pytestmark = pytest.mark.timeout(180)

ENV = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
QUIET_THREADS = "Runtime.inter_op_threads = 3"


def test_ppo_cartpole_learns_and_reports_the_policy_lag(tmp_path):
    proc = run_train_cli(tmp_path, "ppo_cartpole.gin", [], timeout=170, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert third_party_lines(proc) == []  # a quiet run as shipped, from its start (issue 49)
    assert "stopped (stop_at_eval_return)" in proc.stdout, proc.stdout[-3000:]
    returns = [float(r) for r in re.findall(r"greedy policy AverageReturn ([\d.]+)", proc.stdout)]
    assert returns[-1] >= 195.0
    assert re.search(r"\| policy lag \d+\.\d", proc.stdout)
    scalars = read_scalars(str(tmp_path / "train"))
    lags = [v for _, v in scalars["Learner/policy_lag"]]
    most = [v for _, v in scalars["Learner/policy_lag_max"]]
    assert lags and all(0 <= a <= b for a, b in zip(lags, most))
    # One point per update (16 gradient steps, summary_interval 16): the
    # update's means under tf-agents' PPO tags, none of a single minibatch.
    steps = [step for step, _ in scalars["Losses/policy_gradient_loss"]]
    assert steps == list(range(16, 16 * len(steps) + 1, 16))
    # 16 gradient steps per batch (4 epochs x 4 minibatches): the first batch
    # is collected and trained on at step 0 (lag 0); a later batch, collected
    # while the learner trained on the one before, has a positive lag. A run
    # solved at its first evaluation (after one update) has only the first.
    if len(steps) == 1:
        assert max(lags) == 0, lags
    else:
        assert max(lags) > 0, lags
    for tag in ("value_estimation_loss", "entropy_regularization_loss", "total_abs_loss",
                "clip_fraction"):
        assert [step for step, _ in scalars["Losses/" + tag]] == steps, tag
    assert "Losses/entropy" not in scalars


@pytest.mark.parametrize("param, named", [
    ("Task.replayer_fn = @UniformReplayer",
     "MinibatchPPOClipAgent trains on each batch of unrolls once: set Task.replayer_fn = "
     "@OneTimeReplayer (got UniformReplayer, a replay buffer)"),
    ("Schedule.train_steps_per_iteration = 4", "Schedule.train_steps_per_iteration must be 1, got 4"),
    ("Schedule.initial_collect_steps = 1000", "Schedule.initial_collect_steps must be 0, got 1000"),
])
def test_a_replay_buffer_or_repeated_training_is_refused_with_one_line(tmp_path, param, named):
    proc = run_train_cli(tmp_path, "ppo_cartpole.gin", [param], timeout=120, env=ENV)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "alf-async-train: error:" in line]
    assert len(lines) == 1 and named in lines[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not os.path.exists(tmp_path / "train" / "checkpoint")


def test_impala_agent_is_refused_a_replay_buffer_too(tmp_path):
    proc = run_train_cli(tmp_path, "ppo_cartpole.gin",
                         ["Task.agent_fn = @impala_agent", "Task.replayer_fn = @PixelReplayer"],
                         timeout=120, env=ENV)
    assert proc.returncode == 2
    assert "ImpalaAgent trains on each batch of unrolls once" in proc.stderr


def _start(root_dir, *params):
    args = [sys.executable, "-m", "alf_async.bin.train", "--root_dir", str(root_dir),
            "--gin_file", os.path.join(GIN_CONFIGS, "ppo_cartpole.gin"),
            "--gin_param", QUIET_THREADS]
    for param in params:
        args += ["--gin_param", param]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO, env=ENV)


def test_sigint_stops_a_ppo_run_within_5_s_and_a_rerun_resumes_it(tmp_path):
    proc = _start(tmp_path, "Evaluation.stop_at_return = None", "Evaluation.episodes = 0",
                  "Outputs.log_interval_secs = 0.5")
    # Once the learner has trained (a progress line with the policy lag).
    output, elapsed, _ = signal_when_ready(
        proc, lambda line: "[alf_async] iteration" in line and "policy lag" in line)
    assert proc.returncode == 0, output[-3000:]
    assert elapsed < 5.0
    stopped = re.search(r"stopped \(stop_event\) at iteration (\d+), train step (\d+)", output)
    assert stopped, output[-3000:]
    iterations, train_step = int(stopped.group(1)), int(stopped.group(2))
    assert train_step == 16 * iterations   # 4 epochs x 4 minibatches per batch
    checkpoint = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(tmp_path / "train")))
    assert checkpoint.get_tensor("global_step/.ATTRIBUTES/VARIABLE_VALUE") == train_step
    # The rerun goes on from the checkpoint to 2 more iterations.
    proc = run_train_cli(tmp_path, "ppo_cartpole.gin",
                         [QUIET_THREADS, "Evaluation.stop_at_return = None",
                          "Evaluation.episodes = 0", f"Schedule.num_iterations = {iterations + 2}"],
                         timeout=120, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resumed from" in proc.stdout and f"global step {train_step}," in proc.stdout
    assert (f"stopped (num_iterations) at iteration {iterations + 2}, train step "
            f"{train_step + 32}") in proc.stdout
