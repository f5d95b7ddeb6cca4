"""Optional capabilities of environments, declared here so that a reader finds
them in one place (the driver and the learner check for them with
`isinstance`, not by probing attributes).

- `Restartable`: the environment's work happens in something that can die
  and is recreated (a child process, a Ray actor); `restarts` counts that.
  SubprocessEnv, BatchedSubprocessEnv and RayBatchedEnv are Restartable;
  training runs write the total as the `Env/restarts` summary.

A TFEnvironment has a capability when it is a `TFPyEnvironment` whose
Python environment has it (`python_env(tf_env)`).
"""

import abc

from tf_agents.environments import tf_py_environment


class Restartable(abc.ABC):
    """An environment whose worker is recreated when it dies.

    Threads: `restarts` may be read by any thread (a snapshot).
    """

    @property
    @abc.abstractmethod
    def restarts(self) -> int:
        """How many times a worker of this environment was recreated, in total."""


def python_env(tf_env):
    """The Python environment behind `tf_env` (a TFPyEnvironment), else None."""
    if isinstance(tf_env, tf_py_environment.TFPyEnvironment):
        return tf_env.pyenv
    return None


def restarts_of(tf_env):
    """`tf_env`'s restart count if its Python environment is Restartable, else None."""
    env = python_env(tf_env)
    return env.restarts if isinstance(env, Restartable) else None
