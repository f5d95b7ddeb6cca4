"""`UniformReplayer`: a replay buffer with one ring per environment row.

It samples windows uniformly, never across rows or across a row's write
cursor, and checkpoints only the part of its storage that holds steps.
Its subclass `pixel_replayer.PixelReplayer` stores each frame of an image
stack once.

Threads: called by the learner's thread only (`run_async()` calls the
observers, the learner samples); nothing blocks.
"""

import gin
import numpy as np
import tensorflow as tf
from tensorflow.python.trackable.base import SaveType  # pylint: disable=no-name-in-module

from alf_async.learning.replayer_base import Replayer


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
