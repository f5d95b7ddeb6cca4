"""Optional capabilities of environments, declared here so that a reader finds
them in one place (the driver and the learner check for them with
`isinstance`, not by probing attributes).

- `Restartable`: the environment's work happens in something that can die
  and is recreated (a child process, a Ray actor); `restarts` counts that.
  SubprocessEnv, BatchedSubprocessEnv and RayBatchedEnv are Restartable;
  training runs write the total as the `Env/restarts` summary.
- `BlockingStep`: the environment's step waits on something outside the
  process (a child process, a Ray actor, an external client). The driver
  steps it from Python threads rather than inside TF's inter-op pool, steps
  the rows of a batch of them one by one (env_rows.py), and closes it at
  once on stop. SubprocessEnv, BatchedSubprocessEnv, RayBatchedEnv and
  ExternalEnv's slots are BlockingStep. An environment that cannot subclass
  it opts in with the attribute `blocking_step = True` (`steps_block`).

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


class BlockingStep(abc.ABC):
    """A PyEnvironment whose step blocks on something outside the process.

    Its `close()` must be safe from any thread and end a step in progress:
    the driver calls it from its stopping thread. A marker: no methods.
    """


def steps_block(py_env):
    """True when `py_env` is a BlockingStep or declares `blocking_step = True`."""
    return isinstance(py_env, BlockingStep) or bool(getattr(py_env, "blocking_step", False))


def python_env(tf_env):
    """The Python environment behind `tf_env` (a TFPyEnvironment), else None."""
    if isinstance(tf_env, tf_py_environment.TFPyEnvironment):
        return tf_env.pyenv
    return None


def restarts_of(tf_env):
    """`tf_env`'s restart count if its Python environment is Restartable, else None."""
    env = python_env(tf_env)
    return env.restarts if isinstance(env, Restartable) else None
