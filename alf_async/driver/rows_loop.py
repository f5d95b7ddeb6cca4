"""An env thread's rows loop: each row stepped on its own, whichever are ready.

For `stepping.ROWS` environments. A row stepper (`alf_async.roles.RowStepper`,
made by `env_rows.row_stepper`: the rows' own, or the driver's RowWorkers)
steps the rows; a row's transition is recorded right after its step (by
its worker, or in the stepper's `recv`) in per-row unroll buffers
(`env_rows.RowRecorder`), and a row with T transitions is copied out whole.
Each iteration of the loop takes the rows that are ready, asks for their
policy steps in one request (acting.py) and sends each row its action; once
B rows' unrolls are complete it ships them (unrolls.py). A row waits only
for its own step and one forward pass, never for the other rows of its
batch.

AppliedStep rows: whatever steps a row reads its `applied_step()` right
after the step, and the recorder puts the applied action into the row's
transition and keeps its trainable flag; the learn queue gets the shipped
unrolls with untrainable transitions made inert (`InertBoundaries`, per row,
across the row's unrolls), the log queue as they happened. When a row's step
raises `EndOfData`, the unrolls already complete are shipped before it is
raised (fewer than B may be waiting: the data's last unrolls would be lost
otherwise).

Every blocking call of this thread releases the GIL, and taking it back
means waiting behind the workers that want it, so the loop makes few: one
wait for ready rows, one request and one reply per iteration, raw queue ops
on numpy arrays. (A graph loop taking the GIL once per iteration in a
numpy_function would hold one of TF's inter-op threads while it waited, so
this stays in Python.)

Threads: `run` is called by the env thread; it waits at most 0.1 s at a
time for ready rows, then checks for stop. On stop it closes its stepper
and waits for it; leaving with an error it does not wait, since a row
blocked in its step ends only when the driver's stop closes the
environment; the stop then waits for it (`join`, from the stopping thread).
"""

import numpy as np
import tensorflow as tf

from alf_async.driver import applied_steps
from alf_async.driver.env_rows import RowRecorder, row_stepper
from alf_async.environments import capabilities
from alf_async.environments.capabilities import RowFailed

_WAIT_SECS = 0.1   # the longest wait for ready rows between checks for stop


class RowsLoop(object):
    """One env thread's rows loop and the stepper it made."""

    def __init__(self, name, coord, env, stepping, acting, unrolls, queues):
        """
        Args:
            name: the env thread's name (names the row workers' threads).
            coord: the driver's `tf.train.Coordinator`.
            env: the TFEnvironment (for its action specs).
            stepping: its `Stepping` (kind ROWS).
            acting: the thread's `ActorActing` or `SelfActing`.
            unrolls: the thread's `Unrolls` (not paced).
            queues: the driver's `TFQueues` (for the specs).
        """
        self._name = name
        self._coord = coord
        self._env = env
        self._stepping = stepping
        self._acting = acting
        self._unrolls = unrolls
        self._queues = queues
        self._stepper = None
        self.env_error = None   # what a row raised

    def join(self, timeout):
        """Waits up to `timeout` seconds for the stepper's threads (the
        driver's stop, after closing the environments)."""
        if self._stepper is not None:
            self._stepper.join(timeout)

    def run(self):
        """Steps the rows until the driver stops or a row raises."""
        queues, unrolls, acting = self._queues, self._unrolls, self._acting
        B, T, env_ids = unrolls.B, unrolls.T, unrolls.env_ids
        step_spec = queues.policy_step_spec
        num_action = len(tf.nest.flatten(step_spec.action))
        num_state = len(tf.nest.flatten(step_spec.state))
        action_spec = self._stepping.py_env.action_spec()
        recorder = RowRecorder(queues.time_step_spec, step_spec, queues.unroll_spec[0], B, T)
        inert = (applied_steps.InertBoundaries(queues.unroll_spec[0], self._env.action_spec(), B)
                 if self._stepping.reports_applied else None)

        def ship():
            unroll, trainable, rows = recorder.take_complete(env_ids)
            unrolls.ship(unroll, unroll if inert is None else
                         inert.for_learner(unroll, trainable, rows), len(rows))

        acting.open()
        unrolls.open()
        state = [np.array(t) for t in tf.nest.flatten(unrolls.initial_state)]
        stepper = row_stepper(self._name, self._stepping.rows, recorder)
        self._stepper = stepper
        stepper.start()
        failed = True
        try:
            while True:
                results = stepper.recv(timeout=_WAIT_SECS)
                if not results:
                    if self._coord.should_stop():
                        failed = False
                        return
                    continue
                rows = []
                for r, result in results:
                    if isinstance(result, RowFailed):
                        self.env_error = result.error
                        if isinstance(result.error, capabilities.EndOfData) and recorder.complete:
                            ship()   # the data ended: what is complete goes to the learner
                        raise result.error
                    rows.append(r)
                if len(recorder.complete) >= B:
                    ship()
                # One request of all B rows; the rows not asking carry env id -1.
                asking = np.full(B, -1, np.int32)
                asking[rows] = env_ids[rows]
                flat_step = acting.ask(recorder.current, state, asking, rows)
                recorder.acting_with(rows, flat_step)
                for field, value in zip(state, flat_step[num_action:num_action + num_state]):
                    field[rows] = value
                stepper.send(rows, flat_step[0] if num_action == 1 else
                             tf.nest.pack_sequence_as(action_spec, flat_step[:num_action]))
        finally:
            # Leaving with an error of its own (a row's, EndOfData) while the
            # driver runs: do not wait for rows blocked in a step (a hung
            # child process); the driver stops once the error is raised and
            # its stop closes them. On stop the driver has closed them
            # already: wait.
            stepper.close(wait=not failed or self._coord.should_stop())
