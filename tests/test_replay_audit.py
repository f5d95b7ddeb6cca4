"""alf_async.testing.replay_audit on a real Reverb server and checkpoint:
every item read once despite the rate limiter, spliced items and the
steps no item holds counted exactly; and the counting rows that feed it."""

import numpy as np
import pytest
import tensorflow as tf

reverb = pytest.importorskip("reverb")

from alf_async.distributed.reverb_replayer import REPLAY_TABLE, RowWriters, replay_table  # noqa: E402
from alf_async.environments import suites  # noqa: E402
from alf_async.testing import replay_audit  # noqa: E402
from alf_async.testing.envs import COUNTING_ROWS  # noqa: E402

pytestmark = pytest.mark.timeout(60)
SPEC = {"observation": tf.TensorSpec([3], tf.float32)}


def rows(env_ids, counters):
    """exp [N, T]: observation [env id, counter, 0] of each row's steps."""
    counters = np.asarray(counters, np.float32)
    env = np.broadcast_to(np.asarray(env_ids, np.float32)[:, None], counters.shape)
    return {"observation": np.stack([env, counters, np.zeros_like(env)], -1)}


def test_read_checkpoint_reads_every_item_once_and_row_runs_counts_splices_and_gaps(tmp_path):
    server = reverb.Server([replay_table(SPEC, 4, samples_per_insert=4.0, min_size=10,
                                         error_buffer=300.0)],
                           checkpointer=reverb.checkpointers.DefaultCheckpointer(str(tmp_path)))
    client = reverb.Client(f"localhost:{server.port}")
    writers = RowWriters(client, 4)
    try:
        # Rows 0 and 1: counters 0..29 in 3 unrolls (27 items each). Row 2:
        # counters 0..9, then a jump to 15..24 in its stream: 3 of its 17
        # items straddle the jump, and counters 10..14 are held by none.
        for u in range(3):
            writers.write(rows([0, 1], [range(10 * u, 10 * u + 10)] * 2), [0, 1])
        writers.write(rows([2], [list(range(10)) + list(range(15, 25))]), [2])
        writers.flush(timeout_ms=10000)
        with client.trajectory_writer(num_keep_alive_refs=4) as raw:  # one item of two rows
            for step in rows([0, 0, 1, 1], [[40], [41], [42], [43]])["observation"]:
                raw.append({"observation": step[0]})
            raw.create_item(REPLAY_TABLE, 1.0, {"observation": raw.history["observation"][-4:]})
            raw.flush()
        assert client.server_info()[REPLAY_TABLE].current_size == 27 + 27 + 17 + 1
        # A learner sampled all the rate limiter allows: a restored table
        # allows no more samples than that.
        budget = (72 * 4.0) - (4.0 * 10 - 300.0) - 1
        sampled = sum(1 for _ in client.sample(REPLAY_TABLE, num_samples=int(budget),
                                               emit_timesteps=False))
        assert sampled == int(budget)
        client.checkpoint()
    finally:
        writers.close()
        server.stop()
    items = replay_audit.read_checkpoint(str(tmp_path), REPLAY_TABLE, batch=16)
    assert len(items) == 72
    report = replay_audit.row_runs(items)
    assert report == dict(items=72, spliced=1 + 3, rows=[0, 1, 2],
                          missing={2: [10, 11, 12, 13, 14]})


def test_counting_rows_give_each_row_its_own_index_from_the_first_row_on(monkeypatch):
    monkeypatch.setenv("ALF_ASYNC_FIRST_ROW", "1000")
    first = suites.load("suite_gym", COUNTING_ROWS, batch_size=2)
    second = suites.load("suite_gym", COUNTING_ROWS, batch_size=1)
    try:
        indices = [e.reset().observation.numpy()[:, 0].tolist() for e in (first, second)]
        assert indices[0][1] == indices[0][0] + 1 and indices[1][0] == indices[0][0] + 2
        assert indices[0][0] >= 1000
        step = first.step(np.zeros(2, np.int64)).observation.numpy()
        assert step[:, 1:].tolist() == [[1.0, 1.0], [1.0, 1.0]]  # counter, step in episode
    finally:
        first.close()
        second.close()


def test_suite_gym_refuses_a_module_it_cannot_import_in_one_line():
    with pytest.raises(ValueError, match=r"^suite_gym: cannot import 'no_such_module' for "
                                         r"'Thing-v0' \(No module named 'no_such_module'\)"):
        suites.load("suite_gym", "no_such_module:Thing-v0", batch_size=1)
