"""Environment factories by suite name: what the trainer and gin configs use.

    env = suites.load('suite_gym', 'CartPole-v0', batch_size=8, seed=1)  # a TFEnvironment
    env_f = suites.make_env_f('suite_gym', 'CartPole-v0', batch_size=8, seed=1)
    env_f(), env_f(), ...   # one TFEnvironment per call, each with its own seeds

A suite is a function `(env_name, batch_size, seed, **kwargs) -> TFEnvironment`
registered under a name; later suites (gymnasium, subprocess or ray
environments) register themselves with `register_suite` and are picked by
gin (`make_env_f.suite = 'suite_gymnasium'`) or replace `make_env_f` as a
whole (`train.make_env_f = @my_env_f`).

`suite_gym` is `gym.make(name)` batched in one `BatchedGymEnv` (tf-agents'
suite_gym semantics; see gym_batch.py for why not suite_gym itself).
"""

import itertools
import threading

import gin
from tf_agents.environments import tf_py_environment

_SUITES = {}


def register_suite(name, load_fn):
    """Makes `load(name, ...)` call `load_fn(env_name, batch_size, seed, **kwargs)`."""
    _SUITES[name] = load_fn


def suite_names():
    return sorted(_SUITES)


def _load_gym(env_name, batch_size, seed, max_episode_steps=None):
    # gym is imported here so that importing suites costs nothing for other suites.
    import gym

    from alf_async.environments import gym_batch
    try:
        gym.spec(env_name)
    except gym.error.Error as e:
        raise ValueError(f"suite_gym: unknown gym environment {env_name!r} ({e})") from None
    return tf_py_environment.TFPyEnvironment(
        gym_batch.load_batched(env_name, batch_size, seed=seed,
                               max_episode_steps=max_episode_steps))


register_suite("suite_gym", _load_gym)


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


class EnvFactory(object):
    """A thread-safe env_f for the driver: call k builds
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
def make_env_f(suite, env_name, batch_size=1, seed=None, **kwargs):
    """The trainer's default env factory maker: returns an `EnvFactory`.

    The trainer calls `make_env_f(suite, env_name, batch_size, seed)`; replace
    it by gin (`train.make_env_f = @other_maker`) to run the environments
    elsewhere (subprocesses, ray) with the same signature.
    """
    env_f = EnvFactory(suite, env_name, batch_size=batch_size, seed=seed, **kwargs)
    if suite not in _SUITES:  # fail before any thread starts
        raise ValueError(f"unknown environment suite {suite!r}; known: {suite_names()}")
    return env_f
