"""ActorThread: one batched forward pass of the policy for the waiting rows.

Dynamic batching (IMPALA's and SEED RL's inference batching): each iteration
blocks until at least one request row is waiting on its actor queue, then
takes every row that is waiting, up to `max_batch` (actor_queue_cap * B),
runs `policy.action` once over them, and sends each row's policy step to
the action-return queue of the env thread it came from. No environment
waits for a straggler: a batch is whatever is ready, from 1 row to the cap.

There is no timed wait for more rows: a TF queue has no timed dequeue (the
`timeout_ms` attribute is "not supported yet"), and sleeping inside the
graph (a tf.data sleep) cost ~150 us of CPU per poll on the project's
2-core machine, more than the forward pass it would save. Rows accumulate
by themselves while the actor runs a forward pass.

Rows keep their env id (the global row id, env thread index * B + b), so
the policy state comes in with the row and goes back with it: an RNN's state
always stays with its own row, whatever the batch.

The loop is one long-running graph call that ends only when a queue is
closed, so serving actions never takes the GIL. It is traced in `__init__`
on the constructing thread: actors never trace (or build Keras layers)
concurrently, and a policy that does not fit the specs fails at
construction.

Threads: `run()` is this thread; it blocks inside the graph call on the
actor queue (dequeue) and the return queues (enqueue; each holds B rows and
an env thread has at most B requests out, so that never waits). Closing the
queues ends the call. The perf counters may be read by any thread.
"""

import threading

import tensorflow as tf

from alf_async.env_thread import QUEUE_CLOSED_ERRORS


class ActorThread(threading.Thread):
    """Serves one actor queue with dynamically batched `policy.action` calls."""

    def __init__(self, name, coord, policy, actor_queue, return_queues, env_threads,
                 env_batch_size, max_batch):
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
            max_batch: the most rows one forward pass takes.
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
        self._max_batch = max_batch
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
        """Blocks for one request row, then takes the rows waiting, up to max_batch."""
        handle = self._actor_queue.queue.queue_ref
        specs = tf.nest.flatten(self._actor_queue.element_spec)
        dtypes = [s.dtype for s in specs]
        first = tf.raw_ops.QueueDequeueV2(handle=handle, component_types=dtypes)
        with tf.control_dependencies(first):
            more = tf.minimum(tf.raw_ops.QueueSizeV2(handle=handle), self._max_batch - 1)
        rest = tf.raw_ops.QueueDequeueManyV2(handle=handle, n=more, component_types=dtypes)
        flat = [tf.ensure_shape(tf.concat([f[None], r], axis=0), [None] + s.shape.as_list())
                for f, r, s in zip(first, rest, specs)]
        return tf.nest.pack_sequence_as(self._actor_queue.element_spec, flat)

    def _serve_one(self):
        time_step, state, env_ids = self._take_waiting()
        with tf.control_dependencies(tf.nest.flatten(time_step)):
            start = tf.timestamp()
        with tf.control_dependencies([start]):
            step = self._policy.action(time_step, state)
        step_spec = self._return_queues[0].element_spec
        tf.nest.assert_same_structure(step_spec, step)
        flat_step = [tf.cast(t, s.dtype)
                     for t, s in zip(tf.nest.flatten(step), tf.nest.flatten(step_spec))]
        with tf.control_dependencies(flat_step):
            timed = self._inference.assign_add(tf.timestamp() - start)
        # Rows go back to their env threads' queues: partition them by this
        # actor's local index of the env thread (one op per field, then one
        # enqueue per env thread, empty ones included: those are no-ops).
        local = tf.gather(self._local_index, env_ids // self._B)
        parts = [tf.dynamic_partition(t, local, len(self._env_threads)) for t in flat_step]
        sent = []
        with tf.control_dependencies([timed]):
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
