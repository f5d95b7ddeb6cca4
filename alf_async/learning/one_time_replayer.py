"""`OneTimeReplayer`: the learner trains on exactly the batch that was dequeued.

Each row's unroll is preceded by the last step of the row's previous
unroll, so that no transition is lost between unrolls; `sample` returns
the batch whole or cut into the overlapping windows of `num_steps` the
agent trains on.

Threads: called by the learner's thread only (`run_async()` calls the
observers, the learner samples); nothing blocks.
"""

import types

import gin
import numpy as np
import tensorflow as tf
from tf_agents.trajectories import trajectory
from tf_agents.trajectories.time_step import StepType

from alf_async.learning.replayer_base import Replayer


def _windows(exp, num_steps):
    """[R, T, ...] -> [R * (T - num_steps + 1), num_steps, ...], all overlapping windows."""
    T = tf.nest.flatten(exp)[0].shape[1]
    if num_steps is None or num_steps == T:
        return exp
    if T is not None and num_steps > T:
        raise ValueError(f"the agent trains on sequences of {num_steps} steps but the "
                         f"driver's unrolls have {T}: set unroll_length >= {num_steps}")
    num_windows = tf.shape(tf.nest.flatten(exp)[0])[1] - num_steps + 1
    index = tf.range(num_windows)[:, None] + tf.range(num_steps)[None, :]

    def cut(t):
        w = tf.gather(t, index, axis=1)  # [R, num_windows, num_steps, ...]
        return tf.reshape(w, [-1, num_steps] + t.shape[2:].as_list())

    return tf.nest.map_structure(cut, exp)


@gin.configurable
class OneTimeReplayer(Replayer):
    """Keeps only the latest dequeued batch; `sample()` returns it (or its windows).

    Linked unrolls (`link_unrolls=True`, the default). Each row's unroll
    [T] is kept as [T + 1] steps: preceded by the last step of the same
    env row's previous unroll (ALF's and IMPALA's overlap of consecutive
    unrolls by one step). That step's transition (its action, reward and
    the unroll's first observation as its next) is trained on here, and
    the unroll's own last step only bootstraps (actor-critic agents train
    on a [B, T + 1] batch's first T transitions): every transition a row
    makes is trained on exactly once, none dropped at unroll boundaries.
    A row's first unroll, or one that does not continue the step kept for
    its row (the kept step's `next_step_type` is not the unroll's first
    `step_type`: a restarted environment), is preceded by an inert
    boundary step instead: the unroll's first step marked LAST -> FIRST,
    reward 0, discount 1, which tf-agents' agents (and ours) mask as
    they mask episode boundaries. Rows are told apart by env id; a row
    may appear twice in one batch (two consecutive unrolls, in order).
    Needs `Trajectory` experience.

    With `link_unrolls=False` the batch is kept as dequeued: with unroll
    length T and `num_steps` n a row gives T - n + 1 windows, and the n - 1
    transitions that span two consecutive unrolls are not trained on.

    Every batch has the first batch's number of rows (`batch_rows`, if
    given); unrolls may differ in length from batch to batch. Calling
    `sample()` twice trains twice on the same batch. Nothing of it is
    checkpointed: a resumed run's environments start anew.

    The batch is kept in variables shaped [rows, any length, ...], made at
    the first batch, or at construction when `data_spec` and `batch_rows`
    are given: `sample` can then be traced before the first batch
    (`traceable_before_data`), so the learner builds its train iteration
    while the driver collects that batch, as it does with a replay buffer.
    """

    def __init__(self, data_spec=None, num_rows=None, link_unrolls=True, batch_rows=None,
                 name="one_time_replayer"):
        """
        Args:
            data_spec: the Trajectory spec of one step of the experience
                (used with `batch_rows` only).
            num_rows: the number of environment rows (unused; for a
                signature shared with `UniformReplayer`).
            link_unrolls: precede each row's unroll by its previous unroll's
                last step (see the class docstring).
            batch_rows: the rows (unrolls) of every batch it will be given
                (the driver's learn_queue_cap x env_batch_size), or None:
                the first batch's. Needs `data_spec`.
            name: the module's name.
        """
        super().__init__(name=name)
        del num_rows
        if batch_rows is not None and (data_spec is None or isinstance(batch_rows, bool)
                                       or not isinstance(batch_rows, int) or batch_rows < 1):
            raise ValueError(f"OneTimeReplayer(batch_rows=...) needs an int >= 1 and the "
                             f"data_spec, got batch_rows={batch_rows!r} and data_spec="
                             f"{'None' if data_spec is None else 'given'}")
        # Untracked (not checkpointed; a resumed run's driver starts anew):
        # the batch, whether one came, and the last step of each env row's
        # latest unroll [rows seen, ...] with env id -> its row there.
        # The traced linking is made with the batch variables.
        self._state = types.SimpleNamespace(batch=None, has_data=False, kept_steps=None,
                                            kept_index={}, link_fn=None)
        self._linking = bool(link_unrolls)
        self._batch_rows = batch_rows
        if batch_rows is not None:
            self._make_variables(tf.nest.map_structure(
                lambda s: tf.TensorSpec([batch_rows, 0] + s.shape.as_list(), s.dtype),
                data_spec))

    @property
    def traceable_before_data(self):
        """True when the batch variables were made at construction (`batch_rows`)."""
        return self._batch_rows is not None

    def trace(self):
        """Traces the linking of a batch of `batch_rows` rows of any length
        without writing one (the learner does it while the driver collects
        its first batch); nothing without `batch_rows` or linking."""
        if not (self._linking and self.traceable_before_data):
            return
        rows = self._batch_rows
        exp = tf.nest.map_structure(
            lambda v: tf.TensorSpec([rows, None] + v.shape.as_list()[2:], v.dtype),
            self._state.batch)
        kept = tf.nest.map_structure(lambda t: tf.TensorSpec([None] + t.shape.as_list()[1:],
                                                             t.dtype), self._state.kept_steps)
        self._state.link_fn.get_concrete_function(
            exp, kept, tf.TensorSpec([rows], tf.int32), tf.TensorSpec([rows], tf.bool),
            tf.TensorSpec([None], tf.int32))

    def __call__(self, exp, env_ids):
        rows = int(tf.nest.flatten(exp)[0].shape[0])
        if self._batch_rows is not None and rows != self._batch_rows:
            raise ValueError(f"OneTimeReplayer(batch_rows={self._batch_rows}) was given a batch "
                             f"of {rows} rows")
        if self._linking:
            self._store_linked(exp, np.asarray(env_ids).tolist())
        else:
            # Kept in variables (made at the first batch, whose number of rows
            # every batch has) so that a traced train step reads the latest batch.
            if self._state.batch is None:
                self._make_variables(exp)
            tf.nest.map_structure(lambda v, t: v.assign(t), self._state.batch, exp)
        self._state.has_data = True

    def _make_variables(self, batch_spec):
        """The batch variables, shaped like `batch_spec` [N, T, ...] (a nest
        of tensors or TensorSpecs) with any T: every batch has N rows, its
        unrolls may be of any length (tf-agents' DynamicStepDriver in a
        synchronous loop collects a varying number of steps per row); when
        linking (T then the unroll's steps + 1), the kept steps (none yet)
        and the traced linking too."""
        with self.name_scope:
            self._state.batch = tf.nest.map_structure(
                lambda t: tf.Variable(tf.zeros(t.shape, t.dtype), trainable=False, name="batch",
                                      shape=tf.TensorShape([t.shape[0], None] + list(t.shape[2:]))),
                batch_spec)
        if self._linking:
            self._state.kept_steps = tf.nest.map_structure(
                lambda t: tf.zeros([0] + t.shape.as_list()[2:], t.dtype), batch_spec)
            self._state.link_fn = tf.function(self._link_graph, autograph=False,
                                              reduce_retracing=True)

    def _store_linked(self, exp, env_ids):
        """Stores [N, T] as [N, T + 1], each row preceded by its env row's kept
        step; keeps each env row's latest last step. The tensor work is one
        graph call (eager ops would each wait for the GIL behind the env
        threads); only the row bookkeeping is Python."""
        if not isinstance(exp, trajectory.Trajectory):
            raise ValueError(f"OneTimeReplayer(link_unrolls=True) needs Trajectory "
                             f"experience, got {type(exp).__name__}; pass "
                             f"link_unrolls=False for other nests")
        exp = tf.nest.map_structure(tf.convert_to_tensor, exp)
        if self._state.batch is None:
            self._make_variables(tf.nest.map_structure(
                lambda t: tf.TensorSpec([t.shape[0], t.shape[1] + 1] + t.shape[2:], t.dtype),
                exp))
        index = self._state.kept_index
        num_kept = int(tf.nest.flatten(self._state.kept_steps)[0].shape[0])
        # Sources of the preceding steps in [kept steps; this batch's last steps].
        source, has_previous, latest = [], [], dict(index)
        for i, env_id in enumerate(env_ids):
            row = latest.get(env_id)
            has_previous.append(row is not None)
            source.append(0 if row is None else row)
            latest[env_id] = num_kept + i
        # Each env row's latest last step is kept (a row not in this batch keeps its own).
        order = sorted(latest.items())
        self._state.kept_index = {env_id: k for k, (env_id, _) in enumerate(order)}
        self._state.kept_steps = self._state.link_fn(
            exp, self._state.kept_steps, tf.constant(source, tf.int32),
            tf.constant(has_previous), tf.constant([row for _, row in order], tf.int32))

    def _link_graph(self, exp, kept, source, has_previous, keep):
        """Writes the linked batch to the batch variables; returns the kept steps."""
        first = tf.nest.map_structure(lambda t: t[:, 0], exp)
        pool = tf.nest.map_structure(lambda k, t: tf.concat([k, t[:, -1]], axis=0), kept, exp)
        previous = tf.nest.map_structure(lambda t: tf.gather(t, source), pool)
        continues = tf.logical_and(has_previous,
                                   tf.equal(previous.next_step_type, first.step_type))
        n = tf.shape(source)
        boundary = first._replace(
            step_type=tf.fill(n, StepType.LAST), next_step_type=tf.fill(n, StepType.FIRST),
            reward=tf.nest.map_structure(tf.zeros_like, first.reward),
            discount=tf.ones_like(first.discount))

        def precede(v, t, prev, inert):
            cond = tf.reshape(continues, tf.concat([n, tf.ones([t.shape.rank - 2], tf.int32)],
                                                   axis=0))
            return v.assign(tf.concat([tf.where(cond, prev, inert)[:, None], t], axis=1))

        updates = tf.nest.flatten(tf.nest.map_structure(precede, self._state.batch, exp,
                                                        previous, boundary))
        with tf.control_dependencies(updates):
            return tf.nest.map_structure(lambda t: tf.gather(t, keep), pool)

    def num_frames(self):
        """Steps held: those of the latest batch (with the steps preceding its rows)."""
        if not self._state.has_data:
            return 0
        return int(np.prod(tf.shape(tf.nest.flatten(self._state.batch)[0])[:2]))

    def can_sample(self, num_steps):
        del num_steps
        return self._state.has_data

    def sample(self, sample_batch_size=None, num_steps=None):
        """The latest batch, or all its windows of `num_steps`.

        Args:
            sample_batch_size: ignored: the batch is what was dequeued.
            num_steps: window length (the agent's train_sequence_length);
                None for whole (linked) unrolls.
        """
        del sample_batch_size
        if self._state.batch is None or (tf.executing_eagerly() and not self._state.has_data):
            raise ValueError("OneTimeReplayer.sample() before any experience was observed")
        return _windows(tf.nest.map_structure(tf.convert_to_tensor, self._state.batch),
                        num_steps)

