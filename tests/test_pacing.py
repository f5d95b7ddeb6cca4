"""Paced env threads (`AsyncOffPolicyDriver(..., batches_ahead=k)`): the
policy lag is at most k batches, trajectories are those of the unpaced
driver row by row, stop() within 5 s of a thread waiting for a permit, and
configurations that cannot pace are refused with one line."""

import os
import threading
import time

import gin
import numpy as np
import pytest
import tensorflow as tf

from alf_async import AsyncOffPolicyDriver
from alf_async.learning.policy_lag import TrainStepStampedPolicy
from alf_async.testing.policies import StatefulCountingPolicy
from cli_runs import REPO, run_train_cli  # tests/ is on sys.path
from conftest import driver_threads
from test_env_acts import B, NUM_ENVS, T, constructor, unrolls_by_env  # noqa: E402
from test_trainer import read_scalars  # noqa: E402
from test_unroll_training import ENV  # noqa: E402

pytestmark = pytest.mark.timeout(90)

def policy_for(train_step=None):
    """StatefulCountingPolicy, its steps stamped with `train_step` if given."""
    env = constructor("graph")()
    policy = StatefulCountingPolicy(env.time_step_spec(), env.action_spec())
    return policy if train_step is None else TrainStepStampedPolicy(policy, train_step)


class RowsLogged(object):
    """A driver observer (the log thread calls it with each unroll it
    drains, [rows, T, ...]) that counts the rows and lets a test wait for
    a count."""

    def __init__(self):
        self.rows = 0
        self._changed = threading.Condition()

    def __call__(self, trajectory):
        with self._changed:
            self.rows += int(trajectory.step_type.shape[0])
            self._changed.notify_all()

    def wait_for(self, rows, secs=30.0):
        with self._changed:
            assert self._changed.wait_for(lambda: self.rows >= rows, secs), (self.rows, rows)
            return self.rows


def batch_lags(path, num_actor_queues, batches_ahead, batches=6):
    """One env thread, one unroll per batch. The learner's loop as a test:
    take batch k, wait until the env thread has acted every unroll it may
    before the next take (it logs each before it ships it), then count
    batch k trained (the stamp goes to k + 1). Returns each batch's lag: k
    minus the oldest stamp it holds."""
    train_step = tf.Variable(0, dtype=tf.int64)
    logged = RowsLogged()
    driver = AsyncOffPolicyDriver(constructor(path), policy_for(train_step),
                                  num_actor_queues=num_actor_queues, unroll_length=T,
                                  learn_queue_cap=1, batches_ahead=batches_ahead,
                                  observers=[logged])
    # Unrolls the env thread may have acted that the learner has not taken:
    # the learn queue's one and one more it cannot ship; paced k batches
    # ahead, the k it has permits for.
    ahead = 2 if batches_ahead is None else min(batches_ahead, 2)
    lags = []
    driver.start()
    try:
        for k in range(batches):
            exp, _, _ = driver.get_training_exps()
            lags.append(k - int(tf.reduce_min(exp.policy_info.train_step)))
            assert logged.wait_for((k + 1 + ahead) * B) == (k + 1 + ahead) * B  # no more
            train_step.assign(k + 1)
    finally:
        driver.stop()
    return lags


@pytest.mark.parametrize("path, num_actor_queues", [("graph", 0), ("graph", 1),
                                                    ("python", 0), ("python", 1)])
def test_an_unroll_begins_only_once_the_learner_took_the_one_before(path, num_actor_queues):
    paced = batch_lags(path, num_actor_queues, batches_ahead=1)
    # Unpaced (and with two batches ahead, the same here: the learn queue
    # holds one), the env thread runs a batch further ahead.
    unpaced = batch_lags(path, num_actor_queues, batches_ahead=None)
    two_ahead = batch_lags(path, num_actor_queues, batches_ahead=2)
    # Paced, each batch was begun once the one before was taken, so it
    # lags one (the first none).
    assert paced == [0, 1, 1, 1, 1, 1], paced
    assert unpaced == two_ahead == [0, 1, 2, 2, 2, 2], (unpaced, two_ahead)


@pytest.mark.parametrize("path", ["graph", "python"])
def test_paced_trajectories_equal_the_unpaced_row_by_row(path):
    # Three env threads acting themselves, batches of 3 unrolls, paced one
    # batch ahead against unpaced.
    paced, _ = unrolls_by_env(0, path, learn_queue_cap=NUM_ENVS, batches_ahead=1)
    unpaced, _ = unrolls_by_env(0, path, learn_queue_cap=NUM_ENVS)
    assert sorted(paced) == sorted(unpaced) == list(range(NUM_ENVS * B))
    for env_id, unrolls in paced.items():
        for (obs_a, act_a, _, _), (obs_b, act_b, _, _) in zip(unrolls, unpaced[env_id]):
            np.testing.assert_array_equal(obs_a, obs_b)
            np.testing.assert_array_equal(act_a, act_b)
        obs = np.concatenate([o for o, _, _, _ in unrolls])
        np.testing.assert_array_equal(np.diff(obs[:, 1]), np.ones(len(obs) - 1))


@pytest.mark.parametrize("path", ["graph", "python"])
def test_stop_within_5_s_of_a_thread_waiting_for_a_permit(path):
    before = driver_threads()
    driver = AsyncOffPolicyDriver(constructor(path), policy_for(), num_envs=2,
                                  num_actor_queues=1, unroll_length=T, learn_queue_cap=2,
                                  batches_ahead=1)
    driver.start()
    driver.get_training_exps()
    deadline = time.monotonic() + 30
    while driver.get_perf_stats()["learn_queue_size"] < 2 * B:  # both wait for a permit
        assert time.monotonic() < deadline
        time.sleep(0.01)
    start = time.monotonic()
    driver.stop()
    assert time.monotonic() - start < 5.0
    assert driver_threads() == before
    assert driver.get_perf_stats()["env_steps"] == 2 * 2 * B * T   # two batches, no more


@pytest.mark.parametrize("kwargs, message", [
    (dict(batches_ahead=0), r"^batches_ahead must be None \(the env threads collect whenever "
                            r"the learn queue has room\) or an integer >= 1, got 0$"),
    (dict(num_envs=3, learn_queue_cap=2, batches_ahead=1),
     r"^batches_ahead=1 lets 1 x learn_queue_cap 2 = 2 unrolls be collected at once, fewer "
     r"than the 3 env threads: raise batches_ahead or learn_queue_cap to at least 3 unrolls, "
     r"or run fewer env threads$"),
])
def test_a_pacing_that_cannot_work_is_refused_with_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AsyncOffPolicyDriver(constructor("graph"), policy_for(), unroll_length=T,
                             **kwargs)


def test_rows_stepped_one_by_one_are_refused_and_their_environments_closed():
    factory = constructor("rows")
    with pytest.raises(ValueError, match=r"^env0: batches_ahead paces env threads that begin "
                                         r"each unroll of their batch at once"):
        AsyncOffPolicyDriver(factory, policy_for(), unroll_length=T, batches_ahead=1)
    assert len(factory.created) == 1
    assert all(env.closed for env in factory.created[0].counting_envs)


@pytest.mark.timeout(150)
def test_ppo_cartpole_paced_one_batch_ahead_lags_at_most_one_batch(tmp_path):
    # 16 gradient steps per batch: an unroll begun once the learner took the
    # batch before is trained at most 16 steps after it acted, all but its
    # last step, which is trained with the row's next unroll (OneTimeReplayer
    # links them): at most 32 steps after. (Unpaced, the first 8 batches
    # lagged up to 48.)
    proc = run_train_cli(tmp_path, "ppo_cartpole.gin", [
        "Schedule.batches_ahead = 1", "Schedule.num_iterations = 8", "Evaluation.episodes = 0",
        "Evaluation.stop_at_return = None"], timeout=140, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    most = [v for _, v in read_scalars(str(tmp_path / "train"))["Learner/policy_lag_max"]]
    assert len(most) >= 8 and 16 <= max(most) <= 32, most


@pytest.mark.timeout(150)
def test_train_refuses_a_pacing_that_leaves_an_env_thread_idle(tmp_path):
    proc = run_train_cli(tmp_path, "ppo_cartpole.gin", [
        "Layout.env_threads = 2", "Layout.rows_per_env_thread = 8", "Layout.actor_queue_cap = 2",
        "Schedule.batches_ahead = 1", "Schedule.rows_per_batch = 8"], timeout=140, env=ENV)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if "alf-async-train: error:" in line]
    assert lines == ["alf-async-train: error: Schedule.batches_ahead = 1 lets 1 batches of "
                     "1 env threads' unrolls be collected at once, fewer than the 2 env "
                     "threads (Layout.env_threads): raise one of them"], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("gin_file", ["ppo_pong.gin", "ppo_breakout.gin"])
def test_the_atari_ppo_files_act_in_one_paced_env_thread_on_ppo2s_batches(gin_file):
    """One env thread stepping one lockstep pool of 8 games, acting itself
    and paced one batch ahead (docs/agents/ppo.md), on ppo2's batches
    of 8 games x 128 steps."""
    import alf_async.trainer  # noqa: F401  (registers train)  pylint: disable=import-outside-toplevel
    gin_configs = os.path.join(REPO, "gin_configs")
    gin.clear_config()
    gin.add_config_file_search_path(gin_configs)  # ppo_breakout.gin includes ppo_pong.gin
    try:
        gin.parse_config_files_and_bindings([os.path.join(gin_configs, gin_file)], [],
                                            skip_unknown=True)
        q = gin.query_parameter
        assert (q("Layout.env_threads"), q("Layout.rows_per_env_thread"), q("Layout.actor_queues"),
                q("Schedule.batches_ahead"), q("suite_envpool.stepping")) == (1, 8, 0, 1, "lockstep")
        assert q("Schedule.rows_per_batch") * q("Schedule.unroll_length") == 8 * 128
    finally:
        gin.clear_config()
