"""What an env constructor returns, made into the tf-agents PyEnvironment the
rest of alf_async steps: used wherever a user's constructor runs (a
SubprocessEnv child, a Ray env actor, `suites.make_single_env`).

A constructor may return an unbatched tf-agents `PyEnvironment` (used as it
is) or a gym / gymnasium environment, which is stepped with
`BatchedGymEnv`'s semantics (gym_batch.py: tf-agents' specs, auto-reset,
discount 0 at a termination and 1 at a time-limit truncation). Environments
with observations BatchedGymEnv does not handle (dict or tuple spaces) go
through tf-agents' `suite_gym.wrap_env` or `suite_gymnasium.GymnasiumWrapper`.
"""

from tf_agents.environments import batched_py_environment, py_environment

from alf_async.environments.suites import gym_batch


def _is_gym(env):
    import gym
    return isinstance(env, gym.Env)


def _is_gym_or_gymnasium(env):
    return _is_gym(env) or gym_batch.is_gymnasium(env)


def as_py_environment(env, seed=None):
    """`env` (an env constructor's result) as one unbatched PyEnvironment.

    Args:
        env: an unbatched tf-agents PyEnvironment, a gym.Env or a gymnasium.Env.
        seed: the seed of a gym / gymnasium environment's first reset (None:
            unseeded); a PyEnvironment seeds itself.

    Raises:
        TypeError: a batched PyEnvironment, or anything else.
    """
    if isinstance(env, py_environment.PyEnvironment):
        if env.batched:
            raise TypeError(
                "the env constructor must return an unbatched environment; alf_async "
                f"batches several itself (got batched {type(env).__name__})")
        return env
    if _is_gym_or_gymnasium(env):
        if gym_batch.supports_spaces(env):
            return gym_batch.SingleGymEnv(env, seed=seed)
        if _is_gym(env):
            from tf_agents.environments import suite_gym
            if seed is not None:
                env.seed(seed)
            return suite_gym.wrap_env(env)
        from alf_async.environments.suites.suite_gymnasium import GymnasiumWrapper
        return GymnasiumWrapper(env, seed=seed)
    raise TypeError("the env constructor must return a tf_agents PyEnvironment, a gym.Env "
                    f"or a gymnasium.Env, got {type(env).__name__}")


def as_batched_py_environment(envs):
    """Several env constructors' results as one batched PyEnvironment.

    gym / gymnasium environments with flat observations are batched in one
    `BatchedGymEnv` (its cheap loop); anything else in tf-agents'
    `BatchedPyEnvironment` over `as_py_environment` of each.
    """
    envs = list(envs)
    if envs and all(_is_gym_or_gymnasium(e) and gym_batch.supports_spaces(e) for e in envs):
        return gym_batch.BatchedGymEnv(envs)
    return batched_py_environment.BatchedPyEnvironment(
        [as_py_environment(e) for e in envs], multithreading=False)
