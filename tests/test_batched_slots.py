"""ExternalEnv slots as rows of one environment (`env_constructor(slots_per_env=K)`):
one env thread serves K episodes, stepping whichever slots have a client step
ready (EnvThread._rows_loop), with the same exact experience as one slot per
env thread: logged actions, training_enabled=False episodes inert for the
learner and counted in the metrics, each slot's unrolls continuing where the
last ended, policy state per slot, and stop while slots wait. (An exception
in run() through batched slots: test_external_env, parametrized by
slots_per_env; serving through them: test_serving, test_serving_cli.)

Which slot binds which episode is up to the threads, so the assertions find
each learner row's episode by its observations ([episode, step]) and check
that row exactly; every count follows from what the log thread saw.
"""

import collections
import threading
import time
import types

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.policies import tf_policy
from tf_agents.trajectories import policy_step

from alf_async import AsyncOffPolicyDriver
from alf_async.driver.env_rows import row_envs, row_stepper
from alf_async.environments import ExternalEnvFinished
from test_external_env import (BlockedClients, IdleEnv, ScriptedEnv, metric_results, no_external_env_threads_left,
                               numpy, policy_action, three_steps)

pytestmark = pytest.mark.timeout(60)
_ = no_external_env_threads_left   # autouse: no thread or open slot left

SLOTS = 2


def rows_of(exp):
    """The rows of a batch-major Trajectory [n, T] as a list of Trajectories [T]."""
    n = np.asarray(exp.step_type).shape[0]
    return [tf.nest.map_structure(lambda a, i=i: np.asarray(a)[i], exp) for i in range(n)]


def learn_all_rows(ext, policy=None, slots=SLOTS, unroll_length=4, max_batches=50):
    """One env thread over `slots` batched slots of `ext`, until ext's data ends.

    Returns (driver, learner rows [(row, env_id)], log-thread rows).
    """
    policy = policy or ObsStatePolicy.stateless(ext)
    seen = []
    driver = AsyncOffPolicyDriver(ext.env_constructor(slots_per_env=slots), policy, num_envs=1,
                                  unroll_length=unroll_length,
                                  observers=[lambda t: seen.extend(rows_of(numpy(t)))],
                                  stop_grace_period_secs=1.0)
    learned = []
    driver.start()
    try:
        with pytest.raises(ExternalEnvFinished):
            for _ in range(max_batches):
                exp, env_ids, _ = driver.get_training_exps()
                learned += list(zip(rows_of(numpy(exp)), np.asarray(env_ids).tolist()))
    finally:
        driver.stop()
        ext.join(5)
    return driver, learned, seen


def episode_of(row):
    return int(row.observation[0, 0])


def check_learner_took_what_was_logged(learned, seen, slots=SLOTS, as_learned=None):
    """The learner took every full batch (slots rows) of the unrolls shipped,
    and each learner row is one of the unrolls the log thread saw (as
    `as_learned(log_row)` would be learned; the log thread regroups rows so
    that each batch it counts holds an env id once, so order is compared
    per slot elsewhere)."""
    assert len(learned) == len(seen) // slots * slots

    def key(row):
        return tuple(np.asarray(row.observation).ravel().tolist())

    logged = collections.Counter(key(as_learned(r) if as_learned else r) for r in seen)
    took = collections.Counter(key(r) for r, _ in learned)
    assert not took - logged, (took, logged)


class ObsStatePolicy(tf_policy.TFPolicy):
    """With state: action = steps since the episode's FIRST (the state counts
    them per row); without: ObsPolicy's action, (10 * obs[0] + obs[1]) % 1000."""

    def __init__(self, time_step_spec, action_spec, stateful):
        self._stateful = stateful
        super().__init__(time_step_spec, action_spec,
                         policy_state_spec=tf.TensorSpec([], tf.int32) if stateful else ())

    @classmethod
    def stateless(cls, ext):
        return cls(ext.time_step_spec(), ext.action_spec(), stateful=False)

    def _action(self, time_step, policy_state, seed):
        obs = time_step.observation
        if not self._stateful:
            return policy_step.PolicyStep(tf.math.floormod(obs[..., 0] * 10 + obs[..., 1], 1000),
                                          policy_state, ())
        count = tf.where(time_step.is_first(), tf.zeros_like(policy_state), policy_state + 1)
        return policy_step.PolicyStep(count, count, ())

    def _distribution(self, time_step, policy_state):
        raise NotImplementedError


# ------------------------------------------------------------------ tests


def test_slots_per_env_makes_one_environment_whose_rows_are_slots():
    ext = IdleEnv()
    one = ext.env_constructor()()
    three = ext.env_constructor(slots_per_env=3)()
    assert one.batch_size == 1 and row_envs(one) is None   # today's layout, unchanged
    assert three.batch_size == 3 and len(row_envs(three)) == 3
    # The env thread steps slots itself (no worker thread per slot).
    no_recorder = types.SimpleNamespace(record=None)
    assert type(row_stepper("env0", row_envs(three), no_recorder)).__name__ == "SlotStepper"
    other = IdleEnv().env_constructor(slots_per_env=1)()
    mixed = row_envs(three)[:2] + [other.pyenv]   # not all slots of one ExternalEnv
    assert type(row_stepper("env0", mixed, no_recorder)).__name__ == "RowWorkers"
    other.close()
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ValueError, match=r"^slots_per_env must be an integer >= 1, got "):
            ext.env_constructor(slots_per_env=bad)
    one.close()
    three.close()
    ext.stop()


def test_logged_actions_reach_the_learner_through_batched_slots():
    E = 7
    ext = ScriptedEnv([three_steps(logged=(1,)) for _ in range(E)])
    driver, learned, seen = learn_all_rows(ext)
    # Every episode but the last of each slot used (its boundary needs the
    # slot's next episode) was shipped, once.
    episodes = [episode_of(r) for r in seen]
    assert len(set(episodes)) == len(episodes) and E - SLOTS <= len(episodes) <= E - 1
    assert E - 1 not in episodes
    check_learner_took_what_was_logged(learned, seen)
    assert len(learned) >= 4
    for row, _ in learned:
        e = episode_of(row)
        np.testing.assert_array_equal(row.observation, [[e, 0], [e, 1], [e, 2], [e, 3]])
        np.testing.assert_array_equal(row.step_type, [0, 1, 1, 2])
        np.testing.assert_array_equal(row.next_step_type, [1, 1, 2, 0])
        np.testing.assert_array_equal(row.reward, [0.5, 1.5, 3.0, 0.0])
        np.testing.assert_array_equal(row.discount, [1, 1, 0, 1])
        # The logged action, not the policy's, at step 1.
        np.testing.assert_array_equal(
            row.action, [policy_action(e, 0), 900 + 10 * e + 1, policy_action(e, 2),
                         policy_action(e, 3)])
    for row in seen:   # the log thread's trajectories hold the logged actions too
        assert row.action[1] == 900 + 10 * episode_of(row) + 1
    assert ext.actions == [policy_action(e, s) for e in range(E) for s in (0, 2)]
    assert metric_results(driver) == dict(
        NumberOfEpisodes=len(seen), EnvironmentSteps=3 * len(seen), AverageReturn=5.0,
        AverageEpisodeLength=3.0)


def test_training_disabled_episodes_are_inert_for_the_learner_through_batched_slots():
    E = 9
    ext = ScriptedEnv([three_steps(training_enabled=e % 2 == 0) for e in range(E)])
    driver, learned, seen = learn_all_rows(ext)
    # A disabled episode's learner row is blanked: its observations are 0.
    check_learner_took_what_was_logged(
        learned, seen, as_learned=lambda r: r._replace(observation=r.observation * (
            1 - episode_of(r) % 2)))
    assert len(learned) >= 6
    disabled = 0
    for row, _ in learned:
        e = episode_of(row)
        if row.step_type[0] != 2:
            assert e % 2 == 0
            np.testing.assert_array_equal(row.observation, [[e, s] for s in range(4)])
            np.testing.assert_array_equal(row.step_type, [0, 1, 1, 2])
            np.testing.assert_array_equal(row.reward, [0.5, 1.5, 3.0, 0.0])
            continue
        # An odd episode: nothing but inert boundaries (its observations
        # blanked, so episode_of says 0).
        disabled += 1
        np.testing.assert_array_equal(row.observation, np.zeros((4, 2)))
        np.testing.assert_array_equal(row.step_type, [2, 2, 2, 2])
        np.testing.assert_array_equal(row.next_step_type, [0, 0, 0, 0])
        np.testing.assert_array_equal(row.reward, [0, 0, 0, 0])
        np.testing.assert_array_equal(row.discount, [1, 1, 1, 1])
        np.testing.assert_array_equal(row.action, [0, 0, 0, 0])
    # The log thread saw every shipped episode as it happened, disabled ones
    # included, and the metrics count them all.
    episodes = [episode_of(r) for r in seen]
    assert len(set(episodes)) == len(episodes) and E - SLOTS <= len(episodes) <= E - 1
    assert disabled >= 2
    for row in seen:
        e = episode_of(row)
        np.testing.assert_array_equal(row.observation, [[e, s] for s in range(4)])
        np.testing.assert_array_equal(row.step_type, [0, 1, 1, 2])
    assert ext.actions == [policy_action(e, s) for e in range(E) for s in (0, 1, 2)]
    assert metric_results(driver) == dict(
        NumberOfEpisodes=len(seen), EnvironmentSteps=3 * len(seen), AverageReturn=5.0,
        AverageEpisodeLength=3.0)


class ConcurrentClients(ScriptedEnv):
    """`clients` threads, each playing `per_client` get_action episodes
    ([e, 0] .. [e, 3], e = clients * k + c) at once; run() returns when all did."""

    def __init__(self, clients, per_client):
        super().__init__([])
        self._clients, self._per_client = clients, per_client
        self.returned = {}   # episode -> the actions get_action returned

    def run(self):
        def client(c):
            for k in range(self._per_client):
                e = self._clients * k + c
                eid = self.start_episode(f"ep{e}")
                got = [int(self.get_action(eid, np.array([e, s]))) for s in range(3)]
                self.returned[e] = got
                self.end_episode(eid, [e, 3])

        threads = [threading.Thread(target=client, args=(c,), name=f"external_env_client{c}")
                   for c in range(self._clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def test_policy_state_and_unrolls_continue_per_slot_under_concurrent_clients():
    slots, clients, per_client = 3, 3, 6
    ext = ConcurrentClients(clients, per_client)
    policy = ObsStatePolicy(ext.time_step_spec(), ext.action_spec(), stateful=True)
    # Unrolls of 2: each episode's 4 transitions are two unrolls of its slot.
    driver, learned, seen = learn_all_rows(ext, policy=policy, slots=slots, unroll_length=2)
    # The state counts steps since FIRST per slot: another slot's state would
    # break the equality (the clients' steps interleave across slots).
    assert ext.returned == {e: [0, 1, 2] for e in range(clients * per_client)}
    for row in seen:
        np.testing.assert_array_equal(row.action, row.observation[:, 1])
    check_learner_took_what_was_logged(learned, seen, slots=slots)
    assert len(learned) >= 12
    # Each slot's unrolls continue exactly: (e, 0-1), (e, 2-3), then the
    # first half of the next episode that slot served.
    by_slot = {}
    for row, env_id in learned:
        by_slot.setdefault(env_id, []).append(row)
    assert set(by_slot) <= set(range(slots))
    for rows in by_slot.values():
        for before, after in zip(rows, rows[1:]):
            e, s = before.observation[0]
            if s == 0:
                np.testing.assert_array_equal(after.observation, [[e, 2], [e, 3]])
            else:
                assert s == 2 and after.observation[0, 1] == 0 and after.observation[0, 0] != e
                np.testing.assert_array_equal(before.next_step_type, [2, 0])
    metrics = metric_results(driver)
    assert metrics["EnvironmentSteps"] == sum(int((r.step_type != 2).sum()) for r in seen)
    assert metrics["NumberOfEpisodes"] == sum(int((r.next_step_type == 2).sum()) for r in seen)


def test_stopping_the_driver_wakes_every_blocked_call_while_slots_wait():
    """A learner that never consumes stalls the env thread of 2 slots: the
    clients block in get_action (slot bound, env thread blocked), get_action
    (second slot bound, never asked for) and log_action (no free slot,
    queue full); stop wakes them all."""
    ext = ScriptedEnv([], hold=True, max_pending_steps=2)
    driver = AsyncOffPolicyDriver(ext.env_constructor(slots_per_env=2),
                                  ObsStatePolicy.stateless(ext), num_envs=1, unroll_length=2,
                                  stop_grace_period_secs=1.0)
    clients = BlockedClients(ext)
    driver.start()
    clients.start("a")
    # Four unrolls of 2: the first two shipped (the learn queue holds one
    # learner batch, 2 rows), the env thread blocks shipping the next two.
    clients.wait_for("a", 8)
    clients.start("b")
    time.sleep(0.3)          # b binds the second slot
    clients.start("c")       # c waits for a free slot
    time.sleep(0.5)
    assert clients.calls == {"a": 8, "b": 0, "c": 2} and not clients.errors
    assert not [t.name for t in threading.enumerate() if "_row" in t.name]
    clients.stop_driver_and_check_every_call_woke(driver)


def test_the_serving_jobs_env_batch_size_is_slots_per_env_thread():
    from alf_async.serving.job import make_serving_env_constructor  # pylint: disable=import-outside-toplevel
    for bad in (0, -2, 1.5):
        with pytest.raises(ValueError, match=r"^make_serving_env_constructor: "
                                             r"Layout.rows_per_env_thread \(slots per env thread\) "
                                             r"must be an integer >= 1, got "):
            make_serving_env_constructor("suite_gym", "CartPole-v0", batch_size=bad)
    constructor = make_serving_env_constructor("suite_gym", "CartPole-v0", batch_size=4)
    try:
        env = constructor()
        assert env.batch_size == 4 and len(row_envs(env)) == 4
        env.close()
    finally:
        constructor.close()
