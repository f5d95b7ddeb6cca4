"""ActorThread: one batched forward pass of the policy for the waiting envs.

Each iteration takes `actor_queue_cap` requests at once from its actor queue
(`dequeue_many(capacity)`: it waits until that many env threads are
waiting), merges them into one batch of `actor_queue_cap * B` rows, runs
`policy.action` once, and sends each env thread its slice on that thread's
action-return queue (chosen in the graph by gathering the queues' resource
handles with the request's env id).

The loop is one long-running graph call that ends only when a queue is
closed, so serving actions never takes the GIL. It is traced in `__init__`
on the constructing thread: actors never trace (or build Keras layers)
concurrently, and a policy that does not fit the specs fails at
construction.

Threads: `run()` is this thread; it blocks inside the graph call on the
actor queue (dequeue) and the return queues (enqueue; capacity 1 and an env
thread has one request out at a time, so that wait is short). Closing the
queues ends the call. The perf counters may be read by any thread.
"""

import threading

import tensorflow as tf

from alf_async.env_thread import QUEUE_CLOSED_ERRORS
from alf_async.queues import batched_spec


class ActorThread(threading.Thread):
    """Serves one actor queue with batched `policy.action` calls."""

    def __init__(self, name, coord, policy, actor_queue, return_queues, env_batch_size):
        """
        Args:
            name: thread name.
            coord: the driver's `tf.train.Coordinator`.
            policy: a tf-agents TFPolicy.
            actor_queue: the `NestFIFOQueue` of requests this actor serves.
            return_queues: every env thread's action-return `NestFIFOQueue`,
                indexed by env thread index.
            env_batch_size: B.
        """
        super().__init__(name=name, daemon=True)
        self._coord = coord
        self._policy = policy
        self._actor_queue = actor_queue
        self._return_queues = return_queues
        self._cap = actor_queue.capacity
        self._B = env_batch_size
        self._request_spec = batched_spec(actor_queue.element_spec, self._cap)
        self._step_spec = return_queues[0].element_spec
        self._batches = tf.Variable(0, dtype=tf.int64, trainable=False, name=name + "_batches")
        self._inference = tf.Variable(0.0, dtype=tf.float64, trainable=False,
                                      name=name + "_inference_secs")
        self._loop = tf.function(self._loop_graph, autograph=False).get_concrete_function()

    @property
    def batches(self):
        """Forward passes run so far."""
        return int(self._batches.numpy())

    @property
    def rows(self):
        """Environment rows acted for so far (batches * actor_queue_cap * B)."""
        return self.batches * self._cap * self._B

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

    def _serve_one(self):
        cap, B = self._cap, self._B
        flat = self._actor_queue.queue.dequeue_many(cap)
        time_step, state, env_ids = tf.nest.pack_sequence_as(self._request_spec, flat)

        def merge(t):
            return tf.reshape(t, [cap * B] + t.shape[2:].as_list())

        with tf.control_dependencies(flat):
            start = tf.timestamp()
        with tf.control_dependencies([start]):
            step = self._policy.action(tf.nest.map_structure(merge, time_step),
                                       tf.nest.map_structure(merge, state))
        tf.nest.assert_same_structure(self._step_spec, step)
        flat_step = [
            tf.cast(tf.reshape(t, [cap, B] + t.shape[1:].as_list()), s.dtype)
            for t, s in zip(tf.nest.flatten(step), tf.nest.flatten(self._step_spec))
        ]
        with tf.control_dependencies(flat_step):
            timed = self._inference.assign_add(tf.timestamp() - start)
        handles = tf.stack([q.queue.queue_ref for q in self._return_queues])
        sent = []
        with tf.control_dependencies([timed]):
            for k in range(cap):
                sent.append(tf.raw_ops.QueueEnqueueV2(
                    handle=tf.gather(handles, env_ids[k]),
                    components=[t[k] for t in flat_step], timeout_ms=-1))
        with tf.control_dependencies(sent):
            return self._batches.assign_add(1)

    def _loop_graph(self):
        # Runs until a queue op fails because the driver closed the queues.
        tf.while_loop(lambda c: True, lambda c: [self._serve_one()], [self._batches.value()],
                      parallel_iterations=1)
