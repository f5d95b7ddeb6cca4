"""An env thread's graph loop: the whole run is one long-running graph call.

For `stepping.GRAPH` environments: a tf.while_loop that ends only when a
queue is closed, each iteration one unroll (a permit when paced, T steps,
shipped by `Unrolls.ship_in_graph`). The queue traffic and the unroll never
touch Python; the GIL is taken only to step a Python environment
(benchmarks/throughput.py measures the loop; benchmarks/results/HISTORY.md
has what it was compared with). The T steps are written out in the graph
(a Python loop at trace time), not run by an inner tf.while_loop with
TensorArrays.

A Python environment is stepped through our own `tf.numpy_function`, which
records the environment's exception (`env_error`) before TF turns it into a
`tf.errors.OpError`, so the env thread raises the original (a ValueError in
env.step stays a ValueError, with its traceback). A TF-native environment,
or one isolated on its own thread, is stepped with `env.step`; its errors
are TF errors already. Python steps that hold the GIL take the step token
(`Stepping.takes_step_token`): one at a time across env threads, since two
waiting for the GIL would hold both of TF's default inter-op threads and
starve the actors.

Threads: `trace` runs on the driver's constructing thread (env threads never
trace concurrently, and a stop during start-up never waits for a trace);
the traced function is called by the env thread and blocks in its queue
ops and the environment's step; closing the queues ends it (an environment
step in progress finishes first).
"""

import tensorflow as tf
from tf_agents.trajectories import trajectory as trajectory_lib

from alf_async.driver.queues import batched_spec


class GraphLoop(object):
    """Builds one env thread's graph loop."""

    def __init__(self, env, stepping, acting, unrolls, queues, step_token=None):
        """
        Args:
            env: the TFEnvironment (batch size B).
            stepping: its `Stepping` (kind GRAPH).
            acting: the thread's `ActorActing` or `SelfActing`.
            unrolls: the thread's `Unrolls`.
            queues: the driver's `TFQueues` (for the specs).
            step_token: the `NestFIFOQueue` holding the step token, or None
                to step without one (a lone Python step contends with none).
        """
        self._env = env
        self._py_env = stepping.py_env
        self._acting = acting
        self._unrolls = unrolls
        self._step_token = step_token
        B = unrolls.B
        self._time_step_spec, self._state_spec, _ = queues.actor_request_spec
        self._policy_step_spec = batched_spec(queues.policy_step_spec, B)
        self.env_error = None   # what the Python environment's step raised

    def trace(self):
        """The loop's concrete function: (flat time step, flat policy state)
        of the B rows -> runs until the queues close."""
        return tf.function(self._loop, autograph=False).get_concrete_function(
            [tf.TensorSpec(s.shape, s.dtype) for s in tf.nest.flatten(self._time_step_spec)],
            [tf.TensorSpec(s.shape, s.dtype) for s in tf.nest.flatten(self._state_spec)])

    def _py_step(self, *flat_action):
        try:
            action = tf.nest.pack_sequence_as(self._env.action_spec(), list(flat_action))
            return tf.nest.flatten(self._py_env.step(action))
        except BaseException as e:
            self.env_error = e
            raise

    def _env_step(self, action):
        if self._py_env is None:
            return self._env.step(action)
        flat_spec = tf.nest.flatten(self._time_step_spec)
        dtypes = [s.dtype for s in flat_spec]
        if self._step_token is None:
            flat = tf.numpy_function(self._py_step, tf.nest.flatten(action), dtypes,
                                     stateful=True)
        else:
            token = self._step_token.queue
            with tf.control_dependencies(tf.nest.flatten(action)):
                taken = token.dequeue()
            with tf.control_dependencies([taken]):
                flat = tf.numpy_function(self._py_step, tf.nest.flatten(action), dtypes,
                                         stateful=True)
            with tf.control_dependencies(flat):
                returned = token.enqueue(taken)
            with tf.control_dependencies([returned]):
                flat = [tf.identity(t) for t in flat]
        for t, s in zip(flat, flat_spec):
            # Static shapes at trace time (no op): a step of another shape
            # fails at the learn and log queues' enqueue, which check them.
            t.set_shape(s.shape)
        return tf.nest.pack_sequence_as(self._time_step_spec, flat)

    def _unroll(self, flat_time_step, flat_state, env_ids, permit=None):
        """T steps; returns the Trajectory [B, T], the loop state after it
        and the seconds waited for actions in it (None: not timed). Given a
        `permit` (a dequeue of the permits queue), the first step's every op
        waits for it, the policy's variable reads included: the unroll acts
        with the weights of after the learner's `dequeue_all` that gave it.
        """
        transitions, waits = [], []
        for t in range(self._unrolls.T):
            time_step = tf.nest.pack_sequence_as(self._time_step_spec, flat_time_step)
            state = tf.nest.pack_sequence_as(self._state_spec, flat_state)
            if t == 0:
                begin = [] if permit is None else [permit]
            else:
                # Acting itself, step t's variable reads wait for step t-1's
                # outcome: without the edge each ran as the unroll began (they
                # take no data), so all T steps would act with the weights of
                # its start (a policy lag one unroll longer).
                begin = flat_time_step if self._acting.acts_itself else []
            with tf.control_dependencies(begin):
                policy_step, waited = self._acting.in_graph(time_step, state, env_ids)
            if waited is not None:
                waits.append(waited)
            next_time_step = self._env_step(policy_step.action)
            transitions.append(tf.nest.flatten(
                trajectory_lib.from_transition(time_step, policy_step, next_time_step)))
            flat_time_step = tf.nest.flatten(next_time_step)
            flat_state = tf.nest.flatten(policy_step.state)
        flat_traj = [tf.stack(leaves, axis=1) for leaves in zip(*transitions)]
        return flat_traj, flat_time_step, flat_state, (tf.add_n(waits) if waits else None)

    def _loop(self, flat_time_step, flat_state):
        unrolls = self._unrolls
        env_ids = tf.range(unrolls.index * unrolls.B, (unrolls.index + 1) * unrolls.B,
                           dtype=tf.int32)

        def body(flat_time_step, flat_state):
            flat_traj, flat_time_step, flat_state, waited = self._unroll(
                flat_time_step, flat_state, env_ids, unrolls.permit_in_graph())
            counted = unrolls.ship_in_graph(flat_traj + [env_ids], waited)
            with tf.control_dependencies(counted):
                return ([tf.identity(t) for t in flat_time_step],
                        [tf.identity(t) for t in flat_state])

        # Runs until a queue op fails because the driver closed the queues.
        tf.while_loop(lambda *_: True, body, (flat_time_step, flat_state), parallel_iterations=1)
