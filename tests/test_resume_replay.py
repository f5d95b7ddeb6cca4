"""A resumed run restores its replay exactly: a tiny run on counting rows
(every step says which row it is and its place in that row) trains to a
checkpoint; a run resumed on its root_dir holds, before its first batch,
every environment row's stored steps as they were saved (the same steps in
the same slots, the same write cursors), and writes its first batch at
those cursors."""

import gin
import numpy as np
import pytest
import tensorflow as tf

from alf_async import settings, trainer
from alf_async.learning import agents, replayers
from alf_async.testing.envs import COUNTING_ROWS

pytestmark = pytest.mark.timeout(180)

OBS_ENV, OBS_COUNTER = 0, 1  # counting_rows' observation: [env index, counter, step in episode]
# Steps kept per row. A prime: a row of at most 12 unrolls of 4 steps never
# fills it exactly, so the busier env thread's rows wrap with their cursor
# mid-ring.
CAPACITY = 13
T = 4


class RecordedReplayer(replayers.UniformReplayer):
    """A UniformReplayer that keeps, for the test, every instance made
    (`made`) and its contents (`contents()`) just before and just after it
    wrote its first batch, with that batch."""

    made = []

    def __init__(self, data_spec, num_rows, capacity_per_row=CAPACITY, **kwargs):
        super().__init__(data_spec, num_rows, capacity_per_row=capacity_per_row, **kwargs)
        self.before_first = self.after_first = self.first_batch = None
        RecordedReplayer.made.append(self)

    def __call__(self, exp, env_ids):
        if self.before_first is not None:
            return super().__call__(exp, env_ids)
        self.before_first = self.contents()
        self.first_batch = (tf.nest.map_structure(np.asarray, exp), np.asarray(env_ids))
        super().__call__(exp, env_ids)
        self.after_first = self.contents()
        return None

    def contents(self):
        """(written [rows], the storage as a nest of numpy arrays [rows, capacity, ...])."""
        return (self._written.numpy(),
                tf.nest.map_structure(lambda v: v.numpy(), self._storage))


def rows(contents, capacity=CAPACITY):
    """{row: (steps written to it, its held steps oldest first as a nest of
    [held, ...] arrays)}: the ring read from its write cursor on."""
    written, storage = contents
    out = {}
    for row, count in enumerate(written.tolist()):
        held = min(count, capacity)
        slots = [(count - held + k) % capacity for k in range(held)]
        out[row] = (count, tf.nest.map_structure(lambda a, row=row: a[row, slots], storage))
    return out


def assert_same_rows(actual, expected, what):
    assert sorted(actual) == sorted(expected), what
    for row, (count, steps) in expected.items():
        assert actual[row][0] == count, (what, row, actual[row][0], count)
        tf.nest.map_structure(
            lambda a, b, row=row: np.testing.assert_array_equal(a, b, err_msg=f"{what} row {row}"),
            actual[row][1], steps)


def checkpointed_contents(root_dir, structure):
    """The replay as the latest checkpoint of root_dir holds it (the filled
    slots of every row and the written counts), its storage packed as
    `structure` (a replayer's storage nest)."""
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(root_dir / "train")))
    prefix = "replay_buffer/.ATTRIBUTES/"
    flat = [reader.get_tensor(f"{prefix}storage_{i}")
            for i in range(len(tf.nest.flatten(structure)))]
    assert int(reader.get_tensor(f"{prefix}capacity_per_row")) == CAPACITY
    return reader.get_tensor(f"{prefix}written"), tf.nest.pack_sequence_as(structure, flat)


@pytest.fixture(autouse=True)
def _gin():
    gin.clear_config()
    gin.parse_config("dqn_agent.fc_layer_params = (8,)")
    RecordedReplayer.made = []
    yield
    gin.clear_config()
    RecordedReplayer.made = []


def run(root_dir, num_iterations):
    """2 env threads of 2 counting rows, batches of one env thread's 2
    unrolls of 4 steps, 8 env steps of initial collection, no evaluation,
    a checkpoint at exit only."""
    return trainer.train(
        str(root_dir),
        task=settings.Task(env_name=COUNTING_ROWS, agent_fn=agents.dqn_agent,
                           replayer_fn=RecordedReplayer),
        layout=settings.Layout(env_threads=2, rows_per_env_thread=2, actor_queues=1,
                               actor_queue_cap=2),
        schedule=settings.Schedule(num_iterations=num_iterations, unroll_length=T,
                                   rows_per_batch=2, train_steps_per_iteration=1,
                                   sample_batch_size=8, initial_collect_steps=8),
        evaluation=settings.Evaluation(episodes=0),
        outputs=settings.Outputs(summary_interval=1000, checkpoint_interval=1000,
                                 log_interval_secs=60.0),
        print_fn=lambda line: None)


def test_a_resumed_run_restores_every_rows_steps_and_cursor_exactly(tmp_path):
    first = run(tmp_path, num_iterations=12)
    assert first.iterations == 12 and first.global_step > 0
    [saved_replayer] = RecordedReplayer.made
    at_exit = saved_replayer.contents()
    saved = rows(at_exit)
    # 12 batches of 2 unrolls of 4 steps reached the replay, and some rows wrapped.
    assert sum(count for count, _ in saved.values()) == 12 * 2 * T
    assert any(count > CAPACITY and count % CAPACITY for count, _ in saved.values()), saved
    for row, (count, steps) in saved.items():
        # Each row is one environment's steps, in order: the counters run on
        # by one from the oldest held step to the newest.
        obs = steps.observation
        assert len(set(obs[:, OBS_ENV].tolist())) == (1 if count else 0), (row, obs)
        np.testing.assert_array_equal(np.diff(obs[:, OBS_COUNTER]), np.ones(len(obs) - 1))

    # What the checkpoint holds is what the replay held at exit.
    assert_same_rows(rows(checkpointed_contents(tmp_path, at_exit[1])), saved, "checkpoint")

    second = run(tmp_path, num_iterations=14)
    assert second.iterations == 14
    resumed_replayer = RecordedReplayer.made[-1]
    assert resumed_replayer is not saved_replayer
    # Restored: every row's steps, their order and its cursor.
    assert_same_rows(rows(resumed_replayer.before_first), saved, "restored")
    # The resumed run's first batch went on at the restored cursors: each of
    # its unrolls lies right after its row's newest saved step, the other
    # rows and the older steps are untouched.
    exp, env_ids = resumed_replayer.first_batch
    expected = {row: (count, steps) for row, (count, steps) in saved.items()}
    for i, env_id in enumerate(env_ids.tolist()):
        count, steps = expected[env_id]
        unroll = tf.nest.map_structure(lambda a, i=i: a[i], exp)
        expected[env_id] = (count + T, tf.nest.map_structure(
            lambda old, new: np.concatenate([old, new])[-CAPACITY:], steps, unroll))
    assert_same_rows(rows(resumed_replayer.after_first), expected, "after the first batch")
