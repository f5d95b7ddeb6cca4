"""Environments the driver runs: every one reaches it as a tf-agents TFEnvironment.

Names are imported lazily: a SubprocessEnv child imports this package and
should pay only for what it uses.
"""

from alf_async._lazy import lazy_exports

_EXPORTS = {
    "BatchedGymEnv": "gym_batch",
    "load_batched": "gym_batch",
    "Restartable": "capabilities",
    "AppliedStep": "capabilities",
    "BlockingStep": "capabilities",
    "RowStepping": "capabilities",
    "EndOfData": "capabilities",
    "ExternalEnv": "external_env",
    "ExternalEnvFinished": "episodes",
    "ExternalEnvStoppedError": "episodes",
    "TooManyEpisodesError": "episodes",
    "OfflineEnv": "offline",
    "current_env_index": "env_index",
    "as_py_environment": "adapters",
    "SubprocessEnv": "subprocess_env",
    "BatchedSubprocessEnv": "subprocess_batched",
    "create_subprocess_envs": "subprocess_env",
    "close_subprocess_envs": "subprocess_env",
    "subprocess_env_constructor": "subprocess_batched",
    "SubprocessEnvError": "subprocess_env",
    "SubprocessEnvCrashError": "subprocess_env",
    "SubprocessEnvClosedError": "subprocess_env",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
