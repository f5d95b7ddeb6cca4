"""adapters: what an env constructor returns, as the PyEnvironment alf_async steps."""

import gym
import gymnasium
import numpy as np
import pytest
from tf_agents.environments import batched_py_environment, py_environment

from alf_async.environments.suites import gym_batch
from alf_async.environments.suites.adapters import as_batched_py_environment, as_py_environment
from alf_async.testing.envs import CountingEnv, CountingGymEnv


def test_an_unbatched_py_environment_is_used_as_it_is():
    env = CountingEnv()
    assert as_py_environment(env) is env


def test_a_batched_py_environment_or_anything_else_is_refused():
    batched = batched_py_environment.BatchedPyEnvironment([CountingEnv()])
    with pytest.raises(TypeError, match="unbatched"):
        as_py_environment(batched)
    with pytest.raises(TypeError, match="PyEnvironment, a gym.Env or a gymnasium.Env"):
        as_py_environment(object())


@pytest.mark.parametrize("make", [lambda: gym.make("CartPole-v0"),
                                  lambda: gymnasium.make("CartPole-v1")])
def test_gym_and_gymnasium_envs_get_batched_gym_env_semantics(make):
    env = as_py_environment(make(), seed=3)
    assert isinstance(env, gym_batch.SingleGymEnv) and not env.batched
    first = env.reset()
    assert int(first.step_type) == 0 and first.observation.shape == (4,)
    again = as_py_environment(make(), seed=3).reset()
    np.testing.assert_array_equal(first.observation, again.observation)  # seeded


class _DictObservation(gym.Env):
    observation_space = gym.spaces.Dict({"x": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)})
    action_space = gym.spaces.Discrete(2)

    def reset(self):
        return {"x": np.zeros(2, np.float32)}

    def step(self, action):
        return {"x": np.ones(2, np.float32)}, 1.0, True, {}


def test_observation_spaces_batched_gym_env_cannot_step_go_through_tf_agents_wrappers():
    env = as_py_environment(_DictObservation())
    assert isinstance(env, py_environment.PyEnvironment)
    assert not isinstance(env, gym_batch.SingleGymEnv)
    assert env.reset().observation["x"].tolist() == [0.0, 0.0]


def test_a_batch_of_gym_envs_is_one_batched_gym_env_and_py_envs_a_batched_py_env():
    gyms = as_batched_py_environment([CountingGymEnv(), CountingGymEnv()])
    assert isinstance(gyms, gym_batch.BatchedGymEnv) and gyms.batch_size == 2
    pys = as_batched_py_environment([CountingEnv(0), CountingEnv(1)])
    assert isinstance(pys, batched_py_environment.BatchedPyEnvironment)
    assert pys.reset().observation[:, 0].tolist() == [0, 1]
