"""EnvThread: steps one TFEnvironment, gets its actions, ships unrolls.

Each step the thread gets the policy steps of its B rows (from an actor, or
acting itself), steps the environment, and after `unroll_length` steps puts
the unroll — a batch-major Trajectory [B, T] and the global env id of each
row — into the log queue, then the learn queue. Its parts, each in its own
module:

- how it is stepped, decided once by the driver (`stepping.stepping_of`)
  and passed in: a graph loop (graph_loop.py), a Python loop of the batch
  in lockstep (python_loop.py), or its rows one by one (rows_loop.py);
- how it gets its actions (acting.py): through its actor queue, or by
  running the policy itself (`num_actor_queues=0`);
- what it does around the steps, once per unroll (unrolls.py): pacing,
  shipping to the log and learn queues, counting.

Threads: `__init__` (the driver's constructing thread) traces the graph
loop; `run()` is this thread, and blocks in the queue ops (actor queue
enqueue, return queue dequeue, log/learn queue enqueue, the permit dequeue
when paced) and the environment's step. Closing the queues ends it; an
environment step in progress finishes first. The rows loop's stepper is
joined by the driver's stop (`join_row_workers`). The counters may be read
by any thread.
"""

import threading

import tensorflow as tf

from alf_async.driver import applied_steps
from alf_async.driver import stepping as stepping_lib
from alf_async.driver.acting import ActorActing, SelfActing
from alf_async.driver.graph_loop import GraphLoop
from alf_async.driver.python_loop import run_python_loop
from alf_async.driver.rows_loop import RowsLoop
from alf_async.driver.unrolls import Unrolls
from alf_async.environments import capabilities


class EnvThread(threading.Thread):
    """Owns one environment (batch size B) and runs it until the queues close.

    It gets its actions from an actor thread (a request on `actor_queue`,
    the reply on `return_queue`), or, given `policy` instead, acts itself
    (`num_actor_queues=0`). Nothing else differs: the same unrolls, in the
    same order, go to the same log and learn queues.
    """

    def __init__(self, name, coord, env, env_index, queues, actor_queue, return_queue,
                 initial_policy_state, unroll_length, stepping, step_token=None, policy=None,
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
            initial_policy_state: nest of numpy arrays, the policy state for B rows.
            unroll_length: T.
            stepping: `stepping.stepping_of(env)`, how it is stepped.
            step_token: the `NestFIFOQueue` holding the token that graph-mode
                Python steps pass around, or None to step without one.
            policy: the TFPolicy to act with in this thread (with no actor
                queue).
            own_action_fn: `acting.own_action(policy, queues)`, which a thread
                that acts itself calls outside its graph loop (traced once
                per driver; needed with `policy` unless `stepping.in_graph`).

        Raises:
            ValueError: neither or both of an actor queue and a policy, a
                policy with no `own_action_fn` for a Python loop, pacing of
                rows stepped one by one, or an AppliedStep environment that
                cannot be stepped from this thread.
        """
        super().__init__(name=name, daemon=True)
        if (actor_queue is None) == (policy is None):
            raise ValueError(f"{name}: give an actor queue and a return queue, or a policy "
                             f"to act with itself, not both or neither")
        if queues.permits is not None and stepping.kind == stepping_lib.ROWS:
            raise ValueError(
                f"{name}: batches_ahead paces env threads that begin each unroll of their "
                f"batch at once; this one steps its rows one by one (an EnvPool pool "
                f"stepped asynchronously, separate blocking environments), each row "
                f"beginning its unrolls on its own. Use batches_ahead=None, or a batch "
                f"stepped as one (EnvPool: suite_envpool.stepping = 'lockstep')")
        if stepping.reports_applied and stepping.py_env is None:
            raise ValueError(f"{name}: its environment reports applied steps (AppliedStep) "
                             f"but is a TFPyEnvironment with isolation=True, whose Python "
                             f"environment cannot be stepped from this thread")
        if policy is not None and own_action_fn is None and not stepping.in_graph:
            raise ValueError(f"{name}: an env thread that acts itself outside its graph loop "
                             f"needs own_action_fn (own_action(policy, queues))")
        self._coord = coord
        self._env = env
        self._stepping = stepping
        self._queues = queues
        B = queues.env_batch_size
        self._unrolls = Unrolls(name, queues, env_index, unroll_length, initial_policy_state)
        self._steps = self._unrolls.steps_var
        self._acting = (ActorActing(actor_queue, return_queue, queues.policy_step_spec, B)
                        if policy is None else
                        SelfActing(policy, own_action_fn, queues.policy_step_spec, B))
        self._rows = None
        self._graph = None
        self._graph_loop = None
        if stepping.in_graph:
            # Traced here, on the constructing thread, as the actors' loops are.
            self._graph = GraphLoop(env, stepping, self._acting, self._unrolls, queues,
                                    step_token)
            self._graph_loop = self._graph.trace()
        elif stepping.kind == stepping_lib.ROWS:
            self._rows = RowsLoop(name, coord, env, stepping, self._acting, self._unrolls,
                                  queues)

    @property
    def steps(self):
        """Env steps this thread has put into unrolls."""
        return self._unrolls.steps

    @property
    def action_wait_secs(self):
        """Seconds this thread spent waiting for its actions."""
        return self._unrolls.waited_in_graph_secs + self._acting.wait_secs

    @property
    def request_secs(self):
        """Seconds this thread's Python loops spent sending requests to the
        actor (the enqueue op, and taking the GIL back after it; the graph
        loop does not count them)."""
        return self._acting.request_secs

    @property
    def _own_action(self):
        """The concrete function a thread acting itself calls from its Python
        loops (None otherwise); settable before `start()`, to wrap it."""
        return self._acting.own_action if self._acting.acts_itself else None

    @_own_action.setter
    def _own_action(self, fn):
        if self._acting.acts_itself:
            self._acting.own_action = fn

    def join_row_workers(self, timeout):
        """Waits up to `timeout` seconds for the rows loop's stepper (the
        driver's stop, after closing the environments): a loop that left
        with an error did not wait for rows blocked in a step, which end once
        their environment is closed."""
        if self._rows is not None:
            self._rows.join(timeout)

    def drop_graph_loop(self):
        """Drops the traced graph loop of a thread that never ran (the driver's
        stop() calls it): its graph refers back to this thread's parts (its
        numpy_function), a cycle that would keep them alive for good."""
        self._graph_loop = None

    def run(self):
        with self._coord.stop_on_exception():
            try:
                # Held by this call only: see drop_graph_loop.
                graph_loop, self._graph_loop = self._graph_loop, None
                if graph_loop is not None:
                    time_step = self._env.reset()
                    graph_loop(tf.nest.flatten(time_step),
                               tf.nest.flatten(self._unrolls.initial_state))
                elif self._rows is not None:
                    self._rows.run()
                else:
                    run_python_loop(self._env, self._stepping, self._acting, self._unrolls,
                                    self._queues)
            except Exception as e:  # pylint: disable=broad-except
                if isinstance(e, capabilities.EndOfData):
                    applied_steps.wait_until_learner_took_all(self._queues.learn_queue,
                                                              self._coord)
                if self._coord.should_stop():
                    return  # queues (or the env) closed by stop(): not an error
                part = self._graph or self._rows
                env_error = part.env_error if part is not None else None
                if env_error is not None and e is not env_error:
                    # Raise the environment's own exception, not TF's wrapper of it.
                    raise env_error.with_traceback(env_error.__traceback__) from None
                raise
