"""PixelReplayer: each frame stored once, every sampled stack byte-exact.

Frames are tiny (6x5, stacks of 4) and encode (row, episode, step) in their
pixels, so a frame from another row, episode or step shows. Each row's
stream of steps is made up front; a step's `action` is row * ID + its index
in the stream, which names the ground truth of every sampled step.
"""

import glob
import os
import re

import gymnasium
import numpy as np
import pytest
import tensorflow as tf
from gymnasium.wrappers import FrameStackObservation
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory

from alf_async.learning.pixel_replayer import PixelReplayer
from alf_async.learning.replayers import UniformReplayer

H, W, S = 6, 5, 4
ID = 100_000
FIRST, MID, LAST = (int(t) for t in (ts.StepType.FIRST, ts.StepType.MID, ts.StepType.LAST))
LENGTHS = (2, 3, 5, 4, 7)  # episode lengths, cycled: starts come often, some shorter than S


def _spec(observation=tf.TensorSpec([H, W, S], tf.uint8)):
    """A DQN-like collect_data_spec."""
    return trajectory.Trajectory(
        step_type=tf.TensorSpec([], tf.int32), observation=observation,
        action=tf.TensorSpec([], tf.int64), policy_info=(),
        next_step_type=tf.TensorSpec([], tf.int32), reward=tf.TensorSpec([], tf.float32),
        discount=tf.TensorSpec([], tf.float32))


def _frame(row, episode, step):
    """A never-all-zero frame whose pixels encode (row, episode, step)."""
    f = (np.arange(H * W).reshape(H, W) * 7 + row * 50 + episode * 13 + step * 3) % 251 + 1
    f[0, :3] = row, episode, step
    return f.astype(np.uint8)


def _stream(row, length, padding="reset", lengths=LENGTHS):
    """`length` steps of one env row: [(stack [H, W, S], step_type)], episodes of
    `lengths` steps, cycled; episodes start padded with their first frame
    ("reset"), zeros ("zero"), or after the first one continue the last
    episode's stack ("carry")."""
    steps, episode, stack = [], 0, None
    while len(steps) < length:
        episode_length = lengths[episode % len(lengths)]
        for t in range(episode_length):
            f = _frame(row, episode, t)[..., None]
            if t == 0 and padding == "carry" and stack is not None:
                # EnvPool's episodic_life: the stack goes on over a lost life.
                stack = np.concatenate([stack[..., 1:], f], axis=-1)
                step_type = FIRST
            elif t == 0:
                pad = np.zeros_like(f) if padding == "zero" else f
                stack = np.concatenate([pad] * (S - 1) + [f], axis=-1)
                step_type = FIRST
            else:
                stack = np.concatenate([stack[..., 1:], f], axis=-1)
                step_type = LAST if t == episode_length - 1 else MID
            steps.append((stack, step_type))
        episode += 1
    return steps[:length]


class _Feeder:
    """Writes the rows' streams to a replayer in unrolls; knows the ground truth."""

    def __init__(self, streams):
        self.streams = streams
        self.written = np.zeros(len(streams), np.int64)

    def batch(self, ids, T):
        """The next T steps of each id in `ids` (an id twice: two consecutive unrolls)."""
        obs, types, actions = [], [], []
        for e in ids:
            g = self.written[e]
            steps = self.streams[e][g:g + T]
            obs.append([s for s, _ in steps])
            types.append([t for _, t in steps])
            actions.append([e * ID + g + t for t in range(T)])
            self.written[e] += T
        types = np.asarray(types, np.int32)
        shape = types.shape
        return trajectory.Trajectory(
            step_type=types, observation=np.asarray(obs, np.uint8),
            action=np.asarray(actions, np.int64), policy_info=(),
            next_step_type=np.roll(types, -1, axis=1), reward=np.ones(shape, np.float32),
            discount=np.ones(shape, np.float32))

    def write(self, replayer, ids, T):
        replayer(self.batch(ids, T), np.asarray(ids, np.int32))

    def check(self, sample, capacity):
        """Every sampled step is its ground truth, windows inside one row's held
        steps that rebuild no overwritten frame; returns the (row, index) sampled."""
        action = sample.action.numpy()
        rows, index = action // ID, action % ID
        assert (rows == rows[:, :1]).all()
        assert (np.diff(index, axis=1) == 1).all()
        for row, first, last in zip(rows[:, 0], index[:, 0], index[:, -1]):
            written = self.written[row]
            oldest = written - capacity + (S - 1) if written > capacity else 0
            assert oldest <= first and last < written, (row, first, last, written)
        truth = [self.streams[r][g] for r, g in zip(rows.ravel(), index.ravel())]
        expected = np.stack([s for s, _ in truth]).reshape(sample.observation.shape)
        np.testing.assert_array_equal(sample.observation.numpy(), expected)
        np.testing.assert_array_equal(sample.step_type.numpy().ravel(), [t for _, t in truth])
        return set(zip(rows.ravel().tolist(), index.ravel().tolist()))

    def sampleable(self, capacity):
        """Every (row, index) a window of one step may start at."""
        return {(row, g) for row, written in enumerate(self.written)
                for g in range(written - capacity + (S - 1) if written > capacity else 0, written)}


@pytest.mark.parametrize("padding", ["reset", "zero", "carry"])
def test_stacks_are_byte_exact_across_episode_starts_rows_duplicates_and_wraparound(padding):
    num_rows, capacity, T = 3, 16, 3
    replayer = PixelReplayer(_spec(), num_rows=num_rows, capacity_per_row=capacity)
    feeder = _Feeder([_stream(r, 200, padding) for r in range(num_rows)])
    assert not replayer.can_sample(1)
    rng = np.random.RandomState(0)
    tf.random.set_seed(0)
    for i in range(30):
        # A subset of the rows in any order, sometimes one row twice in a row.
        ids = list(rng.choice(num_rows, size=rng.randint(1, 4), replace=False))
        if i % 3 == 0:
            ids.insert(ids.index(ids[0]) + 1, ids[0])
        feeder.write(replayer, ids, T)
        if replayer.can_sample(2):
            feeder.check(replayer.sample(64, 2), capacity)
    assert feeder.written.min() > capacity  # every ring wrapped
    assert replayer.num_frames() == num_rows * capacity
    sampled = feeder.check(replayer.sample(3000, 1), capacity)
    assert sampled == feeder.sampleable(capacity)
    # Among them: episode starts and the S - 1 steps after, where padding shows.
    steps_in_episode = {int(feeder.streams[r][g][0][0, 2, -1]) for r, g in sampled}
    assert set(range(S)) <= steps_in_episode
    # Windows as long as a wrapped ring allows, and no longer.
    feeder.check(replayer.sample(200, capacity - (S - 1)), capacity)
    assert not replayer.can_sample(capacity - (S - 1) + 1)


def test_a_ring_of_capacity_s_samples_only_its_newest_step_once_wrapped():
    replayer = PixelReplayer(_spec(), num_rows=2, capacity_per_row=S)
    feeder = _Feeder([_stream(r, 50) for r in range(2)])
    for _ in range(5):
        feeder.write(replayer, [1, 0], 2)
    sampled = feeder.check(replayer.sample(100, 1), S)
    assert sampled == {(0, 9), (1, 9)}
    assert not replayer.can_sample(2)


def test_two_unrolls_of_one_row_in_one_batch_continue_each_other():
    """The second unroll's first step continues the first unroll's last, which
    is in the batch, not yet in the ring."""
    capacity = 20
    replayer = PixelReplayer(_spec(), num_rows=2, capacity_per_row=capacity)
    feeder = _Feeder([_stream(0, 40), _stream(1, 40, lengths=(100,))])
    feeder.write(replayer, [1, 0, 1, 1], 3)  # row 1: steps 0-8 of one episode
    feeder.write(replayer, [1, 1, 0], 4)
    assert replayer.num_frames() == 17 + 7
    sampled = feeder.check(replayer.sample(2000, 1), capacity)
    assert sampled == feeder.sampleable(capacity)


def test_a_padded_first_stack_starts_afresh_even_if_its_pixels_also_continue():
    """A static screen over an episode end: the FIRST stack [f, f, f, f] also
    continues the last episode's; it is stored as a start (reads no frame of
    that episode), and so is the first stack of a zero-padded episode."""
    static = np.repeat(_frame(0, 0, 0)[..., None], S, axis=-1)
    zero_padded = np.zeros_like(static)
    zero_padded[..., -1] = static[..., -1]
    types = [FIRST, MID, MID, LAST, FIRST, MID, LAST, FIRST]
    stacks = [static] * 7 + [zero_padded]
    replayer = PixelReplayer(_spec(), num_rows=1, capacity_per_row=8)
    feeder = _Feeder([list(zip(stacks, types))])
    feeder.write(replayer, [0], 8)
    # White box: the `starts` codes (1: padded with its frame, 2: with zeros).
    np.testing.assert_array_equal(replayer._storage["starts"].numpy()[0], [1, 0, 0, 0, 1, 0, 0, 2])
    assert feeder.check(replayer.sample(500, 1), 8) == feeder.sampleable(8)


def test_refuses_a_stack_it_cannot_rebuild_and_writes_nothing():
    replayer = PixelReplayer(_spec(), num_rows=2, capacity_per_row=10)
    feeder = _Feeder([_stream(r, 30) for r in range(2)])
    feeder.write(replayer, [0, 1], 3)
    good = feeder.batch([0], 2)

    def refused(obs, step_types, match):
        with pytest.raises(ValueError, match=match):
            replayer(good._replace(observation=obs, step_type=step_types), np.array([0], np.int32))
        assert replayer.num_frames() == 6

    # A FIRST step whose older channels are frames of its own, not padding.
    obs = good.observation.copy()
    obs[0, 1, ..., 0] += 1
    types = good.step_type.copy()
    types[0, 1] = FIRST
    refused(obs, types, r"the stack of step 1 of unroll 0 \(env id 0\) neither continues the "
                        r"row's previous stack \(frames shifted by one\) nor starts one padded "
                        r"with copies of its newest frame or with zeros")
    # A MID step that neither continues nor is padded.
    obs = good.observation.copy()
    obs[0, 0, ..., 1] = 0
    refused(obs, good.step_type, r"step 0 of unroll 0 \(env id 0\) neither continues")
    with pytest.raises(ValueError, match="capacity_per_row=10"):
        replayer(feeder.batch([1, 1, 1, 1], 3), np.array([1, 1, 1, 1], np.int32))
    # A MID step that starts a padded stack (a stream that marks no FIRST) is kept.
    feeder.written[:] = 3
    restart = good.observation.copy()
    restart[0, 1] = np.repeat(restart[0, 1, ..., -1:], S, axis=-1)
    feeder.streams[0][4] = (restart[0, 1], MID)
    feeder.write(replayer, [0], 2)
    feeder.check(replayer.sample(500, 2), 10)


def test_constructor_refusals_and_a_dict_observation():
    with pytest.raises(ValueError, match="capacity_per_row >= the stack depth 4, got 3"):
        PixelReplayer(_spec(), num_rows=1, capacity_per_row=3)
    with pytest.raises(ValueError, match="exactly one uint8"):
        PixelReplayer(_spec(tf.TensorSpec([H, W, S], tf.float32)), num_rows=1)
    with pytest.raises(ValueError, match="Trajectory"):
        PixelReplayer({"observation": tf.TensorSpec([H, W, S], tf.uint8)}, num_rows=1)
    # The stack beside other observation leaves, which are stored as they are.
    spec = _spec({"pixels": tf.TensorSpec([H, W, S], tf.uint8),
                  "z_lives": tf.TensorSpec([2], tf.int32)})
    replayer = PixelReplayer(spec, num_rows=1, capacity_per_row=8)
    feeder = _Feeder([_stream(0, 10)])
    exp = feeder.batch([0], 5)
    lives = np.arange(10, dtype=np.int32).reshape(1, 5, 2)
    replayer(exp._replace(observation={"pixels": exp.observation, "z_lives": lives}),
             np.array([0], np.int32))
    sample = replayer.sample(200, 1)
    g = sample.action.numpy()[:, 0]
    np.testing.assert_array_equal(sample.observation["z_lives"].numpy()[:, 0], lives[0, g])
    feeder.check(sample._replace(observation=sample.observation["pixels"]), 8)


def test_bytes_per_step_of_an_atari_dqn_spec():
    spec = _spec(tf.TensorSpec([84, 84, 4], tf.uint8))
    replayer = PixelReplayer(spec, num_rows=2, capacity_per_row=1000)
    # A frame, the starts code, action, reward, discount, 2 step types; the cursors.
    assert replayer.bytes_per_step() == pytest.approx(84 * 84 + 1 + 8 + 4 + 4 + 4 + 4 + 8 / 1000)
    assert replayer.bytes_per_step() <= 8192
    assert UniformReplayer(spec, num_rows=1, capacity_per_row=10).bytes_per_step() == (
        pytest.approx(84 * 84 * 4 + 8 + 4 + 4 + 4 + 4 + 8 / 10))


def _same_storage_and_samples(replayer, restored, n):
    """Asserts `restored` holds `replayer`'s variables and draws its `n`
    windows of 2 steps for one seed; returns the restored one's sample."""
    for a, b in zip(replayer.variables, restored.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    tf.random.set_seed(3)
    before = replayer.sample(n, 2)
    tf.random.set_seed(3)
    after = restored.sample(n, 2)
    tf.nest.map_structure(np.testing.assert_array_equal, before, after)
    return after


def test_checkpoint_roundtrip_restores_storage_and_samples(tmp_path):
    replayer = PixelReplayer(_spec(), num_rows=2, capacity_per_row=8)
    feeder = _Feeder([_stream(r, 40) for r in range(2)])
    for _ in range(4):
        feeder.write(replayer, [1, 0], 3)
    path = tf.train.Checkpoint(replay_buffer=replayer).save(str(tmp_path / "ckpt"))
    restored = PixelReplayer(_spec(), num_rows=2, capacity_per_row=8)
    tf.train.Checkpoint(replay_buffer=restored).restore(path).assert_consumed()
    feeder.check(_same_storage_and_samples(replayer, restored, 100), 8)
    # Writing goes on where the saved one stopped: stacks still continue.
    feeder.write(restored, [0, 1], 3)
    feeder.check(restored.sample(500, 2), 8)


def _checkpoint_bytes(path):
    return sum(os.path.getsize(f) for f in glob.glob(path + ".*"))


def test_a_partly_filled_replay_checkpoints_its_filled_part_and_resumes_exactly(tmp_path):
    """A checkpoint's bytes follow the steps held, not the capacity; restored,
    the same steps sit in the same slots and sample the same windows."""
    capacity = 1000
    replayer = PixelReplayer(_spec(), num_rows=3, capacity_per_row=capacity)
    feeder = _Feeder([_stream(r, 40) for r in range(3)])
    for ids in ([0, 1, 2], [1, 0], [0]):
        feeder.write(replayer, ids, 4)  # rows hold 12, 8 and 4 steps
    path = tf.train.Checkpoint(replay_buffer=replayer).save(str(tmp_path / "partly"))
    per_step = replayer.bytes_per_step()
    # The first 12 slots of each row (the fullest row's), and a few KB of
    # object graph and index; the whole storage would be 3,000 steps.
    assert 3 * 12 * per_step < _checkpoint_bytes(path) < 3 * 12 * per_step + 8192

    restored = PixelReplayer(_spec(), num_rows=3, capacity_per_row=capacity)
    tf.train.Checkpoint(replay_buffer=restored).restore(path).assert_consumed()
    assert restored.num_frames() == 24
    after = _same_storage_and_samples(replayer, restored, 200)
    assert feeder.check(after, capacity) == feeder.sampleable(capacity)
    # Writing goes on at each row's cursor: the stacks still continue.
    feeder.write(restored, [2, 1, 0], 4)
    feeder.check(restored.sample(500, 2), capacity)

    # A full replay's checkpoint is its whole storage, as before.
    full = PixelReplayer(_spec(), num_rows=3, capacity_per_row=8)
    feeder = _Feeder([_stream(r, 40) for r in range(3)])
    for ids in ([0, 1, 2], [0, 1, 2], [2]):
        feeder.write(full, ids, 4)
    whole = sum(v.numpy().nbytes for v in full.variables)
    path = tf.train.Checkpoint(replay_buffer=full).save(str(tmp_path / "full"))
    assert whole < _checkpoint_bytes(path) < whole + 8192


def test_a_checkpoint_of_another_replay_shape_is_refused(tmp_path):
    replayer = PixelReplayer(_spec(), num_rows=2, capacity_per_row=20)
    feeder = _Feeder([_stream(r, 40) for r in range(2)])
    feeder.write(replayer, [0, 1], 12)
    path = tf.train.Checkpoint(replay_buffer=replayer).save(str(tmp_path / "ckpt"))
    # The first array checked is the step types'.
    other = PixelReplayer(_spec(), num_rows=3, capacity_per_row=20)
    with pytest.raises(ValueError, match=re.escape(
            "PixelReplayer: a checkpointed storage array of shape (2, 12) does not fit this "
            "replayer's (3, 20)")):
        tf.train.Checkpoint(replay_buffer=other).restore(path)
    # A larger capacity would hold the 12 steps, but misplace a wrapped ring's.
    other = PixelReplayer(_spec(), num_rows=2, capacity_per_row=30)
    with pytest.raises(ValueError, match=re.escape(
            "PixelReplayer: the checkpoint's replay has capacity_per_row=20, this one 30")):
        tf.train.Checkpoint(replay_buffer=other).restore(path)


def test_sample_traced_before_data_inside_a_tf_function():
    replayer = PixelReplayer(_spec(), num_rows=3, capacity_per_row=12)
    assert replayer.traceable_before_data
    replayer.trace()
    sample = tf.function(lambda: replayer.sample(300, 2))
    sample.get_concrete_function()
    feeder = _Feeder([_stream(r, 60) for r in range(3)])
    feeder.write(replayer, [2, 0], 4)
    assert feeder.check(sample(), 12) <= feeder.sampleable(12)
    for _ in range(4):
        feeder.write(replayer, [0, 1, 2], 4)
    feeder.check(sample(), 12)


def test_gymnasium_frame_stacks_both_padding_types():
    """The stacks gymnasium's own FrameStackObservation makes (channels moved last)."""

    class Frames(gymnasium.Env):
        observation_space = gymnasium.spaces.Box(0, 255, (H, W), np.uint8)
        action_space = gymnasium.spaces.Discrete(2)

        def __init__(self, row):
            self.row, self.episode, self.t = row, -1, 0

        def reset(self, *, seed=None, options=None):
            self.episode, self.t = self.episode + 1, 0
            return _frame(self.row, self.episode, 0), {}

        def step(self, action):
            self.t += 1
            done = self.t == LENGTHS[self.episode % len(LENGTHS)] - 1
            return _frame(self.row, self.episode, self.t), 0.0, done, False, {}

    def stream(row, length, **kwargs):
        env = FrameStackObservation(Frames(row), S, **kwargs)
        steps, obs, done = [], None, True
        while len(steps) < length:
            if done:
                obs, _ = env.reset()
                step_type = FIRST
            else:
                obs, _, done, _, _ = env.step(0)
                step_type = LAST if done else MID
            steps.append((np.moveaxis(obs, 0, -1), step_type))
        return steps

    for kwargs in ({}, {"padding_type": "zero"}):
        replayer = PixelReplayer(_spec(), num_rows=2, capacity_per_row=10)
        feeder = _Feeder([stream(r, 40, **kwargs) for r in range(2)])
        for _ in range(5):
            feeder.write(replayer, [0, 1], 3)
        assert feeder.check(replayer.sample(1000, 1), 10) == feeder.sampleable(10)
