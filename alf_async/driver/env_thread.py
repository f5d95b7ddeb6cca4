"""EnvThread: steps one TFEnvironment, asks an actor for actions, ships unrolls.

Each step the thread puts one request of its B rows (time_step,
policy_state, env_id) into its actor queue, waits on its own action-return
queue, and steps the environment. After `unroll_length` steps it puts the
unroll — a batch-major Trajectory [B, T] and the global env id of each row —
into the log queue, then the learn queue (in that order, so the metrics
never count fewer unrolls than the learner was given).

The whole loop is one long-running graph call (a tf.while_loop that ends
only when a queue is closed): the queue traffic and the unroll never touch
Python, and the GIL is taken only to step a Python environment. Measured in
benchmarks/throughput.py: a Python loop of eager queue ops was ~5x slower
with 4 env threads, because every per-step op and numpy conversion
competed for the GIL.

Environments whose step blocks on something outside the process (a child
process, a Ray actor, a client of an ExternalEnv) declare it with
`blocking_step = True` on their Python environment. When the rows of such a
batch are separate environments (tf-agents' BatchedPyEnvironment, our
BatchedSubprocessEnv, ExternalEnv's batched slots), each row is stepped on its
own and asks for its action as soon as it is ready (`_rows_loop`, env_rows.py):
no row waits for a slower one. So is a batch that steps its own rows, blocking
or not (`capabilities.RowStepping`: an EnvPool pool). In-process rows step on a
worker thread each; SubprocessEnv children, ExternalEnv slots and EnvPool pools
need none (subprocess_rows.py, slot_stepper.py, envpool_rows.py). Other
blocking environments are stepped as one batch from a Python loop with eager
queue ops (`_python_loop`). Both stay off the graph, and both record what an
`AppliedStep` environment (or row) applied (applied_steps.py): its action in
the trajectory, and its untrainable transitions as inert boundaries in the
learn queue's copy of the unrolls (the log queue's copy is as it happened);
AppliedStep environments that do not block are stepped by `_python_loop` too.
Inside the graph, a blocked `numpy_function` holds one of TF's inter-op threads
(as many as cores by default), so a few blocked steps starved the actors and
deadlocked the driver (measured: 3 ExternalEnv slots and one client on 2
cores), and at most two child processes stepped at once. Their per-step
overhead does not matter next to the wait.

A Python environment behind a TFPyEnvironment is stepped through our own
`tf.numpy_function`, which records the environment's exception before TF
turns it into a `tf.errors.OpError`; the thread then raises the original
(a ValueError in env.step stays a ValueError, with its traceback). Other
TFEnvironments are stepped in the graph with `env.step`; their errors are TF
errors already.

An env thread that acts itself (`num_actor_queues=0`, no actor thread)
runs `policy.action` where the round trip was: inside its graph loop, or
from its Python loops through one traced concrete function (`own_action`).
In the graph loop that removes the request, the reply, their hand-offs and
the wait's timer; from Python, a concrete function's call costs more than
the round trip (benchmarks/driver_cost.py), so there an actor is cheaper.

Threads: `__init__` (the driver's constructing thread) traces the graph
loop; `run()` is this thread; everything blocks inside the graph call
(actor queue enqueue, return queue dequeue, log/learn queue enqueue, the
environment's own step; paced by the driver's `batches_ahead`, the permit
dequeue before each unroll). Closing the queues ends the call; an environment
step in progress finishes first. The Python loops block in the same queue
ops, and `_rows_loop` also waits at most 0.1 s at a time for ready rows
(then checks for stop); its row workers are described in env_rows.py (on
stop it joins them; leaving with an error it does not, since a row blocked
in its step ends only when the driver's stop closes the environment; the
stop then waits for them, `join_row_workers`). The
perf counters may be read by any thread.
"""

import threading
import time

import numpy as np
import tensorflow as tf
from tf_agents.environments import batched_py_environment
from tf_agents.trajectories import trajectory as trajectory_lib

from alf_async.driver import applied_steps
from alf_async.driver.queues import batched_spec
from alf_async.driver.env_rows import RowRecorder, row_envs, row_stepper
from alf_async.environments.capabilities import RowFailed
from alf_async.environments import capabilities

QUEUE_CLOSED_ERRORS = (tf.errors.CancelledError, tf.errors.OutOfRangeError)


def blocks(tf_env):
    """True when `tf_env`'s Python environment's step blocks
    (`capabilities.steps_block`): its own, or every environment's of a
    tf-agents BatchedPyEnvironment."""
    if not uses_python_env(tf_env):
        return False
    pyenv = tf_env.pyenv
    if isinstance(pyenv, batched_py_environment.BatchedPyEnvironment):
        return all(capabilities.steps_block(e) for e in pyenv.envs)
    return capabilities.steps_block(pyenv)


def uses_python_env(tf_env):
    """True when `tf_env`'s Python environment can be stepped from any thread.

    A TFPyEnvironment built with `isolation=True` must run its environment on
    its own thread, so it is stepped through `tf_env.step` instead.
    """
    return capabilities.python_env(tf_env) is not None and getattr(tf_env, "_pool", None) is None


def takes_step_token(tf_env):
    """True when an env thread steps `tf_env` in its graph loop from Python
    with the GIL held, and so takes turns with the others that do (the step
    token): not an environment whose step releases the GIL
    (`capabilities.steps_release_gil`: EnvPool's lockstep pool)."""
    return (not blocks(tf_env) and uses_python_env(tf_env)
            and not capabilities.steps_release_gil(tf_env.pyenv))


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


class EnvThread(threading.Thread):
    """Owns one environment (batch size B) and runs it until the queues close.

    It gets its actions from an actor thread (a request on `actor_queue`,
    the reply on `return_queue`), or, given `policy` instead, acts itself
    (`num_actor_queues=0`): the graph loop runs `policy.action` in its own
    graph between the steps, and the Python loops call `own_action`'s
    concrete function for the rows that are ready. Nothing else differs:
    the same unrolls, in the same order, go to the same log and learn
    queues.
    """

    def __init__(self, name, coord, env, env_index, queues, actor_queue, return_queue,
                 initial_policy_state, unroll_length, step_token=None, policy=None,
                 own_action_fn=None):
        """
        Args:
            name: thread name.
            coord: the driver's `tf.train.Coordinator`.
            env: a TFEnvironment with batch size B.
            env_index: this thread's index; rows get global ids env_index*B + b.
            queues: the driver's `TFQueues` (for the learn and log queues).
            actor_queue: the `NestFIFOQueue` this thread sends requests to, or
                None when it acts itself (`policy`).
            return_queue: the `NestFIFOQueue` its actions come back on (None
                with `policy`).
            initial_policy_state: nest of tensors, the policy state for B rows.
            unroll_length: T.
            step_token: the `NestFIFOQueue` holding the token that graph-mode
                env threads pass around their Python steps, or None to step
                without one (a lone graph-mode env thread contends with no
                other: the token would only add two queue ops per step).
            policy: the TFPolicy to act with in this thread (with no actor
                queue).
            own_action_fn: `own_action(policy, queues)`, which the Python
                loops of a thread that acts itself call (traced once per
                driver; needed with `policy` where `steps_in_graph(env)` is
                False).

        Raises:
            ValueError: neither or both of an actor queue and a policy, or a
                policy with no `own_action_fn` for a Python loop.
        """
        super().__init__(name=name, daemon=True)
        if (actor_queue is None) == (policy is None):
            raise ValueError(f"{name}: give an actor queue and a return queue, or a policy "
                             f"to act with itself, not both or neither")
        self._coord = coord
        self._env = env
        self._index = env_index
        self._queues = queues
        self._actor_queue = actor_queue
        self._return_queue = return_queue
        self._policy = policy
        self._own_action = own_action_fn
        self._initial_policy_state = initial_policy_state
        self._T = unroll_length
        self._B = queues.env_batch_size
        self._step_token = step_token
        self._permits = queues.permits
        if self._permits is not None and row_envs(env) is not None:
            raise ValueError(
                f"{name}: batches_ahead paces env threads that begin each unroll of their "
                f"batch at once; this one steps its rows one by one (row_envs: an EnvPool "
                f"pool stepped asynchronously, separate blocking environments), each row "
                f"beginning its unrolls on its own. Use batches_ahead=None, or a batch "
                f"stepped as one (EnvPool: suite_envpool.stepping = 'lockstep')")
        self._batched_time_step_spec, self._batched_state_spec, _ = queues.actor_request_spec
        self._batched_policy_step_spec = batched_spec(queues.policy_step_spec, self._B)
        self._python_env = uses_python_env(env)
        # AppliedStep environments are stepped by a Python loop, which reads
        # their applied_step() (see applied_steps.py): by rows if row_envs()
        # takes them, else as one batch.
        self._reports_applied = applied_steps.reports(env)
        if self._reports_applied and not self._python_env:
            raise ValueError(f"{name}: its environment reports applied steps (AppliedStep) "
                             f"but is a TFPyEnvironment with isolation=True, whose Python "
                             f"environment cannot be stepped from this thread")
        self._env_error = None
        # Counters of the Python loops (the graph loop uses the variables).
        self._py_steps = 0
        self._py_wait = 0.0
        self._py_request = 0.0
        self._row_workers = None   # _rows_loop's stepper, for join_row_workers
        self._steps = tf.Variable(0, dtype=tf.int64, trainable=False, name=name + "_steps")
        self._wait = tf.Variable(0.0, dtype=tf.float64, trainable=False,
                                 name=name + "_action_wait_secs")
        # The graph loop is traced here, on the constructing thread, as the
        # actors' are: env threads never trace concurrently, and stop() during
        # start-up never waits for a trace to finish (the reliability trials
        # once saw 4 env threads' traces outlast the 4 s grace period on a
        # machine loaded 8 deep).
        self._graph_loop = None
        if self.steps_in_graph(env):
            self._graph_loop = tf.function(self._loop, autograph=False).get_concrete_function(
                [tf.TensorSpec(s.shape, s.dtype)
                 for s in tf.nest.flatten(self._batched_time_step_spec)],
                [tf.TensorSpec(s.shape, s.dtype)
                 for s in tf.nest.flatten(self._batched_state_spec)])
        elif policy is not None and own_action_fn is None:
            raise ValueError(f"{name}: an env thread that acts itself outside its graph loop "
                             f"needs own_action_fn (own_action(policy, queues))")

    @staticmethod
    def steps_in_graph(env):
        """Whether an env thread runs `env` in its graph loop (`_loop`),
        not in one of its Python loops."""
        return row_envs(env) is None and not blocks(env) and not applied_steps.reports(env)

    @property
    def steps(self):
        """Env steps this thread has put into unrolls."""
        return int(self._steps.numpy()) + self._py_steps

    @property
    def action_wait_secs(self):
        """Seconds this thread spent waiting for its actions."""
        return float(self._wait.numpy()) + self._py_wait

    @property
    def request_secs(self):
        """Seconds this thread's Python loops spent sending requests to the
        actor (the enqueue op, and taking the GIL back after it; the graph
        loop does not count them)."""
        return self._py_request

    def join_row_workers(self, timeout):
        """Waits up to `timeout` seconds for the row workers of `_rows_loop`
        (the driver's stop, after closing the environments): a loop that left
        with an error did not wait for rows blocked in a step, which end once
        their environment is closed."""
        if self._row_workers is not None:
            self._row_workers.join(timeout)

    def drop_graph_loop(self):
        """Drops the traced graph loop of a thread that never ran (the driver's
        stop() calls it). The loop's graph refers back to this thread (its
        numpy_function), and that cycle kept ~7 MB per driver alive for good:
        60 drivers built and stopped in one process grew to 860 MiB, against
        513 MiB when the loop was traced in run() and dropped with its call.
        """
        self._graph_loop = None

    def run(self):
        with self._coord.stop_on_exception():
            try:
                rows = row_envs(self._env)
                # Held by this call only: see drop_graph_loop.
                graph_loop, self._graph_loop = self._graph_loop, None
                if graph_loop is not None:
                    time_step = self._env.reset()
                    graph_loop(tf.nest.flatten(time_step),
                               tf.nest.flatten(self._initial_policy_state))
                elif rows is not None:
                    self._rows_loop(rows)
                else:
                    self._python_loop(self._env.pyenv.reset())
            except Exception as e:  # pylint: disable=broad-except
                if isinstance(e, capabilities.EndOfData):
                    applied_steps.wait_until_learner_took_all(self._queues.learn_queue,
                                                              self._coord)
                if self._coord.should_stop():
                    return  # queues (or the env) closed by stop(): not an error
                if self._env_error is not None and e is not self._env_error:
                    # Raise the environment's own exception, not TF's wrapper of it.
                    raise self._env_error.with_traceback(
                        self._env_error.__traceback__) from None
                raise

    # ------------------------------------------- Python, row by row (blocking)

    def _queue_handles(self):
        """The raw handles of the request, reply, learn and log queues (Python
        loops; request and reply None for a thread that acts itself)."""
        if self._actor_queue is None:
            request = reply = None
        else:
            request = self._actor_queue.queue.queue_ref
            reply = self._return_queue.queue.queue_ref
        return (request, reply, self._queues.learn_queue.queue.queue_ref,
                self._queues.log_queue.queue.queue_ref)

    def _ask(self, request, reply, step_dtypes, flat_time_step, flat_state, env_ids,
             rows=None):
        """The flat policy step of `rows`, in their order (None: all B rows;
        Python loops). From the actor: one request of the B rows (those not
        asking carry env id -1) and one reply, the wait for it counted. A
        thread that acts itself calls `own_action` for those rows only and,
        as in its graph loop, counts no wait: the forward pass is its own work.
        """
        if request is None:
            if rows is not None:
                flat_time_step = [f[rows] for f in flat_time_step]
                flat_state = [f[rows] for f in flat_state]
            return [t.numpy() for t in self._own_action(flat_time_step, flat_state)]
        sent = time.perf_counter()
        tf.raw_ops.QueueEnqueueV2(handle=request,
                                  components=flat_time_step + flat_state + [env_ids])
        start = time.perf_counter()
        flat_step = tf.raw_ops.QueueDequeueV2(handle=reply, component_types=step_dtypes)
        self._py_wait += time.perf_counter() - start
        self._py_request += start - sent
        return [t.numpy() if rows is None else t.numpy()[rows] for t in flat_step]

    def _rows_loop(self, envs):
        """Steps each row on its own worker thread (or with the rows' own
        stepper: ExternalEnv slots, SubprocessEnv children, an EnvPool pool;
        no threads) and asks for actions for whichever rows are ready
        (EnvPool's asynchronous mode, see env_rows.py).

        A row's transition is recorded right after its step (by its worker, or
        in the stepper's `recv`) in per-row unroll buffers; a row with T
        transitions is copied out whole. Each iteration of this thread then
        takes the rows that are ready, sends one request of them to the actor,
        waits for their policy steps and hands each row its action; once B
        rows' unrolls are complete it ships them (one enqueue to the log queue,
        then one to the learn queue). A row waits only for its own step and one
        forward pass, never for the other rows of its batch.

        AppliedStep rows: each worker reads its row's `applied_step()` right
        after the step, and the recorder puts the applied action into the
        row's transition and keeps its trainable flag; the learn queue gets
        the shipped unrolls with untrainable transitions made inert
        (`InertBoundaries`, per row, across the row's unrolls), the log queue
        as they happened. When a row's step raises `EndOfData`, the unrolls
        already complete are shipped before it is raised (fewer than B may
        be waiting: the data's last unrolls would be lost otherwise).

        Every blocking call of this thread releases the GIL, and taking it
        back means waiting behind the workers that want it (instrumented with
        32 workers on 2 cores: ~0.5-1 ms per call), so the loop makes few:
        one wait for ready rows, one request and one reply per iteration,
        raw queue ops on numpy arrays. (A graph loop taking the GIL once per
        iteration in a numpy_function measured no faster, and held one of
        TF's inter-op threads while it waited, so this stays in Python.)
        """
        B, T = self._B, self._T
        request, reply, learn, log = self._queue_handles()
        step_spec = self._queues.policy_step_spec
        step_dtypes = [s.dtype for s in tf.nest.flatten(step_spec)]
        num_action = len(tf.nest.flatten(step_spec.action))
        num_state = len(tf.nest.flatten(step_spec.state))
        action_spec = self._env.pyenv.action_spec()
        env_ids = np.arange(self._index * B, (self._index + 1) * B, dtype=np.int32)
        recorder = RowRecorder(self._queues.time_step_spec, step_spec,
                               self._queues.unroll_spec[0], B, T)
        inert = (applied_steps.InertBoundaries(self._queues.unroll_spec[0],
                                               self._env.action_spec(), B)
                 if self._reports_applied else None)

        def ship():
            unroll, trainable, rows = recorder.take_complete(env_ids)
            tf.raw_ops.QueueEnqueueManyV2(handle=log, components=unroll)
            tf.raw_ops.QueueEnqueueManyV2(
                handle=learn,
                components=unroll if inert is None else inert.for_learner(unroll, trainable, rows))
            self._py_steps += T * len(rows)

        state = [np.array(t) for t in tf.nest.flatten(self._initial_policy_state)]
        workers = row_stepper(self.name, envs, recorder)
        self._row_workers = workers
        workers.start()
        failed = True
        try:
            while True:
                results = workers.recv(timeout=0.1)
                if not results:
                    if self._coord.should_stop():
                        failed = False
                        return
                    continue
                rows = []
                for r, result in results:
                    if isinstance(result, RowFailed):
                        self._env_error = result.error
                        if isinstance(result.error, capabilities.EndOfData) and recorder.complete:
                            ship()   # the data ended: what is complete goes to the learner
                        raise result.error
                    rows.append(r)
                if len(recorder.complete) >= B:
                    ship()
                # One request of all B rows; the rows not asking carry env id -1.
                asking = np.full(B, -1, np.int32)
                asking[rows] = env_ids[rows]
                flat_step = self._ask(request, reply, step_dtypes, recorder.current, state,
                                      asking, rows)
                recorder.acting_with(rows, flat_step)
                for field, value in zip(state, flat_step[num_action:num_action + num_state]):
                    field[rows] = value
                workers.send(rows, flat_step[0] if num_action == 1 else
                             tf.nest.pack_sequence_as(action_spec, flat_step[:num_action]))
        finally:
            # Leaving with an error of its own (a row's, EndOfData) while the
            # driver runs: do not wait for rows blocked in a step (a hung
            # child process); the driver stops once the error is raised and
            # its stop closes them. On stop the driver has closed them
            # already: wait.
            workers.close(wait=not failed or self._coord.should_stop())

    # ----------------------------------------------------- Python (blocking)

    def _python_loop(self, time_step):
        """The same loop as `_loop`, in Python, for environments whose step blocks.

        Queue traffic uses the raw queue ops on numpy arrays (one op per
        request and per reply of B rows): `NestFIFOQueue.enqueue`'s Python
        wrapper (nest checks, conversions) cost ~4x the op itself.
        """
        request, reply, learn, log = self._queue_handles()
        pyenv = self._env.pyenv
        step_spec = self._queues.policy_step_spec
        step_dtypes = [s.dtype for s in tf.nest.flatten(step_spec)]
        env_ids = np.arange(self._index * self._B, (self._index + 1) * self._B, dtype=np.int32)
        flat_state = [np.asarray(t) for t in tf.nest.flatten(self._initial_policy_state)]
        applied = (applied_steps.AppliedSteps(pyenv, self._queues.unroll_spec[0],
                                              self._env.action_spec(), self._B)
                   if self._reports_applied else None)
        while True:
            if self._permits is not None:   # paced: begin only with a permit
                tf.raw_ops.QueueDequeueV2(handle=self._permits.queue.queue_ref,
                                          component_types=[tf.int32])
            transitions = []
            for _ in range(self._T):
                flat_step = self._ask(request, reply, step_dtypes, tf.nest.flatten(time_step),
                                      flat_state, env_ids)
                policy_step = tf.nest.pack_sequence_as(step_spec, flat_step)
                next_time_step = pyenv.step(policy_step.action)
                if applied is not None:
                    policy_step = applied.after_step(policy_step)
                transitions.append(tf.nest.flatten(
                    trajectory_lib.from_transition(time_step, policy_step, next_time_step)))
                time_step = next_time_step
                flat_state = tf.nest.flatten(policy_step.state)
            unroll = [np.stack(leaves, axis=1) for leaves in zip(*transitions)] + [env_ids]
            tf.raw_ops.QueueEnqueueManyV2(handle=log, components=unroll)
            tf.raw_ops.QueueEnqueueManyV2(
                handle=learn, components=unroll if applied is None else applied.for_learner(unroll))
            self._py_steps += self._T * self._B

    # ------------------------------------------------------------------ graph

    def _py_step(self, *flat_action):
        try:
            action = tf.nest.pack_sequence_as(self._env.action_spec(), list(flat_action))
            return tf.nest.flatten(self._env.pyenv.step(action))
        except BaseException as e:
            self._env_error = e
            raise

    def _env_step(self, action):
        if not self._python_env:
            return self._env.step(action)
        flat_spec = tf.nest.flatten(self._batched_time_step_spec)
        dtypes = [s.dtype for s in flat_spec]
        if self._step_token is None:
            flat = tf.numpy_function(self._py_step, tf.nest.flatten(action), dtypes,
                                     stateful=True)
        else:
            # One Python step at a time across env threads (the step token):
            # they hold the GIL anyway, and two waiting for it would hold both
            # of TF's default inter-op threads, starving the actors.
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
        return tf.nest.pack_sequence_as(self._batched_time_step_spec, flat)

    def _act(self, time_step, policy_state, env_ids):
        """The policy steps of the B rows, and the seconds waited for them
        (None for a thread that acts itself, which times nothing: its
        forward pass is its own work, not a wait).

        From the actor: sends the B request rows and waits for the reply.
        Acting itself: `policy.action` in this graph, its outputs given the
        spec's dtypes and (at trace time, no op) its static shapes.
        """
        if self._policy is not None:
            spec = self._batched_policy_step_spec
            flat_step = flat_policy_step(self._policy.action(time_step, policy_state), spec)
            for t, s in zip(flat_step, tf.nest.flatten(spec)):
                t.set_shape(s.shape)
            return tf.nest.pack_sequence_as(spec, flat_step), None
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
        return tf.nest.pack_sequence_as(self._batched_policy_step_spec, flat_step), waited

    def _unroll(self, flat_time_step, flat_state, env_ids, permit=None):
        """T steps; returns the Trajectory [B, T], the loop state after it
        and the seconds waited for actions in it (None: not timed). Given a
        `permit` (a dequeue of the permits queue), the first step's every op
        waits for it, the policy's variable reads included: the unroll acts
        with the weights of after the learner's `dequeue_all` that gave it.

        The T steps are written out in the graph (a Python loop at trace
        time) rather than run by an inner tf.while_loop with TensorArrays,
        which measured ~2x slower per step (benchmarks/throughput.py).
        """
        transitions, waits = [], []
        for t in range(self._T):
            time_step = tf.nest.pack_sequence_as(self._batched_time_step_spec, flat_time_step)
            state = tf.nest.pack_sequence_as(self._batched_state_spec, flat_state)
            if t == 0:
                begin = [] if permit is None else [permit]
            else:
                # Acting itself, step t's variable reads wait for step t-1's
                # outcome: without the edge each ran as the unroll began (they
                # take no data), so all T steps acted with the weights of
                # its start (measured: a policy lag one unroll longer).
                begin = flat_time_step if self._policy is not None else []
            with tf.control_dependencies(begin):
                policy_step, waited = self._act(time_step, state, env_ids)
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
        env_ids = tf.range(self._index * self._B, (self._index + 1) * self._B, dtype=tf.int32)

        def body(flat_time_step, flat_state):
            # Paced (the driver's batches_ahead): begin only with a permit.
            permit = None if self._permits is None else self._permits.queue.dequeue()
            flat_traj, flat_time_step, flat_state, waited = self._unroll(
                flat_time_step, flat_state, env_ids, permit)
            unroll = flat_traj + [env_ids]
            logged = self._queues.log_queue.queue.enqueue_many(unroll)
            with tf.control_dependencies([logged]):
                learned = self._queues.learn_queue.queue.enqueue_many(unroll)
            # The counters once per unroll, not per step.
            with tf.control_dependencies([learned]):
                counted = [self._steps.assign_add(self._T * self._B)]
                if waited is not None:
                    counted.append(self._wait.assign_add(waited))
            with tf.control_dependencies(counted):
                return ([tf.identity(t) for t in flat_time_step],
                        [tf.identity(t) for t in flat_state])

        # Runs until a queue op fails because the driver closed the queues.
        tf.while_loop(lambda *_: True, body, (flat_time_step, flat_state), parallel_iterations=1)

