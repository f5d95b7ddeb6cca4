"""PixelReplayer: a uniform replay that stores each frame of a pixel stack once.

An Atari observation is a stack of the last S frames, uint8 [H, W, S]
channels last, newest frame last; within an episode a step's stack is the
previous step's shifted by one frame (obs_t[..., :-1] == obs_{t-1}[..., 1:]).
Storing whole stacks keeps every frame S times (28 KB per 84x84x4 step);
`PixelReplayer` keeps only the newest frame of each step (7 KB) and rebuilds
the stacks when it samples, as Dopamine's circular replay does. It is a
`UniformReplayer` (one ring per environment row, windows sampled uniformly,
never across rows or a row's write cursor, `tf.Variable` storage that a
`tf.train.Checkpoint` saves), so `Task.replayer_fn = @PixelReplayer` is a
drop-in for `@UniformReplayer`.

Storage layout, per environment row r and ring slot p (step % capacity):
- `frames` uint8 [rows, capacity, H, W]: the newest frame of the step's stack;
- `starts` int8 [rows, capacity]: 0 when the step's stack continues the
  previous step's of that row; 1 when a stack starts there padded with copies
  of its own frame (gymnasium's `FrameStackObservation` default,
  padding_type="reset", and EnvPool's Atari); 2 when it starts padded with
  zeros (Dopamine's convention, padding_type="zero");
- `fields`: every other leaf of the data spec (step types, action,
  policy_info, reward, discount) as `UniformReplayer` stores it;
- `written` int64 [rows]: steps ever written per row.
An 84x84x4 DQN step takes 7,081 bytes (`bytes_per_step()`), against 28,248
for `UniformReplayer`: 16 rows x 62,500 steps (1M) is 7.1 GB.

Exactness: a sampled stack equals, byte for byte, the observation written.
Rebuilding step t's stack takes the frames of steps t, t-1, ... back to
the nearest step whose `starts` is not 0, then that start's padding. Whether
a step continues is decided by comparing its pixels with the previous step's
stack of the same row (the row's previous unroll in the same batch, or the
stack rebuilt from the ring), never across rows. A padded stack at a FIRST
step starts a new one even when its pixels would also continue the last
episode's, so a stack reaches back past an episode start only where the
environment's own stack did: EnvPool with `episodic_life=True` carries the
stack over a lost life (its FIRST stacks continue the previous ones, which
is how they are stored). A step whose older channels neither continue the
previous stack nor are padding of one of the two kinds (say an environment
that fills them at a reset with frames of its own, or channels-first
stacks) cannot be rebuilt from one frame: the whole batch is refused with a
one-line ValueError and nothing of it is written. A side store of whole
first stacks, which would accept any padding, was not needed by any
environment here: gymnasium's `FrameStackObservation` (both padding
types), tf-agents' `FrameStack4`, baselines' `FrameStack` and EnvPool 1.2.5
(`envpool.make("Breakout-v5", env_type="gymnasium")` repeats the first
frame in the older channels after every reset) all pad one of these two
ways.

A step's stack reads up to S - 1 earlier steps of its row, so in a ring that
has wrapped the oldest S - 1 steps held serve only as history: no window
starts there (every window still lies between the row's oldest held step
and its cursor). `capacity_per_row` must be at least S.

Threads: like `UniformReplayer`, called by the learner's thread only
(`run_async()` calls the observers, the learner's traced train step
samples); nothing blocks.
"""

import gin
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

from alf_async.learning.uniform_replayer import UniformReplayer, _earlier_same_row

# The values of `starts` (see the module docstring).
_CONTINUES = 0
_REPEATS_FRAME = 1
_ZEROS = 2


@gin.configurable
class PixelReplayer(UniformReplayer):
    """A `UniformReplayer` that stores each frame of an image stack once.

    The data spec is a Trajectory whose observation is (or holds exactly one)
    uint8 [H, W, S] image stack, channels last, newest frame last; other
    observation leaves are stored as they are. See the module docstring for
    the storage layout and which stacks are accepted.
    """

    def __init__(self, data_spec, num_rows, capacity_per_row=10000, name="pixel_replayer"):
        """
        Args:
            data_spec: the Trajectory spec of one step (the agent's
                `collect_data_spec`).
            num_rows: number of environment rows (num_envs * env batch size);
                env ids must lie in [0, num_rows).
            capacity_per_row: steps each row keeps; at least the stack depth S
                and the steps one driver batch can bring to one row.
            name: the module's name (and its variables').

        Raises:
            ValueError: no single uint8 [H, W, S] stack in the observation, or
                capacity_per_row < S.
        """
        # Set before the base class builds its rings: `_stored_spec` reads them.
        self._stack_index, self._stack_shape = _find_stack(data_spec)
        depth = self._stack_shape[-1]
        if capacity_per_row < depth:
            raise ValueError(f"PixelReplayer needs capacity_per_row >= the stack depth {depth}, "
                             f"got {capacity_per_row}")
        super().__init__(data_spec, num_rows, capacity_per_row=capacity_per_row, name=name)
        self._history = depth - 1

    def _stored_spec(self):
        height, width, _ = self._stack_shape
        fields = tf.nest.flatten(self._spec)
        del fields[self._stack_index]
        return {"frames": tf.TensorSpec([height, width], tf.uint8),
                "starts": tf.TensorSpec([], tf.int8),
                "fields": fields}

    def __call__(self, exp, env_ids):
        """Appends each row of `exp` [N, T, ...] to the ring of its env id.

        Raises:
            ValueError: the batch brings a row more steps than its capacity, or
                holds a stack that cannot be rebuilt from its newest frame
                (nothing of the batch is then written).
        """
        env_ids = self._check_batch(exp, env_ids)
        unroll, step = self._add_concrete()(exp, env_ids).numpy()
        if unroll >= 0:
            raise ValueError(
                f"PixelReplayer: the stack of step {step} of unroll {unroll} (env id "
                f"{int(env_ids[unroll])}) neither continues the row's previous stack (frames "
                f"shifted by one) nor starts one padded with copies of its newest frame or with "
                f"zeros, so it cannot be stored as one frame (stacks must be uint8 [H, W, S], "
                f"newest frame last)")

    def _add_graph(self, exp, env_ids):
        """Writes the batch, or nothing when some stack cannot be rebuilt from
        one frame; returns [-1, -1], or the (unroll, step) of the first such."""
        ids = self._row_ids(env_ids)
        fields = tf.nest.flatten(exp)
        # One [N, T, H, W] tensor per channel, oldest first: comparing whole
        # channels is faster than slicing the channel axis of the stacks.
        channels = tf.unstack(fields.pop(self._stack_index), axis=-1)
        starts = self._starts(ids, channels, exp.step_type)
        refused = starts < 0

        def write():
            stored = {"frames": channels[-1], "starts": starts, "fields": fields}
            with tf.control_dependencies([self._write(ids, stored)]):
                return tf.constant([-1, -1], tf.int64)

        return tf.cond(tf.reduce_any(refused), lambda: tf.where(refused)[0], write)

    def _starts(self, ids, channels, step_type):
        """The `starts` code of each step [N, T] of the stacks whose channels
        are `channels` (S x [N, T, H, W]); -1 for a stack that cannot be
        rebuilt from its newest frame."""
        # The stack before each unroll's first step: the last step of the
        # row's previous unroll in this batch, else the row's newest stored one.
        before = tf.reduce_max(tf.where(_earlier_same_row(ids),
                                        tf.range(tf.size(ids, out_type=tf.int64))[None, :], -1),
                               axis=1)
        written = tf.gather(self._written, ids)
        in_batch = before >= 0
        stored = tf.unstack(self._stacks(ids, written[:, None] - 1)[:, 0], axis=-1)
        previous = [tf.concat([tf.where(in_batch[:, None, None],
                                        tf.gather(c[:, -1], tf.maximum(before, 0)), p)[:, None],
                               c[:, :-1]], axis=1) for c, p in zip(channels, stored)]
        has_previous = tf.concat([(in_batch | (written > 0))[:, None],
                                  tf.ones_like(step_type[:, 1:], tf.bool)], axis=1)

        def equal(pairs):
            result = tf.ones_like(step_type, tf.bool)
            for a, b in pairs:
                result = result & tf.reduce_all(tf.equal(a, b), axis=[2, 3])
            return result

        older, newest = channels[:-1], channels[-1]
        continues = has_previous & equal(zip(older, previous[1:]))
        start = tf.where(equal((c, newest) for c in older), _REPEATS_FRAME,
                         tf.where(equal((c, tf.zeros_like(c)) for c in older), _ZEROS, -1))
        # A padded FIRST stack starts afresh, even if it also continues.
        fresh = tf.equal(step_type, ts.StepType.FIRST) & (start >= 0)
        return tf.cast(tf.where(continues & ~fresh, _CONTINUES, start), tf.int8)

    def _stacks(self, rows, steps):
        """rows [B], steps [B, n] (counted from each row's first write) -> the
        rebuilt stacks [B, n, H, W, S] of those steps."""
        depth = self._stack_shape[-1]
        # The `starts` of each step and the depth - 2 before it: the nearest
        # nonzero one is where its stack starts (age depth - 1: no start
        # there, all depth frames are the row's own).
        starts = tf.gather_nd(self._storage["starts"], self._index(
            rows, steps[..., None] - tf.range(depth - 1, dtype=tf.int64)))  # [B, n, depth - 1]
        starts = tf.concat([starts, tf.zeros_like(starts[..., :1])], axis=-1)  # age depth - 1
        found = tf.concat([tf.not_equal(starts[..., :-1], _CONTINUES),
                           tf.ones_like(starts[..., :1], tf.bool)], axis=-1)
        start_age = tf.argmax(tf.cast(found, tf.int32), axis=-1, output_type=tf.int64)  # [B, n]
        padding = tf.gather(starts, start_age, batch_dims=2)  # [B, n]
        # Channel c holds the frame of age depth - 1 - c; ages beyond the
        # start are its padding: its own frame again, or zeros.
        ages = tf.range(depth - 1, -1, -1, dtype=tf.int64)
        frame_age = tf.minimum(ages, start_age[..., None])  # [B, n, depth]
        index = self._index(rows, steps[..., None] - frame_age)
        frames = tf.gather_nd(self._storage["frames"], index)  # [B, n, depth, H, W]
        keep = ~((ages > start_age[..., None]) & tf.equal(padding, _ZEROS)[..., None])
        frames = frames * tf.cast(keep, tf.uint8)[..., None, None]  # faster than tf.where
        # Channels last. Transposing [.., depth, H * W] moves the same bytes
        # as [.., depth, H, W] -> [.., H, W, depth], faster (fewer, longer
        # runs for TF's uint8 transpose).
        h, w = self._stack_shape[0], self._stack_shape[1]
        outer = tf.shape(frames)[:2]
        flat = tf.reshape(frames, tf.concat([outer, [depth, h * w]], axis=0))
        return tf.reshape(tf.transpose(flat, [0, 1, 3, 2]),
                          tf.concat([outer, [h, w, depth]], axis=0))

    def sample(self, sample_batch_size, num_steps=None):
        """Samples `sample_batch_size` windows of `num_steps` uniformly (with
        replacement), stacks rebuilt.

        Args:
            sample_batch_size: windows per sample.
            num_steps: steps per window (the agent's train_sequence_length);
                None means 1 (the time dimension is kept).

        Returns:
            A Trajectory like `data_spec` of [sample_batch_size, num_steps, ...].
                Fails (InvalidArgumentError) if no row holds a whole window yet.
        """
        n = 1 if num_steps is None else int(num_steps)
        rows, steps = self._sample_steps(sample_batch_size, n)
        index = self._index(rows, steps)
        fields = [tf.gather_nd(v, index) for v in self._storage["fields"]]
        fields.insert(self._stack_index, self._stacks(rows, steps))
        return tf.nest.pack_sequence_as(self._spec, fields)


def _find_stack(data_spec):
    """(index in tf.nest.flatten(data_spec), [H, W, S]) of the observation's
    only uint8 rank-3 leaf."""
    if not (hasattr(data_spec, "observation") and hasattr(data_spec, "step_type")):
        raise ValueError(f"PixelReplayer takes a Trajectory spec, got {type(data_spec).__name__}")
    is_stack = tf.nest.map_structure(lambda s: s.dtype == tf.uint8 and s.shape.rank == 3,
                                     data_spec.observation)
    marks = tf.nest.flatten(tf.nest.map_structure(lambda s: False, data_spec)._replace(
        observation=is_stack))
    if marks.count(True) != 1:
        raise ValueError(f"PixelReplayer needs exactly one uint8 [H, W, S] image stack in the "
                         f"observation, found {marks.count(True)}: {data_spec.observation}")
    index = marks.index(True)
    return index, tf.nest.flatten(data_spec)[index].shape.as_list()
