"""Environments the driver runs: every one reaches it as a tf-agents TFEnvironment.

    suites/       environments by suite name (gym, gymnasium, Atari, EnvPool),
                  and what a user's env constructor returns made a PyEnvironment
    processes/    environments in other processes: child processes
                  (SubprocessEnv), Ray actors; their crash recovery
    external/     external environments: ExternalEnv, its episodes and slots,
                  offline logs
    rows/         row steppers: the rows of a batch stepped one by one
    capabilities  what an environment may declare (all of the above use it)

Names are imported lazily: a SubprocessEnv child imports this package and
should pay only for what it uses.
"""

from alf_async._lazy import lazy_exports

_EXPORTS = {
    "BatchedGymEnv": "suites.gym_batch",
    "load_batched": "suites.gym_batch",
    "Restartable": "capabilities",
    "AppliedStep": "capabilities",
    "BlockingStep": "capabilities",
    "RowStepping": "capabilities",
    "EndOfData": "capabilities",
    "GilFreeStep": "capabilities",
    "OffersRowStepper": "capabilities",
    "ray_env_constructor": "processes.ray_env",
    "ExternalEnv": "external.external_env",
    "ExternalEnvFinished": "external.episodes",
    "ExternalEnvStoppedError": "external.episodes",
    "TooManyEpisodesError": "external.episodes",
    "OfflineEnv": "external.offline",
    "current_env_index": "processes.env_index",
    "as_py_environment": "suites.adapters",
    "SubprocessEnv": "processes.subprocess_env",
    "BatchedSubprocessEnv": "processes.subprocess_batched",
    "create_subprocess_envs": "processes.subprocess_batched",
    "close_subprocess_envs": "processes.subprocess_env",
    "subprocess_env_constructor": "processes.subprocess_batched",
    "SubprocessEnvError": "processes.subprocess_env",
    "SubprocessEnvCrashError": "processes.subprocess_env",
    "SubprocessEnvClosedError": "processes.subprocess_env",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
