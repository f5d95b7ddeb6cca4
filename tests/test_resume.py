"""Running alf-async-train again on a root_dir: a finished or solved
run says so and exits 0; a changed learning rate applies over the checkpoint's
(the optimizer's state restored); the epsilon schedule follows the config; a
config that does not fit the checkpoint fails with one line, exit 2.

One tiny finished run (smoke.gin, module-scoped) is shared; tests that train
on work on copies of it."""

import glob
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from alf_async.learning import agents

from alf_async import resume

from cli_runs import (REPO, lines_before_progress, run_train_cli,  # tests/ is on sys.path
                      third_party_lines)

pytestmark = pytest.mark.timeout(180)

ENV = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
LR_KEY = "agent/_optimizer/_learning_rate/.ATTRIBUTES/VARIABLE_VALUE"
ADAM_STEP_KEY = "agent/_optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"


def train_cli(root_dir, *params):
    return run_train_cli(root_dir, "smoke.gin", params, timeout=150, env=ENV)


def listing(root_dir):
    return sorted(os.path.relpath(p, root_dir)
                  for p in glob.glob(os.path.join(root_dir, "**"), recursive=True))


def latest(root_dir):
    return tf.train.load_checkpoint(tf.train.latest_checkpoint(os.path.join(root_dir, "train")))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """smoke.gin run to its end (40 iterations, 74 train steps): (root_dir, process)."""
    root_dir = tmp_path_factory.mktemp("finished") / "run"
    proc = train_cli(root_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root_dir, proc


@pytest.fixture
def resumable(finished_run, tmp_path):
    """A copy of the finished run, to train on."""
    copy = tmp_path / "run"
    shutil.copytree(finished_run[0], copy)
    return copy


def test_the_run_prints_only_its_own_labelled_lines(finished_run):
    """smoke.gin as shipped: a quiet start and a quiet run (test_quiet_start)."""
    _, proc = finished_run
    assert third_party_lines(proc) == []
    # An evaluation may finish before the first progress line (log_interval_secs
    # is 1 s): alf_async's own line, nothing else.
    assert [line for line in lines_before_progress(proc.stdout.splitlines())
            if not line.startswith("[alf_async] eval at train step ")] == []
    lines = proc.stdout.splitlines()
    assert lines and all(line.startswith("[alf_async] ") for line in lines), lines
    assert any(" | collect policy AverageReturn " in line for line in lines)
    assert any(": greedy policy AverageReturn " in line for line in lines)
    assert lines[-1].startswith("[alf_async] stopped (num_iterations) at iteration 40, ")


def test_a_finished_run_says_so_and_starts_nothing(finished_run):
    root_dir, _ = finished_run
    before = listing(root_dir)
    proc = train_cli(root_dir)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.splitlines() == [
        f"[alf_async] {root_dir} is finished: Schedule.num_iterations = 40 reached (iteration 40, "
        f"train step 74, env steps 320); nothing to do. Raise the limit to train on, or use a "
        f"new --root_dir to start fresh"]
    assert listing(root_dir) == before  # no operative config, checkpoint or summary


def test_a_solved_run_says_so(resumable):
    # A return of 1 is reached at the first evaluation (train step 80).
    params = ("Schedule.num_iterations = 1000", "Evaluation.stop_at_return = 1.0")
    proc = train_cli(resumable, *params)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[alf_async] stopped (stop_at_eval_return) at iteration " in proc.stdout
    solved_return = latest(resumable).get_tensor(
        "solved/average_return/.ATTRIBUTES/VARIABLE_VALUE")
    before = listing(resumable)
    again = train_cli(resumable, *params)
    assert again.returncode == 0 and again.stderr == ""
    assert again.stdout.splitlines() == [
        f"[alf_async] {resumable} is finished: solved at train step 80 (evaluation "
        f"AverageReturn {solved_return:.1f} >= Evaluation.stop_at_return = 1) (iteration 43, "
        f"train step 80, env steps 344); nothing to do. Raise the limit to train on, or use a "
        f"new --root_dir to start fresh"]
    assert listing(resumable) == before
    # A higher bar trains on.
    assert resume.finished(str(resumable), 1000, None, solved_return + 1) is None


def test_a_changed_learning_rate_applies_over_the_checkpoint(finished_run, resumable):
    adam_steps = latest(finished_run[0]).get_tensor(ADAM_STEP_KEY)
    assert latest(finished_run[0]).get_tensor(LR_KEY) == np.float32(0.001)
    proc = train_cli(resumable, "Schedule.num_iterations = 44", "dqn_agent.learning_rate = 0.0123",
                     "Runtime.inter_op_threads = 1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("[alf_async] the config's value applies: dqn_agent.learning_rate = 0.0123 "
            "(the checkpoint had 0.001)") in proc.stdout.splitlines()
    reader = latest(resumable)
    assert reader.get_tensor(LR_KEY) == np.float32(0.0123)
    # Adam's state was restored and went on: 4 more iterations of 2 train steps.
    assert reader.get_tensor(ADAM_STEP_KEY) == adam_steps + 8
    newest = max(glob.glob(str(resumable / "operative_config-*.gin")), key=os.path.getmtime)
    with open(newest) as f:
        assert "dqn_agent.learning_rate = 0.0123\n" in f.read()
    # Runtime.inter_op_threads reached TF: the driver's hint counts 1 thread and
    # names the binding that fixes it.
    [hint] = proc.stderr.splitlines()
    assert hint.startswith("TF has 1 inter-op threads for 1 graph-mode environment steps at a "
                           "time (of 2 env threads) and 1 actor threads")
    assert "--gin_param 'Runtime.inter_op_threads = 2'" in hint


def test_an_incompatible_config_fails_with_one_line_naming_every_difference(finished_run):
    # Each binding that shapes the checkpoint is compared: one run changes
    # four, and the line names each, in CHECKPOINT_SHAPING_BINDINGS' order.
    root_dir, _ = finished_run
    before = listing(root_dir)
    proc = train_cli(root_dir, "Schedule.num_iterations = 1000",
                     "dqn_agent.fc_layer_params = (32,)", "Layout.env_threads = 1",
                     "Layout.rows_per_env_thread = 4", "Schedule.rows_per_batch = 4",
                     "UniformReplayer.capacity_per_row = 100")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        f"alf-async-train: error: --root_dir {root_dir} holds a checkpoint this config cannot "
        f"resume (Layout.env_threads was 2, this config says 1; Layout.rows_per_env_thread was 2, this "
        f"config says 4; UniformReplayer.capacity_per_row was 200, this config says 100; "
        f"dqn_agent.fc_layer_params was (16,), this config says (32,)): a new --root_dir "
        f"starts fresh"]
    assert listing(root_dir) == before


# ------------------------------------------------------------------ in process

def _specs(continuous):
    if continuous:
        observation = tensor_spec.TensorSpec([3], tf.float32)
        action = tensor_spec.BoundedTensorSpec([1], tf.float32, -2.0, 2.0)
    else:
        observation = tensor_spec.TensorSpec([4], tf.float32)
        action = tensor_spec.BoundedTensorSpec([], tf.int64, 0, 1)
    return ts.time_step_spec(observation), action


def test_every_sac_learning_rate_applies_over_the_checkpoint(tmp_path):
    old = agents.sac_agent(*_specs(True), tf.Variable(0, dtype=tf.int64),
                           actor_fc_layer_params=(8,), critic_joint_fc_layer_params=(8,))
    for optimizer in (old._actor_optimizer, old._critic_optimizer, old._alpha_optimizer):
        optimizer.iterations.assign(7)
    path = tf.train.Checkpoint(agent=old).save(str(tmp_path / "ckpt"))
    new = agents.sac_agent(*_specs(True), tf.Variable(0, dtype=tf.int64),
                           actor_fc_layer_params=(8,), critic_joint_fc_layer_params=(8,),
                           actor_learning_rate=1e-3, alpha_learning_rate=2e-3)
    configured = resume.configured_values(new)
    tf.train.Checkpoint(agent=new).restore(path).assert_existing_objects_matched()
    assert resume.apply_config(configured) == [
        "sac_agent.actor_learning_rate = 0.001 (the checkpoint had 0.0003)",
        "sac_agent.alpha_learning_rate = 0.002 (the checkpoint had 0.0003)"]
    rates = [float(o.learning_rate.numpy()) for o in (
        new._actor_optimizer, new._critic_optimizer, new._alpha_optimizer)]
    np.testing.assert_allclose(rates, [1e-3, 3e-4, 2e-3], rtol=1e-6)
    assert [int(o.iterations.numpy()) for o in (
        new._actor_optimizer, new._critic_optimizer, new._alpha_optimizer)] == [7, 7, 7]


def test_the_epsilon_schedule_is_the_configs_at_the_restored_step(tmp_path):
    step = tf.Variable(0, dtype=tf.int64)
    old = agents.dqn_agent(*_specs(False), step, fc_layer_params=(8,), epsilon_greedy=1.0,
                           epsilon_final=0.05, epsilon_decay_steps=1000)
    step.assign(500)
    path = tf.train.Checkpoint(agent=old, step=step).save(str(tmp_path / "ckpt"))
    new_step = tf.Variable(0, dtype=tf.int64)
    new = agents.dqn_agent(*_specs(False), new_step, fc_layer_params=(8,), epsilon_greedy=0.5,
                           epsilon_final=0.1, epsilon_decay_steps=2000)
    configured = resume.configured_values(new)
    tf.train.Checkpoint(agent=new, step=new_step).restore(path)
    assert resume.apply_config(configured) == []  # the schedule is not in the checkpoint
    # 500 of 2000 steps from 0.5 to 0.1.
    assert float(new.collect_policy._epsilon()) == pytest.approx(0.4)
    new_step.assign(5000)
    assert float(new.collect_policy._epsilon()) == pytest.approx(0.1)
