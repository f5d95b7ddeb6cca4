"""What an AppliedStep environment applied, recorded by the env thread.

The env thread's half of `capabilities.AppliedStep` (read that class's
docstring for the contract), shared by both of its Python loops:

- `put_action` writes an applied action over the policy's in the arrays a
  loop builds its trajectory from;
- `InertBoundaries.for_learner(unroll, trainable, rows)` returns the copy of
  complete unrolls the learn queue gets, in which every untrainable
  transition is an inert boundary; it keeps, per row, whether the row's
  last shipped transition needs the next one's observation. The log queue
  gets the unrolls as they happened.

`python_loop.py` (a batch stepped in lockstep) uses `AppliedSteps`:
after each step it reads the environment's `applied_step()`, puts the
applied action into the policy step, keeps the step's `trainable` flags and
makes each complete unroll of the B rows inert where needed.
`rows_loop.py` (rows stepped one by one, env_rows.py) reads each
row's `applied_step()` on the row's worker, records the applied action and
flag in that row's unroll (`env_rows.RowRecorder`), and hands the unrolls it
ships, with their flags and rows, to an `InertBoundaries`.

`wait_until_learner_took_all(learn_queue, coord)` is what an env thread does
before it raises `capabilities.EndOfData`.

Threads: an `AppliedSteps` or `InertBoundaries` belongs to one env thread,
which calls all of its methods; nothing blocks. `wait_until_learner_took_all`
blocks the env thread until the learn queue holds less than one learner
batch, or the driver stops.
"""

import time

import numpy as np
import tensorflow as tf
from tf_agents.environments import batched_py_environment
from tf_agents.trajectories.time_step import StepType

from alf_async.environments import capabilities

_DRAIN_POLL_SECS = 0.01


def put_action(leaves, index, action):
    """Writes the action nest `action` into the flat arrays `leaves` at `index`
    (a row, or a (row, t) cell): how both env-thread loops record an applied action."""
    for leaf, value in zip(leaves, tf.nest.flatten(action)):
        leaf[index] = value


class InertBoundaries(object):
    """Makes the untrainable transitions of complete unrolls inert, row by row.

    The learn queue's copy of an unroll replaces every transition whose
    `trainable` flag is False with an inert boundary (see
    `capabilities.AppliedStep`); the observation of such a transition is
    kept only when the trainable transition before it in the same row needs
    it as its next observation, which may be the last transition of that
    row's previous unroll: that much state is kept per row.

    Threads: one env thread calls `for_learner`; nothing blocks.
    """

    def __init__(self, trajectory_spec, action_spec, num_rows):
        """
        Args:
            trajectory_spec: the unroll's Trajectory spec (TensorSpecs [T, ...]).
            action_spec: the environment's action TensorSpec nest (unbatched).
            num_rows: how many rows the env thread ships unrolls of.
        """
        self._trajectory_spec = trajectory_spec
        self._num_leaves = len(tf.nest.flatten(trajectory_spec))
        # Per row: the last transition shipped is trainable and not a
        # boundary, i.e. it needs the next transition's observation.
        self._needs_next = np.zeros([num_rows], bool)
        self._blank_action = [np.asarray(getattr(s, "minimum", 0), s.dtype.as_numpy_dtype)
                              for s in tf.nest.flatten(action_spec)]

    def for_learner(self, unroll, trainable, rows):
        """The learn queue's copy of complete unrolls.

        Args:
            unroll: flat trajectory [n, T, ...] + any further components
                (env ids), as the learn queue takes them.
            trainable: bool [n, T], each transition's flag.
            rows: int [n], the row of each unroll; a row may appear more
                than once, its unrolls in the order they happened.

        Returns:
            `unroll` itself when every transition is trainable, else a copy
                whose untrainable transitions are inert boundaries.
        """
        traj = tf.nest.pack_sequence_as(self._trajectory_spec, unroll[:self._num_leaves])
        step_type = np.asarray(traj.step_type)
        boundary = step_type == StepType.LAST
        carried = trainable[:, -1] & ~boundary[:, -1]
        first_needs_next = np.empty([len(rows)], bool)
        for i, r in enumerate(rows):   # in order: a row's next unroll follows its last
            first_needs_next[i] = self._needs_next[r]
            self._needs_next[r] = carried[i]
        if trainable.all():
            return unroll
        needs_next = np.concatenate(
            [first_needs_next[:, None], (trainable & ~boundary)[:, :-1]], axis=1)
        inert = ~trainable
        blank = inert & ~needs_next

        def where(cells, value, leaf):
            cells = cells.reshape(cells.shape + (1,) * (leaf.ndim - 2))
            return np.where(cells, np.asarray(value, leaf.dtype), leaf)

        traj = traj._replace(
            step_type=where(inert, StepType.LAST, step_type),
            next_step_type=where(inert, StepType.FIRST, np.asarray(traj.next_step_type)),
            reward=where(inert, 0, np.asarray(traj.reward)),
            discount=where(inert, 1, np.asarray(traj.discount)),
            observation=tf.nest.map_structure(lambda o: where(blank, 0, np.asarray(o)),
                                              traj.observation),
            action=tf.nest.pack_sequence_as(traj.action, [
                where(inert, v, np.asarray(a))
                for a, v in zip(tf.nest.flatten(traj.action), self._blank_action)]),
            policy_info=tf.nest.map_structure(lambda i: where(inert, 0, np.asarray(i)),
                                              traj.policy_info))
        return tf.nest.flatten(traj) + list(unroll[self._num_leaves:])


class AppliedSteps(object):
    """Applied actions and trainable flags of an environment stepped as one batch
    (python_loop.py)."""

    def __init__(self, py_env, trajectory_spec, action_spec, batch_size):
        """
        Args:
            py_env: the AppliedStep environment (or a BatchedPyEnvironment of
                unbatched ones), batch size `batch_size`.
            trajectory_spec: the unroll's Trajectory spec (TensorSpecs [T, ...]).
            action_spec: the environment's action TensorSpec nest (unbatched).
            batch_size: B.
        """
        if isinstance(py_env, capabilities.AppliedStep):
            self._envs = None
            self._env = py_env
        elif isinstance(py_env, batched_py_environment.BatchedPyEnvironment):
            self._envs = list(py_env.envs)
        else:
            raise TypeError(f"{type(py_env).__name__} is not an AppliedStep environment")
        self._B = batch_size
        self._rows = np.arange(batch_size)
        self._trainable = []     # [B] flags of the unroll's steps so far
        self._inert = InertBoundaries(trajectory_spec, action_spec, batch_size)

    def after_step(self, policy_step):
        """Reads what the step applied; returns `policy_step` with that action."""
        flat = [np.asarray(a) for a in tf.nest.flatten(policy_step.action)]
        if self._envs is None:
            action, trainable = self._env.applied_step()
            self._trainable.append(np.broadcast_to(np.asarray(trainable, bool), [self._B]))
            if action is None:
                return policy_step
            flat = [np.asarray(a, p.dtype).reshape(p.shape)
                    for a, p in zip(tf.nest.flatten(action), flat)]
        else:
            applied = [env.applied_step() for env in self._envs]
            self._trainable.append(np.array([bool(t) for _, t in applied]))
            if all(a is None for a, _ in applied):
                return policy_step
            flat = [np.array(a) for a in flat]
            for r, (action, _) in enumerate(applied):
                if action is not None:
                    put_action(flat, r, action)
        return policy_step._replace(action=tf.nest.pack_sequence_as(policy_step.action, flat))

    def for_learner(self, unroll):
        """The learn queue's copy of a complete unroll (flat trajectory [B, T, ...]
        + env ids): untrainable transitions made inert boundaries."""
        trainable = np.stack(self._trainable, axis=1)   # [B, T]
        self._trainable = []
        return self._inert.for_learner(unroll, trainable, self._rows)


def wait_until_learner_took_all(learn_queue, coord):
    """Blocks until `learn_queue` holds less than one learner batch (the rest
    can never make one) or `coord` stops; called by an env thread before it
    raises EndOfData."""
    while not coord.should_stop():
        try:
            if int(learn_queue.size()) < learn_queue.capacity:
                return
        except tf.errors.OpError:   # closed and gone: the driver is stopping
            return
        time.sleep(_DRAIN_POLL_SECS)
