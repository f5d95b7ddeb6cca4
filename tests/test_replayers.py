"""Replayers: the uniform replayer keeps one ring per environment row."""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.trajectories import trajectory

from alf_async import AsyncOffPolicyDriver
from alf_async.learning.replayers import OneTimeReplayer, UniformReplayer
from alf_async.testing.envs import OBS_COUNTER, OBS_ENV, CountingEnvConstructor
from alf_async.testing.policies import CountingPolicy

SPEC = {"env": tf.TensorSpec([], tf.int32), "counter": tf.TensorSpec([], tf.int64),
        "obs": tf.TensorSpec([2], tf.float32)}


def _unroll(env_ids, starts, T):
    """Rows of T steps: row i is env env_ids[i], counters starts[i] .. starts[i] + T - 1."""
    counters = np.asarray(starts, np.int64)[:, None] + np.arange(T)[None, :]
    return {
        "env": np.broadcast_to(np.asarray(env_ids, np.int32)[:, None], counters.shape).copy(),
        "counter": counters,
        "obs": np.stack([counters, -counters], axis=-1).astype(np.float32),
    }


def _check_windows(sample, written, capacity, num_steps):
    env = sample["env"].numpy()
    counter = sample["counter"].numpy()
    assert env.shape == counter.shape == (env.shape[0], num_steps)
    # Never across rows.
    assert (env == env[:, :1]).all()
    # Consecutive steps of that row, all still held: never across the write cursor.
    assert (np.diff(counter, axis=1) == 1).all()
    for e, c in zip(env[:, 0], counter):
        assert written[e] - capacity <= c[0] and c[-1] < written[e], (e, c, written[e])
    np.testing.assert_array_equal(sample["obs"].numpy()[..., 0], counter)


def test_uniform_rows_stay_per_env_with_subsets_duplicates_and_wraparound():
    num_rows, capacity, T = 5, 12, 4
    replayer = UniformReplayer(SPEC, num_rows=num_rows, capacity_per_row=capacity)
    assert not replayer.can_sample(3)
    with pytest.raises(tf.errors.InvalidArgumentError):
        replayer.sample(4, 3)
    written = np.zeros(num_rows, np.int64)
    rng = np.random.RandomState(0)
    for _ in range(40):
        # A subset of the envs, in any order, sometimes one env twice in a row.
        ids = list(rng.choice(num_rows, size=rng.randint(1, 4), replace=False))
        if rng.rand() < 0.3:
            ids.insert(ids.index(ids[0]) + 1, ids[0])
        starts = []
        for e in ids:
            starts.append(written[e])
            written[e] += T
        replayer(_unroll(ids, starts, T), np.asarray(ids, np.int32))
        if replayer.can_sample(3):
            _check_windows(replayer.sample(64, 3), written, capacity, 3)
    assert written.min() > capacity  # every ring wrapped
    assert replayer.num_frames() == num_rows * capacity
    sample = replayer.sample(2000, capacity)  # windows as long as a whole ring
    _check_windows(sample, written, capacity, capacity)
    # Uniform over windows: every row is sampled.
    assert set(sample["env"].numpy()[:, 0]) == set(range(num_rows))


def test_uniform_refuses_a_batch_larger_than_a_row():
    replayer = UniformReplayer(SPEC, num_rows=2, capacity_per_row=6)
    with pytest.raises(ValueError, match="capacity_per_row=6"):
        replayer(_unroll([1, 1], [0, 4], 4), np.array([1, 1], np.int32))


def test_uniform_samples_only_rows_that_hold_a_window():
    replayer = UniformReplayer(SPEC, num_rows=3, capacity_per_row=10)
    replayer(_unroll([2], [0], 2), np.array([2], np.int32))
    replayer(_unroll([0], [0], 4), np.array([0], np.int32))
    sample = replayer.sample(200, 3)
    assert set(sample["env"].numpy()[:, 0]) == {0}
    _check_windows(sample, np.array([4, 0, 2]), 10, 3)


def test_uniform_replayer_checkpoint_roundtrip(tmp_path):
    replayer = UniformReplayer(SPEC, num_rows=2, capacity_per_row=8)
    replayer(_unroll([1, 0], [0, 0], 5), np.array([1, 0], np.int32))
    path = tf.train.Checkpoint(replay_buffer=replayer).save(str(tmp_path / "ckpt"))
    restored = UniformReplayer(SPEC, num_rows=2, capacity_per_row=8)
    tf.train.Checkpoint(replay_buffer=restored).restore(path).assert_consumed()
    assert restored.num_frames() == 10
    _check_windows(restored.sample(50, 5), np.array([5, 5]), 8, 5)


def test_uniform_replayer_checkpoints_the_steps_it_holds_not_its_capacity(tmp_path):
    replayer = UniformReplayer(SPEC, num_rows=2, capacity_per_row=5000)
    replayer(_unroll([1, 0], [0, 0], 5), np.array([1, 0], np.int32))
    replayer(_unroll([1], [5], 5), np.array([1], np.int32))  # rows hold 5 and 10 steps
    path = tf.train.Checkpoint(replay_buffer=replayer).save(str(tmp_path / "ckpt"))
    saved = sum(os.path.getsize(f) for f in glob.glob(path + ".*"))
    assert 2 * 10 * replayer.bytes_per_step() < saved < 2 * 10 * replayer.bytes_per_step() + 8192
    restored = UniformReplayer(SPEC, num_rows=2, capacity_per_row=5000)
    tf.train.Checkpoint(replay_buffer=restored).restore(path).assert_consumed()
    assert restored.num_frames() == 15
    tf.random.set_seed(1)
    before = replayer.sample(50, 5)
    tf.random.set_seed(1)
    after = restored.sample(50, 5)
    tf.nest.map_structure(np.testing.assert_array_equal, before, after)
    _check_windows(after, np.array([5, 10]), 5000, 5)


def test_uniform_replayer_behind_the_driver_keeps_env_rows():
    """Real driver batches (subsets of env threads, in any order) of CountingEnvs."""
    env_constructor = CountingEnvConstructor(batch_size=2, episode_length=lambda i: 3 + i)
    probe = env_constructor()
    policy = CountingPolicy(probe.time_step_spec(), probe.action_spec())
    num_envs = 3
    replayer = UniformReplayer(policy.trajectory_spec, num_rows=num_envs * 2,
                               capacity_per_row=16)
    driver = AsyncOffPolicyDriver(env_constructor, policy, num_envs=num_envs, unroll_length=3,
                                  learn_queue_cap=2, exp_observers=[replayer])
    driver.start()
    try:
        for _ in range(12):
            driver.run_async()
    finally:
        driver.stop()
    sample = replayer.sample(500, 4)
    obs = sample.observation.numpy()
    # env row r of env thread i is CountingEnv index 2 + 2 * i + b (the probe took 0, 1).
    assert (obs[..., OBS_ENV] == obs[:, :1, OBS_ENV]).all()
    assert (np.diff(obs[..., OBS_COUNTER], axis=1) == 1).all()
    assert len(set(obs[:, 0, OBS_ENV])) == num_envs * 2


def test_one_time_replayer_unlinked_trains_on_the_dequeued_batch_in_windows():
    replayer = OneTimeReplayer(link_unrolls=False)
    assert not replayer.can_sample(2)
    replayer(_unroll([3, 1], [0, 100], 5), np.array([3, 1], np.int32))
    windows = replayer.sample(num_steps=2)
    counter = windows["counter"].numpy()
    assert counter.shape == (2 * 4, 2)
    assert (np.diff(counter, axis=1) == 1).all()
    assert sorted(counter[:, 0]) == [0, 1, 2, 3, 100, 101, 102, 103]
    # The next batch replaces it, also inside a traced function.
    sample = tf.function(lambda: replayer.sample(num_steps=5))
    replayer(_unroll([0, 2], [7, 9], 5), np.array([0, 2], np.int32))
    assert sorted(sample()["counter"].numpy()[:, 0]) == [7, 9]
    replayer(_unroll([0, 2], [12, 14], 5), np.array([0, 2], np.int32))
    assert sorted(sample()["counter"].numpy()[:, 0]) == [12, 14]
    with pytest.raises(ValueError, match="unroll_length"):
        replayer.sample(num_steps=6)


def _trajectory(env_ids, starts, T, first_step_type=None):
    """Trajectory rows of T steps: observation = counter (starts[i] + t),
    action = 10 * counter, reward = counter, all MID steps (a row may start
    with `first_step_type[i]`)."""
    counters = np.asarray(starts, np.int64)[:, None] + np.arange(T)[None, :]
    step_type = np.ones(counters.shape, np.int32)
    if first_step_type is not None:
        step_type[:, 0] = first_step_type
    return trajectory.Trajectory(
        step_type=step_type, observation=counters, action=10 * counters,
        policy_info=(), next_step_type=np.ones(counters.shape, np.int32),
        reward=counters.astype(np.float32), discount=np.full(counters.shape, 0.5, np.float32))


def test_one_time_replayer_links_each_rows_unrolls_by_their_shared_step():
    replayer = OneTimeReplayer()
    sample = tf.function(lambda: replayer.sample())
    replayer(_trajectory([3, 1], [0, 100], 4), np.array([3, 1], np.int32))
    exp = sample()
    # A row's first unroll is preceded by an inert boundary: its first step
    # marked LAST -> FIRST, reward 0, discount 1.
    np.testing.assert_array_equal(exp.observation.numpy(), [[0, 0, 1, 2, 3],
                                                            [100, 100, 101, 102, 103]])
    np.testing.assert_array_equal(exp.step_type.numpy()[:, 0], [2, 2])
    np.testing.assert_array_equal(exp.next_step_type.numpy()[:, 0], [0, 0])
    np.testing.assert_array_equal(exp.reward.numpy()[:, 0], [0.0, 0.0])
    np.testing.assert_array_equal(exp.discount.numpy()[:, 0], [1.0, 1.0])
    # Next batch: row 1 twice (two consecutive unrolls, in order), row 3 absent.
    replayer(_trajectory([1, 1], [104, 108], 4), np.array([1, 1], np.int32))
    exp = sample()
    np.testing.assert_array_equal(exp.observation.numpy(), [[103, 104, 105, 106, 107],
                                                            [107, 108, 109, 110, 111]])
    # The preceding step is the previous unroll's last, whole: its action and reward.
    np.testing.assert_array_equal(exp.action.numpy()[:, 0], [1030, 1070])
    np.testing.assert_array_equal(exp.reward.numpy()[:, 0], [103.0, 107.0])
    np.testing.assert_array_equal(exp.step_type.numpy()[:, 0], [1, 1])
    # Row 0 is new; row 3 kept its step while absent.
    replayer(_trajectory([0, 3], [50, 4], 4), np.array([0, 3], np.int32))
    exp = sample()
    np.testing.assert_array_equal(exp.observation.numpy(), [[50, 50, 51, 52, 53],
                                                            [3, 4, 5, 6, 7]])
    np.testing.assert_array_equal(exp.step_type.numpy()[:, 0], [2, 1])
    assert replayer.num_frames() == 2 * 5


def _trajectory_spec():
    """The spec of one step of `_trajectory`'s rows."""
    return trajectory.Trajectory(
        step_type=tf.TensorSpec([], tf.int32), observation=tf.TensorSpec([], tf.int64),
        action=tf.TensorSpec([], tf.int64), policy_info=(),
        next_step_type=tf.TensorSpec([], tf.int32), reward=tf.TensorSpec([], tf.float32),
        discount=tf.TensorSpec([], tf.float32))


def test_one_time_replayer_with_batch_rows_is_traced_before_its_first_batch():
    """Given its batch's rows, the variables exist at construction: a sample
    traced before any batch reads each batch that comes; a batch of other
    rows is refused and the kept one stays."""
    assert not OneTimeReplayer().traceable_before_data
    replayer = OneTimeReplayer(_trajectory_spec(), num_rows=4, batch_rows=2)
    assert replayer.traceable_before_data
    assert not replayer.can_sample(None) and replayer.num_frames() == 0
    sample = tf.function(lambda: replayer.sample()).get_concrete_function()
    replayer.trace()   # the linking, for batches of any length: nothing written
    assert not replayer.can_sample(None) and replayer.num_frames() == 0
    with pytest.raises(ValueError, match="before any experience was observed"):
        replayer.sample()
    replayer(_trajectory([3, 1], [0, 100], 4), np.array([3, 1], np.int32))
    assert replayer.can_sample(None) and replayer.num_frames() == 2 * 5
    np.testing.assert_array_equal(sample().observation.numpy(), [[0, 0, 1, 2, 3],
                                                                 [100, 100, 101, 102, 103]])
    replayer(_trajectory([1, 3], [104, 4], 4), np.array([1, 3], np.int32))
    np.testing.assert_array_equal(sample().observation.numpy(), [[103, 104, 105, 106, 107],
                                                                 [3, 4, 5, 6, 7]])
    with pytest.raises(ValueError, match=r"^OneTimeReplayer\(batch_rows=2\) was given a "
                                         r"batch of 3 rows$"):
        replayer(_trajectory([0, 1, 3], [0, 108, 8], 4), np.array([0, 1, 3], np.int32))
    np.testing.assert_array_equal(sample().observation.numpy()[:, 1], [104, 4])
    replayer(_trajectory([3, 1], [8, 108], 2), np.array([3, 1], np.int32))  # shorter
    np.testing.assert_array_equal(sample().observation.numpy(), [[7, 8, 9], [107, 108, 109]])
    # Unlinked: the batch as dequeued, read by a function traced before it came.
    unlinked = OneTimeReplayer(SPEC, link_unrolls=False, batch_rows=2)
    windows = tf.function(lambda: unlinked.sample(num_steps=5)).get_concrete_function()
    unlinked(_unroll([0, 2], [7, 9], 5), np.array([0, 2], np.int32))
    np.testing.assert_array_equal(windows()["counter"].numpy()[:, 0], [7, 9])


@pytest.mark.parametrize("kwargs", [dict(batch_rows=2), dict(data_spec=SPEC, batch_rows=0),
                                    dict(data_spec=SPEC, batch_rows=True)])
def test_one_time_replayer_refuses_batch_rows_it_cannot_use(kwargs):
    with pytest.raises(ValueError, match=r"^OneTimeReplayer\(batch_rows=\.\.\.\) needs an int "
                                         r">= 1 and the data_spec"):
        OneTimeReplayer(**kwargs)


def test_one_time_replayer_does_not_link_an_unroll_that_starts_anew():
    """A restarted environment's unroll starts with FIRST where the kept
    step expected MID: the kept step is not its predecessor."""
    replayer = OneTimeReplayer()
    replayer(_trajectory([0], [0], 3), np.array([0], np.int32))
    replayer(_trajectory([0], [500], 3, first_step_type=[0]), np.array([0], np.int32))
    exp = replayer.sample()
    np.testing.assert_array_equal(exp.observation.numpy(), [[500, 500, 501, 502]])
    np.testing.assert_array_equal(exp.step_type.numpy()[0, :2], [2, 0])


def test_one_time_replayer_windows_span_linked_unrolls():
    replayer = OneTimeReplayer()
    replayer(_trajectory([0], [0], 3), np.array([0], np.int32))
    replayer(_trajectory([0], [3], 3), np.array([0], np.int32))
    windows = replayer.sample(num_steps=2).observation.numpy()
    np.testing.assert_array_equal(windows, [[2, 3], [3, 4], [4, 5]])


def test_one_time_replayer_linking_needs_trajectories():
    with pytest.raises(ValueError, match="link_unrolls=False"):
        OneTimeReplayer()(_unroll([0], [0], 3), np.array([0], np.int32))


def test_linked_unrolls_behind_the_driver_train_every_transition_once():
    """Real driver batches of CountingEnvs (subsets of env threads, rows
    twice in one batch): over all batches each row's trained transitions
    (the first T of T + 1 steps, boundaries excluded) are its transitions,
    each exactly once, in order."""
    env_constructor = CountingEnvConstructor(batch_size=2, episode_length=lambda i: 4 + i)
    probe = env_constructor()
    policy = CountingPolicy(probe.time_step_spec(), probe.action_spec())
    replayer = OneTimeReplayer(policy.trajectory_spec, num_rows=6)
    trained = {}   # env row -> counters of the trained transitions' observations
    next_counter = {}

    def record(exp, env_ids):
        del exp
        linked = replayer.sample()
        obs = linked.observation.numpy()
        boundary = (linked.step_type.numpy() == 2) & (linked.next_step_type.numpy() == 0)
        for i, env_id in enumerate(np.asarray(env_ids)):
            rows = trained.setdefault(int(env_id), [])
            for t in range(obs.shape[1] - 1):
                if not boundary[i, t]:
                    rows.append(int(obs[i, t, OBS_COUNTER]))
                    # The transition's next observation is the step after it.
                    next_counter[rows[-1]] = int(obs[i, t + 1, OBS_COUNTER])

    driver = AsyncOffPolicyDriver(env_constructor, policy, num_envs=3, unroll_length=3,
                                  learn_queue_cap=2, exp_observers=[replayer, record])
    driver.start()
    try:
        for _ in range(15):
            driver.run_async()
    finally:
        driver.stop()
    assert len(trained) == 6
    for env_id, counters in trained.items():
        # Every step the row emitted but its last (only bootstrapped so far),
        # once and in order; episode boundaries (LAST -> FIRST) are not
        # transitions of the environment.
        assert counters == sorted(set(counters)), env_id
        assert all(next_counter[c] == c + 1 for c in counters)
        assert len(counters) >= 3 * 3   # at least three unrolls of the row


def test_one_time_replayer_takes_unrolls_of_any_length():
    """A synchronous loop's DynamicStepDriver collects a varying number of
    steps per row: the rows stay, the length may change."""
    replayer = OneTimeReplayer()
    sample = tf.function(lambda: replayer.sample())
    replayer(_trajectory([0, 1], [0, 10], 3), np.array([0, 1], np.int32))
    assert sample().observation.shape == (2, 4)
    replayer(_trajectory([0, 1], [3, 13], 5), np.array([0, 1], np.int32))
    np.testing.assert_array_equal(sample().observation.numpy(), [[2, 3, 4, 5, 6, 7],
                                                                 [12, 13, 14, 15, 16, 17]])
    np.testing.assert_array_equal(replayer.sample(num_steps=5).observation.numpy()[:, 0],
                                  [2, 3, 12, 13])
