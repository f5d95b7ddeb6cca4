"""TF queues that carry nests: NestFIFOQueue and TFQueues, which owns them all.

Every queue is a `tf.queue.FIFOQueue`. Blocking enqueues and dequeues release
the GIL while they wait and are cancelled by `close(cancel_pending_enqueues=
True)`: a blocked enqueue then raises `tf.errors.CancelledError` and a dequeue
that cannot be filled raises `tf.errors.OutOfRangeError`. That is how `stop()`
wakes every thread of the driver.
"""

import tensorflow as tf

# What a queue op raises once the queue is closed (the driver's stop).
QUEUE_CLOSED_ERRORS = (tf.errors.CancelledError, tf.errors.OutOfRangeError)


class NestFIFOQueue(object):
    """A `tf.queue.FIFOQueue` whose elements are nests of tensors.

    Built from a nest of `tf.TensorSpec`s; each element is one such nest.
    Any thread may call any method; ops are eager (a tf.function call costs
    more than an eager queue op: benchmarks/driver_cost.py).
    """

    def __init__(self, capacity, element_spec, name):
        """
        Args:
            capacity: maximum number of elements; also what `dequeue_all()`
                takes at once.
            element_spec: a nest of `tf.TensorSpec`s, one element's structure.
            name: the queue's name, used in error messages and summaries.
        """
        if capacity < 1:
            raise ValueError(f"queue {name!r}: capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._spec = element_spec
        self._name = name
        flat = tf.nest.flatten(element_spec)
        if not flat:
            raise ValueError(f"queue {name!r}: the element spec has no tensors")
        self._queue = tf.queue.FIFOQueue(
            capacity,
            dtypes=[s.dtype for s in flat],
            shapes=[s.shape for s in flat],
            shared_name=None,
            name=name)

    @property
    def capacity(self):
        return self._capacity

    @property
    def name(self):
        return self._name

    @property
    def element_spec(self):
        return self._spec

    @property
    def queue(self):
        """The underlying `tf.queue.FIFOQueue` (for `QueueBase.from_list`)."""
        return self._queue

    def flatten(self, element):
        """Flattens `element` to the queue's component list, checking its structure."""
        tf.nest.assert_same_structure(self._spec, element)
        return tf.nest.flatten(element)

    def enqueue(self, element):
        """Puts one element in; blocks while the queue is full."""
        return self._queue.enqueue(self.flatten(element))

    def dequeue(self):
        """Takes one element out; blocks while the queue is empty."""
        return self._pack(self._queue.dequeue())

    def enqueue_many(self, elements):
        """Puts `n` elements in, given stacked on a new outer axis of size n."""
        return self._queue.enqueue_many(self.flatten(elements))

    def dequeue_many(self, n):
        """Takes `n` elements, stacked on a new outer axis; blocks until there are n."""
        return self._pack(self._queue.dequeue_many(n))

    def dequeue_all(self):
        """Takes `capacity` elements at once: blocks until the queue is full."""
        return self.dequeue_many(self._capacity)

    def size(self):
        return self._queue.size()

    def close(self, cancel_pending_enqueues=True):
        """Closes the queue; by default cancels every blocked enqueue."""
        self._queue.close(cancel_pending_enqueues=cancel_pending_enqueues)

    def is_closed(self):
        return bool(self._queue.is_closed())

    def _pack(self, flat):
        if not isinstance(flat, (list, tuple)):
            flat = [flat]
        return tf.nest.pack_sequence_as(self._spec, list(flat))


def batched_spec(spec, batch_size):
    """Prepends `batch_size` to every TensorSpec of a nest (drops bounds)."""
    return tf.nest.map_structure(
        lambda s: tf.TensorSpec([batch_size] + list(s.shape), s.dtype, name=s.name), spec)


class TFQueues(object):
    """Every queue of one driver.

    With `num_actor_queues=0` (env threads that act themselves) there are
    no actor queues and no action-return queues.

    - `actor_queues[k]`: requests to act, one per env thread per step, each
      the B rows of its env thread: (time_step [B, ...], policy_state
      [B, ...], env_id [B]), env_id the row's global id, or -1 for a row
      that is not asking this time (an env thread stepping its rows one by
      one asks for the rows that are ready). Capacity: the env threads that
      use it (each has at most one request out), so an env thread never
      blocks on it.
    - `action_return_queues[i]`: env thread i's policy steps, one [B, ...]
      reply per request (rows that did not ask hold zeros). Capacity 1.
    - `learn_queue` (capacity `learn_queue_cap * B` rows): (trajectory [T,
      ...], env_id), one environment's unroll each; `dequeue_all()` gives
      the learner's batch [learn_queue_cap * B, T] with no reshape.
    - `log_queue` (capacity `log_queue_cap` rows): the same rows, for metrics.
    - `step_token` (capacity 1): the token graph-mode env threads hold while
      they step a Python environment.
    - `permits` (with `batches_ahead`, else None; capacity `batches_ahead *
      learn_queue_cap`, full at the start): an env thread takes one before
      each unroll it begins, and the learner's `dequeue_all` gives back
      `learn_queue_cap`, one per unroll it took (see `check_pacing`).

    A request of B rows is one queue element, not B: each element costs a
    round trip and context switches of its own (the driver's CPU and
    context switches per step are in benchmarks/throughput.py). An actor
    still batches whatever is waiting: every request in its queue, up to
    `actor_queue_cap` of them (dynamic batching, see actor_thread.py).
    """

    def __init__(self, num_envs, env_batch_size, learn_queue_cap, actor_queue_cap,
                 num_actor_queues, unroll_length, time_step_spec, policy_state_spec,
                 policy_step_spec, trajectory_spec, log_queue_cap=None, batches_ahead=None):
        """
        Args:
            num_envs: number of env threads.
            env_batch_size: B, the batch size of every environment.
            learn_queue_cap: unrolls of B rows per learner batch.
            actor_queue_cap: at most this many requests (env threads'
                B rows) per batched forward pass.
            num_actor_queues: number of actor threads (one queue each); env
                thread i uses actor queue i % num_actor_queues; 0: none, each
                env thread acts itself.
            unroll_length: T, steps per unroll.
            time_step_spec: the unbatched TimeStep spec nest.
            policy_state_spec: the unbatched policy state spec nest.
            policy_step_spec: the unbatched PolicyStep spec nest.
            trajectory_spec: the unbatched Trajectory spec nest.
            log_queue_cap: capacity of the log queue in rows (default
                2 * num_envs * B).
            batches_ahead: None, or the learner batches the env threads may
                have begun and the learner not yet taken (the `permits`).

        The configuration is checked by `check_queue_config` and
        `check_pacing`, which the driver runs before it builds its
        environments (a configuration that cannot work starts no child
        process); this constructor assumes it passed.
        """
        B = env_batch_size
        self.num_envs = num_envs
        self.env_batch_size = B
        self.unroll_length = unroll_length
        self.actor_queue_cap = actor_queue_cap
        self.max_actor_batch = actor_queue_cap * B  # rows
        # Tuples, not dicts: their flat order is the order written here, which
        # the threads rely on to enqueue flat lists without re-flattening.
        self.time_step_spec = time_step_spec
        self.actor_request_spec = batched_spec((
            time_step_spec,                       # time_step
            policy_state_spec,                    # policy_state
            tf.TensorSpec([], tf.int32)), B)      # env_id (global row id, -1: not asking)
        self.policy_step_spec = policy_step_spec
        self.unroll_spec = (
            batched_spec(trajectory_spec, unroll_length),  # trajectory [T, ...]
            tf.TensorSpec([], tf.int32))                   # env_id
        self.actor_queues = [
            NestFIFOQueue(len(range(k, num_envs, num_actor_queues)),
                          self.actor_request_spec, f"actor_queue_{k}")
            for k in range(num_actor_queues)
        ]
        self.action_return_queues = [
            NestFIFOQueue(1, batched_spec(policy_step_spec, B), f"action_return_queue_{i}")
            for i in range(num_envs if num_actor_queues else 0)
        ]
        self.learn_queue = NestFIFOQueue(learn_queue_cap * B, self.unroll_spec, "learn_queue")
        self.log_queue = NestFIFOQueue(log_queue_cap or 2 * num_envs * B, self.unroll_spec,
                                       "log_queue")
        # Graph-mode env threads take this one token around each Python env
        # step (see EnvThread._env_step); closing it wakes a thread waiting.
        self.step_token = NestFIFOQueue(1, tf.TensorSpec([], tf.int32), "step_token")
        self.step_token.enqueue(0)
        self.permits = None
        if batches_ahead is not None:
            num_permits = batches_ahead * learn_queue_cap
            self.permits = NestFIFOQueue(num_permits, tf.TensorSpec([], tf.int32), "permits")
            self.permits.enqueue_many(tf.zeros([num_permits], tf.int32))

    def all_queues(self):
        return (self.actor_queues + self.action_return_queues +
                [self.learn_queue, self.log_queue, self.step_token] +
                ([self.permits] if self.permits is not None else []))

    def close_all(self):
        """Closes every queue, cancelling blocked enqueues and dequeues. Idempotent."""
        for q in self.all_queues():
            q.close(cancel_pending_enqueues=True)


def check_queue_config(num_envs, num_actor_queues, actor_queue_cap, learn_queue_cap,
                       unroll_length):
    """Refuses queue sizes that are empty or that leave an actor without work.

    `actor_queue_cap` is an upper bound (actors take the rows that are
    waiting), so any value >= 1 works; env thread i uses actor queue
    i % num_actor_queues, so more actor queues than env threads would leave
    an actor that never gets a request. With no actor queue
    (`num_actor_queues=0`) each env thread acts itself.
    """
    for name, value in [("num_envs", num_envs), ("actor_queue_cap", actor_queue_cap),
                        ("learn_queue_cap", learn_queue_cap),
                        ("unroll_length", unroll_length)]:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not isinstance(num_actor_queues, int) or isinstance(num_actor_queues, bool) or (
            num_actor_queues < 0):
        raise ValueError(f"num_actor_queues must be an integer >= 0 (0: each env thread "
                         f"acts itself), got {num_actor_queues!r}")
    if num_actor_queues > num_envs:
        raise ValueError(
            f"num_actor_queues must be <= num_envs, got {num_actor_queues} > {num_envs}: "
            f"env thread i sends to actor queue i % num_actor_queues, so actor queue "
            f"{num_envs} would never get a request. Lower num_actor_queues or raise "
            f"num_envs.")


def check_pacing(batches_ahead, num_envs, learn_queue_cap):
    """Refuses a `batches_ahead` that is not None or an integer >= 1, or that
    leaves an env thread idle for good.

    With `batches_ahead = k` the env threads may have begun at most k
    learner batches (k * learn_queue_cap unrolls) that the learner has not
    taken: an env thread takes a permit before each unroll, and each
    `dequeue_all` gives back one per unroll taken. That bounds how far the
    policy that acted trails the one that learns (the policy lag) to the
    train steps of k batches. With fewer permits than env threads, some
    would never collect.
    """
    if batches_ahead is None:
        return
    if not isinstance(batches_ahead, int) or isinstance(batches_ahead, bool) or batches_ahead < 1:
        raise ValueError(f"batches_ahead must be None (the env threads collect whenever the "
                         f"learn queue has room) or an integer >= 1, got {batches_ahead!r}")
    if num_envs > batches_ahead * learn_queue_cap:
        raise ValueError(
            f"batches_ahead={batches_ahead} lets {batches_ahead} x learn_queue_cap "
            f"{learn_queue_cap} = {batches_ahead * learn_queue_cap} unrolls be collected at "
            f"once, fewer than the {num_envs} env threads: raise batches_ahead or "
            f"learn_queue_cap to at least {num_envs} unrolls, or run fewer env threads")
