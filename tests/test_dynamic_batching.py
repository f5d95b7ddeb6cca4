"""Dynamic batching and row-by-row stepping, exactly: actors batch whatever
rows are waiting (1 to the cap), every row gets its own action and policy
state, rows of a blocking batch step at their own pace, and stop works while
actors wait for a batch."""

import time

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.policies import tf_policy
from tf_agents.trajectories import policy_step

from alf_async import AsyncOffPolicyDriver
from alf_async.testing.envs import (OBS_COUNTER, OBS_ENV, OBS_STEP, BlockingCountingEnv,
                                    CountingEnvConstructor, straggler_latency, uniform_latency)
from alf_async.testing.policies import StatefulCountingPolicy, expected_counting_action
from conftest import driver_threads

pytestmark = pytest.mark.timeout(90)


class BatchSizePolicy(tf_policy.TFPolicy):
    """CountingPolicy's action; its info is the number of rows in the forward
    pass that computed it, so trajectories record every actor batch size."""

    def __init__(self, time_step_spec, action_spec):
        super().__init__(time_step_spec, action_spec,
                         info_spec=tf.TensorSpec([], tf.int32, name="batch_size"))

    def _action(self, time_step, policy_state, seed):
        action = tf.cast(expected_counting_action(time_step.observation), tf.int32)
        rows = tf.shape(action)[0]
        return policy_step.PolicyStep(action, policy_state, tf.fill([rows], rows))

    def _distribution(self, time_step, policy_state):
        raise NotImplementedError


def make(constructor, policy_cls, **kwargs):
    env = CountingEnvConstructor()()
    return AsyncOffPolicyDriver(constructor, policy_cls(env.time_step_spec(),
                                                        env.action_spec()), **kwargs)


def collect_until(driver, done, max_batches):
    """Learner batches as numpy until done(batches) or max_batches."""
    batches = []
    while len(batches) < max_batches and not (batches and done(batches)):
        exp, env_ids, _ = driver.get_training_exps()
        batches.append((tf.nest.map_structure(lambda t: t.numpy(), exp), env_ids.numpy()))
    return batches


def rows_by_env(batches):
    rows = {}
    for exp, env_ids in batches:
        for r, env_id in enumerate(env_ids):
            rows.setdefault(int(env_id), []).append(
                tf.nest.map_structure(lambda x, r=r: x[r], exp))
    return rows


def assert_row_continuous_and_routed(env_id, unrolls):
    """One row's unrolls: one environment, no step lost or repeated, its own actions."""
    obs = np.concatenate([u.observation for u in unrolls])
    assert set(obs[:, OBS_ENV]) == {env_id}  # one environment per row id
    np.testing.assert_array_equal(obs[:, OBS_COUNTER], np.arange(len(obs)))
    actions = np.concatenate([u.action for u in unrolls])
    np.testing.assert_array_equal(actions, expected_counting_action(obs))


def assert_continuous_and_routed(batches, num_rows):
    rows = rows_by_env(batches)
    assert sorted(rows) == list(range(num_rows))
    for env_id, unrolls in rows.items():
        assert_row_continuous_and_routed(env_id, unrolls)


def one_thread_of_blocking_rows(B, T, latency):
    """A driver of one env thread over B BlockingCountingEnv rows (stepped one
    by one) whose policy writes its batch size into policy_info."""
    return make(CountingEnvConstructor(batch_size=B, env_cls=BlockingCountingEnv,
                                       latency=latency),
                BatchSizePolicy, num_envs=1, unroll_length=T, learn_queue_cap=1)


def batch_sizes(batches):
    return sorted({int(s) for exp, _ in batches for s in exp.policy_info.ravel()})


def every_batch_size_and_row(num_rows):
    """A collect_until condition: every actor batch size 1..num_rows has
    occurred and every row has delivered an unroll (a learner batch can hold
    two unrolls of one row and none of another)."""
    return lambda batches: (batch_sizes(batches) == list(range(1, num_rows + 1)) and
                            len(rows_by_env(batches)) == num_rows)


def test_rows_with_random_latencies_each_get_their_own_actions_in_every_batch_size():
    B, T = 4, 3
    driver = one_thread_of_blocking_rows(B, T, uniform_latency)
    driver.start()
    try:
        # Every batch size 1..B should occur with random latencies; collect
        # until it has (a bounded number of batches, so a bug fails, not hangs).
        batches = collect_until(driver, every_batch_size_and_row(B), 400)
    finally:
        driver.stop()
    assert batch_sizes(batches) == [1, 2, 3, 4]
    assert_continuous_and_routed(batches, B)
    for exp, env_ids in batches:
        assert exp.observation.shape == (B, T, 3) and env_ids.shape == (B,)


def test_graph_env_threads_are_batched_from_one_thread_to_the_cap():
    B, num_envs, cap = 2, 4, 3
    driver = make(CountingEnvConstructor(batch_size=B), BatchSizePolicy, num_envs=num_envs,
                  unroll_length=4, learn_queue_cap=2, actor_queue_cap=cap)
    driver.start()
    try:
        batches = collect_until(driver, lambda b: len(rows_by_env(b)) == num_envs * B, 300)
        batches += collect_until(driver, lambda b: False, 40)
    finally:
        driver.stop()
    sizes = batch_sizes(batches)
    # Whole requests of B rows, at most `cap` env threads' worth per forward pass.
    assert set(sizes) <= {2, 4, 6} and sizes
    assert_continuous_and_routed(batches, num_envs * B)
    stats = driver.get_perf_stats()
    assert stats["actor_rows"] >= stats["env_steps"]


def test_rnn_state_stays_with_its_row_under_random_latencies():
    B = 4
    driver = make(CountingEnvConstructor(batch_size=B, episode_length=lambda i: 3 + i,
                                         env_cls=BlockingCountingEnv, latency=uniform_latency),
                  StatefulCountingPolicy, num_envs=2, unroll_length=5, learn_queue_cap=2,
                  actor_queue_cap=2)
    driver.start()
    try:
        batches = collect_until(
            driver, lambda b: max(int(e.observation[..., OBS_STEP].max()) for e, _ in b) >= 9,
            300)
    finally:
        driver.stop()
    for exp, _ in batches:
        # The state counts steps since FIRST per row; another row's state
        # (another episode length, another phase) would break the equality.
        np.testing.assert_array_equal(exp.action, exp.observation[..., OBS_STEP])
    assert max(int(e.observation[..., OBS_STEP].max()) for e, _ in batches) >= 9


def test_a_straggler_row_never_holds_up_the_others():
    B, T = 4, 2
    assert_straggler_never_holds_up_the_others(
        one_thread_of_blocking_rows(B, T, straggler_latency), B, T)


def assert_straggler_never_holds_up_the_others(driver, B, T):
    """`driver`: one env thread of B rows stepped one by one, row 0 taking
    0.25 s a step, the others none."""
    driver.start()
    try:
        batches = collect_until(driver, lambda b: False, 60)  # 60 * B * T = 480 steps
    finally:
        driver.stop()
    rows = rows_by_env(batches)
    steps = {env_id: len(unrolls) * T for env_id, unrolls in rows.items()}
    # Lockstep, every row would have as many steps as row 0 (one per 0.25 s).
    # Here each fast row took at least 10x as many, however loaded the machine.
    assert sum(steps.values()) == 60 * B * T
    assert all(steps[r] >= 10 * max(steps.get(0, 0), T) for r in (1, 2, 3)), steps
    for r in (1, 2, 3):
        assert_row_continuous_and_routed(r, rows[r])


def test_stop_while_the_actor_waits_for_a_batch():
    # Every row is inside a 1 s step, so the actor waits on an empty queue
    # and the learner on an empty learn queue.
    driver = make(CountingEnvConstructor(batch_size=2, env_cls=BlockingCountingEnv,
                                         latency=1.0),
                  BatchSizePolicy, num_envs=2, unroll_length=2, stop_grace_period_secs=4.0)
    driver.start()
    time.sleep(0.5)
    stats = driver.get_perf_stats()
    assert stats["actor_queue_sizes"] == [0] and stats["actor_rows"] == 4  # the first requests
    start = time.monotonic()
    driver.stop()
    assert time.monotonic() - start < 5.0
    assert not driver_threads()
