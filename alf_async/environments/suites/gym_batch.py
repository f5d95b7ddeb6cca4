"""BatchedGymEnv: B gym (or gymnasium) environments stepped in one loop, as one
batched PyEnvironment.

Why our own instead of tf-agents' `BatchedPyEnvironment` over `suite_gym`
environments: each of those steps goes through GymWrapper, TimeLimit,
PyEnvironment.step and a per-env nest stack, many times the Python of the
CartPole step itself; with 64 CartPoles that stack, not the simulator or
the policy, bounds collection (benchmarks/throughput.py compares both;
docs/design.md, "Why our own parts where a library exists"). This class
keeps tf-agents' semantics exactly:

- specs from `tf_agents.environments.gym_wrapper.spec_from_gym_space`, so
  they equal suite_gym's;
- per-environment auto-reset: the step after a LAST returns the FIRST of a
  new episode (reward 0, discount 1) and ignores that row's action;
- a terminal step has discount 0; a step ended by the time limit (gym's
  TimeLimit, `info["TimeLimit.truncated"]`; gymnasium's `truncated`) is LAST
  with discount 1, as with tf-agents' TimeLimit wrapper.

gymnasium environments (the 5-tuple step API, `reset()` returning
(obs, info)) are recognised and stepped with the same semantics; their specs
come from `suite_gymnasium.spec_from_space`.
"""

import gym
import numpy as np
from tf_agents.environments import gym_wrapper, py_environment
from tf_agents.specs import array_spec
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories.time_step import StepType



class BatchedGymEnv(py_environment.PyEnvironment):
    """A batched PyEnvironment over gym environments with one flat Box/Discrete
    observation each.

    Args:
        envs: a list of gym environments (or zero-arg callables making them),
            all with the same spaces.
        seed: if not None, env i is reset with seed `seed + i` the first time.
        discount: the discount of non-terminal steps.
    """

    def __init__(self, envs, seed=None, discount=1.0):
        super().__init__(handle_auto_reset=False)
        self._envs = [e() if callable(e) and not hasattr(e, "step") else e for e in envs]
        if not self._envs:
            raise ValueError("BatchedGymEnv needs at least one environment")
        first = self._envs[0]
        self._gymnasium = is_gymnasium(first)
        spec_from_space = _spec_from_space_fn(first)
        self._observation_spec = spec_from_space(first.observation_space, name="observation")
        self._action_spec = spec_from_space(first.action_space, name="action")
        for i, env in enumerate(self._envs[1:], start=1):
            if (env.observation_space != first.observation_space or
                    env.action_space != first.action_space):
                raise ValueError(f"BatchedGymEnv: env {i}'s spaces differ from env 0's")
        if not isinstance(self._observation_spec, array_spec.ArraySpec):
            raise ValueError(f"BatchedGymEnv supports Box/Discrete observations only, got "
                             f"{first.observation_space}")
        self._seed = seed
        self._seeded = False
        self._discount = np.float32(discount)
        self._obs_dtype = self._observation_spec.dtype
        self._scalar_action = self._action_spec.shape == ()
        self._done = np.zeros(len(self._envs), bool)

    @property
    def batched(self):
        return True

    @property
    def batch_size(self):
        return len(self._envs)

    @property
    def envs(self):
        return list(self._envs)

    def observation_spec(self):
        return self._observation_spec

    def action_spec(self):
        return self._action_spec

    def _reset(self):
        B = len(self._envs)
        obs = np.empty((B,) + self._observation_spec.shape, self._obs_dtype)
        for i, env in enumerate(self._envs):
            obs[i] = self._reset_env(i, env)
        self._seeded = True
        self._done[:] = False
        return ts.TimeStep(np.full(B, StepType.FIRST), np.zeros(B, np.float32),
                           np.ones(B, np.float32), obs)

    def _reset_env(self, i, env):
        seed = self._seed + i if self._seed is not None and not self._seeded else None
        out = env.reset(seed=seed) if seed is not None else env.reset()
        return out[0] if self._gymnasium else out

    def _step(self, action):
        B = len(self._envs)
        obs = np.empty((B,) + self._observation_spec.shape, self._obs_dtype)
        step_type = np.empty(B, np.int32)
        reward = np.zeros(B, np.float32)
        discount = np.empty(B, np.float32)
        done = self._done
        scalar = self._scalar_action
        for i, env in enumerate(self._envs):
            if done[i]:
                obs[i] = env.reset()[0] if self._gymnasium else env.reset()
                step_type[i] = StepType.FIRST
                discount[i] = 1.0
                done[i] = False
                continue
            if self._gymnasium:
                o, r, terminated, truncated, _ = env.step(
                    action[i].item() if scalar else action[i])
            else:
                o, r, d, info = env.step(action[i].item() if scalar else action[i])
                truncated = d and info.get("TimeLimit.truncated", False)
                terminated = d and not truncated
            obs[i] = o
            reward[i] = r
            if terminated or truncated:
                done[i] = True
                step_type[i] = StepType.LAST
                discount[i] = 0.0 if terminated else self._discount
            else:
                step_type[i] = StepType.MID
                discount[i] = self._discount
        return ts.TimeStep(step_type, reward, discount, obs)

    def close(self):
        for env in self._envs:
            env.close()


def is_gymnasium(env):
    """True if `env` is a gymnasium environment (False without gymnasium installed)."""
    try:
        import gymnasium
    except ImportError:
        return False
    return isinstance(env, gymnasium.Env)


def _spec_from_space_fn(env):
    if is_gymnasium(env):
        from alf_async.environments.suites.suite_gymnasium import spec_from_space
        return spec_from_space
    return gym_wrapper.spec_from_gym_space


def supports_spaces(env):
    """True if BatchedGymEnv can step `env` (a gym or gymnasium environment):
    its observation space converts to one tf-agents ArraySpec (Box, Discrete)."""
    try:
        spec = _spec_from_space_fn(env)(env.observation_space)
    except ValueError:
        return False
    return isinstance(spec, array_spec.ArraySpec)


def load_batched(name, batch_size, seed=None, max_episode_steps=None):
    """A BatchedGymEnv of `batch_size` `gym.make(name)` environments.

    Args:
        name: a registered gym id, e.g. "CartPole-v0".
        batch_size: number of environments.
        seed: env i is first reset with seed + i (None: unseeded).
        max_episode_steps: replaces the registered time limit (as suite_gym does).
    """
    def make():
        env = gym.make(name)
        if max_episode_steps is not None:
            env = gym.wrappers.TimeLimit(env.unwrapped, max_episode_steps)
        return env

    return BatchedGymEnv([make() for _ in range(batch_size)], seed=seed)


class SingleGymEnv(py_environment.PyEnvironment):
    """One gym or gymnasium environment as an unbatched PyEnvironment, with
    BatchedGymEnv's semantics (it is a BatchedGymEnv of one, unbatched), for
    places that want one environment each: SubprocessEnv children, Ray actors.

    Args:
        env: a gym or gymnasium environment.
        seed: the seed of its first reset.
    """

    def __init__(self, env, seed=None):
        super().__init__(handle_auto_reset=False)
        self._batched = BatchedGymEnv([env], seed=seed)

    def observation_spec(self):
        return self._batched.observation_spec()

    def action_spec(self):
        return self._batched.action_spec()

    def _reset(self):
        return _first_row(self._batched.reset())

    def _step(self, action):
        return _first_row(self._batched.step(np.expand_dims(np.asarray(action), 0)))

    def close(self):
        self._batched.close()


def _first_row(time_step):
    import tensorflow as tf
    return tf.nest.map_structure(lambda x: x[0], time_step)
