"""How an env thread gets its actions: the one seam between stepping and acting.

Every way of stepping (graph_loop.py, python_loop.py, rows_loop.py) asks
for its policy steps through one of two objects with the same methods:

- `ActorActing`: through its actor queue. A request of the B rows
  (time_step, policy_state, env_id) goes to the actor queue; the reply
  comes back on the thread's own action-return queue (actor_thread.py).
- `SelfActing`: the env thread runs `policy.action` itself
  (`num_actor_queues=0`, no actor thread): inside its graph loop, or from
  its Python loops through one traced concrete function (`own_action`). In
  the graph loop that removes the request, the reply, their hand-offs and
  the wait's timer; from Python, a concrete function's call costs more
  than the round trip (benchmarks/driver_cost.py measures both), so there
  an actor is cheaper.

Each has `in_graph(time_step, policy_state, env_ids)` (graph ops, called at
trace time) and, for the Python loops, `open()` once per run and then
`ask(flat_time_step, flat_state, env_ids, rows=None)` per request. Both
give the same policy steps in the same dtypes (`flat_policy_step`).

Threads: `in_graph` runs on the thread that traces the graph loop (the
driver's constructing thread); `open` and `ask` on the env thread; the
counters (`wait_secs`, `request_secs`) may be read by any thread.
"""

import time

import tensorflow as tf

from alf_async.driver.queues import batched_spec


def flat_policy_step(step, spec):
    """`step`'s fields, flat, each cast to `spec`'s dtype (the dtypes the
    queues and the trajectories carry), its structure checked against
    `spec` (at trace time). The actor's forward pass and an env thread
    acting itself both give their policy steps this way."""
    tf.nest.assert_same_structure(spec, step)
    return [tf.cast(t, s.dtype) for t, s in zip(tf.nest.flatten(step), tf.nest.flatten(spec))]


def own_action(policy, queues):
    """The concrete function an env thread that acts itself calls from its
    Python loops: (flat time step [n, ...], flat policy state [n, ...]) ->
    the flat policy step [n, ...] in `queues.policy_step_spec`'s dtypes, for
    any n (the rows that are ready). One per driver, shared by its env
    threads; traced by the caller (the driver's constructing thread)."""
    def act(flat_time_step, flat_state):
        step = policy.action(
            tf.nest.pack_sequence_as(policy.time_step_spec, flat_time_step),
            tf.nest.pack_sequence_as(policy.policy_state_spec, flat_state))
        return flat_policy_step(step, queues.policy_step_spec)

    def signature(spec):
        return [tf.TensorSpec([None] + s.shape.as_list(), s.dtype) for s in tf.nest.flatten(spec)]

    return tf.function(act, autograph=False).get_concrete_function(
        signature(queues.time_step_spec), signature(policy.policy_state_spec))


class ActorActing(object):
    """Actions from an actor thread: a request on `actor_queue`, the reply
    on `return_queue` (both `NestFIFOQueue`s)."""

    acts_itself = False

    def __init__(self, actor_queue, return_queue, policy_step_spec, batch_size):
        self._actor_queue = actor_queue
        self._return_queue = return_queue
        self._batched_step_spec = batched_spec(policy_step_spec, batch_size)
        self._step_dtypes = [s.dtype for s in tf.nest.flatten(policy_step_spec)]
        self._request = self._reply = None
        self.wait_secs = 0.0      # Python loops: waiting for replies
        self.request_secs = 0.0   # Python loops: sending requests

    def in_graph(self, time_step, policy_state, env_ids):
        """The B rows' policy steps and the seconds waited for them (graph ops)."""
        # Explicit control dependencies: automatic ones order ops per resource
        # only, and these touch different queues.
        flat_request = tf.nest.flatten((time_step, policy_state, env_ids))
        request = self._actor_queue.queue.enqueue(flat_request)
        with tf.control_dependencies([request]):
            start = tf.timestamp()
        with tf.control_dependencies([start]):
            flat_step = self._return_queue.queue.dequeue()
        if not isinstance(flat_step, list):
            flat_step = [flat_step]  # static shapes: the queue's element shapes
        with tf.control_dependencies(flat_step):
            waited = tf.timestamp() - start
        return tf.nest.pack_sequence_as(self._batched_step_spec, flat_step), waited

    def open(self):
        """Takes the queues' raw handles for `ask` (once per run). Queue
        traffic uses the raw queue ops on numpy arrays (one op per request
        and per reply of B rows): `NestFIFOQueue.enqueue`'s Python wrapper
        (nest checks, conversions) costs several times the op itself."""
        self._request = self._actor_queue.queue.queue_ref
        self._reply = self._return_queue.queue.queue_ref

    def ask(self, flat_time_step, flat_state, env_ids, rows=None):
        """The flat policy step (numpy) of `rows`, in their order (None: all
        B rows): one request of the B rows (those not asking carry env id
        -1) and one reply; the wait for it and the request are counted."""
        sent = time.perf_counter()
        tf.raw_ops.QueueEnqueueV2(handle=self._request,
                                  components=flat_time_step + flat_state + [env_ids])
        start = time.perf_counter()
        flat_step = tf.raw_ops.QueueDequeueV2(handle=self._reply,
                                              component_types=self._step_dtypes)
        self.wait_secs += time.perf_counter() - start
        self.request_secs += start - sent
        return [t.numpy() if rows is None else t.numpy()[rows] for t in flat_step]


class SelfActing(object):
    """Actions from `policy.action`, run by the env thread itself."""

    acts_itself = True
    wait_secs = 0.0      # its forward pass is its own work, not a wait
    request_secs = 0.0

    def __init__(self, policy, own_action_fn, policy_step_spec, batch_size):
        """
        Args:
            policy: the TFPolicy (its `action` runs inside the graph loop).
            own_action_fn: `own_action(policy, queues)`, which `ask` calls
                (None for a thread that only runs its graph loop).
            policy_step_spec: the unbatched PolicyStep spec.
            batch_size: B.
        """
        self._policy = policy
        self.own_action = own_action_fn
        self._batched_step_spec = batched_spec(policy_step_spec, batch_size)

    def in_graph(self, time_step, policy_state, env_ids):
        """`policy.action` in this graph, its outputs given the spec's dtypes
        and (at trace time, no op) its static shapes; waits for nothing
        (None)."""
        del env_ids
        spec = self._batched_step_spec
        flat_step = flat_policy_step(self._policy.action(time_step, policy_state), spec)
        for t, s in zip(flat_step, tf.nest.flatten(spec)):
            t.set_shape(s.shape)
        return tf.nest.pack_sequence_as(spec, flat_step), None

    def open(self):
        """Nothing to open."""

    def ask(self, flat_time_step, flat_state, env_ids, rows=None):
        """The flat policy step (numpy) of `rows` (None: all B rows), from
        `own_action` for those rows only."""
        del env_ids
        if rows is not None:
            flat_time_step = [f[rows] for f in flat_time_step]
            flat_state = [f[rows] for f in flat_state]
        return [t.numpy() for t in self.own_action(flat_time_step, flat_state)]
