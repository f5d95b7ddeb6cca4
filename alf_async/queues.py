"""TF queues that carry nests: NestFIFOQueue and TFQueues, which owns them all.

Every queue is a `tf.queue.FIFOQueue`. Blocking enqueues and dequeues release
the GIL while they wait and are cancelled by `close(cancel_pending_enqueues=
True)`: a blocked enqueue then raises `tf.errors.CancelledError` and a dequeue
that cannot be filled raises `tf.errors.OutOfRangeError`. That is how `stop()`
wakes every thread of the driver.
"""

import tensorflow as tf


class NestFIFOQueue(object):
    """A `tf.queue.FIFOQueue` whose elements are nests of tensors.

    Built from a nest of `tf.TensorSpec`s; each element is one such nest.
    Any thread may call any method; ops are eager (a tf.function call costs
    ~10x an eager queue op on this project's machines, see benchmarks/).
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

    - `actor_queues[k]` (capacity `actor_queue_cap`): an env thread's request
      to act, (time_step, policy_state, env_id), each with the env's batch B.
    - `action_return_queues[i]` (capacity 1): env thread i's policy step.
    - `learn_queue` (capacity `learn_queue_cap`): one unroll per element,
      (trajectory [B, T, ...], env_ids [B]).
    - `log_queue` (capacity `log_queue_cap`): the same unrolls, for metrics.
    """

    def __init__(self, num_envs, env_batch_size, learn_queue_cap, actor_queue_cap,
                 num_actor_queues, unroll_length, time_step_spec, policy_state_spec,
                 policy_step_spec, trajectory_spec, log_queue_cap=None):
        """
        Args:
            num_envs: number of env threads.
            env_batch_size: B, the batch size of every environment.
            learn_queue_cap: unrolls per learner batch.
            actor_queue_cap: env threads per batched forward pass.
            num_actor_queues: number of actor threads (one queue each).
            unroll_length: T, steps per unroll.
            time_step_spec, policy_state_spec, policy_step_spec,
            trajectory_spec: unbatched TensorSpec nests.
            log_queue_cap: capacity of the log queue (default 2 * num_envs).

        Raises:
            ValueError: for a configuration that can deadlock or is empty.
        """
        check_queue_config(num_envs, num_actor_queues, actor_queue_cap,
                           learn_queue_cap, unroll_length)
        B = env_batch_size
        self.num_envs = num_envs
        self.env_batch_size = B
        self.unroll_length = unroll_length
        # Tuples, not dicts: their flat order is the order written here, which
        # the threads rely on to enqueue flat lists without re-flattening.
        self.actor_request_spec = (
            batched_spec(time_step_spec, B),      # time_step
            batched_spec(policy_state_spec, B),   # policy_state
            tf.TensorSpec([], tf.int32))          # env_id (the env thread's index)
        self.policy_step_spec = batched_spec(policy_step_spec, B)
        self.unroll_spec = (
            batched_spec(batched_spec(trajectory_spec, unroll_length), B),  # trajectory
            tf.TensorSpec([B], tf.int32))                                   # env_ids
        self.actor_queues = [
            NestFIFOQueue(actor_queue_cap, self.actor_request_spec, f"actor_queue_{k}")
            for k in range(num_actor_queues)
        ]
        self.action_return_queues = [
            NestFIFOQueue(1, self.policy_step_spec, f"action_return_queue_{i}")
            for i in range(num_envs)
        ]
        self.learn_queue = NestFIFOQueue(learn_queue_cap, self.unroll_spec, "learn_queue")
        self.log_queue = NestFIFOQueue(log_queue_cap or 2 * num_envs, self.unroll_spec,
                                       "log_queue")

    def all_queues(self):
        return (self.actor_queues + self.action_return_queues +
                [self.learn_queue, self.log_queue])

    def close_all(self):
        """Closes every queue, cancelling blocked enqueues and dequeues. Idempotent."""
        for q in self.all_queues():
            q.close(cancel_pending_enqueues=True)


def check_queue_config(num_envs, num_actor_queues, actor_queue_cap, learn_queue_cap,
                       unroll_length):
    """Refuses queue sizes that are empty or that deadlock the actor queues.

    Env thread i uses actor queue i % num_actor_queues, and an actor waits for
    `actor_queue_cap` requests, so every actor queue needs at least that many
    env threads: num_actor_queues * actor_queue_cap <= num_envs.
    """
    for name, value in [("num_envs", num_envs), ("num_actor_queues", num_actor_queues),
                        ("actor_queue_cap", actor_queue_cap),
                        ("learn_queue_cap", learn_queue_cap),
                        ("unroll_length", unroll_length)]:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if num_actor_queues * actor_queue_cap > num_envs:
        raise ValueError(
            f"num_actor_queues * actor_queue_cap must be <= num_envs, got "
            f"{num_actor_queues} * {actor_queue_cap} > {num_envs}: each actor waits for "
            f"actor_queue_cap={actor_queue_cap} environments, and with "
            f"{num_envs} env threads over {num_actor_queues} actor queues some actor "
            f"would wait forever (deadlock). Lower num_actor_queues or actor_queue_cap, "
            f"or raise num_envs.")
