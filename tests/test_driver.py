"""AsyncOffPolicyDriver on tiny deterministic environments: exact counts,
continuity, routing, metrics, RNN state, and every failure and stop path."""

import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.environments import batched_py_environment, tf_py_environment
from tf_agents.metrics import tf_metrics

from alf_async import AsyncOffPolicyDriver, DriverStoppedError
from alf_async.driver.health import DriverHealth
from alf_async.learning.scalar_summaries import ScalarSummaries
from alf_async.driver.metrics import AsyncStepMetric, by_name
from alf_async.testing.envs import OBS_COUNTER, OBS_ENV, OBS_STEP, CountingEnv, CountingEnvConstructor
from alf_async.testing.policies import (CountingPolicy, FailingPolicy, StatefulCountingPolicy,
                                        expected_counting_action)
from conftest import driver_threads
from test_trainer import read_scalars  # noqa: E402  (tests/ is on sys.path)

pytestmark = pytest.mark.timeout(60)


def specs(batch_size=1):
    env = CountingEnvConstructor(batch_size=batch_size)()
    return env.time_step_spec(), env.action_spec()


def make(factory, policy_cls=CountingPolicy, **kwargs):
    return AsyncOffPolicyDriver(factory, policy_cls(*specs()), **kwargs)


def collect(driver, num_batches):
    out = []
    for _ in range(num_batches):
        exp, env_ids, steps = driver.get_training_exps()
        out.append((tf.nest.map_structure(lambda t: t.numpy(), exp), env_ids.numpy(), steps))
    return out


def rows_by_env(batches):
    """env_id -> list of rows [T, 3] of observations, in arrival order."""
    rows = {}
    for exp, env_ids, _ in batches:
        for r, env_id in enumerate(env_ids):
            rows.setdefault(int(env_id), []).append(exp.observation[r])
    return rows


def test_batches_are_continuous_per_env_with_stable_ids_and_exact_steps():
    B, num_envs, T, cap = 2, 3, 4, 2
    factory = CountingEnvConstructor(batch_size=B, episode_length=lambda i: 3 + i)
    driver = make(factory, num_envs=num_envs, unroll_length=T, learn_queue_cap=cap,
                  actor_queue_cap=2)
    driver.start()
    try:
        # Env threads start at their own pace (each traces its loop first):
        # collect until every env has contributed, and at least 12 batches.
        batches = collect(driver, 12)
        while len(rows_by_env(batches)) < num_envs * B and len(batches) < 2000:
            batches += collect(driver, 1)
    finally:
        driver.stop()
    for exp, env_ids, steps in batches:
        assert steps == cap * T * B == 16
        assert env_ids.dtype == np.int32 and env_ids.shape == (cap * B,)
        assert exp.observation.shape == (cap * B, T, 3)
        assert exp.step_type.shape == exp.reward.shape == exp.action.shape == (cap * B, T)
        # Routing: each action was computed from its own row's observation.
        np.testing.assert_array_equal(exp.action, expected_counting_action(exp.observation))
    rows = rows_by_env(batches)
    assert set(rows) <= set(range(num_envs * B)) and len(rows) == num_envs * B
    env_index_of = {}
    for env_id, obs_rows in rows.items():
        obs = np.concatenate(obs_rows)                      # [n*T, 3]
        # One env per id, for the driver's life.
        assert len(set(obs[:, OBS_ENV])) == 1
        env_index_of[env_id] = int(obs[0, OBS_ENV])
        # No step lost, none repeated: counters are consecutive across batches.
        np.testing.assert_array_equal(obs[:, OBS_COUNTER], np.arange(len(obs)))
    # The B rows of one env thread are one env's batch (built by one env_constructor call).
    for thread in range(num_envs):
        indices = sorted(env_index_of[thread * B + b] for b in range(B))
        assert indices[0] % B == 0 and indices == list(range(indices[0], indices[0] + B))
    assert sorted(env_index_of.values()) == list(range(num_envs * B))


def test_rewards_discounts_and_step_types_follow_the_env():
    driver = make(CountingEnvConstructor(episode_length=3), num_envs=1, unroll_length=8)
    driver.start()
    try:
        (exp, _, _), = collect(driver, 1)
    finally:
        driver.stop()
    # F M M L F M M L: transitions F->M, M->M, M->L, L->F(boundary), ...
    np.testing.assert_array_equal(exp.step_type[0], [0, 1, 1, 2, 0, 1, 1, 2])
    np.testing.assert_array_equal(exp.next_step_type[0], [1, 1, 2, 0, 1, 1, 2, 0])
    np.testing.assert_array_equal(exp.reward[0], [1, 1, 1, 0, 1, 1, 1, 0])
    np.testing.assert_array_equal(exp.discount[0], [1, 1, 0, 1, 1, 1, 0, 1])
    np.testing.assert_array_equal(exp.observation[0, :, OBS_STEP], [0, 1, 2, 3, 0, 1, 2, 3])


def test_rnn_policy_state_is_carried_per_environment():
    factory = CountingEnvConstructor(batch_size=2, episode_length=lambda i: 2 + 2 * i)
    driver = make(factory, policy_cls=StatefulCountingPolicy, num_envs=4, unroll_length=3,
                  learn_queue_cap=2, num_actor_queues=2, actor_queue_cap=2)
    driver.start()
    try:
        # Until the longer episodes (env 2 on: 6+ steps) have been seen.
        batches = collect(driver, 10)
        while (max(int(exp.observation[..., OBS_STEP].max()) for exp, _, _ in batches) < 5
               and len(batches) < 500):
            batches += collect(driver, 1)
    finally:
        driver.stop()
    for exp, _, _ in batches:
        # The state counts steps since FIRST per row: it equals step_in_episode
        # only if no row ever got another row's state.
        np.testing.assert_array_equal(exp.action, exp.observation[..., OBS_STEP])
    assert max(int(exp.observation[..., OBS_STEP].max()) for exp, _, _ in batches) >= 5


def test_metrics_count_every_unroll_after_stop_and_follow_tf_agents():
    seen = []
    factory = CountingEnvConstructor(batch_size=2, episode_length=5)
    driver = make(factory, num_envs=3, unroll_length=4, learn_queue_cap=2,
                  observers=[lambda traj: seen.append(
                      tf.nest.map_structure(lambda t: t.numpy(), traj))])
    driver.start()
    learned = []
    try:
        for exp, _, _ in collect(driver, 8):
            learned.append(exp.observation)
    finally:
        driver.stop()
    result = {name: m.result().numpy() for name, m in by_name(driver.get_metrics()).items()}
    episodes, env_steps = result["NumberOfEpisodes"], result["EnvironmentSteps"]
    avg_return, avg_length = result["AverageReturn"], result["AverageEpisodeLength"]
    assert avg_return == 5.0 and avg_length == 5.0
    # Exactly tf-agents' counts over every unroll the LogThread saw ...
    ref_eps, ref_steps = tf_metrics.NumberOfEpisodes(), tf_metrics.EnvironmentSteps()
    for traj in seen:
        ref_eps(tf.nest.map_structure(tf.convert_to_tensor, traj))
        ref_steps(tf.nest.map_structure(tf.convert_to_tensor, traj))
    assert episodes == ref_eps.result().numpy() and env_steps == ref_steps.result().numpy()
    # ... and the LogThread saw every unroll the learner was given.
    logged = {tuple(row[0]) for traj in seen for row in traj.observation}
    for obs in learned:
        for row in obs:
            assert tuple(row[0]) in logged
    assert sum(len(traj.observation) for traj in seen) >= len(learned) * 4


def test_run_async_feeds_exp_observers_and_returns_steps():
    got = []
    driver = make(CountingEnvConstructor(batch_size=2), num_envs=2, unroll_length=3,
                  learn_queue_cap=2, exp_observers=[lambda exp, ids: got.append((exp, ids))])
    driver.start()
    try:
        assert [driver.run_async() for _ in range(3)] == [12, 12, 12]
    finally:
        driver.stop()
    assert len(got) == 3
    exp, ids = got[0]
    assert exp.observation.shape == (4, 3, 3) and ids.shape == (4,)


def test_environments_are_built_concurrently():
    builds = []   # (start, end) of each build

    def slow_env_constructor():
        start = time.perf_counter()
        time.sleep(1.0)
        env = CountingEnvConstructor()()
        builds.append((start, time.perf_counter()))
        return env

    driver = make(slow_env_constructor, num_envs=4)
    driver.stop()
    # Every build began before any ended: all four were under way at once
    # (whatever the machine's load does to how long each takes).
    assert len(builds) == 4
    assert max(start for start, _ in builds) < min(end for _, end in builds), builds


def test_tf_environment_without_python_fast_path():
    def env_constructor():
        return tf_py_environment.TFPyEnvironment(
            batched_py_environment.BatchedPyEnvironment([CountingEnv()], multithreading=False),
            isolation=True)

    driver = make(env_constructor, num_envs=2, unroll_length=4, learn_queue_cap=2)
    driver.start()
    try:
        batches = collect(driver, 4)
    finally:
        driver.stop()
    for obs_rows in rows_by_env(batches).values():
        obs = np.concatenate(obs_rows)
        np.testing.assert_array_equal(obs[:, OBS_COUNTER], np.arange(len(obs)))


# ------------------------------------------------------------- refused input

def test_idle_actor_config_is_refused_before_envs_are_built():
    factory = CountingEnvConstructor()
    with pytest.raises(ValueError, match="actor queue 2 would never get a request"):
        make(factory, num_envs=2, num_actor_queues=3)
    assert factory.created == []


def test_env_specs_that_differ_from_each_other_are_refused_and_envs_closed():
    built = []

    def env_constructor():
        env = CountingEnvConstructor(batch_size=1 + len(built) % 2)()
        built.append(env)
        return env

    with pytest.raises(ValueError, match="batch size"):
        make(env_constructor, num_envs=2)
    assert all(e.counting_envs[0].closed for e in built)


def test_env_specs_that_differ_from_the_policys_are_refused():
    from tf_agents.specs import tensor_spec
    time_step_spec, action_spec = specs()
    policy = CountingPolicy(time_step_spec, tensor_spec.BoundedTensorSpec((), tf.int32, 0, 5))
    with pytest.raises(ValueError, match="action_spec does not match the policy's"):
        AsyncOffPolicyDriver(CountingEnvConstructor(), policy)


def test_non_async_metric_is_refused_with_the_reason():
    with pytest.raises(TypeError, match="AsyncStepMetric"):
        make(CountingEnvConstructor(), metrics=[tf_metrics.AverageReturnMetric()])


def test_env_f_error_is_raised_from_the_constructor_with_its_type():
    calls = []

    def env_constructor():
        calls.append(1)
        if len(calls) == 2:
            raise KeyError("no such simulator")
        return CountingEnvConstructor()()

    with pytest.raises(KeyError, match="no such simulator"):
        make(env_constructor, num_envs=3)


def test_run_is_refused_and_start_only_once():
    driver = make(CountingEnvConstructor())
    with pytest.raises(RuntimeError, match="run_async"):
        driver.run()
    driver.start()
    with pytest.raises(RuntimeError, match="only once"):
        driver.start()
    driver.stop()


# ------------------------------------------------------------ worker errors

def assert_raised_within(driver, error_type, match, seconds=5.0):
    start = time.perf_counter()
    with pytest.raises(error_type, match=match):
        for _ in range(1000):
            driver.run_async()
    assert time.perf_counter() - start < seconds
    driver.stop()  # already stopped: returns, does not raise again
    assert not driver_threads()


def test_value_error_in_env_step_arrives_as_value_error():
    driver = make(CountingEnvConstructor(raise_on_step=7, error=ValueError("env step 7 broke")),
                  num_envs=2, unroll_length=2)
    driver.start()
    assert_raised_within(driver, ValueError, "env step 7 broke")


def test_policy_error_arrives_with_its_type():
    time_step_spec, action_spec = specs()
    driver = AsyncOffPolicyDriver(CountingEnvConstructor(),
                                  FailingPolicy(time_step_spec, action_spec, fail_at=10),
                                  num_envs=2, unroll_length=2)
    driver.start()
    assert_raised_within(driver, tf.errors.InvalidArgumentError, "FailingPolicy")


def test_observer_error_arrives_with_its_type():
    class ObserverBroke(Exception):
        pass

    def observer(traj):
        raise ObserverBroke("observer failed")

    driver = make(CountingEnvConstructor(), num_envs=1, unroll_length=2, observers=[observer])
    driver.start()
    assert_raised_within(driver, ObserverBroke, "observer failed")


def test_error_is_raised_by_stop_when_the_learner_never_asked():
    driver = make(CountingEnvConstructor(raise_on_step=1, error=ValueError("first step")),
                  num_envs=1)
    driver.start()
    deadline = time.time() + 5
    while driver_threads() and time.time() < deadline:
        time.sleep(0.05)
    with pytest.raises(ValueError, match="first step"):
        driver.stop()
    driver.stop()
    with pytest.raises(DriverStoppedError):
        driver.run_async()


def test_a_new_driver_works_after_a_failed_one():
    failing = make(CountingEnvConstructor(raise_on_step=3), num_envs=1, unroll_length=2)
    failing.start()
    with pytest.raises(ValueError):
        for _ in range(100):
            failing.run_async()
    driver = make(CountingEnvConstructor(), num_envs=1, unroll_length=2)
    driver.start()
    assert driver.run_async() == 2
    driver.stop()


# --------------------------------------------------------------------- stop

@pytest.mark.parametrize("state", ["never_started", "running", "twice"])
def test_stop_returns_quickly_and_leaves_no_thread(state):
    factory = CountingEnvConstructor(batch_size=2)
    driver = make(factory, num_envs=2, unroll_length=2)
    if state != "never_started":
        driver.start()
        driver.run_async()
    start = time.perf_counter()
    driver.stop()
    if state == "twice":
        driver.stop()
    assert time.perf_counter() - start < 5
    assert not driver_threads()
    assert all(e.counting_envs[0].closed for e in factory.created)


def test_stop_from_another_thread_wakes_a_blocked_learner():
    # learn_queue_cap 1,000,000 with one env: the learner waits for minutes
    # (1,000 unrolls took under 0.5 s on an AVX-512 EPYC).
    driver = make(CountingEnvConstructor(), num_envs=1, unroll_length=2, learn_queue_cap=1_000_000)
    driver.start()
    outcome = {}

    def learner():
        try:
            driver.run_async()
            outcome["returned"] = True
        except DriverStoppedError as e:
            outcome["error"] = e

    t = threading.Thread(target=learner)
    t.start()
    time.sleep(0.5)
    assert t.is_alive()
    start = time.perf_counter()
    driver.stop()
    t.join(5)
    assert time.perf_counter() - start < 5 and not t.is_alive()
    assert isinstance(outcome.get("error"), DriverStoppedError)
    assert not driver_threads()


def test_run_async_before_start_is_refused():
    driver = make(CountingEnvConstructor())
    with pytest.raises(DriverStoppedError, match="start"):
        driver.run_async()
    driver.stop()


def test_perf_stats_count_steps_and_batches():
    driver = make(CountingEnvConstructor(batch_size=2), num_envs=2, unroll_length=4,
                  learn_queue_cap=2, actor_queue_cap=2)
    driver.start()
    for _ in range(3):
        driver.run_async()
    driver.stop()
    stats = driver.get_perf_stats()
    assert stats["env_steps"] >= 3 * 16 and stats["env_steps"] % 8 == 0
    # Dynamic batches: 1 to actor_queue_cap * B = 4 rows each; every env step
    # was acted for, and at most one unroll (T=4) per row (4 rows) is in flight.
    assert stats["actor_batches"] <= stats["actor_rows"] <= 4 * stats["actor_batches"]
    assert stats["env_steps"] <= stats["actor_rows"] <= stats["env_steps"] + 4 * 4
    assert stats["actor_batches"] * 4 >= stats["env_steps"]
    assert stats["actor_inference_secs"] > 0 and stats["action_wait_secs"] > 0


def test_health_rates_are_one_point_per_interval_and_none_at_a_repeated_step(tmp_path):
    # The run's final write lands on the train step of the regular write just
    # before it: that interval has no train steps, and writes no rates.
    driver = make(CountingEnvConstructor(batch_size=2), num_envs=2, unroll_length=4,
                  learn_queue_cap=2, actor_queue_cap=2)
    clock = iter([100.0, 102.0, 103.0, 107.0]).__next__
    health = DriverHealth(driver, clock=clock)
    summaries = ScalarSummaries(tf.summary.create_file_writer(str(tmp_path)))

    def write(step):
        summaries.write({tag: (value, step) for tag, value in health.scalars(step).items()})

    driver.start()
    try:
        driver.run_async()
        write(10)
        for _ in range(3):
            driver.run_async()
        write(20)       # 2 s after the write at 10
        write(20)       # the final write: no interval of its own
        write(30)       # 5 s after the write at 20
    finally:
        driver.stop()
    summaries.flush()
    scalars = read_scalars(str(tmp_path))
    assert scalars["Perf/train_steps_per_sec"] == [(20, 5.0), (30, 2.0)]
    for tag in ("Perf/env_steps_per_sec", "Perf/action_wait_fraction"):
        assert [step for step, _ in scalars[tag]] == [20, 30], tag
    # Occupancy is a state, not a rate: one point per write.
    assert [step for step, _ in scalars["Queues/learn_queue_occupancy"]] == [10, 20, 20, 30]
