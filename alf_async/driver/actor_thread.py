"""ActorThread: one batched forward pass of the policy for the waiting rows.

Dynamic batching (IMPALA's and SEED RL's inference batching): each iteration
blocks until at least one request is waiting on its actor queue, then takes
every request that is waiting, up to `max_requests` (actor_queue_cap), runs
`policy.action` once over their rows, and sends each request's policy steps
back to the action-return queue of the env thread it came from. No
environment waits for a straggler: a batch is whatever is ready.

A request is the B rows of one env thread (see queues.py: one queue element
per request, not one per row). Env threads that step their rows one by one
(rows_loop.py) ask only for the rows that are ready
and mark the others with env_id -1; an actor serving such a thread
(`partial_requests`) acts only for the marked-ready rows, so the batch is
exactly the rows that asked, from 1 to the cap's rows.

There is no timed wait for more requests: a TF queue has no timed dequeue
(the `timeout_ms` attribute is "not supported yet"), and sleeping inside the
graph (a tf.data sleep) costs CPU on every poll, more than the forward pass
it would save (benchmarks/results/HISTORY.md). Requests
accumulate by themselves while the actor runs a forward pass.

Rows keep their env id (the global row id, env thread index * B + b), so
the policy state comes in with the row and goes back with it: an RNN's state
always stays with its own row, whatever the batch.

The loop is one long-running graph call that ends only when a queue is
closed, so serving actions never takes the GIL. It is traced in `__init__`
on the constructing thread: actors never trace (or build Keras layers)
concurrently, and a policy that does not fit the specs fails at
construction.

Threads: `run()` is this thread; it blocks inside the graph call on the
actor queue (dequeue) and the return queues (enqueue; an env thread has at
most one request out and its return queue holds one reply, so that never
waits). Closing the queues ends the call. The perf counters may be read by
any thread.
"""

import threading

import tensorflow as tf

from alf_async.driver.acting import flat_policy_step
from alf_async.driver.queues import QUEUE_CLOSED_ERRORS


class ActorThread(threading.Thread):
    """Serves one actor queue with dynamically batched `policy.action` calls."""

    def __init__(self, name, coord, policy, actor_queue, return_queues, env_threads,
                 env_batch_size, max_requests, partial_requests=False):
        """
        Args:
            name: thread name.
            coord: the driver's `tf.train.Coordinator`.
            policy: a tf-agents TFPolicy.
            actor_queue: the `NestFIFOQueue` of request rows this actor serves.
            return_queues: every env thread's action-return `NestFIFOQueue`,
                indexed by env thread index.
            env_threads: indices of the env threads that use `actor_queue`.
            env_batch_size: B.
            max_requests: the most requests (of B rows) one forward pass takes.
            partial_requests: whether requests may mark rows as not asking
                (env_id -1); if not, every row of a request is acted for
                with no masking ops.
        """
        super().__init__(name=name, daemon=True)
        self._coord = coord
        self._policy = policy
        self._actor_queue = actor_queue
        self._return_queues = [return_queues[i] for i in env_threads]
        self._env_threads = list(env_threads)
        # env thread index -> its position among this actor's env threads.
        local_index = [0] * len(return_queues)
        for j, i in enumerate(self._env_threads):
            local_index[i] = j
        self._local_index = tf.constant(local_index, tf.int32)
        self._B = env_batch_size
        self._max_requests = max_requests
        self._partial = partial_requests
        self._batches = tf.Variable(0, dtype=tf.int64, trainable=False, name=name + "_batches")
        self._rows = tf.Variable(0, dtype=tf.int64, trainable=False, name=name + "_rows")
        self._inference = tf.Variable(0.0, dtype=tf.float64, trainable=False,
                                      name=name + "_inference_secs")
        self._loop = tf.function(self._loop_graph, autograph=False).get_concrete_function()

    @property
    def batches(self):
        """Forward passes run so far."""
        return int(self._batches.numpy())

    @property
    def rows(self):
        """Environment rows acted for so far."""
        return int(self._rows.numpy())

    @property
    def inference_secs(self):
        """Seconds spent in policy.action (not waiting for requests)."""
        return float(self._inference.numpy())

    def run(self):
        with self._coord.stop_on_exception():
            try:
                self._loop()
            except QUEUE_CLOSED_ERRORS:
                if not self._coord.should_stop():
                    raise

    def _take_waiting(self):
        """Blocks for one request, then takes the requests waiting, up to
        max_requests; returns their flat fields, each [n, B, ...]."""
        handle = self._actor_queue.queue.queue_ref
        dtypes = [s.dtype for s in tf.nest.flatten(self._actor_queue.element_spec)]
        first = tf.raw_ops.QueueDequeueV2(handle=handle, component_types=dtypes)
        if self._max_requests == 1:
            return [f[None] for f in first]
        with tf.control_dependencies(first):
            more = tf.minimum(tf.raw_ops.QueueSizeV2(handle=handle), self._max_requests - 1)
        rest = tf.raw_ops.QueueDequeueManyV2(handle=handle, n=more, component_types=dtypes)
        return [tf.concat([f[None], r], axis=0) for f, r in zip(first, rest)]

    def _serve_one(self):
        requests = self._take_waiting()  # each [n, B, ...]
        flat_rows = [tf.reshape(t, [-1] + s.shape.as_list()[1:]) for t, s in
                     zip(requests, tf.nest.flatten(self._actor_queue.element_spec))]
        env_ids = flat_rows[-1]  # [n * B]
        if self._partial:
            asking = tf.where(env_ids >= 0)  # [rows, 1]
            flat_rows = [tf.gather_nd(t, asking) for t in flat_rows]
        time_step, state, env_ids = tf.nest.pack_sequence_as(
            self._actor_queue.element_spec, flat_rows)
        with tf.control_dependencies(tf.nest.flatten(time_step)):
            start = tf.timestamp()
        with tf.control_dependencies([start]):
            step = self._policy.action(time_step, state)
        step_spec = self._return_queues[0].element_spec  # [B, ...]
        flat_step = flat_policy_step(step, step_spec)
        if self._partial:  # back to [n * B] rows; rows that did not ask get zeros
            num_rows = tf.shape(requests[-1], out_type=tf.int64)[0] * self._B
            flat_step = [tf.scatter_nd(asking, t, tf.concat([[num_rows], tf.shape(
                t, out_type=tf.int64)[1:]], axis=0)) for t in flat_step]
        flat_step = [tf.reshape(t, [-1] + s.shape.as_list())
                     for t, s in zip(flat_step, tf.nest.flatten(step_spec))]  # [n, B, ...]
        with tf.control_dependencies(flat_step):
            timed = self._inference.assign_add(tf.timestamp() - start)
        sent = []
        with tf.control_dependencies([timed]):
            if len(self._return_queues) == 1:
                sent.append(tf.raw_ops.QueueEnqueueManyV2(
                    handle=self._return_queues[0].queue.queue_ref, components=flat_step))
            else:
                # Each reply goes back to its env thread's queue: partition the
                # requests by this actor's local index of the env thread (one op
                # per field, then one enqueue per env thread, empty ones
                # included: those are no-ops).
                owner = tf.reduce_max(requests[-1], axis=1) // self._B
                local = tf.gather(self._local_index, owner)
                parts = [tf.dynamic_partition(t, local, len(self._env_threads))
                         for t in flat_step]
                for j, q in enumerate(self._return_queues):
                    sent.append(tf.raw_ops.QueueEnqueueManyV2(
                        handle=q.queue.queue_ref, components=[p[j] for p in parts]))
        with tf.control_dependencies(sent):
            counted = self._rows.assign_add(tf.cast(tf.shape(env_ids)[0], tf.int64))
        with tf.control_dependencies([counted]):
            return self._batches.assign_add(1)

    def _loop_graph(self):
        # Runs until a queue op fails because the driver closed the queues.
        tf.while_loop(lambda c: True, lambda c: [self._serve_one()], [self._batches.value()],
                      parallel_iterations=1)
