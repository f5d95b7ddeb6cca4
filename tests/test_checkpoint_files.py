"""A stopped checkpoint write leaves nothing half-done (issue 51).

In process: `remove_partial` on the leftovers an unfinished write leaves,
and `CheckpointWrites.finish_or_remove` on a real write of ~400 MB, let
finish or cut off. As users run it: a second SIGINT while
alf-async-train writes its checkpoint at exit, then the rerun.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from alf_async.bin import train as train_cli
from alf_async.learning import checkpoint_files
from cli_runs import GIN_CONFIGS, REPO  # tests/ is on sys.path
from conftest import signal_when_ready

pytestmark = pytest.mark.timeout(180)


def _manager(ckpt_dir, megabytes=1):
    variable = tf.Variable(tf.zeros([megabytes * 2**18], tf.float32))
    checkpoint = tf.train.Checkpoint(v=variable)
    return variable, tf.train.CheckpointManager(checkpoint, str(ckpt_dir), max_to_keep=2)


def _temp_dirs(ckpt_dir):
    return [name for name in os.listdir(ckpt_dir) if name.endswith("_temp")]


def test_remove_partial_removes_an_unfinished_write_and_keeps_the_named_checkpoints(tmp_path):
    variable, manager = _manager(tmp_path)
    variable.assign(tf.fill(variable.shape, 1.0))
    manager.save()
    manager.save()
    # What a process cut off in its third write leaves: the temporary
    # directory, and a moved data file whose index was not written.
    os.mkdir(tmp_path / "ckpt-3_temp")
    (tmp_path / "ckpt-3_temp" / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"x")
    (tmp_path / "ckpt-3.data-00000-of-00001").write_bytes(b"x")
    (tmp_path / "notes.index").write_bytes(b"not a checkpoint's")
    assert checkpoint_files.remove_partial(str(tmp_path)) == [
        "ckpt-3.data-00000-of-00001", "ckpt-3_temp"]
    assert sorted(os.listdir(tmp_path)) == [
        "checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index", "ckpt-2.data-00000-of-00001",
        "ckpt-2.index", "notes.index"]
    variable.assign(tf.zeros(variable.shape))
    tf.train.Checkpoint(v=variable).restore(manager.latest_checkpoint).assert_consumed()
    assert manager.latest_checkpoint.endswith("ckpt-2") and float(variable[0]) == 1.0
    assert checkpoint_files.remove_partial(str(tmp_path / "missing")) == []


def _write_in_thread(writes, manager, ckpt_dir):
    """Saves `manager` inside `writes.writing` on a thread; returns the
    thread and a list that gets its error (a write cut off fails)."""
    errors = []

    def save():
        try:
            with writes.writing(str(ckpt_dir)):
                manager.save()
        except Exception as e:  # pylint: disable=broad-except  (asserted by the caller)
            errors.append(e)

    thread = threading.Thread(target=save)
    thread.start()
    deadline = time.monotonic() + 30
    while not _temp_dirs(ckpt_dir):
        assert thread.is_alive() and time.monotonic() < deadline, "no write seen in progress"
        time.sleep(0.001)
    return thread, errors


def test_a_write_in_progress_is_waited_for_within_the_grace(tmp_path):
    variable, manager = _manager(tmp_path, megabytes=400)
    manager.save()
    variable.assign(tf.ones(variable.shape))
    writes = checkpoint_files.CheckpointWrites()
    thread, errors = _write_in_thread(writes, manager, tmp_path)
    assert writes.finish_or_remove(60) == ([str(tmp_path)], [])
    thread.join(60)
    assert errors == [] and _temp_dirs(tmp_path) == []
    assert manager.latest_checkpoint.endswith("ckpt-2")
    with pytest.raises(checkpoint_files.WritesEnded, match=re.escape(
            f"no checkpoint is written into {tmp_path}: the process is exiting")):
        with writes.writing(str(tmp_path)):
            pass


def test_a_write_past_the_grace_is_removed_and_the_previous_checkpoint_stays(tmp_path):
    variable, manager = _manager(tmp_path, megabytes=400)
    variable.assign(tf.fill(variable.shape, 7.0))
    manager.save()
    variable.assign(tf.ones(variable.shape))
    writes = checkpoint_files.CheckpointWrites()
    thread, errors = _write_in_thread(writes, manager, tmp_path)
    assert writes.finish_or_remove(0) == ([], [str(tmp_path)])
    thread.join(60)
    assert len(errors) == 1, errors  # the write fails: its directory is gone
    assert _temp_dirs(tmp_path) == []
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-1.data-00000-of-00001",
                                           "ckpt-1.index"]
    restored = tf.Variable(tf.zeros(variable.shape))
    tf.train.Checkpoint(v=restored).restore(
        tf.train.latest_checkpoint(str(tmp_path))).assert_consumed()
    assert np.all(restored.numpy() == 7.0)


# smoke.gin with a Q-network of ~37M weights: its checkpoint (the network,
# its target and Adam's two slots) is ~600 MB, a write long enough to be
# interrupted, short enough to finish within the grace.
BIG_NETWORK = ["dqn_agent.fc_layer_params = (6000, 6000)", "Outputs.checkpoint_interval = 1000000",
               "Evaluation.interval = 1000000", "Schedule.num_iterations = 1000000",
               "Outputs.log_interval_secs = 0.2"]


def _train(root_dir, *params):
    args = [sys.executable, "-m", "alf_async.bin.train", "--root_dir", str(root_dir),
            "--gin_file", os.path.join(GIN_CONFIGS, "smoke.gin")]
    for param in params:
        args += ["--gin_param", param]
    return args


def test_a_second_sigint_during_the_checkpoint_at_exit_lets_it_finish_then_resumes(tmp_path):
    proc = subprocess.Popen(_train(tmp_path, *BIG_NETWORK), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=REPO)
    ckpt_dir = tmp_path / "train"
    try:
        for line in proc.stdout:
            if line.startswith("[alf_async] iteration") and "loss -" not in line:
                break
        else:
            raise AssertionError(f"exited with {proc.wait()} before training")
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 60
        while not (ckpt_dir.is_dir() and _temp_dirs(ckpt_dir)):
            assert proc.poll() is None and time.monotonic() < deadline, "no write seen"
            time.sleep(0.001)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=train_cli.WRITE_GRACE_SECS + 30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == train_cli.EXIT_INTERRUPTED, output[-3000:]
    # (The trainer's thread may print its last lines meanwhile.)
    assert train_cli.WRITE_FINISHED.replace("ROOT_DIR", str(tmp_path)) in output.splitlines()
    assert _temp_dirs(ckpt_dir) == []
    latest = tf.train.latest_checkpoint(str(ckpt_dir))
    step = int(tf.train.load_variable(latest, "global_step/.ATTRIBUTES/VARIABLE_VALUE"))
    assert latest == str(ckpt_dir / f"ckpt-{step}") and step > 0, latest

    # The rerun resumes from it.
    rerun = subprocess.Popen(_train(tmp_path, *BIG_NETWORK), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, cwd=REPO)
    resumed = []
    output, _, _ = signal_when_ready(
        rerun, lambda line: resumed.append(line) or line.startswith("[alf_async] iteration"),
        ready_secs=120, exit_secs=60)
    assert rerun.returncode == 0, output[-3000:]
    [line] = [line for line in resumed if "resumed from" in line]
    assert line.startswith(f"[alf_async] resumed from {latest}: global step {step}, "), line
