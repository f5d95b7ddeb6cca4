"""Graph-mode env threads whose environments' steps release the GIL
(`capabilities.GilFreeStep`, EnvPool's lockstep pool) step at the same time, with
no step token; those whose steps hold it take turns. Trajectories stay
exact either way."""

import threading
import time

import numpy as np
import pytest
from tf_agents.environments import tf_py_environment, wrappers

from alf_async import AsyncOffPolicyDriver
from alf_async.environments import capabilities
from alf_async.testing.bench.graph_ops import graph_ops_per_step
from alf_async.testing.envs import CountingEnvConstructor
from alf_async.testing.policies import StatefulCountingPolicy

pytestmark = pytest.mark.timeout(90)

B, T, STEP_SECS = 2, 4, 0.02


class InStep(object):
    """How many steps are in progress at once, at most (any thread)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._now = 0
        self.most = 0

    def __enter__(self):
        with self._lock:
            self._now += 1
            self.most = max(self.most, self._now)

    def __exit__(self, *exc):
        with self._lock:
            self._now -= 1


class SleepingBatch(wrappers.PyEnvironmentBaseWrapper):
    """A batch of CountingEnvs whose every step first sleeps (the GIL free),
    counted by `in_step`; it does not declare so."""

    def __init__(self, env, in_step):
        super().__init__(env)
        self._in_step = in_step

    def _step(self, action):
        with self._in_step:
            time.sleep(STEP_SECS)
            return self._env.step(action)


class GilFreeSleepingBatch(SleepingBatch, capabilities.GilFreeStep):
    """A SleepingBatch that declares that its step releases the GIL."""


def make_constructor(in_step, releases):
    inner = CountingEnvConstructor(batch_size=B, episode_length=lambda i: 3 + i % 4)
    batch = GilFreeSleepingBatch if releases else SleepingBatch

    def build():
        return tf_py_environment.TFPyEnvironment(batch(inner().pyenv, in_step))
    return build


def policy_for(build):
    env = build()
    return StatefulCountingPolicy(env.time_step_spec(), env.action_spec())


@pytest.mark.parametrize("num_actor_queues", [0, 1])
@pytest.mark.parametrize("releases", [True, False])
def test_steps_that_release_the_gil_run_at_once_and_others_take_turns(releases,
                                                                      num_actor_queues):
    in_step = InStep()
    build = make_constructor(in_step, releases)
    assert capabilities.steps_release_gil(build().pyenv) is releases
    driver = AsyncOffPolicyDriver(build, policy_for(build), num_envs=2,
                                  num_actor_queues=num_actor_queues, unroll_length=T,
                                  learn_queue_cap=1)
    rows = {}
    driver.start()
    try:
        while len(rows) < 2 * B or min(len(r) for r in rows.values()) < 4:
            exp, env_ids, _ = driver.get_training_exps()
            for r, env_id in enumerate(env_ids.numpy()):
                rows.setdefault(int(env_id), []).append(exp.observation[r].numpy())
    finally:
        driver.stop()
    assert in_step.most == (2 if releases else 1)
    assert sorted(rows) == list(range(2 * B))
    for env_id, unrolls in rows.items():
        obs = np.concatenate(unrolls)
        # Continuity: each row's counter goes up by one, its env id is its own.
        np.testing.assert_array_equal(np.diff(obs[:, 1]), np.ones(len(obs) - 1))
        assert len(set(obs[:, 0])) == 1


@pytest.mark.parametrize("releases", [True, False])
def test_the_step_token_costs_two_queue_ops_a_step_only_where_the_gil_is_held(releases):
    build = make_constructor(InStep(), releases)
    driver = AsyncOffPolicyDriver(build, policy_for(build), num_envs=2, num_actor_queues=0,
                                  unroll_length=T)
    try:
        ops = graph_ops_per_step(driver)
    finally:
        driver.stop()
    # The log and learn queues' enqueue_many once per unroll, and with the
    # token its dequeue and enqueue every step.
    assert ops["queue_ops_per_step"] == (2 / T if releases else 2 + 2 / T)
