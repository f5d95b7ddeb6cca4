"""Environments by suite name: what the trainer and gin configs use.

    env = suites.load('suite_gym', 'CartPole-v0', batch_size=8, seed=1)  # a TFEnvironment
    env_constructor = suites.make_env_constructor('suite_gym', 'CartPole-v0',
                                                  batch_size=8, seed=1)
    env_constructor(), env_constructor(), ...   # one TFEnvironment per call, own seeds

Names, as in tf-agents: an *env load fn* loads an environment by name
(`suite_gym.load`; here `(env_name, batch_size, seed, **kwargs) ->
TFEnvironment`, registered under a suite name with `register_suite` and
picked by `Task.suite`); an *env constructor* is a zero-arg callable
returning an environment (tf-agents' `EnvConstructor`): what the driver
calls once per env thread, and what SubprocessEnv and Ray call in their
workers. The `make_*env_constructor` functions here make the driver's
constructor from a suite and a name; `Task.make_env_constructor` picks one
(`@make_subprocess_env_constructor`, `@make_ray_env_constructor`, or your
own with the same signature).

`suite_gym` is `gym.make(name)` batched in one `BatchedGymEnv` (tf-agents'
suite_gym semantics; see gym_batch.py for why not suite_gym itself).
"""

import importlib
import functools
import itertools
import threading

import gin
from tf_agents.environments import tf_py_environment

# Imported here so that gin files can bind `suite_atari.*` and
# `suite_envpool.*` before a game loads; they import ale-py, gymnasium and
# envpool only when one does.
from alf_async.environments.suites import suite_atari, suite_envpool
from alf_async.errors import missing_extra

_SUITES = {}


def register_suite(name, env_load_fn):
    """Makes `load(name, ...)` call `env_load_fn(env_name, batch_size, seed, **kwargs)`."""
    _SUITES[name] = env_load_fn


def suite_names():
    return sorted(_SUITES)


def _load_gym(env_name, batch_size, seed, max_episode_steps=None):
    # gym is imported here so that importing suites costs nothing for other suites.
    import gym

    from alf_async.environments.suites import gym_batch
    if ":" in env_name:
        # 'module:EnvId' imports the module that registers EnvId first, as
        # gym.make does from gym 0.24 on (our pinned 0.23 makes only ids).
        module, _, env_name = env_name.partition(":")
        try:
            with gin.unlock_config():  # the module may define configurables
                importlib.import_module(module)
        except ImportError as e:
            raise ValueError(f"suite_gym: cannot import {module!r} for {env_name!r} "
                             f"({e})") from None
    try:
        gym.spec(env_name)
    except gym.error.Error as e:
        raise ValueError(f"suite_gym: unknown gym environment {env_name!r} ({e})") from None
    return tf_py_environment.TFPyEnvironment(
        gym_batch.load_batched(env_name, batch_size, seed=seed,
                               max_episode_steps=max_episode_steps))


register_suite("suite_gym", _load_gym)


def _load_gymnasium(env_name, batch_size, seed, max_episode_steps=None):
    # gymnasium is an extra (pip install -e '.[gymnasium]'): imported on use.
    try:
        import gymnasium
    except ImportError:
        raise ValueError("suite_gymnasium needs gymnasium: pip install -e '.[gymnasium]'") \
            from None
    from alf_async.environments.suites import gym_batch
    try:
        gymnasium.spec(env_name)
    except gymnasium.error.Error as e:
        raise ValueError(f"suite_gymnasium: unknown gymnasium environment {env_name!r} "
                         f"({e})") from None
    from alf_async.environments.suites import suite_gymnasium
    kwargs = {} if max_episode_steps is None else dict(max_episode_steps=max_episode_steps)
    return tf_py_environment.TFPyEnvironment(gym_batch.BatchedGymEnv(
        [suite_gymnasium.make(env_name, **kwargs) for _ in range(batch_size)], seed=seed))


register_suite("suite_gymnasium", _load_gymnasium)


def _load_atari(env_name, batch_size, seed, **kwargs):
    return suite_atari.load(env_name, batch_size, seed, **kwargs)


register_suite("suite_atari", _load_atari)


def _load_envpool(env_name, batch_size, seed, **kwargs):
    return suite_envpool.load(env_name, batch_size, seed, **kwargs)


register_suite("suite_envpool", _load_envpool)


# The suites whose environments can run one per child process or Ray actor.
SINGLE_ENV_SUITES = ("suite_gym", "suite_gymnasium", "suite_atari")


def make_single_env(suite, env_name, seed=None, max_episode_steps=None, env_kwargs=None):
    """One unbatched PyEnvironment of `suite` (suite_gym, suite_gymnasium or
    suite_atari; `env_kwargs`: suite_atari's preprocessing knobs).

    Runs inside a SubprocessEnv child or a Ray actor, where
    `current_env_index()` offsets the seed so that every environment gets
    its own.
    """
    from alf_async.environments.suites.adapters import as_py_environment
    from alf_async.environments.processes.env_index import current_env_index
    index = current_env_index() or 0
    seed = None if seed is None else seed + index
    if suite != "suite_atari" and env_kwargs:
        raise ValueError(f"make_single_env: env_kwargs are suite_atari's, not {suite!r}'s")
    if suite == "suite_gym":
        import gym
        env = gym.make(env_name)
        if max_episode_steps is not None:
            env = gym.wrappers.TimeLimit(env.unwrapped, max_episode_steps)
    elif suite == "suite_gymnasium":
        from alf_async.environments.suites import suite_gymnasium
        kwargs = {} if max_episode_steps is None else dict(max_episode_steps=max_episode_steps)
        env = suite_gymnasium.make(env_name, **kwargs)
    elif suite == "suite_atari":
        if max_episode_steps is not None:
            raise ValueError("suite_atari's time limit is the knob "
                             "max_num_frames_per_episode, not max_episode_steps")
        env = suite_atari.make_env(env_name, **(env_kwargs or {}))
    else:
        raise ValueError(f"make_single_env: suite {suite!r} is not one of "
                         f"{list(SINGLE_ENV_SUITES)}")
    return as_py_environment(env, seed=seed)


def _single_env_kwargs(suite, env_name, env_kwargs):
    """suite_atari: its knobs with this process's gin bindings applied, the id
    checked. Children and Ray actors parse gin before anything imports
    suite_atari there, so they would drop its bindings; resolved here, they
    get every knob explicitly."""
    if suite != "suite_atari":
        return env_kwargs
    suite_atari.check_game(env_name)
    return suite_atari.knob_values(**(env_kwargs or {}))


@gin.configurable
def make_subprocess_env_constructor(suite, env_name, batch_size=1, seed=None,
                                    max_episode_steps=None, env_kwargs=None,
                                    **subprocess_kwargs):
    """Like `make_env_constructor`, with the environments in child processes.

    Each env thread gets a TFEnvironment over `batch_size` environments in
    SubprocessEnvs (stepped concurrently), one per child process unless
    `envs_per_process` says more. gin: `Task.make_env_constructor =
    @make_subprocess_env_constructor`; `make_subprocess_env_constructor.step_timeout`,
    `.max_restarts`, `.transport`, `.envs_per_process`, ... go to
    `subprocess_env_constructor`; `env_kwargs` to suite_atari.
    """
    if suite not in SINGLE_ENV_SUITES:
        raise ValueError(f"make_subprocess_env_constructor: suite {suite!r} is not one of "
                         f"{list(SINGLE_ENV_SUITES)}")
    env_kwargs = _single_env_kwargs(suite, env_name, env_kwargs)
    from alf_async.environments.processes.subprocess_batched import subprocess_env_constructor
    return subprocess_env_constructor(
        functools.partial(make_single_env, suite, env_name, seed, max_episode_steps,
                          env_kwargs),
        num_envs=batch_size, **subprocess_kwargs)


@gin.configurable
def make_ray_env_constructor(suite, env_name, batch_size=1, seed=None,
                             max_episode_steps=None, actors_per_env=1, env_kwargs=None,
                             **ray_kwargs):
    """Like `make_env_constructor`, with the environments inside Ray actors.

    Each env thread gets a TFEnvironment over `actors_per_env` actors of
    `batch_size // actors_per_env` environments. gin: `Task.make_env_constructor
    = @make_ray_env_constructor`; `make_ray_env_constructor.address`,
    `.num_cpus`, `.actor_options`, ... go to `ray_env_constructor`; `env_kwargs`
    to suite_atari.
    """
    if suite not in SINGLE_ENV_SUITES:
        raise ValueError(f"make_ray_env_constructor: suite {suite!r} is not one of "
                         f"{list(SINGLE_ENV_SUITES)}")
    if batch_size % actors_per_env:
        raise ValueError(f"make_ray_env_constructor: batch_size {batch_size} is not a "
                         f"multiple of actors_per_env {actors_per_env}")
    env_kwargs = _single_env_kwargs(suite, env_name, env_kwargs)
    try:
        from alf_async.environments.processes.ray_env import ray_env_constructor
    except ModuleNotFoundError as e:
        raise missing_extra(e, "make_ray_env_constructor", "Ray", "ray", "ray") from None
    return ray_env_constructor(
        functools.partial(make_single_env, suite, env_name, seed, max_episode_steps,
                          env_kwargs),
        envs_per_actor=batch_size // actors_per_env, actors_per_env=actors_per_env,
        **ray_kwargs)


@gin.configurable
def load(suite, env_name, batch_size=1, seed=None, **kwargs):
    """Builds one TFEnvironment of `batch_size` environments.

    Args:
        suite: a registered suite name ('suite_gym', ...).
        env_name: the environment's name within the suite ('CartPole-v0').
        batch_size: number of environments batched in the TFEnvironment.
        seed: env b of the batch is seeded `seed + b` (None: unseeded).
        **kwargs: passed to the suite (suite_gym: max_episode_steps).

    Raises:
        ValueError: an unknown suite or environment name, or batch_size < 1.
    """
    if suite not in _SUITES:
        raise ValueError(f"unknown environment suite {suite!r}; known: {suite_names()}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    return _SUITES[suite](env_name, batch_size, seed, **kwargs)


class SuiteEnvConstructor(object):
    """A thread-safe env constructor for the driver: call k builds
    `load(suite, env_name, batch_size, seed + k * batch_size)`, so every
    environment of every env thread gets its own seed."""

    def __init__(self, suite, env_name, batch_size=1, seed=None, **kwargs):
        self.suite = suite
        self.env_name = env_name
        self.batch_size = batch_size
        self._seed = seed
        self._kwargs = kwargs
        self._calls = itertools.count()
        self._lock = threading.Lock()

    def __call__(self):
        with self._lock:
            k = next(self._calls)
        seed = None if self._seed is None else self._seed + k * self.batch_size
        return load(self.suite, self.env_name, batch_size=self.batch_size, seed=seed,
                    **self._kwargs)


@gin.configurable
def make_env_constructor(suite, env_name, batch_size=1, seed=None, **kwargs):
    """The trainer's default: environments in the learner's process
    (a `SuiteEnvConstructor`).

    The trainer calls `make_env_constructor(suite, env_name, batch_size, seed)`;
    replace it by gin (`Task.make_env_constructor = @other`) to run the
    environments elsewhere (subprocesses, Ray) with the same signature.
    """
    if suite not in _SUITES:  # fail before any thread starts
        raise ValueError(f"unknown environment suite {suite!r}; known: {suite_names()}")
    return SuiteEnvConstructor(suite, env_name, batch_size=batch_size, seed=seed, **kwargs)


def sized_env_constructor(make_env_constructor, suite, env_name, seed=None):
    """`choose_layout`'s env_constructor: callable(batch_size, **kwargs) ->
    an environment of `suite`'s `env_name` with that many rows.

    It calls one driver env_constructor per batch size and kwargs, so that
    every environment it makes has its own seeds; any thread may call it.

    Args:
        make_env_constructor: `make_env_constructor`,
            `make_subprocess_env_constructor` or one with their signature.
        suite: as theirs.
        env_name: as theirs.
        seed: as theirs.

    Returns:
        The callable.
    """
    constructors, lock = {}, threading.Lock()

    def env_constructor(batch_size, **kwargs):
        key = (batch_size, tuple(sorted(kwargs.items())))
        with lock:
            if key not in constructors:
                constructors[key] = make_env_constructor(suite, env_name, batch_size=batch_size,
                                                         seed=seed, **kwargs)
            constructor = constructors[key]
        return constructor()
    return env_constructor
