"""alf_async metrics agree exactly with tf-agents' on the same trajectories."""

import json
import threading

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.metrics import tf_metrics
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory as trajectory_lib

from alf_async.driver import metrics as metrics_lib

FIRST, MID, LAST = 0, 1, 2


def episode_stream(rng, num_steps):
    """One env's transitions: random episode lengths 1..6 and random rewards."""
    step_type, next_step_type, reward = [], [], []
    current = FIRST
    remaining = rng.integers(1, 7)
    for _ in range(num_steps):
        if current == LAST:
            nxt, r = FIRST, 0.0
            remaining = rng.integers(1, 7)
        else:
            remaining -= 1
            nxt = LAST if remaining == 0 else MID
            r = float(rng.integers(-3, 4))
        step_type.append(current)
        next_step_type.append(nxt)
        reward.append(r)
        current = nxt
    return np.array(step_type), np.array(next_step_type), np.array(reward, np.float32)


def make_traj(step_type, next_step_type, reward):
    n = step_type.shape
    return trajectory_lib.Trajectory(
        step_type=step_type.astype(np.int32), observation=np.zeros(n, np.float32),
        action=np.zeros(n, np.int32), policy_info=(),
        next_step_type=next_step_type.astype(np.int32), reward=reward,
        discount=np.ones(n, np.float32))


@pytest.mark.timeout(60)
def test_unrolls_in_any_env_order_match_tf_agents_stepwise_metrics():
    num_envs, T, num_unrolls = 5, 4, 12
    rng = np.random.default_rng(0)
    streams = [episode_stream(rng, T * num_unrolls) for _ in range(num_envs)]
    ours = [metrics_lib.NumberOfEpisodes(), metrics_lib.EnvironmentSteps(),
            metrics_lib.AverageReturn(buffer_size=1000),
            metrics_lib.AverageEpisodeLength(buffer_size=1000)]
    theirs = [tf_metrics.NumberOfEpisodes(), tf_metrics.EnvironmentSteps(),
              tf_metrics.AverageReturnMetric(batch_size=num_envs, buffer_size=1000),
              tf_metrics.AverageEpisodeLengthMetric(batch_size=num_envs, buffer_size=1000)]
    # tf-agents: all envs in lockstep, one time step at a time.
    full = [np.stack([s[k] for s in streams]) for k in range(3)]
    for t in range(T * num_unrolls):
        traj = make_traj(*[x[:, t] for x in full])
        for m in theirs:
            m(tf.nest.map_structure(tf.convert_to_tensor, traj))
    # ours: unroll u of every env, envs in a shuffled order, 2 rows per unroll
    # where possible (env ids need not be contiguous).
    for u in range(num_unrolls):
        order = rng.permutation(num_envs)
        for group in np.array_split(order, 3):
            sl = slice(u * T, (u + 1) * T)
            traj = make_traj(*[x[group, sl] for x in full])
            for m in ours:
                m(traj, group)
    for mine, ref in zip(ours, theirs):
        assert mine.name == ref.name.replace("Metric", "") or mine.name == ref.name
        np.testing.assert_allclose(mine.result().numpy(), ref.result().numpy(), rtol=1e-6,
                                   err_msg=mine.name)
    assert ours[0].result().numpy() > 20  # the stream really had episodes


def test_five_rewarded_steps_give_return_and_length_five():
    # FIRST -> MID x4 -> LAST, then the boundary LAST -> FIRST.
    st = np.array([[FIRST, MID, MID, MID, MID, LAST]])
    nst = np.array([[MID, MID, MID, MID, LAST, FIRST]])
    r = np.array([[1, 1, 1, 1, 1, 0]], np.float32)
    ms = [metrics_lib.NumberOfEpisodes(), metrics_lib.EnvironmentSteps(),
          metrics_lib.AverageReturn(), metrics_lib.AverageEpisodeLength()]
    for m in ms:
        m(make_traj(st, nst, r), np.array([0]))
    assert [float(m.result()) for m in ms] == [1.0, 5.0, 5.0, 5.0]


def test_average_keeps_the_last_buffer_size_episodes():
    m = metrics_lib.AverageReturn(buffer_size=2)
    for ret in [10.0, 2.0, 4.0]:
        m(make_traj(np.array([[FIRST]]), np.array([[LAST]]), np.array([[ret]], np.float32)),
          np.array([0]))
    assert float(m.result()) == 3.0
    m.reset()
    assert float(m.result()) == 0.0


def test_state_survives_a_checkpoint_round_trip(tmp_path):
    m = metrics_lib.EnvironmentSteps()
    avg = metrics_lib.AverageReturn()
    traj = make_traj(np.array([[FIRST, MID]]), np.array([[MID, LAST]]),
                     np.array([[1.0, 2.0]], np.float32))
    m(traj, np.array([0]))
    avg(traj, np.array([0]))
    path = tf.train.Checkpoint(steps=m, ret=avg).save(str(tmp_path / "ckpt"))
    m2, avg2 = metrics_lib.EnvironmentSteps(), metrics_lib.AverageReturn()
    tf.train.Checkpoint(steps=m2, ret=avg2).restore(path).assert_existing_objects_matched()
    assert int(m2.result()) == 2 and float(avg2.result()) == 3.0
    assert json.loads(m2.saved_state.serialize()) == {"count": 2}


@pytest.mark.timeout(60)
def test_concurrent_updates_and_reads_lose_nothing():
    m = metrics_lib.EnvironmentSteps()
    traj = make_traj(np.full((2, 3), MID), np.full((2, 3), MID), np.ones((2, 3), np.float32))

    def update(k):
        for _ in range(500):
            m(traj, np.array([2 * k, 2 * k + 1]))

    threads = [threading.Thread(target=update, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    reads = [int(m.result()) for _ in range(200)]
    for t in threads:
        t.join()
    assert reads == sorted(reads)
    assert int(m.result()) == 4 * 500 * 6


def test_tf_summaries_use_tf_agents_tags(tmp_path):
    m, steps = metrics_lib.AverageReturn(), metrics_lib.EnvironmentSteps()
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        m.tf_summaries(train_step=tf.constant(1, tf.int64), step_metrics=[steps])
    writer.flush()
    tags = set()
    for f in tmp_path.iterdir():
        for e in tf.compat.v1.train.summary_iterator(str(f)):
            tags.update(v.tag for v in e.summary.value)
    assert tags == {"Metrics/AverageReturn", "Metrics_vs_EnvironmentSteps/AverageReturn"}
