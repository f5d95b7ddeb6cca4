"""Rows of a batched environment stepped one by one, whichever are ready first.

When the environments of a batch block on something outside the process (a
child process, a remote simulator, a sleep), stepping the batch in lockstep
makes every row wait for the slowest one. EnvPool's asynchronous mode
instead sends each environment its action as soon as it has one and returns
whichever environments are ready. `RowWorkers` does that for a list of
unbatched PyEnvironments: one Python worker thread per row, each stepping its
own environment (a blocking step releases the GIL while it waits), and one
shared ready queue that the env thread drains.

Which environments are stepped this way is decided once, by
`stepping.stepping_of` (its `rows`): a `capabilities.RowStepping` batch
(suite_envpool's pools, envpool_rows.py), or a batch whose rows are
separate unbatched `BlockingStep` environments. `row_stepper` gives the
`alf_async.roles.RowStepper` that steps them: the batch's own, or the rows'
own when they offer one (`capabilities.OffersRowStepper`: ExternalEnv's
slots, slot_stepper.py; SubprocessEnvs, subprocess_rows.py), else
`RowWorkers`. Rows may be `AppliedStep`s (ExternalEnv's slots are):
whatever steps a row reads `applied_step()` right after the row's step, and
`RowRecorder` records the applied action in that row's transition and keeps
its `trainable` flag with the row's unroll (the env thread makes the
learner's copy inert where needed, applied_steps.py).

`RowRecorder` keeps each row's unroll as it grows; complete ones wait in
`complete` until the env thread ships them.

Threads: `start()`, `send()`, `recv()` and `close()` are called by the
owning env thread only. Each worker thread blocks on its inbox
(`queue.SimpleQueue.get`) and in its environment's step; `recv` blocks at
most `timeout` seconds. `close()` tells the workers to exit and joins them:
a worker inside a step exits when the step returns (the driver closes
blocking environments on stop, which ends such a step). RowRecorder's
threads are in its docstring.
"""

import collections
import queue
import threading
import time

import numpy as np
import tensorflow as tf
from tf_agents.trajectories import trajectory as trajectory_lib

from alf_async.driver.applied_steps import put_action
from alf_async.driver.stepping import stepping_of
from alf_async.environments import capabilities
from alf_async.environments.capabilities import RowFailed
from alf_async.roles import RowStepper

_RESET = object()
_STOP = object()


def row_envs(tf_env):
    """What steps `tf_env`'s rows one by one (`stepping_of(tf_env).rows`):
    the RowStepping batch, the rows' unbatched environments (a list), or
    None when its rows are not stepped one by one."""
    return stepping_of(tf_env).rows


def row_stepper(name, envs, recorder):
    """The `alf_async.roles.RowStepper` of `envs` (a `Stepping.rows`) for an
    env thread, recording each row's steps with `recorder` (a RowRecorder):
    a RowStepping batch's own (`envs.make_row_stepper(recorder.record_rows)`),
    the rows' own if they offer one (`capabilities.OffersRowStepper`:
    `envs[0].row_stepper(envs, recorder.record)`, None when it cannot step
    them all), else `RowWorkers(name, envs, recorder.record)`."""
    if isinstance(envs, capabilities.RowStepping):
        return envs.make_row_stepper(recorder.record_rows)
    stepper = None
    if isinstance(envs[0], capabilities.OffersRowStepper):
        stepper = envs[0].row_stepper(envs, recorder.record)
    return stepper if stepper is not None else RowWorkers(name, envs, recorder.record)


class RowWorkers(RowStepper):
    """One worker thread per environment row; results come back on one queue."""

    def __init__(self, name, envs, on_step):
        """
        Args:
            name: prefix of the worker threads' names.
            envs: unbatched PyEnvironments, one per row.
            on_step: callable(row, time_step, applied), called by the row's
                worker after each reset and step, before the row is reported
                ready; `applied` is the environment's `applied_step()` after
                a step of an AppliedStep row, else None.
        """
        self._envs = list(envs)
        self._applies = [isinstance(e, capabilities.AppliedStep) for e in self._envs]
        self._on_step = on_step
        self._ready = queue.SimpleQueue()
        self._inboxes = [queue.SimpleQueue() for _ in self._envs]
        self._threads = [
            threading.Thread(target=self._work, args=(r,), name=f"{name}_row{r}", daemon=True)
            for r in range(len(self._envs))
        ]

    def start(self):
        """Starts the workers; each resets its environment and reports the first step."""
        for r, t in enumerate(self._threads):
            self._inboxes[r].put(_RESET)
            t.start()

    def send(self, rows, actions):
        """Has each row of `rows` step with its action: row `rows[j]` with
        `capabilities.row_action(actions, j)` (`actions`: the action nest,
        batched over `rows`)."""
        for j, row in enumerate(rows):
            self._inboxes[row].put(capabilities.row_action(actions, j))

    def recv(self, timeout):
        """Blocks up to `timeout` seconds for a result; returns every result waiting.

        Returns:
            A list of (row, None or RowFailed), possibly empty (timed out).
        """
        try:
            results = [self._ready.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                results.append(self._ready.get_nowait())
            except queue.Empty:
                return results

    def close(self, wait=True):
        """Tells every worker to exit once it is idle and, with `wait`, waits
        until they have.

        A worker inside a step exits when the step returns; one that never
        returns keeps a waiting caller here, as a step of its own would. The
        env thread leaving with an error does not wait: another row may be
        blocked in a step that only the driver's stop ends (a hung child
        process, a remote simulator that stopped answering), and the driver
        stops only once the error is raised.
        """
        for inbox in self._inboxes:
            inbox.put(_STOP)
        if not wait:
            return
        for t in self._threads:
            if t.is_alive():
                t.join()

    def join(self, timeout):
        """Waits up to `timeout` seconds in all for the workers to exit (after
        `close(wait=False)` and the environments' close; the driver's stop)."""
        deadline = time.monotonic() + timeout
        for t in self._threads:
            if t.is_alive():
                t.join(max(0.0, deadline - time.monotonic()))

    def _work(self, row):
        env, inbox, ready, on_step = (self._envs[row], self._inboxes[row], self._ready,
                                      self._on_step)
        applies = self._applies[row]
        while True:
            action = inbox.get()
            if action is _STOP:
                return
            try:
                if action is _RESET:
                    on_step(row, env.reset(), None)
                else:
                    time_step = env.step(action)
                    on_step(row, time_step, env.applied_step() if applies else None)
            except BaseException as e:  # pylint: disable=broad-except
                ready.put((row, RowFailed(e)))
                return
            ready.put((row, None))


class RowRecorder(object):
    """Per-row unroll buffers for an env thread's rows loop (rows_loop.py).

    Threads: `record(r, ...)` is called by row r's worker right after its
    step (or by the env thread, in a stepper's `recv`), `record_rows` in a
    RowStepping batch's `recv`; `acting_with` and `take_complete` by the
    env thread. They never touch a row at the same time: a worker records
    only between receiving its action (after `acting_with`) and reporting
    ready, and the env thread reads a row only after it reported ready. `complete` is a deque that
    workers append to and the env thread pops from (both thread-safe).
    """

    def __init__(self, time_step_spec, policy_step_spec, unroll_spec, B, T):
        def zeros(spec, outer):
            return [np.zeros(outer + s.shape.as_list(), s.dtype.as_numpy_dtype)
                    for s in tf.nest.flatten(spec)]

        self._T = T
        # The current time step of each row (its last request) and the
        # policy step it is stepping with, batch-major.
        self.current = zeros(time_step_spec, [B])
        self.acting = zeros(policy_step_spec, [B])
        self._buffers = zeros(unroll_spec, [B])  # [B, T, ...]
        self._trainable = np.ones([B, T], bool)  # AppliedStep rows' flags
        self._filled = np.zeros(B, np.int64)
        self._started = np.zeros(B, bool)  # acting with a policy step yet
        # Complete unrolls, in order: (flat trajectory [T, ...], trainable [T], row).
        self.complete = collections.deque()
        # Where each trajectory field comes from: a leaf of the current time
        # step or of the acting policy step (an array above), or a leaf of
        # the next time step (None, the leaf's index); from_transition only
        # routes fields, so tracing it with string leaves gives the map.
        tags = {"current": (time_step_spec, self.current),
                "acting": (policy_step_spec, self.acting), "next": (time_step_spec, None)}
        traced = trajectory_lib.from_transition(*(
            tf.nest.pack_sequence_as(spec, [f"{kind}:{i}"
                                            for i in range(len(tf.nest.flatten(spec)))])
            for kind, (spec, _) in tags.items()))
        num_action = len(tf.nest.flatten(policy_step_spec.action))
        self._plan = []
        self._action_buffers = []   # the trajectory's action leaves, in the action's order
        for buffer, tag in zip(self._buffers, tf.nest.flatten(traced)):
            kind, i = tag.split(":")
            arrays = tags[kind][1]
            self._plan.append((buffer, None if arrays is None else arrays[int(i)], int(i)))
            if kind == "acting" and int(i) < num_action:
                self._action_buffers.append(buffer)

    def record(self, r, time_step, applied=None):
        """Row r stepped to `time_step` (a worker thread); `applied` is its
        `applied_step()` (action or None, trainable), None for other rows."""
        flat_next = tf.nest.flatten(time_step)
        if self._started[r]:
            t = self._filled[r]
            for buffer, array, i in self._plan:
                buffer[r, t] = flat_next[i] if array is None else array[r]
            if applied is not None:
                action, trainable = applied
                if action is not None:
                    put_action(self._action_buffers, (r, t), action)
                self._trainable[r, t] = bool(trainable)
            if t + 1 == self._T:
                self.complete.append(([b[r].copy() for b in self._buffers],
                                      self._trainable[r].copy(), r))
                t = -1
            self._filled[r] = t + 1
        for field, value in zip(self.current, flat_next):
            field[r] = value

    def record_rows(self, rows, time_step):
        """`record` for several rows at once, none of them AppliedStep rows:
        rows `rows` (int [n], each once) stepped to `time_step` (batched
        over them). Each field is written with one indexed assignment, not
        one per row (a RowStepping batch's receive: EnvPool's)."""
        rows = np.asarray(rows)
        flat_next = tf.nest.flatten(time_step)
        started = self._started[rows]
        if started.any():
            going, t = rows[started], self._filled[rows[started]]
            for buffer, array, i in self._plan:
                buffer[going, t] = flat_next[i][started] if array is None else array[going]
            done = t + 1 == self._T
            for r in going[done]:
                self.complete.append(([b[r].copy() for b in self._buffers],
                                      self._trainable[r].copy(), int(r)))
            self._filled[going] = np.where(done, 0, t + 1)
        for field, value in zip(self.current, flat_next):
            field[rows] = value

    def acting_with(self, rows, flat_step):
        """`rows` will step with the policy steps `flat_step` (the env thread)."""
        for field, value in zip(self.acting, flat_step):
            field[rows] = value
        self._started[rows] = True

    def take_complete(self, env_ids):
        """The complete unrolls so far, stacked, oldest first.

        Returns:
            (unroll, trainable, rows): the flat trajectory [n, T, ...] + the
                rows' env ids [n]; each transition's trainable flag [n, T]; each
                unroll's row [n] (a row may appear more than once).
        """
        complete = [self.complete.popleft() for _ in range(len(self.complete))]
        unroll = [np.stack(leaves) for leaves in zip(*(c[0] for c in complete))]
        rows = np.array([c[2] for c in complete], np.int64)
        return unroll + [env_ids[rows]], np.stack([c[1] for c in complete]), rows
