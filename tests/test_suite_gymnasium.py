"""suite_gymnasium: spec conversion, terminated vs truncated, seeding, render."""

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from tf_agents.environments import tf_py_environment
from tf_agents.specs import array_spec

from alf_async.environments.suites import suite_gymnasium
from alf_async.environments.suites.suite_gymnasium import GymnasiumWrapper, spec_from_space

FIRST, MID, LAST = 0, 1, 2


def test_box_spec_keeps_shape_dtype_and_bounds():
    spec = spec_from_space(spaces.Box(-1.0, 2.0, shape=(3, 2), dtype=np.float32), "obs")
    assert spec == array_spec.BoundedArraySpec((3, 2), np.float32, -1.0, 2.0, name="obs")


def test_discrete_with_start():
    spec = spec_from_space(spaces.Discrete(4, start=2))
    assert spec.shape == () and spec.dtype == np.int64
    assert spec.minimum == 2 and spec.maximum == 5


def test_multi_discrete_and_multi_binary():
    md = spec_from_space(spaces.MultiDiscrete([3, 5]))
    assert md.shape == (2,) and md.dtype == np.int64
    np.testing.assert_array_equal(md.minimum, [0, 0])
    np.testing.assert_array_equal(md.maximum, [2, 4])
    mb = spec_from_space(spaces.MultiBinary(4))
    assert mb.shape == (4,) and mb.dtype == np.int8 and mb.minimum == 0 and mb.maximum == 1


def test_dict_and_tuple_nests():
    spec = spec_from_space(spaces.Dict({
        "pos": spaces.Box(0, 1, (2,), np.float32),
        "flags": spaces.Tuple((spaces.Discrete(2), spaces.MultiBinary(3))),
    }))
    assert set(spec) == {"pos", "flags"}
    assert spec["pos"].shape == (2,) and isinstance(spec["flags"], tuple)
    assert spec["flags"][0].maximum == 1 and spec["flags"][1].shape == (3,)


def test_unsupported_space_is_refused_with_what_is_expected():
    with pytest.raises(ValueError, match="expected Box, Discrete"):
        spec_from_space(spaces.Text(5))


class _Scripted(gymnasium.Env):
    """Ends as told: ('terminated' | 'truncated') after 2 steps; Dict obs."""

    observation_space = spaces.Dict({"t": spaces.Box(0, 10, (1,), np.float32),
                                     "k": spaces.Discrete(3)})
    action_space = spaces.Tuple((spaces.Discrete(2), spaces.Box(-1, 1, (2,), np.float32)))

    def __init__(self, ending):
        self._ending = ending
        self._t = 0
        self.actions = []

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return {"t": np.array([0.0]), "k": 0}, {}

    def step(self, action):
        self.actions.append(action)
        self._t += 1
        done = self._t == 2
        return ({"t": np.array([self._t]), "k": self._t % 3}, 0.5, done and self._ending == "terminated",
                done and self._ending == "truncated", {})


@pytest.mark.parametrize("ending, discount", [("terminated", 0.0), ("truncated", 1.0)])
def test_terminated_has_discount_zero_truncated_has_discount_one(ending, discount):
    inner = _Scripted(ending)
    env = GymnasiumWrapper(inner)
    first = env.reset()
    assert first.step_type == FIRST and first.observation["t"].dtype == np.float32
    action = (np.int64(1), np.array([0.5, -0.5], np.float32))
    mid = env.step(action)
    last = env.step(action)
    assert (mid.step_type, mid.discount) == (MID, 1.0)
    assert (last.step_type, float(last.discount), float(last.reward)) == (LAST, discount, 0.5)
    assert env.step(action).step_type == FIRST  # auto-reset
    assert inner.actions[0][0] == 1 and isinstance(inner.actions[0][0], int)


def test_time_limit_truncates_cartpole_with_discount_one():
    env = suite_gymnasium.load("CartPole-v1", max_episode_steps=3, seed=0)
    env.reset()
    steps = [env.step(np.int64(i % 2)) for i in range(3)]
    assert [s.step_type for s in steps] == [MID, MID, LAST]
    assert steps[-1].discount == 1.0


def test_same_seed_same_first_observations():
    def rollout(seed):
        env = suite_gymnasium.load("CartPole-v1", seed=seed)
        obs = [env.reset().observation]
        obs += [env.step(np.int64(1)).observation for _ in range(3)]
        return np.stack(obs)

    np.testing.assert_array_equal(rollout(7), rollout(7))
    assert not np.array_equal(rollout(7), rollout(8))


def test_specs_fit_tf_agents_and_render_passes_through():
    env = suite_gymnasium.load("CartPole-v1", render_mode="rgb_array")
    tf_env = tf_py_environment.TFPyEnvironment(env)
    assert tf_env.action_spec().maximum == 1
    env.reset()
    frame = env.render()
    assert frame.ndim == 3 and frame.shape[2] == 3
