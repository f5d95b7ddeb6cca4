"""The driver over SubprocessEnvs: a child killed mid-episode ends that episode
as a truncation and training goes on; stop() leaves no child behind."""

import functools
import os
import signal

import numpy as np
import pytest
from tf_agents.policies import random_tf_policy

from alf_async import AsyncOffPolicyDriver
from alf_async.environments import subprocess_env_constructor
from alf_async.testing.envs import OBS_STEP, CountingEnv

FIRST, MID, LAST = 0, 1, 2


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.timeout(90)
def test_killed_child_is_a_truncation_then_a_fresh_episode():
    # Episodes never end by themselves, so the kill is always mid-episode.
    env_constructor = subprocess_env_constructor(
        functools.partial(CountingEnv, episode_length=10**6), num_envs=2, step_timeout=20.0)
    spec_env = env_constructor()
    policy = random_tf_policy.RandomTFPolicy(spec_env.time_step_spec(), spec_env.action_spec())
    spec_env.close()
    driver = AsyncOffPolicyDriver(env_constructor, policy, num_envs=2, unroll_length=4,
                                  learn_queue_cap=2)
    driver.start()
    rows = {}

    def collect(n):
        for _ in range(n):
            exp, env_ids, _ = driver.get_training_exps()
            for r, env_id in enumerate(env_ids.numpy()):
                rows.setdefault(int(env_id), []).append(
                    (exp.step_type[r].numpy(), exp.next_step_type[r].numpy(),
                     exp.discount[r].numpy(), exp.observation[r].numpy()))

    try:
        # Kill only once every row has reached the learner (see test_ray_env).
        collect(3)
        while len(rows) < 4:
            collect(1)
        victim = driver.environments[0].pyenv.envs[0]
        pids = [e.pid for env in driver.environments for e in env.pyenv.envs]
        os.kill(victim.pid, signal.SIGKILL)
        # While the victim's child restarts, the other env thread may fill
        # the learn queue: collect until row 0 shows its episode end and a
        # few steps of the new episode (bounded by the test timeout).
        while not any((row[1] == LAST).any() for row in rows.get(0, [])[-3:-1]):
            collect(1)
        collect(4)
        assert victim.restarts == 1
        assert sum(env.pyenv.restarts for env in driver.environments) == 1
    finally:
        driver.stop()
    new_pids = [e.pid for env in driver.environments for e in env.pyenv.envs]
    for pid in set(pids + [p for p in new_pids if p]):
        assert not alive(pid), f"child {pid} left behind"

    def concat(env_id, k):
        return np.concatenate([row[k] for row in rows[env_id]])

    # Row 0 (env thread 0, batch index 0) is the victim.
    step_type, next_step_type, discount, obs = (concat(0, k) for k in range(4))
    lasts = np.flatnonzero(next_step_type == LAST)
    assert len(lasts) == 1, "exactly one episode end: the truncation"
    k = lasts[0]
    assert discount[k] == 1.0, "a crash is a truncation (discount 1), not a termination"
    np.testing.assert_array_equal(obs[k + 1], obs[k],
                                  "the truncation carries the last observation the parent saw")
    assert step_type[k + 1] == LAST and next_step_type[k + 1] == FIRST
    assert obs[k + 2, OBS_STEP] == 0 and step_type[k + 2] == FIRST, "then a fresh episode"
    # No other step was lost or repeated: steps count up by one except there.
    steps_in_episode = obs[:, OBS_STEP]
    np.testing.assert_array_equal(np.diff(steps_in_episode[:k + 1]), 1)
    np.testing.assert_array_equal(np.diff(steps_in_episode[k + 2:]), 1)
    # The other rows never ended an episode.
    for env_id in (1, 2, 3):
        assert not np.any(concat(env_id, 1) == LAST)
        np.testing.assert_array_equal(np.diff(concat(env_id, 3)[:, OBS_STEP]), 1)
