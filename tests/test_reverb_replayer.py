"""ReverbReplayer against a real Reverb server: exact streams, the rate
limiter, checkpoint -> new server, and a trainer run that trains."""

import glob
import os

import gin
import numpy as np
import pytest
import tensorflow as tf

reverb = pytest.importorskip("reverb")

from alf_async import trainer  # noqa: E402
from alf_async.distributed.reverb_replayer import REPLAY_TABLE, ReverbReplayer, replay_table, window_spec  # noqa: E402

SMOKE_GIN = os.path.join(os.path.dirname(__file__), os.pardir, "gin_configs", "smoke.gin")
SPEC = {"env": tf.TensorSpec([], tf.int32), "step": tf.TensorSpec([], tf.int32)}


@pytest.fixture(autouse=True)
def _clear_gin():
    yield
    gin.clear_config()


def queue_table(data_spec, sequence_length, learner_in_process=False):
    """A FIFO queue: sampling returns every item once, in insertion order."""
    return reverb.Table.queue(REPLAY_TABLE, 1000,
                              signature=window_spec(data_spec, sequence_length))


def unroll(env_ids, first_steps, T):
    """exp [N, T]: env = the row's env id, step = that env's step counter."""
    steps = np.asarray(first_steps)[:, None] + np.arange(T)[None, :]
    env = np.broadcast_to(np.asarray(env_ids)[:, None], steps.shape)
    return {"env": env.astype(np.int32), "step": steps.astype(np.int32)}


def drain(replayer, count):
    items = [s.data for s in replayer.client.sample(REPLAY_TABLE, num_samples=count,
                                                         emit_timesteps=False,
                                                         unpack_as_table_signature=True)]
    return [(list(item["env"]), list(item["step"])) for item in items]


@pytest.mark.timeout(60)
def test_every_window_is_consecutive_steps_of_one_env():
    replayer = ReverbReplayer(SPEC, sequence_length=3, table_fn=queue_table)
    try:
        # Rows of any envs, in any order, an env twice in one batch (in order).
        replayer(unroll([2, 0], [0, 0], 4), [2, 0])
        replayer(unroll([0, 0, 1], [4, 8, 0], 4), [0, 0, 1])
        replayer(unroll([2], [4], 4), [2])
        replayer.flush(timeout_ms=5000)
        # env 0: 12 steps -> 10 windows; env 1: 4 -> 2; env 2: 8 -> 6.
        assert replayer.num_frames() == 18
        items = drain(replayer, 18)
    finally:
        replayer.close()
    by_env = {}
    for envs, steps in items:
        assert len(set(envs)) == 1, f"a window joins envs {envs}"
        by_env.setdefault(envs[0], []).append(steps)
    assert by_env == {e: [[s, s + 1, s + 2] for s in range(n - 2)]
                      for e, n in ((0, 12), (1, 4), (2, 8))}


@pytest.mark.timeout(60)
def test_rate_limiter_blocks_inserts_then_samples():
    # Both sides limited (as for collectors writing to a learner's server).
    table = lambda spec, length, learner_in_process: replay_table(  # noqa: E731
        spec, length, samples_per_insert=1.0, min_size=2, error_buffer=2.0)
    replayer = ReverbReplayer(SPEC, sequence_length=1, table_fn=table)
    try:
        assert replayer.rate_limiter() == (1.0, 2, 0.0, 4.0)
        assert not replayer.can_sample(1)
        replayer(unroll([0], [0], 10), [0])  # 10 windows; never blocks the caller
        # inserts * 1.0 - samples may not exceed 4: the 5th insert waits.
        with pytest.raises(reverb.errors.DeadlineExceededError):
            replayer.flush(timeout_ms=1000)
        assert replayer.num_frames() == 4
        assert replayer.can_sample(1)
        # Samples let as many inserts in (the dataset may have fetched one ahead).
        dataset = reverb.TrajectoryDataset.from_table_signature(
            replayer.server_address, REPLAY_TABLE, 1, rate_limiter_timeout_ms=1000)
        assert len(list(dataset.take(3))) == 3
        with pytest.raises(reverb.errors.DeadlineExceededError):
            replayer.flush(timeout_ms=1000)
        stats = replayer.table_info().rate_limiter_info
        assert stats.sample_stats.completed in (3, 4)
        assert stats.insert_stats.completed == stats.sample_stats.completed + 4
        # A sample that would put the learner ahead of samples_per_insert x inserts
        # waits (here: gives up after its timeout), so sampling on until it gives up
        # lets every insert in and then stops at exactly 1 sample per insert.
        list(dataset.take(20))
        stats = replayer.table_info().rate_limiter_info
        assert stats.insert_stats.completed == 10
        assert stats.sample_stats.completed == 10
        replayer.flush(timeout_ms=1000)
    finally:
        replayer.close()


@pytest.mark.timeout(60)
def test_checkpoint_restores_the_items_in_a_new_server(tmp_path):
    directory = str(tmp_path / "replay")
    replayer = ReverbReplayer(SPEC, sequence_length=2, checkpoint_dir=directory,
                              table_fn=queue_table)
    replayer(unroll([0, 1], [0, 0], 3), [0, 1])
    replayer.flush(timeout_ms=5000)
    path = replayer.checkpoint()
    replayer.close()
    assert path.startswith(directory)
    restored = ReverbReplayer(SPEC, sequence_length=2, checkpoint_dir=directory,
                              table_fn=queue_table)
    try:
        assert restored.num_frames() == 4
        assert sorted(drain(restored, 4)) == [
            ([0, 0], [0, 1]), ([0, 0], [1, 2]), ([1, 1], [0, 1]), ([1, 1], [1, 2])]
    finally:
        restored.close()


def reverb_smoke(extra=()):
    gin.parse_config_files_and_bindings([SMOKE_GIN], [
        "Task.replayer_fn = @ReverbReplayer",
        "ReverbReplayer.sequence_length = 2",
        # 2 train steps x 16 windows per iteration of 1 unroll x 2 envs x 4 steps = 8 inserts.
        "replay_table.samples_per_insert = 4.0",
        "replay_table.min_size = 32",
        "replay_table.error_buffer = 64",
    ] + list(extra))


@pytest.mark.timeout(120)
def test_trainer_trains_from_reverb_and_checkpoints_the_table(tmp_path):
    reverb_smoke()
    lines = []
    result = trainer.train(str(tmp_path), print_fn=lines.append)
    assert result.stopped_by == "num_iterations"
    assert result.iterations == 40
    # Training starts once 32 windows are in (8 per iteration, less each row's first
    # one): from iteration 5 or 6 on, 2 train steps per iteration.
    assert result.global_step in (2 * 35, 2 * 36), result.global_step
    losses = [line for line in lines if "loss" in line]
    assert losses and "nan" not in losses[-1]
    assert glob.glob(str(tmp_path / "replay" / "*")), "no Reverb checkpoint in root_dir/replay"
    # Resume: the table comes back from root_dir/replay, training goes on at once.
    gin.clear_config()
    reverb_smoke(["Schedule.num_iterations = 42"])
    lines = []
    result = trainer.train(str(tmp_path), print_fn=lines.append)
    assert result.iterations == 42
    assert any(line.startswith("[alf_async] resumed") for line in lines)


@pytest.mark.timeout(60)
def test_trainer_refuses_a_schedule_that_waits_on_itself(tmp_path):
    reverb_smoke(["replay_table.samples_per_insert = 2.0"])
    with pytest.raises(trainer.ConfigError, match="samples_per_insert = 4"):
        trainer.train(str(tmp_path), print_fn=lambda line: None)
    gin.clear_config()
    reverb_smoke(["replay_table.error_buffer = 31"])
    with pytest.raises(trainer.ConfigError, match="error_buffer >= 32"):
        trainer.train(str(tmp_path), print_fn=lambda line: None)
