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
  once on stop. SubprocessEnv, BatchedSubprocessEnv, RayBatchedEnv, EnvPoolEnv
  and ExternalEnv's slots are BlockingStep. An environment that cannot
  subclass it (one a suite built and wrapped) declares it with the attribute
  `blocking_step = True` on itself or its class: `isinstance(env,
  BlockingStep)` is True for it too, and that check is the only place the
  attribute is read.
- `GilFreeStep`: the environment's step waits with the GIL released
  (EnvPool's lockstep pool, whose C++ threads step the games). The driver
  steps it in its graph loop as any in-process environment, but without
  the step token that makes other graph-mode Python steps take turns: they
  would only hold the GIL one at a time anyway, while two pools step at
  once (benchmarks/results/HISTORY.md has the runs).
- `AppliedStep`: right after each step the environment says which action it
  actually applied and whether the transition may be trained on
  (`applied_step()`); the env thread records that action in the trajectory
  and ships untrainable transitions to the learner only as inert
  boundaries. ExternalEnv's slots are AppliedStep (logged actions,
  `training_enabled=False` episodes); any environment that clips, overrides
  or vetoes actions may be.
- Row steppers (`alf_async.roles.RowStepper`): what steps the rows of a
  batch one by one for their env thread. Two kinds of environment offer
  their own, each a class here, so that the driver needs no Python thread
  per row:
  - `RowStepping`: a batched environment that steps its own rows one by
    one, each as soon as it has its action, and reports whichever rows are
    ready (EnvPool's asynchronous mode: suites.envpool_envs.EnvPoolEnv;
    `make_row_stepper`).
  - `OffersRowStepper`: an unbatched environment, a row of a batch of them,
    that can step the batch's rows itself when they are all of its kind
    (ExternalEnv's slots, SubprocessEnvs; `row_stepper`).
  Rows of other blocking environments get the driver's row workers.
- `RowFailed`: what a row stepper (the driver's RowWorkers, SlotStepper,
  SubprocessRows, EnvPoolRows) reports for a row instead of its time step
  when that row's environment raised; the env thread raises the error
  again.
- `EndOfData`: the exception a step raises when its environment will never
  produce experience again (ExternalEnvFinished is one); the env thread
  raises it once the learner has taken every full batch left.

A TFEnvironment has a capability when it is a `TFPyEnvironment` whose
Python environment has it (`python_env(tf_env)`).
"""

import abc

import numpy as np
import tensorflow as tf
from tf_agents.environments import batched_py_environment, tf_py_environment


class Restartable(abc.ABC):
    """An environment whose worker is recreated when it dies.

    Threads: `restarts` may be read by any thread (a snapshot).
    """

    @property
    @abc.abstractmethod
    def restarts(self) -> int:
        """How many times a worker of this environment was recreated, in total."""


class _DeclaredBlocking(abc.ABCMeta):
    """BlockingStep's metaclass: `isinstance(env, BlockingStep)` is also True
    for an environment that declares `blocking_step = True` (on itself, its
    class, or, through tf-agents' wrappers' attribute forwarding, the
    environment it wraps): the documented opt-in of an environment that
    cannot subclass BlockingStep (docs/guides/environments.md, "Blocking steps")."""

    def __instancecheck__(cls, instance):
        if super().__instancecheck__(instance):
            return True
        return cls is BlockingStep and bool(getattr(instance, "blocking_step", False))


class BlockingStep(abc.ABC, metaclass=_DeclaredBlocking):
    """A PyEnvironment whose step blocks on something outside the process.

    Subclass it, or declare `blocking_step = True` (see the module
    docstring). Its `close()` must be safe from any thread and end a step in
    progress: the driver calls it from its stopping thread. A marker: no
    methods.
    """


class GilFreeStep(abc.ABC):
    """A PyEnvironment whose step waits with the GIL released (EnvPool's
    lockstep pool): an env thread steps it in its graph loop without the
    step token (see the module docstring). A marker: no methods."""


class AppliedStep(abc.ABC):
    """A PyEnvironment that reports, right after each step, what that step applied.

    The env thread (a Python loop: environments with this capability are
    never stepped inside the graph; rows of a batch stepped one by one are
    each read by their own worker, env_rows.py) calls `applied_step()` after
    every `step()` and before the next call to the environment, and then

    - records the returned action in the trajectory instead of the policy's
      (for the log queue and the learn queue alike);
    - ships every transition with `trainable` False to the learn queue as an
      inert boundary: step_type LAST, next_step_type FIRST, reward 0,
      discount 1, action and policy info blanked (zeros, or the action
      spec's minimum), and the observation blanked too unless the
      transition before it in the same row is trainable and needs it as its
      next observation. tf-agents' losses mask every transition that starts
      at a LAST step, so none of these trains the agent, and nothing of a
      transition that no trainable one depends on reaches the learner.
      Boundaries rather than dropping: the learn queue carries unrolls of a
      fixed length T, and a replayer's n-step windows need each row's steps
      contiguous. The log queue gets the transition as it happened, so the
      metrics count it like any other.

    Threads: `applied_step()` is called by the thread that steps the
    environment (the env thread, or the row's worker thread when the rows
    of a batch are stepped one by one), after `step()` returned on that same
    thread.
    """

    @abc.abstractmethod
    def applied_step(self):
        """What the last `step()` applied.

        Returns:
            (action, trainable): `action` the action nest actually applied
                (numpy, with the environment's batch dimension when it is
                batched), or None when it applied the action it was given;
                `trainable` a bool (a bool array [batch_size] when batched):
                False keeps the transition from the learner.
        """


class RowStepping(abc.ABC):
    """A batched PyEnvironment whose rows can be stepped one by one, each as
    soon as its action comes, by a stepper the environment makes itself.

    The driver's env thread steps such an environment row by row instead of
    as one batch: no row waits for the others' steps. The environment's
    `close()` may be called from another thread once its env thread has
    left; while it has a stepper it is stepped through that stepper only.

    Threads: `make_row_stepper` and every stepper method are called by the
    env thread that owns the environment.
    """

    @abc.abstractmethod
    def make_row_stepper(self, on_rows):
        """A new `alf_async.roles.RowStepper` of this environment's rows.

        Args:
            on_rows: callable(rows, time_step), which the stepper's `recv`
                calls with the rows (int [n]) whose reset or step came and
                their time step (a tf-agents TimeStep batched over them),
                before it returns them; rows that failed are not recorded.
        """


class OffersRowStepper(abc.ABC):
    """An unbatched PyEnvironment, one row of a batch of separate
    environments, that can step the batch's rows itself with no Python
    thread per row (ExternalEnv's slots: slot_stepper.py; SubprocessEnvs:
    subprocess_rows.py).

    Threads: `row_stepper` and every stepper method are called by the env
    thread that owns the rows.
    """

    @abc.abstractmethod
    def row_stepper(self, rows, on_step):
        """A new `alf_async.roles.RowStepper` of `rows` (this environment
        among them), or None when it cannot step them all (they are not all
        of its kind): the driver's row workers step them then.

        Args:
            rows: the unbatched PyEnvironments of the batch, one per row.
            on_step: callable(row, time_step, applied), which the stepper
                calls for each row whose reset or step came, before it
                reports the row ready; `applied` is an AppliedStep row's
                `applied_step()` after a step, else None.
        """


class RowFailed(object):
    """What a row stepper reports instead of a time step when a row's
    environment raised; `error` is the exception, raised again by the env
    thread."""

    def __init__(self, error):
        self.error = error


class EndOfData(Exception):
    """Raised by a step: this environment will never produce experience again.

    The env thread raises it (stopping the driver, and again in the
    learner's thread) only once the learner has taken every full batch that
    is left, so finite data is learned from to its end.
    """


def reports_applied_step(py_env):
    """True when `py_env` is an AppliedStep, or a tf-agents BatchedPyEnvironment
    of AppliedStep environments."""
    if isinstance(py_env, AppliedStep):
        return True
    if isinstance(py_env, batched_py_environment.BatchedPyEnvironment):
        return all(isinstance(e, AppliedStep) for e in py_env.envs)
    return False


def steps_block(py_env):
    """True when `py_env` is a BlockingStep (by class or declaration)."""
    return isinstance(py_env, BlockingStep)


def steps_release_gil(py_env):
    """True when `py_env` is a GilFreeStep."""
    return isinstance(py_env, GilFreeStep)


def row_action(actions, j):
    """Row j's action (unbatched) of the action nest `actions`, batched over
    the rows a row stepper's `send` is given."""
    if isinstance(actions, np.ndarray):
        return actions[j]
    return tf.nest.map_structure(lambda a: a[j], actions)


def python_env(tf_env):
    """The Python environment behind `tf_env` (a TFPyEnvironment), else None."""
    if isinstance(tf_env, tf_py_environment.TFPyEnvironment):
        return tf_env.pyenv
    return None


def restarts_of(tf_env):
    """`tf_env`'s restart count if its Python environment is Restartable, else None."""
    env = python_env(tf_env)
    return env.restarts if isinstance(env, Restartable) else None
