"""Environments in Ray actors (local Ray, 2 CPUs): the driver learns from them,
a killed actor is replaced mid-run, and nothing of Ray is left behind."""

import functools
import os
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

ray = pytest.importorskip("ray")

from tf_agents.policies import random_tf_policy  # noqa: E402

from alf_async import AsyncOffPolicyDriver  # noqa: E402
from alf_async.environments.processes import ray_env  # noqa: E402
from alf_async.environments.processes.ray_env import (RayBatchedEnv, RayEnvCrashError,  # noqa: E402
                                                      ray_env_constructor)
from alf_async.testing.envs import (OBS_STEP, CountingEnv, raising_env,  # noqa: E402
                                   slow_to_build_env)

FIRST, MID, LAST = 0, 1, 2
RAY_PROCESS_NAMES = ("raylet", "gcs_server", "ray::", "default_worker.py")


def ray_processes():
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(name in cmd for name in RAY_PROCESS_NAMES):
            found.append((int(pid), cmd[:80]))
    return found


@pytest.fixture
def no_ray_left():
    yield
    ray_env.shutdown()
    import time
    deadline = time.time() + 10
    while ray_processes() and time.time() < deadline:
        time.sleep(0.2)
    assert not ray_processes(), f"Ray processes left: {ray_processes()}"


def make_driver(env_constructor, **kwargs):
    spec_env = env_constructor()
    policy = random_tf_policy.RandomTFPolicy(spec_env.time_step_spec(), spec_env.action_spec())
    spec_env.close()
    return AsyncOffPolicyDriver(env_constructor, policy, **kwargs)


@pytest.mark.timeout(120)
def test_killed_actor_is_replaced_and_its_episodes_truncated(no_ray_left):
    env_constructor = ray_env_constructor(
        functools.partial(CountingEnv, episode_length=10**6, env_index=0),
        envs_per_actor=2, actors_per_env=2, num_cpus=2, step_timeout=30.0)
    driver = make_driver(env_constructor, num_envs=2, unroll_length=4, learn_queue_cap=2)
    driver.start()
    rows = {}

    def collect(n):
        for _ in range(n):
            exp, env_ids, steps = driver.get_training_exps()
            assert steps == 2 * 4 * 4
            for r, env_id in enumerate(env_ids.numpy()):
                rows.setdefault(int(env_id), []).append(
                    (exp.next_step_type[r].numpy(), exp.discount[r].numpy(),
                     exp.observation[r].numpy()))

    try:
        # Kill only once every row has reached the learner: a kill before an
        # env thread's first step has no episode in flight to truncate.
        collect(3)
        while len(rows) < 8:
            collect(1)
        victim_env = driver.environments[0]
        ray.kill(victim_env.pyenv.actor_handles()[1])  # rows 2 and 3 of env thread 0
        while not all(any((row[0] == LAST).any() for row in rows.get(i, [])[-3:-1])
                      for i in (2, 3)):
            collect(1)
        collect(2)
        assert victim_env.restarts == 1 and driver.environments[1].restarts == 0
    finally:
        driver.stop()
    for env_id in (2, 3):
        next_step_type = np.concatenate([r[0] for r in rows[env_id]])
        discount = np.concatenate([r[1] for r in rows[env_id]])
        steps = np.concatenate([r[2] for r in rows[env_id]])[:, OBS_STEP]
        lasts = np.flatnonzero(next_step_type == LAST)
        assert len(lasts) == 1 and discount[lasts[0]] == 1.0, "one truncation, discount 1"
        k = lasts[0]
        assert steps[k + 1] == steps[k] and steps[k + 2] == 0, "last obs, then a FIRST"
        np.testing.assert_array_equal(np.diff(steps[:k + 1]), 1)
        np.testing.assert_array_equal(np.diff(steps[k + 2:]), 1)
    for env_id in (0, 1, 4, 5, 6, 7):
        assert not any((r[0] == LAST).any() for r in rows[env_id]), "other rows untouched"


@pytest.mark.timeout(120)
def test_env_error_keeps_its_type_and_restart_limit_is_clear(no_ray_left):
    ray_env.ensure_ray(num_cpus=2)
    env = RayBatchedEnv(functools.partial(raising_env, raise_on_step=2), max_restarts=0)
    try:
        env.reset()
        env.step(np.zeros(1, np.int32))
        with pytest.raises(ValueError):
            env.step(np.zeros(1, np.int32))
        assert env.restarts == 0
        ray.kill(env.actor_handles()[0])
        with pytest.raises(RayEnvCrashError, match="max_restarts=0"):
            # ray.kill returns before the actor is gone: a step sent right
            # after it may still be served (seen once in a full test run).
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                env.step(np.zeros(1, np.int32))
    finally:
        env.close()


@pytest.mark.timeout(120)
def test_a_new_actor_gets_init_timeout_to_start_and_a_step_step_timeout(no_ray_left):
    # Ray starts a worker process for each actor: its first call (specs, or a
    # replacement's reset) may take far longer than a step.
    ray_env.ensure_ray(num_cpus=2)
    build = functools.partial(slow_to_build_env, build_secs=3.0)
    env = RayBatchedEnv(build, step_timeout=1.5, init_timeout=60.0, max_restarts=1)
    try:
        assert env.reset().step_type.tolist() == [FIRST]
        assert env.step(np.zeros(1, np.int32)).step_type.tolist() == [MID]
        ray.kill(env.actor_handles()[0])
        deadline = time.monotonic() + 30
        while env.restarts == 0 and time.monotonic() < deadline:
            truncated = env.step(np.zeros(1, np.int32))
        assert env.restarts == 1 and truncated.step_type.tolist() == [LAST]
        assert env.step(np.zeros(1, np.int32)).step_type.tolist() == [FIRST]   # the new actor's
    finally:
        env.close()
    with pytest.raises(ray.exceptions.GetTimeoutError):
        RayBatchedEnv(build, step_timeout=60.0, init_timeout=1.0)
