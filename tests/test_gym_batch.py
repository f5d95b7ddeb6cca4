"""BatchedGymEnv keeps tf-agents' suite_gym semantics."""

import gym
import numpy as np
import pytest
from tf_agents.environments import suite_gym
from tf_agents.trajectories import time_step as ts

from alf_async.environments.suites.gym_batch import BatchedGymEnv, load_batched

FIRST, MID, LAST = 0, 1, 2


def test_specs_equal_suite_gyms():
    ours = load_batched("CartPole-v0", 3)
    theirs = suite_gym.load("CartPole-v0")
    assert ours.batch_size == 3 and ours.batched
    assert ours.observation_spec() == theirs.observation_spec()
    assert ours.action_spec() == theirs.action_spec()
    assert ours.time_step_spec() == theirs.time_step_spec()


def test_observations_follow_the_seeded_gym_env():
    env = load_batched("CartPole-v0", 2, seed=11)
    first = env.reset()
    ref = gym.make("CartPole-v0")
    np.testing.assert_allclose(first.observation[1], ref.reset(seed=12), rtol=1e-6)
    for a in [0, 1, 1]:
        step = env.step(np.array([a, a]))
        obs, reward, _, _ = ref.step(a)
        np.testing.assert_allclose(step.observation[1], obs, rtol=1e-6)
        assert step.reward[1] == reward and step.step_type[1] == MID


def test_truncation_has_discount_one_then_auto_resets_ignoring_the_action():
    env = load_batched("CartPole-v0", 2, seed=0, max_episode_steps=3)
    env.reset()
    types, discounts = [], []
    for _ in range(5):
        step = env.step(np.array([0, 1]))
        types.append(step.step_type.tolist())
        discounts.append(step.discount.tolist())
    assert types == [[MID, MID], [MID, MID], [LAST, LAST], [FIRST, FIRST], [MID, MID]]
    assert discounts[2] == [1.0, 1.0] and discounts[3] == [1.0, 1.0]


def test_termination_has_discount_zero():
    env = BatchedGymEnv([gym.make("CartPole-v0")], seed=0)
    env.reset()
    for _ in range(200):
        step = env.step(np.array([0]))
        if step.step_type[0] == LAST:
            break
    assert step.step_type[0] == LAST and step.discount[0] == 0.0 and step.reward[0] == 1.0
    assert env.step(np.array([0])).step_type[0] == FIRST


def test_mismatched_spaces_and_dict_observations_are_refused():
    with pytest.raises(ValueError, match="spaces differ"):
        BatchedGymEnv([gym.make("CartPole-v0"), gym.make("Pendulum-v1")])
    with pytest.raises(ValueError, match="at least one"):
        BatchedGymEnv([])


def test_gymnasium_envs_step_with_the_same_semantics():
    import gymnasium
    from alf_async.environments.suites import suite_gymnasium
    env = BatchedGymEnv([gymnasium.make("CartPole-v1", max_episode_steps=3) for _ in range(2)],
                        seed=5)
    ref = suite_gymnasium.load("CartPole-v1", max_episode_steps=3, seed=6)
    assert env.observation_spec() == ref.observation_spec()
    assert env.action_spec() == ref.action_spec()
    first, ref_first = env.reset(), ref.reset()
    np.testing.assert_allclose(first.observation[1], ref_first.observation)
    for _ in range(4):
        step, ref_step = env.step(np.array([1, 1])), ref.step(np.int64(1))
        assert step.step_type[1] == ref_step.step_type
        assert step.discount[1] == ref_step.discount
        np.testing.assert_allclose(step.observation[1], ref_step.observation)
    assert step.step_type[1] == FIRST  # truncated at 3 (discount 1), then auto-reset
