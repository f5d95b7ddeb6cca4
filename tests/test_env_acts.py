"""Env threads that act themselves (`num_actor_queues=0`): the same
trajectories as the threaded actor's, row by row, on every loop (graph,
rows, Python), stop within 5 s, errors with their type, and the graph
loop's op count per step as the cost account reports it."""

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.environments import batched_py_environment, tf_py_environment, wrappers

from alf_async import AsyncOffPolicyDriver
from alf_async.driver.layout import check_layout, format_layout, parse_layout
from alf_async.driver.layout_model import Layout
from alf_async.learning.policy_lag import TrainStepStampedPolicy
from alf_async.testing.bench.graph_ops import graph_ops_per_step
from alf_async.testing.envs import BlockingCountingEnv, CountingEnv, CountingEnvConstructor
from alf_async.testing.policies import FailingPolicy, StatefulCountingPolicy
from conftest import driver_threads

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.timeout(90)

B, NUM_ENVS, T = 2, 3, 4


class BlockingBatch(wrappers.PyEnvironmentBaseWrapper):
    """A batch of CountingEnvs stepped as one blocking batch: the env
    thread's Python loop (not row by row)."""

    blocking_step = True


def constructor(path):
    """A CountingEnvConstructor whose environments the driver steps on
    `path`: 'graph', 'rows' (a worker thread per row) or 'python'."""
    lengths = lambda i: 3 + i % 4   # noqa: E731
    if path == "graph":
        return CountingEnvConstructor(batch_size=B, episode_length=lengths)
    if path == "rows":
        return CountingEnvConstructor(batch_size=B, episode_length=lengths,
                                      env_cls=BlockingCountingEnv, latency=0.0)
    inner = CountingEnvConstructor(batch_size=B, episode_length=lengths)

    def build():
        return tf_py_environment.TFPyEnvironment(BlockingBatch(inner().pyenv))
    return build


def unrolls_by_env(num_actor_queues, path, per_env=5, policy_cls=StatefulCountingPolicy,
                   learn_queue_cap=1, batches_ahead=None):
    """env id -> its first `per_env` unrolls, (observation, action, policy
    state, step type), in order, and the driver's perf stats."""
    env = constructor("graph")()
    policy = policy_cls(env.time_step_spec(), env.action_spec())
    driver = AsyncOffPolicyDriver(constructor(path), policy, num_envs=NUM_ENVS,
                                  num_actor_queues=num_actor_queues, unroll_length=T,
                                  learn_queue_cap=learn_queue_cap, batches_ahead=batches_ahead)
    rows = {}
    driver.start()
    try:
        while len(rows) < NUM_ENVS * B or min(len(r) for r in rows.values()) < per_env:
            exp, env_ids, _ = driver.get_training_exps()
            for r, env_id in enumerate(env_ids.numpy()):
                rows.setdefault(int(env_id), []).append(
                    (exp.observation[r].numpy(), exp.action[r].numpy(),
                     exp.policy_info[r].numpy() if tf.nest.flatten(exp.policy_info) else None,
                     exp.step_type[r].numpy()))
        stats = driver.get_perf_stats()
    finally:
        driver.stop()
    assert stats["actor_batches"] == (0 if num_actor_queues == 0 else stats["actor_batches"])
    return {k: v[:per_env] for k, v in rows.items()}, stats


@pytest.mark.parametrize("path", ["graph", "rows", "python"])
def test_trajectories_equal_the_threaded_actors_row_by_row(path):
    own, own_stats = unrolls_by_env(0, path)
    actor, actor_stats = unrolls_by_env(1, path)
    assert sorted(own) == sorted(actor) == list(range(NUM_ENVS * B))
    for env_id in own:
        for (obs_a, act_a, _, st_a), (obs_b, act_b, _, st_b) in zip(own[env_id], actor[env_id]):
            np.testing.assert_array_equal(obs_a, obs_b)
            np.testing.assert_array_equal(act_a, act_b)
            np.testing.assert_array_equal(st_a, st_b)
        # Continuity: each row's counter goes up by one, its env id is its own.
        obs = np.concatenate([o for o, _, _, _ in own[env_id]])
        np.testing.assert_array_equal(np.diff(obs[:, 1]), np.ones(len(obs) - 1))
        assert len(set(obs[:, 0])) == 1
        # StatefulCountingPolicy's action is its per-row state: the step in
        # the episode, which only state kept with its own row gives.
        actions = np.concatenate([a for _, a, _, _ in own[env_id]])
        np.testing.assert_array_equal(actions, obs[:, 2] % 1000)
    assert own_stats["actor_batches"] == 0 and own_stats["actor_rows"] == 0
    assert actor_stats["actor_batches"] > 0
    # Requests are timed in the Python loops, never by a thread acting itself.
    assert own_stats["request_secs"] == 0.0
    assert (actor_stats["request_secs"] > 0) == (path != "graph")


@pytest.mark.parametrize("path", ["graph", "rows", "python"])
def test_stop_within_5_s_and_no_thread_left(path):
    env = constructor("graph")()
    policy = StatefulCountingPolicy(env.time_step_spec(), env.action_spec())
    before = driver_threads()
    driver = AsyncOffPolicyDriver(constructor(path), policy, num_envs=NUM_ENVS,
                                  num_actor_queues=0, unroll_length=T)
    driver.start()
    driver.get_training_exps()
    start = time.monotonic()
    driver.stop()
    assert time.monotonic() - start < 5.0
    assert driver_threads() == before


@pytest.mark.parametrize("path", ["graph", "rows"])
def test_errors_come_back_with_their_type(path):
    # The environment's own error, from the env thread.
    factory = CountingEnvConstructor(batch_size=B, raise_on_step=6, **(
        dict(env_cls=BlockingCountingEnv, latency=0.0) if path == "rows" else {}))
    env = constructor("graph")()
    policy = StatefulCountingPolicy(env.time_step_spec(), env.action_spec())
    driver = AsyncOffPolicyDriver(factory, policy, num_envs=2, num_actor_queues=0,
                                  unroll_length=T)
    driver.start()
    with pytest.raises(ValueError, match="injected failure at step 6"):
        for _ in range(50):
            driver.get_training_exps()
    driver.stop()
    # The policy's error, raised where the env thread acts.
    policy = FailingPolicy(env.time_step_spec(), env.action_spec(), fail_at=9)
    driver = AsyncOffPolicyDriver(constructor(path), policy, num_envs=2, num_actor_queues=0,
                                  unroll_length=T)
    driver.start()
    with pytest.raises(tf.errors.InvalidArgumentError):
        for _ in range(50):
            driver.get_training_exps()
    driver.stop()


def test_num_actor_queues_is_refused_below_0_with_one_line():
    env = constructor("graph")()
    policy = StatefulCountingPolicy(env.time_step_spec(), env.action_spec())
    with pytest.raises(ValueError, match=r"^num_actor_queues must be an integer >= 0 \(0: each "
                                         r"env thread acts itself\), got -1$"):
        AsyncOffPolicyDriver(constructor("graph"), policy, num_actor_queues=-1)


def test_a_layout_with_no_actor_queue_is_named_and_parsed():
    layout = Layout(2, 8, 0, 1, False)
    assert format_layout(layout) == "2x8, no actor queue, in process"
    assert parse_layout("2x8, no actor queue, in process") == layout
    assert parse_layout("4x4, no actor queue, in child processes") == Layout(4, 4, 0, 1, True)
    check_layout(layout, 16)


def test_graph_loop_ops_per_step_as_the_cost_account_counts_them():
    env = constructor("graph")()
    policy = StatefulCountingPolicy(env.time_step_spec(), env.action_spec())
    counts = {}
    for num_envs in (1, 2):
        for queues in (0, 1):
            driver = AsyncOffPolicyDriver(constructor("graph"), policy, num_envs=num_envs,
                                          num_actor_queues=queues, unroll_length=T)
            try:
                counts[num_envs, queues] = graph_ops_per_step(driver)
            finally:
                driver.stop()
    # Queue ops per step of an env thread's graph loop: the log and learn
    # queues' enqueue_many once per unroll; with an actor, its request and
    # reply each step; with two env threads stepping Python, the step token
    # taken and given back each step.
    assert counts[1, 0]["queue_ops_per_step"] == 2 / T
    assert counts[1, 1]["queue_ops_per_step"] == 2 + 2 / T
    assert counts[2, 0]["queue_ops_per_step"] == 2 + 2 / T
    assert counts[2, 1]["queue_ops_per_step"] == 4 + 2 / T
    for num_envs in (1, 2):
        own, threaded = counts[num_envs, 0], counts[num_envs, 1]
        assert own["actor"] == 0 and threaded["actor"] > 0
        # The policy's ops move into the env thread; the round trip, the
        # timer and the actor's batching and routing are gone.
        assert own["total"] < threaded["total"], (own, threaded)


def test_the_cost_account_runs_each_side_and_records_the_host(tmp_path):
    out = tmp_path / "cost.json"
    script = os.path.join(REPO, "benchmarks", "driver_cost.py")
    done = subprocess.run(
        [sys.executable, script, "--paths", "graph", "--rows", "2", "--layouts", "1x2",
         "--rounds", "1", "--seconds", "0.5", "--unroll_length", "4", "--json", str(out)],
        capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["host"]["cores"] >= 1 and "kernels" in record["host"]
    sides = record["table"]["graph"]
    assert list(sides) == ["lockstep", "environment alone", "alf_async 1x2, 1 actor",
                           "alf_async 1x2, acting itself"]
    for side in sides.values():
        assert side["rate"] > 0 and side["cpu_us"] > 0 and len(side["rounds"]) == 1
    # Acting itself, the env thread's graph runs the policy and no round
    # trip: fewer ops per step than the env thread and the actor together.
    assert sides["alf_async 1x2, acting itself"]["tf_ops"] < sides["alf_async 1x2, 1 actor"][
        "tf_ops"]
    assert sides["environment alone"]["tf_ops"] == 0


class GatedBatch(wrappers.PyEnvironmentBaseWrapper):
    """A batch whose second step waits for the test (`reached`, then `gate`)."""

    def __init__(self, env):
        super().__init__(env)
        self.calls = 0
        self.reached = threading.Event()
        self.gate = threading.Event()

    def _step(self, action):
        self.calls += 1
        if self.calls == 2:
            self.reached.set()
            self.gate.wait(30)
        return self._env.step(action)


def test_acting_itself_each_step_reads_the_weights_as_it_acts():
    # Step t's forward pass reads the variables once step t-1 is done, not
    # when the unroll began: a variable changed during step 1 reaches steps
    # 2 and 3 (here the train step a TrainStepStampedPolicy stamps).
    inner = CountingEnvConstructor(batch_size=B)
    batch = GatedBatch(inner().pyenv)
    train_step = tf.Variable(0, dtype=tf.int64)
    env = constructor("graph")()
    policy = TrainStepStampedPolicy(
        StatefulCountingPolicy(env.time_step_spec(), env.action_spec()), train_step)
    driver = AsyncOffPolicyDriver(lambda: tf_py_environment.TFPyEnvironment(batch), policy,
                                  num_actor_queues=0, unroll_length=T)
    driver.start()
    try:
        assert batch.reached.wait(30)
        train_step.assign(7)
        batch.gate.set()
        exp, _, _ = driver.get_training_exps()
    finally:
        driver.stop()
    np.testing.assert_array_equal(exp.policy_info.train_step.numpy(), [[0, 0, 7, 7]] * B)
