"""Replayers: where the learner's experience goes between `run_async()` and training.

A replayer (`Replayer`, the interface) is an exp_observer of the driver,
`replayer(exp, env_ids)` with `exp` a batch-major Trajectory [rows, T, ...]
and `env_ids` int32 [rows], and it hands experience to the training step
with `sample(sample_batch_size, num_steps)` -> Trajectory [batch,
num_steps, ...]. `sample` uses TF ops only, so the learner traces it into
the same graph as `agent.train`.

- `OneTimeReplayer`: trains on exactly the batch that was dequeued (each
  row's unroll preceded by the last step of the row's previous unroll, so
  that no transition is lost between unrolls), whole or cut into the
  overlapping windows of `num_steps` the agent trains on.
- `UniformReplayer`: a replay buffer with one ring per environment row;
  samples windows uniformly, never across rows or across a row's write
  cursor. Its subclass `pixel_replayer.PixelReplayer` stores each frame of
  an image stack once.

Threads: both are called by the learner's thread only (`run_async()` calls
the observers, the learner samples); nothing blocks.
"""

import types

import gin
import numpy as np
import tensorflow as tf
from tensorflow.python.trackable.base import SaveType  # pylint: disable=no-name-in-module
from tf_agents.trajectories import trajectory
from tf_agents.trajectories.time_step import StepType


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


class Replayer(tf.Module):
    """The interface the learner uses; subclass it for your own replayer.

    Required: `__call__(exp, env_ids)` (an exp_observer), `can_sample(num_steps)`,
    `sample(sample_batch_size, num_steps)`, `num_frames()`.

    Optional capabilities, off by default (the learner and its hooks read
    them instead of probing attributes):
    - `traceable_before_data`: True when `sample` can be traced before the
      first batch arrived; the learner then builds its train iteration at
      start-up, on a helper thread, while the driver collects.
    - `trace()`: builds the graph that writes a batch without writing one;
      the learner calls it while the driver collects its first batch.
    - `policy_lag()`: the latest sample's policy lag (summaries, progress lines).
    """

    traceable_before_data = False

    def __call__(self, exp, env_ids):
        raise NotImplementedError

    def can_sample(self, num_steps):
        """True once `sample(..., num_steps)` can return data."""
        raise NotImplementedError

    def sample(self, sample_batch_size, num_steps=None):
        raise NotImplementedError

    def num_frames(self):
        """Steps currently held."""
        raise NotImplementedError

    def trace(self):
        """Builds the write graph ahead of the first batch (nothing by default)."""

    def policy_lag(self):
        """(mean, max) policy lag of the latest sample, in train steps, or None
        where it is not measured (see `policy_lag.PolicyLag`)."""
        return None


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


@gin.configurable
class UniformReplayer(Replayer):
    """A uniform replay buffer with one ring of `capacity_per_row` steps per env row.

    Why not tf-agents' `TFUniformReplayBuffer`: its `add_batch` writes one
    item to every one of its `batch_size` rows at once, i.e. it assumes every
    batch holds all environments in a fixed order. The driver's batches hold
    the unrolls of whichever env threads were ready (a subset, in any order,
    sometimes two consecutive unrolls of one env row). So each env row
    (global env id) here owns a ring and a write counter; an unroll is
    written at its row's cursor, and a sampled window of `num_steps` lies
    inside one row and between that row's oldest kept step and its cursor —
    an n-step sample never joins two environments, nor the newest step with
    the oldest of a wrapped ring.

    Windows are sampled uniformly over all valid windows of all rows. The
    storage is `tf.Variable`s; a `tf.train.Checkpoint` (or tf-agents'
    `Checkpointer(replay_buffer=...)`) saves and restores the part of it
    that holds steps: the first `max(min(written, capacity_per_row))` slots
    of every row, with each row's count of steps written. A checkpoint of a
    replay holding 3,000 steps is the bytes of about 3,000 steps, whatever
    its capacity; a full one is the whole storage, as it is in memory.
    Restored, the rows hold the same steps in the same slots, so a sample
    with the same seed draws the same windows (slots past a row's held
    steps are never read, and a restore leaves them as they were).
    """

    # `sample` can be traced before any data arrives (it fails only when run).
    traceable_before_data = True

    def __init__(self, data_spec, num_rows, capacity_per_row=10000, name="uniform_replayer"):
        """
        Args:
            data_spec: nest of `tf.TensorSpec`s of one step (the agent's
                `collect_data_spec`).
            num_rows: number of environment rows (num_envs * env batch size);
                env ids must lie in [0, num_rows).
            capacity_per_row: steps each row keeps; must be at least the
                steps one driver batch can bring to one row.
            name: the module's name (and its variables').
        """
        super().__init__(name=name)
        if num_rows < 1 or capacity_per_row < 1:
            raise ValueError(f"UniformReplayer needs num_rows >= 1 and capacity_per_row >= 1, "
                             f"got {num_rows} and {capacity_per_row}")
        self._spec = data_spec
        self._num_rows = num_rows
        self._capacity = capacity_per_row
        with self.name_scope:
            # tf.zeros hands its buffer to the variable: no second copy at the peak.
            self._storage = tf.nest.map_structure(
                lambda s: tf.Variable(tf.zeros([num_rows, capacity_per_row] + s.shape.as_list(),
                                               s.dtype), trainable=False, name="storage"),
                self._stored_spec())
            # Steps ever written per row; the row's cursor is written % capacity.
            self._written = tf.Variable(tf.zeros([num_rows], tf.int64), trainable=False,
                                        name="written")
        # A signature with free [rows, T] so that one trace serves every batch
        # and `trace()` can build it before the first batch arrives.
        batch_spec = tf.nest.map_structure(
            lambda s: tf.TensorSpec([None, None] + s.shape.as_list(), s.dtype), data_spec)
        self._add = tf.function(self._add_graph, autograph=False, input_signature=(
            batch_spec, tf.TensorSpec([None], tf.int32)))
        self._add_fn = None

    # Steps before a window's first step that `sample` reads too (a subclass's
    # frame history): in a wrapped ring the oldest `_history` steps held start
    # no window, so every step a window reads is still held.
    _history = 0

    def _stored_spec(self):
        """What a ring slot holds: one step of `data_spec` (a subclass may store
        steps in another form; `__init__` calls it once)."""
        return self._spec

    def _trackable_children(self, save_type=SaveType.CHECKPOINT, **kwargs):
        children = super()._trackable_children(save_type, **kwargs)
        if save_type == SaveType.CHECKPOINT:
            # Saved by `_serialize_to_tensors`, the filled part only: as
            # children, the variables would be saved whole (a 1M-step pixel
            # replay is 7 GB however few steps it holds).
            children = {name: child for name, child in children.items()
                        if name not in ("_storage", "_written")}
        return children

    def _serialize_to_tensors(self):
        filled = self._filled_slots()
        tensors = {"written": self._written.read_value(),
                   "capacity_per_row": tf.constant(self._capacity, tf.int64)}
        # Sparse reads: the scatter writes put the variables in TF's
        # copy-on-read mode, where reading one (or a slice of it) copies
        # all of it first (7 GB for a 1M-step pixel replay).
        slots = self._first_slots(filled)
        for i, v in enumerate(tf.nest.flatten(self._storage)):
            tensors[f"storage_{i}"] = tf.gather_nd(v, slots)
        return tensors

    def _restore_from_tensors(self, restored_tensors):
        storage = tf.nest.flatten(self._storage)
        names = sorted(restored_tensors)
        if names != sorted(["written", "capacity_per_row"] +
                           [f"storage_{i}" for i in range(len(storage))]):
            raise ValueError(f"{type(self).__name__}: the checkpoint holds {names}, not this "
                             f"replayer's {len(storage)} storage arrays")
        # A row's step t sits in slot t % capacity: another capacity would
        # misplace a ring that has wrapped.
        saved = int(restored_tensors["capacity_per_row"])
        if saved != self._capacity:
            raise ValueError(f"{type(self).__name__}: the checkpoint's replay has "
                             f"capacity_per_row={saved}, this one {self._capacity}")
        for i, v in enumerate(storage):
            t = restored_tensors[f"storage_{i}"]
            if not t.shape[:1].concatenate(t.shape[2:]).is_compatible_with(
                    v.shape[:1].concatenate(v.shape[2:])) or t.shape[1] > self._capacity:
                raise ValueError(f"{type(self).__name__}: a checkpointed storage array of "
                                 f"shape {t.shape} does not fit this replayer's {v.shape}")
            # In place (an assign would copy `t` first while the restore
            # still holds it: three times the storage at the peak).
            v.scatter_nd_update(self._first_slots(t.shape[1]), t)
        return self._written.assign(restored_tensors["written"])

    def _held(self):
        """Per row [R]: the steps it holds."""
        return tf.minimum(self._written, self._capacity)

    def _filled_slots(self):
        """Slots [0, n) of some row hold steps; no row holds any past n."""
        return int(tf.reduce_max(self._held()))

    def _first_slots(self, n):
        """The [rows, n, 2] (row, slot) indices of every row's slots [0, n)."""
        rows = tf.range(self._num_rows, dtype=tf.int64)
        return self._index(rows, tf.broadcast_to(tf.range(n, dtype=tf.int64)[None, :],
                                                 [self._num_rows, n]))

    def trace(self):
        """Builds the graph that writes a batch, without writing one (the
        learner does it while the driver collects its first batch)."""
        self._add_concrete()

    def _add_concrete(self):
        # Called as a ConcreteFunction: the tf.function's own dispatch
        # (signature binding, cache lookup) would cost more per call.
        if self._add_fn is None:
            self._add_fn = self._add.get_concrete_function()
        return self._add_fn

    @property
    def capacity_per_row(self):
        return self._capacity

    @property
    def num_rows(self):
        return self._num_rows

    def __call__(self, exp, env_ids):
        """Appends each row of `exp` [N, T, ...] to the ring of its env id."""
        self._add_concrete()(exp, self._check_batch(exp, env_ids))

    def _check_batch(self, exp, env_ids):
        """Refuses a batch that does not fit; returns `env_ids` as an int32 tensor."""
        tf.nest.assert_same_structure(self._spec, exp)
        T = int(tf.nest.flatten(exp)[0].shape[1])
        env_ids = tf.convert_to_tensor(env_ids, tf.int32)
        most = int(np.bincount(env_ids.numpy()).max()) * T
        if most > self._capacity:
            # Two writes to one slot in one scatter would land in any order.
            raise ValueError(f"a batch brings {most} steps to one env row, more than "
                             f"capacity_per_row={self._capacity}: raise capacity_per_row to "
                             f"at least learn_queue_cap * unroll_length")
        return env_ids

    def _add_graph(self, exp, env_ids):
        return self._write(self._row_ids(env_ids), exp)

    def _row_ids(self, env_ids):
        """int32 env ids [N] -> int64 row ids, checked to lie in [0, num_rows)."""
        ids = tf.cast(env_ids, tf.int64)
        tf.debugging.assert_less(ids, tf.constant(self._num_rows, tf.int64),
                                 message=f"{type(self).__name__}: env id >= num_rows")
        return ids

    def _write(self, ids, stored):
        """Writes `stored` (a nest like `_stored_spec()`, [N, T, ...]) at the
        cursors of rows `ids` [N] and advances them; returns the update."""
        T = tf.shape(tf.nest.flatten(stored)[0], out_type=tf.int64)[1]
        # A row may appear twice in one batch (two consecutive unrolls of a
        # fast env, in order): the k-th occurrence goes k unrolls further.
        rank = tf.reduce_sum(tf.cast(_earlier_same_row(ids), tf.int64), axis=1)
        start = tf.gather(self._written, ids) + rank * T  # [N]
        index = self._index(ids, start[:, None] + tf.range(T)[None, :])  # [N, T, 2]
        updates = [v.scatter_nd_update(index, t) for v, t in
                   zip(tf.nest.flatten(self._storage), tf.nest.flatten(stored))]
        with tf.control_dependencies(updates):
            return self._written.scatter_nd_add(ids[:, None], tf.fill(tf.shape(ids), T))

    def _index(self, rows, steps):
        """rows [B] and steps [B, ...] (counted from each row's first write) ->
        the [B, ..., 2] (row, slot) indices into `_storage`."""
        rows = tf.reshape(rows, [-1] + [1] * (steps.shape.rank - 1))
        return tf.stack([tf.broadcast_to(rows, tf.shape(steps)), steps % self._capacity], axis=-1)

    def bytes_per_step(self):
        """Bytes of all the replayer's variables divided by its capacity in steps."""
        total = sum(v.shape.num_elements() * v.dtype.size for v in self.variables)
        return total / (self._num_rows * self._capacity)

    def num_frames(self):
        """Steps currently held, summed over rows."""
        return int(tf.reduce_sum(self._held()))

    def can_sample(self, num_steps):
        """True once some row holds a window of `num_steps` steps."""
        return bool(tf.reduce_any(self._windows(num_steps)[0] > 0))

    def _windows(self, n):
        """Per row [R]: how many windows of `n` steps it holds, and the step
        (counted from the row's first write) the first of them starts at."""
        held = self._held()
        skip = tf.where(self._written > self._capacity, tf.constant(self._history, tf.int64), 0)
        return tf.maximum(held - skip - n + 1, 0), self._written - held + skip

    def sample(self, sample_batch_size, num_steps=None):
        """Samples `sample_batch_size` windows of `num_steps` uniformly (with replacement).

        Args:
            sample_batch_size: windows per sample.
            num_steps: steps per window (the agent's train_sequence_length);
                None means 1 (the time dimension is kept).

        Returns:
            A nest like `data_spec` of [sample_batch_size, num_steps, ...].
                Fails (InvalidArgumentError) if no row holds a whole window yet.
        """
        n = 1 if num_steps is None else int(num_steps)
        index = self._index(*self._sample_steps(sample_batch_size, n))
        return tf.nest.map_structure(lambda v: tf.gather_nd(v, index), self._storage)

    def _sample_steps(self, sample_batch_size, n):
        """Draws windows of `n` steps uniformly over all rows' windows; returns
        their rows [B] and steps [B, n] (counted from each row's first write)."""
        windows, first = self._windows(n)
        cumulative = tf.cumsum(windows)
        total = cumulative[-1]
        check = tf.debugging.assert_positive(
            total, message=f"{type(self).__name__}: no row holds {n} steps yet")
        with tf.control_dependencies([check]):
            u = tf.random.uniform([sample_batch_size], maxval=total, dtype=tf.int64)
        row = tf.searchsorted(cumulative, u, side="right", out_type=tf.int64)  # first row with cumulative > u
        offset = u - (tf.gather(cumulative, row) - tf.gather(windows, row))
        start = tf.gather(first, row) + offset
        return row, start[:, None] + tf.range(n, dtype=tf.int64)[None, :]


def _earlier_same_row(ids):
    """[N] row ids -> [N, N] bool, true at [i, j] when entry j comes before
    entry i in the batch and has the same row."""
    n = tf.shape(ids)[0]
    earlier = tf.range(n)[None, :] < tf.range(n)[:, None]
    return tf.logical_and(tf.equal(ids[:, None], ids[None, :]), earlier)
