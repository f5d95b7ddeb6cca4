"""ReverbReplayer: the driver's unrolls go to a Reverb table, the learner samples it.

    replayer = ReverbReplayer(agent.collect_data_spec, num_rows=32, sequence_length=4,
                              samples_per_insert=4.0, min_size=1000)
    driver = AsyncOffPolicyDriver(..., exp_observers=[replayer])

The same `Replayer` interface as `UniformReplayer` (uniform_replayer.py), backed by
a Reverb server: in this process (the default; `checkpoint_dir` makes it
checkpointable) or elsewhere (`server_address`, e.g. a learner's server that
collector processes write to).

Streams. Every env row (global env id) writes through its own
`reverb.TrajectoryWriter`, and an item is created for every window of
`sequence_length` consecutive steps of that row (stride 1), from the
writer's own history. So a window never joins two environments; like
`UniformReplayer`, windows do run across a row's episode boundaries (the
agents mask those with the trajectory's step types and discounts).
Why not tf-agents' `ReverbAddTrajectoryObserver`: it takes one unbatched
step per call for one environment and drops its cache at every episode end
(windows never span episodes); one writer per row with the same
`create_item(history[-L:])` logic is the few lines below.

Sampling. `sample()` reads `reverb.TrajectoryDataset` (batched
`sample_batch_size`), whose iterator is made eagerly once and read with
`next()` inside the learner's traced train step.

Rate limiting. The table's `SampleToInsertRatio(samples_per_insert,
min_size, error_buffer)`: an insert waits while the learner is more than
`error_buffer` samples behind `samples_per_insert` per item, a sample waits
while it is more than `error_buffer` ahead, and nothing is sampled below
`min_size` items. `error_buffer` defaults to Acme's and tf-agents' SAC
choice, 10% of `min_size * samples_per_insert` (at least Reverb's minimum,
`2 * max(1, samples_per_insert)`). In one process (the replayer starts its own server) the learner's thread
both inserts and samples, on a fixed schedule whose ratio `check_schedule`
checks against samples_per_insert; a limit on samples could there only
make it wait on itself (after a restart, the samples the dataset had
fetched ahead are gone but counted, and new streams start fewer windows),
so that table limits inserts only (`replay_table(learner_in_process=True)`),
and inserts never block the caller. Collector processes writing to a
learner's server meet the full two-sided limiter.

Queues of unrolls. Agents that train on each batch of unrolls once (PPO,
IMPALA: `agents.trains_on_unrolls`) read a queue instead (`unroll_table`,
Reverb's `Table.queue`, as Acme's IMPALA): FIFO, each item sampled once,
bounded (an insert waits while it is full, a sample while it is empty).
Each env row is a stream whose items are its last T + 1 steps every T
steps (`RowWriters(period=T)`, Acme's SequenceAdder with period T): the
first once the stream holds T + 1 steps, then [T..2T], [2T..3T], ...;
consecutive items of a row share one step (it bootstraps the one and
starts the next), so no transition is lost. `sample(B)` returns [B, T + 1]
items (with `sample_batch_size` fixed: the learner's rows per batch). The
dataset then fetches ahead exactly `max_in_flight_samples_per_worker`
items (default 1; tf.data's injected prefetch, which would take one more
batch out of the queue, is turned off), and each item fetched ahead has
left the queue: a learner that waits for a batch counts them
(`replay_feed.ReplayFeed`).

Checkpoints. With `checkpoint_dir`, the in-process server is built with
Reverb's `DefaultCheckpointer` there: it loads the latest checkpoint at
start (items and rate limiter state), and `checkpoint()` writes one.

Threads: `__call__`, `can_sample`, `num_frames`, `checkpoint` run on the
learner's thread; `sample` runs inside its train step. `__call__` never
blocks (the writers send in the background; items wait for the rate
limiter there); `sample` blocks while the rate limiter refuses samples.
`close()` from the owner, after training stopped.
"""

import types

import gin
import numpy as np
import reverb
import tensorflow as tf

from alf_async import roles
from alf_async.learning.replayer_base import Replayer
from alf_async import quiet

REPLAY_TABLE = "replay"


def default_error_buffer(samples_per_insert, min_size):
    """10% of `min_size * samples_per_insert` (Acme, tf-agents' SAC), at least
    Reverb's minimum `2 * max(1, samples_per_insert)`."""
    return max(0.1 * min_size * samples_per_insert, 2.0 * max(1.0, samples_per_insert))


def window_spec(data_spec, sequence_length):
    """The table's signature: each step's spec with a leading [sequence_length]."""
    return tf.nest.map_structure(
        lambda s: tf.TensorSpec([sequence_length] + s.shape.as_list(), s.dtype), data_spec)


@gin.configurable
def replay_table(data_spec, sequence_length, max_size=100000, samples_per_insert=4.0,
                 min_size=1000, error_buffer=None, prioritized=False, priority_exponent=0.8,
                 name=REPLAY_TABLE, learner_in_process=False):
    """The replay table: uniform (or prioritized) over windows, FIFO removal,
    rate limited by `SampleToInsertRatio`.

    Args:
        data_spec: nest of `tf.TensorSpec`s of one step.
        sequence_length: steps per item (the agent's train_sequence_length).
        max_size: items kept (oldest removed first).
        samples_per_insert: samples of each item over its lifetime, on average.
        min_size: items before the first sample.
        error_buffer: how far (in samples) the ratio may drift before one
            side waits; None: `default_error_buffer`.
        prioritized: sample by priority (`priority_exponent`) instead of
            uniformly; items are inserted with priority 1 (nothing updates
            priorities yet).
        priority_exponent: see `prioritized`.
        name: the table's name.
        learner_in_process: the table's only writer and sampler is one
            learner thread (`ReverbReplayer` with its own server): samples
            are then not limited (see module docstring), inserts are.
    """
    if error_buffer is None:
        error_buffer = default_error_buffer(samples_per_insert, min_size)
    if learner_in_process:
        offset = samples_per_insert * min_size
        error_buffer = (-float(np.finfo(np.float32).max), offset + error_buffer)
    selector = (reverb.selectors.Prioritized(priority_exponent) if prioritized
                else reverb.selectors.Uniform())
    return reverb.Table(
        name, sampler=selector, remover=reverb.selectors.Fifo(), max_size=max_size,
        rate_limiter=reverb.rate_limiters.SampleToInsertRatio(
            samples_per_insert=samples_per_insert, min_size_to_sample=min_size,
            error_buffer=error_buffer),
        signature=window_spec(data_spec, sequence_length))


@gin.configurable
def unroll_table(data_spec, sequence_length, max_size=64, name=REPLAY_TABLE):
    """The queue of unrolls (Reverb's `Table.queue`): FIFO sampler and
    remover, each item sampled once (`max_times_sampled=1`), a `Queue` rate
    limiter (inserts wait while it holds `max_size` items, samples while it
    is empty).

    Args:
        data_spec: nest of `tf.TensorSpec`s of one step (a
            `TrainStepStampedPolicy`'s `trajectory_spec`).
        sequence_length: steps per item (the learner's unroll_length + 1).
        max_size: items the queue holds; every item waits behind those
            ahead of it, so it bounds the policy lag a full queue adds.
        name: the table's name (the replay table's: the learner role's
            health summaries and the collectors find it there).
    """
    if not isinstance(max_size, int) or isinstance(max_size, bool) or max_size < 1:
        raise ValueError(f"unroll_table.max_size must be an int >= 1, got {max_size!r}")
    if sequence_length < 2:
        raise ValueError(f"a queue of unrolls needs items of >= 2 steps (unroll_length + 1), "
                         f"got {sequence_length}")
    return reverb.Table.queue(name, max_size, signature=window_spec(data_spec, sequence_length))


def is_unroll_queue(table_info):
    """True if `table_info` (a `reverb.TableInfo`) is a queue (`unroll_table`):
    a FIFO sampler and each item sampled once."""
    return table_info.max_times_sampled == 1 and bool(table_info.sampler_options.fifo)


class RowWriters(object):
    """One `reverb.TrajectoryWriter` per env row; an item of the row's last
    `sequence_length` steps every `period` steps, the first once the row's
    stream holds `sequence_length` steps: with period 1 every window
    (stride 1, a replay table's), with period L - 1 items that share one
    step ([0..T], [T..2T], ...: a queue of unrolls).

    Threads: one thread at a time (the learner's, or a collector's);
    `write` does not block (items are sent in the background).
    """

    def __init__(self, client, sequence_length, table=REPLAY_TABLE, priority=1.0, period=1):
        if not isinstance(period, int) or isinstance(period, bool) or period < 1:
            raise ValueError(f"RowWriters' period must be an int >= 1, got {period!r}")
        self._client = client
        self._length = sequence_length
        self._period = period
        self._table = table
        self._priority = priority
        self._writers = {}
        self._steps = {}

    @property
    def period(self):
        return self._period

    def write(self, exp, env_ids):
        """Appends each row of `exp` [N, T, ...] to its env id's stream, in
        order; creates the items that became due."""
        flat = [np.asarray(t) for t in tf.nest.flatten(exp)]
        env_ids = np.asarray(env_ids)
        T = flat[0].shape[1]
        for row, env_id in enumerate(env_ids.tolist()):
            writer = self._writers.get(env_id)
            if writer is None:
                writer = self._client.trajectory_writer(num_keep_alive_refs=self._length)
                self._writers[env_id] = writer
                self._steps[env_id] = 0
            for t in range(T):
                writer.append(tf.nest.pack_sequence_as(exp, [a[row, t] for a in flat]))
                self._steps[env_id] += 1
                beyond = self._steps[env_id] - self._length
                if beyond >= 0 and beyond % self._period == 0:
                    writer.create_item(self._table, self._priority, tf.nest.map_structure(
                        lambda column: column[-self._length:], writer.history))

    def flush(self, timeout_ms=None):
        """Waits until the server took every item (raises
        `reverb.errors.DeadlineExceededError` after `timeout_ms`)."""
        for writer in self._writers.values():
            writer.flush(timeout_ms=timeout_ms)

    def wait(self, max_pending, stop_event, poll_ms=200, on_timeout=None):
        """Waits until each row's stream has at most `max_pending` items the
        server did not confirm yet (the rate limiter holds inserts there),
        or `stop_event` is set; returns False if it stopped waiting for that.
        This is what holds a collector to the learner's pace: without it
        the items pile up in the writers. `on_timeout()` is called every
        `poll_ms` of waiting (it may raise, e.g. when the server is gone)."""
        for writer in self._writers.values():
            while True:
                try:
                    writer.flush(block_until_num_items=max_pending, timeout_ms=poll_ms)
                    break
                except reverb.errors.DeadlineExceededError:
                    if stop_event.is_set():
                        return False
                    if on_timeout is not None:
                        on_timeout()
        return True

    def close(self):
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()


@gin.configurable
class ReverbReplayer(Replayer, roles.CheckpointedReplay, roles.ScheduledReplay,
                     roles.ClosableReplay):
    """A `Replayer` over a Reverb table (see module docstring).

    Args:
        data_spec: nest of `tf.TensorSpec`s of one step (the agent's
            `collect_data_spec`).
        num_rows: environment rows (unused: a row's stream is made at its
            first unroll; for the signature shared with `UniformReplayer`).
        sequence_length: steps per window (the agent's
            train_sequence_length: DQN's n_step_update + 1, SAC's 2).
        server_address: 'host:port' of a server that has the table; None
            starts one in this process (with `table_fn`).
        checkpoint_dir: the in-process server's Reverb checkpoint directory
            (restored at start if it holds one); None: not checkpointed.
        port: the in-process server's port (None: a free one).
        table_fn: callable(data_spec, sequence_length, learner_in_process)
            -> `reverb.Table` (`replay_table`, whose rate limiter knobs are gin's).
        max_in_flight_samples_per_worker: items the dataset fetches ahead;
            None: 64 from a replay table, 1 from a queue (`unroll_table`:
            each item fetched ahead has left the queue and waits there).
        sample_batch_size: items per `sample()` whatever the learner asks
            (a queue of unrolls: the rows of a batch); None: the learner's.
        name: the module's name.
    """

    traceable_before_data = True

    def __init__(self, data_spec, num_rows=None, sequence_length=gin.REQUIRED,
                 server_address=None, checkpoint_dir=None, port=None, table_fn=replay_table,
                 max_in_flight_samples_per_worker=None, sample_batch_size=None,
                 name="reverb_replayer"):
        super().__init__(name=name)
        del num_rows
        if not isinstance(sequence_length, int) or sequence_length < 1:
            raise ValueError(f"ReverbReplayer.sequence_length must be an int >= 1, got "
                             f"{sequence_length!r}")
        for binding, value in (("max_in_flight_samples_per_worker",
                                max_in_flight_samples_per_worker),
                               ("sample_batch_size", sample_batch_size)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or
                                      value < 1):
                raise ValueError(f"ReverbReplayer.{binding} must be None or an int >= 1, got "
                                 f"{value!r}")
        self._spec = data_spec
        self._length = sequence_length
        self._batch_size = sample_batch_size
        # Untracked (tf.Module would try to checkpoint the dataset iterator).
        self._state = types.SimpleNamespace(server=None, iterator=None, batch_size=None)
        if server_address is None:
            checkpointer = (reverb.checkpointers.DefaultCheckpointer(checkpoint_dir)
                            if checkpoint_dir else None)
            table = table_fn(data_spec, sequence_length, learner_in_process=True)
            with quiet.reverb_info_dropped():
                self._state.server = reverb.Server([table], port=port,
                                                   checkpointer=checkpointer)
            server_address = f"localhost:{self._state.server.port}"
        self._address = server_address
        self._client = reverb.Client(server_address)
        self._queue = is_unroll_queue(self.table_info())
        if max_in_flight_samples_per_worker is None:
            max_in_flight_samples_per_worker = 1 if self._queue else 64
        self._in_flight = max_in_flight_samples_per_worker
        self._writers = RowWriters(self._client, sequence_length)

    @property
    def server_address(self):
        return self._address

    @property
    def client(self):
        return self._client

    @property
    def sequence_length(self):
        return self._length

    @property
    def max_in_flight_samples(self):
        """Samples the dataset may request ahead of the learner."""
        return self._in_flight

    @property
    def is_queue(self):
        """True if the table is a queue of unrolls (`unroll_table`)."""
        return self._queue

    def table_info(self):
        """The replay table's `reverb.TableInfo` (size, rate limiter counts)."""
        return self._client.server_info()[REPLAY_TABLE]

    def rate_limiter(self):
        """(samples_per_insert, min_size, min_diff, max_diff) of the table."""
        info = self.table_info().rate_limiter_info
        return (info.samples_per_insert, info.min_size_to_sample, info.min_diff,
                info.max_diff)

    def check_schedule(self, samples_per_iteration, inserts_per_iteration):
        """Raises ValueError unless a learner that, each iteration, inserts
        `inserts_per_iteration` items and then samples `samples_per_iteration`
        (both on its own thread) keeps the table's ratio: samples_per_insert
        must be theirs, and one iteration's samples must fit in the error
        buffer (else its inserts wait, in the background, for samples that
        only come after them)."""
        spi, min_size, _, max_diff = self.rate_limiter()
        ratio = samples_per_iteration / inserts_per_iteration
        if abs(ratio - spi) > 1e-6 * spi:
            raise ValueError(
                f"the learner samples {samples_per_iteration} per iteration "
                f"(train_steps_per_iteration x sample_batch_size) and inserts "
                f"{inserts_per_iteration} (learn_queue_cap x env_batch_size x unroll_length), "
                f"{ratio:g} samples per insert, but the table's samples_per_insert is {spi:g}: "
                f"in one process they must be equal; set "
                f"replay_table.samples_per_insert = {ratio:g}")
        error_buffer = max_diff - spi * min_size
        if error_buffer < samples_per_iteration:
            raise ValueError(
                f"replay_table's error_buffer {error_buffer:g} is below one iteration's "
                f"{samples_per_iteration} samples; set replay_table.error_buffer >= "
                f"{samples_per_iteration}")

    def __call__(self, exp, env_ids):
        """Writes each row of `exp` [N, T, ...] to its env id's stream (every
        window of `sequence_length`: period 1, also into a queue)."""
        tf.nest.assert_same_structure(self._spec, exp)
        self._writers.write(exp, env_ids)

    def flush(self, timeout_ms=None):
        """Waits until the server took every written item."""
        self._writers.flush(timeout_ms)

    def num_frames(self):
        """Items (windows) in the table."""
        return int(self.table_info().current_size)

    def can_sample(self, num_steps):
        """True once the table holds `min_size` items (the rate limiter's)."""
        del num_steps
        info = self.table_info()
        return info.current_size >= info.rate_limiter_info.min_size_to_sample

    def sample(self, sample_batch_size, num_steps=None):
        """`sample_batch_size` windows of `sequence_length` steps from the table
        (the replayer's own `sample_batch_size` instead, if it has one).

        Returns:
            A nest like `data_spec` of [sample_batch_size, sequence_length, ...].
        """
        n = self._length if num_steps is None else int(num_steps)
        if n != self._length:
            raise ValueError(f"the agent trains on windows of {n} steps but "
                             f"ReverbReplayer.sequence_length is {self._length}: set it to {n}")
        if self._batch_size is not None:
            sample_batch_size = self._batch_size
        if self._state.iterator is None or self._state.batch_size != sample_batch_size:
            with tf.init_scope():  # made eagerly, read inside the traced train step
                # One worker: the samples fetched ahead stay within
                # max_in_flight_samples_per_worker (see check_schedule);
                # a queue's in FIFO order.
                dataset = reverb.TrajectoryDataset.from_table_signature(
                    self._address, REPLAY_TABLE, self._in_flight, num_workers_per_iterator=1)
                dataset = dataset.batch(sample_batch_size, drop_remainder=True)
                if self._queue:
                    # No batch prefetched beyond the in-flight items (module docstring).
                    options = tf.data.Options()
                    options.experimental_optimization.inject_prefetch = False
                    dataset = dataset.with_options(options)
                with quiet.reverb_info_dropped():  # the sampler is made here
                    self._state.iterator = iter(dataset)
                self._state.batch_size = sample_batch_size
        # In data_spec's own nest types (the table's signature brings back
        # namedtuples of the same name and fields, without their methods).
        return tf.nest.pack_sequence_as(self._spec,
                                        tf.nest.flatten(next(self._state.iterator).data))

    def checkpoint(self):
        """Writes a Reverb checkpoint (of the in-process server: its
        `checkpoint_dir`); returns its path."""
        with quiet.reverb_info_dropped():
            return self._client.checkpoint()

    def close(self):
        """Closes the writers, the dataset and the in-process server."""
        self._writers.close()
        self._state.iterator = None
        if self._state.server is not None:
            with quiet.reverb_info_dropped():
                self._state.server.stop()
            self._state.server = None
