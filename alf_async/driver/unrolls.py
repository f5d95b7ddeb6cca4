"""An env thread's unroll bookkeeping, written once for its three ways of stepping.

What every way of stepping (graph_loop.py, python_loop.py, rows_loop.py)
does around its steps, once per unroll and never per step:

- pacing: with the driver's `batches_ahead`, take a permit before each
  unroll begins (`TFQueues.permits`);
- shipping: put the unroll — a batch-major Trajectory [n, T] and the global
  env id of each row — into the log queue, then the learn queue (in that
  order, so the metrics never count fewer unrolls than the learner was
  given), then count its env steps;
- the rows' initial policy state and global env ids (env_index * B + b).

The graph loop builds the same three steps as ops (`permit_in_graph`,
`ship_in_graph`); the Python loops run them with raw queue ops on numpy
arrays (`open`, `take_permit`, `ship`).

Threads: the graph ops are built on the thread that traces the graph loop;
`open`, `take_permit` and `ship` run on the env thread and block in their
queue ops (closing the queues ends them); `steps` may be read by any thread.
"""

import numpy as np
import tensorflow as tf


class Unrolls(object):
    """One env thread's pacing, shipping and step count."""

    def __init__(self, name, queues, env_index, unroll_length, initial_policy_state):
        """
        Args:
            name: the env thread's name (names its counter variables).
            queues: the driver's `TFQueues`.
            env_index: the env thread's index.
            unroll_length: T.
            initial_policy_state: nest of numpy arrays, the policy state for
                the B rows.
        """
        self.B = queues.env_batch_size
        self.T = unroll_length
        self.index = env_index
        self.env_ids = np.arange(env_index * self.B, (env_index + 1) * self.B, dtype=np.int32)
        self.initial_state = initial_policy_state
        self._queues = queues
        self._permits = queues.permits
        self._learn = self._log = self._permit = None
        # The graph loop's counters are variables; the Python loops' a number.
        self.steps_var = tf.Variable(0, dtype=tf.int64, trainable=False, name=name + "_steps")
        self.wait_var = tf.Variable(0.0, dtype=tf.float64, trainable=False,
                                    name=name + "_action_wait_secs")
        self.py_steps = 0

    @property
    def paced(self):
        """Each unroll begins with a permit (`batches_ahead`)."""
        return self._permits is not None

    @property
    def steps(self):
        """Env steps shipped so far."""
        return int(self.steps_var.numpy()) + self.py_steps

    @property
    def waited_in_graph_secs(self):
        """Seconds the graph loop waited for its actions."""
        return float(self.wait_var.numpy())

    # ------------------------------------------------------------------ graph

    def permit_in_graph(self):
        """The permit's dequeue op, or None when not paced."""
        return None if self._permits is None else self._permits.queue.dequeue()

    def ship_in_graph(self, unroll, waited):
        """Ops: `unroll` (flat Trajectory [B, T, ...] + env ids [B]) to the log
        queue, then the learn queue, then the counters (`waited`: seconds
        waited for actions in it, or None). Returns the counting ops."""
        logged = self._queues.log_queue.queue.enqueue_many(unroll)
        with tf.control_dependencies([logged]):
            learned = self._queues.learn_queue.queue.enqueue_many(unroll)
        with tf.control_dependencies([learned]):
            counted = [self.steps_var.assign_add(self.T * self.B)]
            if waited is not None:
                counted.append(self.wait_var.assign_add(waited))
        return counted

    # ----------------------------------------------------------------- Python

    def open(self):
        """Takes the queues' raw handles (once per run)."""
        self._learn = self._queues.learn_queue.queue.queue_ref
        self._log = self._queues.log_queue.queue.queue_ref
        if self._permits is not None:
            self._permit = self._permits.queue.queue_ref

    def take_permit(self):
        """Blocks until a permit comes (paced), else returns at once."""
        if self._permit is not None:
            tf.raw_ops.QueueDequeueV2(handle=self._permit, component_types=[tf.int32])

    def ship(self, unroll, for_learner, rows):
        """`unroll` (flat Trajectory [n, T, ...] + env ids [n], numpy) to the
        log queue, `for_learner` (the same, or its copy with untrainable
        transitions made inert) to the learn queue, and its n * T steps
        counted; `rows` is n."""
        tf.raw_ops.QueueEnqueueManyV2(handle=self._log, components=unroll)
        tf.raw_ops.QueueEnqueueManyV2(handle=self._learn, components=for_learner)
        self.py_steps += self.T * rows
