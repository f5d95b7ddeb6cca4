"""Dynamic batching and row-by-row stepping, exactly: actors batch whatever
rows are waiting (1 to the cap), requests of env threads waiting together
are merged into one forward pass, every row gets its own action and policy
state, rows of a blocking batch step at their own pace, and stop works while
actors wait for a batch."""

import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.policies import tf_policy
from tf_agents.trajectories import policy_step

from alf_async import AsyncOffPolicyDriver
from alf_async.testing.envs import (OBS_COUNTER, OBS_ENV, OBS_STEP, BlockingCountingEnv,
                                    CountingEnv, CountingEnvConstructor, straggler_latency,
                                    uniform_latency)
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


def make_policy(policy_cls):
    env = CountingEnvConstructor()()
    return policy_cls(env.time_step_spec(), env.action_spec())


def make(constructor, policy_cls, **kwargs):
    return AsyncOffPolicyDriver(constructor, make_policy(policy_cls), **kwargs)


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


class GatedPassPolicy(tf_policy.TFPolicy):
    """CountingPolicy's action; its info is [forward pass number, rows in
    that pass], so the trajectories say which steps one forward pass acted
    for. The first forward pass records its rows in `first_rows`, then
    waits for a token in `gate` (a TF queue the test fills): the test
    decides when it ends."""

    def __init__(self, time_step_spec, action_spec):
        super().__init__(time_step_spec, action_spec,
                         info_spec=tf.TensorSpec([2], tf.int32, name="pass_and_rows"))
        self.gate = tf.queue.FIFOQueue(2, tf.int32, shapes=[])
        self.passes = tf.Variable(0, dtype=tf.int32, trainable=False)  # forward passes begun
        self.first_rows = tf.Variable(0, dtype=tf.int32, trainable=False)

    def _action(self, time_step, policy_state, seed):
        action = tf.cast(expected_counting_action(time_step.observation), tf.int32)
        rows = tf.shape(action)[0]
        number = self.passes.assign_add(1).read_value() - 1

        def wait_at_the_gate():
            with tf.control_dependencies([self.first_rows.assign(rows)]):
                return self.gate.dequeue() * 0 + number

        number = tf.cond(tf.equal(number, 0), wait_at_the_gate, lambda: number)
        return policy_step.PolicyStep(action, policy_state,
                                      tf.tile(tf.stack([number, rows])[None], [rows, 1]))

    def _distribution(self, time_step, policy_state):
        raise NotImplementedError


def test_requests_of_env_threads_waiting_together_are_merged_into_one_forward_pass():
    B, num_envs, cap = 2, 3, 2
    policy = make_policy(GatedPassPolicy)
    driver = AsyncOffPolicyDriver(CountingEnvConstructor(batch_size=B), policy,
                                  num_envs=num_envs, unroll_length=4, learn_queue_cap=2,
                                  actor_queue_cap=cap)
    driver.start()
    try:
        # The first forward pass holds 1 or 2 env threads' first requests and
        # waits at the gate until the others' are waiting in the actor queue.
        deadline = time.monotonic() + 60
        while int(policy.first_rows) // B + driver.get_perf_stats()[
                "actor_queue_sizes"][0] < num_envs:
            assert time.monotonic() < deadline, "the env threads' first requests never waited"
            time.sleep(0.01)
        policy.gate.enqueue(0)
        batches = collect_until(driver, lambda b: len(rows_by_env(b)) == num_envs * B, 300)
        batches += collect_until(driver, lambda b: False, 40)
    finally:
        policy.gate.enqueue(0)  # (the gate holds 2: no wait if the test failed before)
        driver.stop()
    rows = rows_by_env(batches)
    # The forward pass of each env thread's first step: both rows of a thread in one.
    first_pass = {}
    for env_id, unrolls in rows.items():
        first_pass.setdefault(env_id // B, set()).add(tuple(unrolls[0].policy_info[0]))
    assert sorted(first_pass) == list(range(num_envs))
    assert all(len(passes) == 1 for passes in first_pass.values()), first_pass
    threads_in = {}
    for thread, [(number, pass_rows)] in first_pass.items():
        threads_in.setdefault((number, pass_rows), []).append(thread)
    # Passes 0 and 1 served the three first requests (the cap is 2): one of
    # them served two env threads at once, exactly their 2 x B rows.
    assert sorted(number for number, _ in threads_in) == [0, 1], threads_in
    [(merged, threads)] = [(key, t) for key, t in threads_in.items() if len(t) == 2]
    assert merged[1] == 2 * B, threads_in
    # Every pass took whole requests of B rows, at most `cap` of them.
    sizes = {int(r) for exp, _ in batches for r in exp.policy_info[..., 1].ravel()}
    assert sizes <= {B, 2 * B} and 2 * B in sizes, sizes
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


class StepsUntilClosed(CountingEnv):
    """A CountingEnv whose every step waits until the environment is closed
    (a remote simulator that does not answer), declaring `blocking_step`:
    its close() wakes a step, from any thread, as that promises. Each step
    releases `entered` as it begins to wait."""

    blocking_step = True

    def __init__(self, entered, **kwargs):
        super().__init__(**kwargs)
        self._entered = entered
        self._closing = threading.Event()

    def _step(self, action):
        self._entered.release()
        self._closing.wait(60)
        return super()._step(action)

    def close(self):
        self._closing.set()
        super().close()


def test_stop_while_the_actor_waits_for_a_batch():
    # Every row is inside a step that waits until stop closes its
    # environment, so the actor waits on an empty queue and the learner on
    # an empty learn queue.
    entered = threading.Semaphore(0)
    driver = make(CountingEnvConstructor(batch_size=2, env_cls=StepsUntilClosed,
                                         entered=entered),
                  BatchSizePolicy, num_envs=2, unroll_length=2, stop_grace_period_secs=4.0)
    driver.start()
    try:
        for _ in range(4):
            assert entered.acquire(timeout=60), "a row never stepped"
        # The 4 first requests were served (the actor counts a batch's rows
        # just after sending its replies); no row can ask again.
        deadline = time.monotonic() + 30
        while driver.get_perf_stats()["actor_rows"] < 4:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        stats = driver.get_perf_stats()
        assert stats["actor_queue_sizes"] == [0] and stats["actor_rows"] == 4
        assert stats["learn_queue_size"] == 0 and stats["env_steps"] == 0
    finally:
        start = time.monotonic()
        driver.stop()
    assert time.monotonic() - start < 5.0
    assert not driver_threads()
