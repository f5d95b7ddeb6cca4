"""suite_gymnasium: gymnasium 1.x environments as tf-agents PyEnvironments.

tf-agents 0.19's `suite_gym` speaks gym's 4-tuple API; gymnasium, its
maintained successor, returns (obs, reward, terminated, truncated, info) and
seeds through `reset(seed=...)`. This suite mirrors `suite_gym.load`:

- `terminated` ends an episode as a termination (LAST, discount 0);
  `truncated` (a time limit, or the environment's own) as a truncation
  (LAST, discount 1 — the value of the last state still counts);
- `seed` goes to the first `reset(seed=...)`; later resets continue that RNG;
- spaces become tf-agents array specs (Box, Discrete, MultiDiscrete,
  MultiBinary, and Dict / Tuple nests of them);
- `render()` passes through to gymnasium's `render()` (choose `render_mode`
  when loading).

Install with `pip install -e '.[gymnasium]'` (gymnasium 1.3.0: the newest
release that installs beside tf-agents' typing-extensions pin).
"""

import os

import gymnasium
import numpy as np
from tf_agents.environments import py_environment
from tf_agents.specs import array_spec
from tf_agents.trajectories import time_step as ts

from gymnasium import spaces

from alf_async import quiet


def spec_from_space(space, name=None):
    """Converts a gymnasium space to a tf-agents array spec (or a nest of them).

    Raises:
        ValueError: for a space kind with no array-spec equivalent.
    """
    if isinstance(space, spaces.Box):
        return array_spec.BoundedArraySpec(space.shape, space.dtype, minimum=space.low,
                                           maximum=space.high, name=name)
    if isinstance(space, spaces.Discrete):
        start = int(space.start)
        return array_spec.BoundedArraySpec((), np.int64, minimum=start,
                                           maximum=start + int(space.n) - 1, name=name)
    if isinstance(space, spaces.MultiDiscrete):
        start = np.asarray(space.start, np.int64) if hasattr(space, "start") else 0
        return array_spec.BoundedArraySpec(space.shape, np.int64, minimum=start,
                                           maximum=start + np.asarray(space.nvec) - 1,
                                           name=name)
    if isinstance(space, spaces.MultiBinary):
        return array_spec.BoundedArraySpec(space.shape, np.int8, minimum=0, maximum=1,
                                           name=name)
    if isinstance(space, spaces.Dict):
        return {key: spec_from_space(sub, name=key) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(spec_from_space(sub, name=f"{name or 'tuple'}_{i}")
                     for i, sub in enumerate(space.spaces))
    raise ValueError(f"suite_gymnasium cannot convert the space {space!r} to a tf-agents "
                     f"spec: expected Box, Discrete, MultiDiscrete, MultiBinary, Dict or "
                     f"Tuple")


def _to_spec(value, spec):
    """Converts an observation (nest) to the spec's dtypes and structure."""
    if isinstance(spec, dict):
        return {k: _to_spec(value[k], s) for k, s in spec.items()}
    if isinstance(spec, tuple):
        return tuple(_to_spec(v, s) for v, s in zip(value, spec))
    return np.asarray(value, dtype=spec.dtype).reshape(spec.shape)


def _to_action(action, space):
    """Converts a tf-agents action (nest of arrays) to what the gymnasium space takes."""
    if isinstance(space, spaces.Discrete):
        return int(np.asarray(action).item())
    if isinstance(space, spaces.Dict):
        return {k: _to_action(action[k], sub) for k, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_to_action(a, sub) for a, sub in zip(action, space.spaces))
    return np.asarray(action, dtype=space.dtype)


class GymnasiumWrapper(py_environment.PyEnvironment):
    """A tf-agents PyEnvironment over one gymnasium environment.

    Args:
        env: a `gymnasium.Env`.
        discount: the discount of non-terminal steps.
        seed: passed to the first `reset(seed=...)`.
    """

    def __init__(self, env, discount=1.0, seed=None):
        super().__init__(handle_auto_reset=True)
        self._env = env
        self._discount = np.float32(discount)
        self._seed = seed
        self._observation_spec = spec_from_space(env.observation_space, name="observation")
        self._action_spec = spec_from_space(env.action_space, name="action")

    @property
    def gymnasium_env(self):
        return self._env

    def observation_spec(self):
        return self._observation_spec

    def action_spec(self):
        return self._action_spec

    def _reset(self):
        seed, self._seed = self._seed, None
        obs, _ = self._env.reset(seed=seed)
        return ts.restart(_to_spec(obs, self._observation_spec))

    def _step(self, action):
        obs, reward, terminated, truncated, _ = self._env.step(
            _to_action(action, self._env.action_space))
        obs = _to_spec(obs, self._observation_spec)
        reward = np.asarray(reward, np.float32)
        if terminated:
            return ts.termination(obs, reward)
        if truncated:
            return ts.truncation(obs, reward, discount=self._discount)
        return ts.transition(obs, reward, discount=self._discount)

    def render(self, mode="rgb_array"):
        """gymnasium's `render()`; its mode is the `render_mode` chosen at load."""
        return self._env.render()

    def close(self):
        self._env.close()


def load(name, max_episode_steps=None, discount=1.0, seed=None, render_mode=None,
         env_kwargs=None):
    """Loads a gymnasium environment by id as a tf-agents PyEnvironment.

    Args:
        name: a registered gymnasium id, e.g. "CartPole-v1".
        max_episode_steps: overrides the registered time limit (None: keep it).
        discount: the discount of non-terminal steps.
        seed: the seed of the first reset.
        render_mode: gymnasium's render mode ("rgb_array", "human", ...).
        env_kwargs: extra keyword arguments for `gymnasium.make`.
    """
    kwargs = dict(env_kwargs or {})
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    return GymnasiumWrapper(make(name, **kwargs), discount=discount, seed=seed)


def make(name, **kwargs):
    """`gymnasium.make(name, **kwargs)`; in a quiet process (alf-async-train
    without --verbose) MuJoCo's known harmless warnings are dropped first
    (`quiet.quiet_mujoco`), since make() compiles the model."""
    if os.environ.get(quiet.ENV_VAR) == "1" and _is_gymnasium_mujoco(name):
        quiet.quiet_mujoco()
    return gymnasium.make(name, **kwargs)


def _is_gymnasium_mujoco(name):
    """True for gymnasium's own MuJoCo environments (HalfCheetah-v5, ...)."""
    spec = gymnasium.registry.get(name)
    return spec is not None and str(spec.entry_point).startswith("gymnasium.envs.mujoco")
