"""How a SubprocessEnv's calls reach its child process and come back, and
what happens when the child dies: `SubprocessCalls`, the base class that
holds that half of SubprocessEnv (subprocess_env.py holds its public API,
creation and closing), and the errors both raise.

One request is in flight at a time, under `_io_lock`: `_send` writes it
(with the sequence number its reply must carry) and `_receive` waits, at most
until the request's deadline, for that reply. A child that died, broke its
pipe or did not answer in time is killed and restarted (`_recover`,
`_restart`), and the call is answered as `recovery.CrashRecovery` says
(a truncation, the new FIRST step, or `SubprocessEnvError` for `call()`).

With shared memory (the default transport) `_attach` hands each new child
the segment after it is ready; a step or a reset then writes the action
into the environment's slot and sends a frame alone, and its reply is read
from the slot (`_receive(raw=True)` leaves that read to a batch that reads
all its rows at once). The wire protocol is subprocess_protocol.py's, the
child's side subprocess_child.py's, the slots shared_slots.py's.
"""

import collections
import time

import tensorflow as tf

from alf_async.environments.processes import subprocess_protocol as protocol
from alf_async.environments.processes.subprocess_child import child_main

__all__ = ["IN_SLOT", "InFlight", "RowOf", "SubprocessCalls", "SubprocessEnvClosedError",
           "SubprocessEnvCrashError", "SubprocessEnvError"]


class SubprocessEnvError(RuntimeError):
    """Base class of the errors SubprocessEnv raises about its child process."""


class SubprocessEnvCrashError(SubprocessEnvError):
    """A child process died or hung and cannot be (or may no longer be) restarted."""


class SubprocessEnvClosedError(SubprocessEnvError):
    """The SubprocessEnv was closed (possibly by another thread) during or before a call."""


class InFlight(collections.namedtuple("InFlight", "command seq deadline failure pending")):
    """One request sent to the child (or one answered without it, pending=True)."""


IN_SLOT = protocol.IN_SLOT   # what a raw receive returns when the time step is in the slot


class RowOf(collections.namedtuple("RowOf", "batch row")):
    """The time step a caller saw last, as row `row` of the batch it read (a
    BatchedSubprocessEnv's), taken out only if a crash needs it."""

    def time_step(self):
        return tf.nest.map_structure(lambda a: a[self.row], self.batch)


class SubprocessCalls(object):
    """SubprocessEnv's requests to its child: sending, receiving, restarting.

    A base class of `SubprocessEnv` only: it uses the state its `__init__`
    sets (`_child`, `_seq`, `_in_flight`, `_io_lock`, `_state_lock`,
    `_closed`, `_initialized`, `_recovery`, the timeouts, the constructor's
    pickle, the specs).
    """

    def _name(self):
        return (f"SubprocessEnv(env_index={self._env_index}, "
                f"env_constructor={self._constructor_repr})")

    def _where(self):
        return f"environment process pid {self._child.pid} (env_index {self._env_index})"

    def _new_child(self):
        return protocol.ChildProcess(self._ctx, child_main, self._constructor_bytes,
                                     self._gin_config, self._env_index)

    def _specs(self):
        if self._time_step_spec is None:
            raise RuntimeError(f"{self._name()} is not initialised yet: its specs come from "
                               "the child; use start=True, initialize() or create_subprocess_envs")
        return self._time_step_spec, self._action_spec

    def _check_usable(self):
        if self._closed:
            raise SubprocessEnvClosedError(f"{self._name()} is closed")
        self._recovery.check()
        if not self._initialized:
            self._specs()  # raises the "not initialised" error
            raise RuntimeError(f"{self._name()} is not initialised yet")

    def _send(self, command, payload, in_slot=False):
        """Sends one request (first half of a call). Holds _io_lock until _receive().

        With shared slots a step or a reset is a frame alone: the action is
        written into the slot here, unless `in_slot` (the caller wrote it)."""
        self._check_usable()
        if not self._io_lock.acquire(blocking=False):
            raise RuntimeError(f"{self._name()} is used by two threads at once, or a "
                               "request is in flight; it is not thread-safe")
        try:
            if command in (protocol.STEP, protocol.RESET) and self._recovery.owes():
                self._in_flight = InFlight(command, None, None, None, True)
                return
            self._seq += 1
            failure = None
            try:
                if self._views is not None and command in (protocol.STEP, protocol.RESET):
                    if command == protocol.STEP and not in_slot:
                        self._write_action(payload)   # a wrong action raises: the caller's
                    tag = protocol.STEP_IN_SLOT if command == protocol.STEP else \
                        protocol.RESET_IN_SLOT
                    self._child.send_frame(tag, self._seq, self._slot)
                else:
                    self._child.send(command, self._seq, payload)  # pickling errors: the caller's
            except protocol.ChildDied as e:
                failure = str(e)
            self._in_flight = InFlight(command, self._seq,
                                        time.monotonic() + self._step_timeout, failure, False)
        except BaseException:
            self._io_lock.release()
            raise

    def _receive(self, raw=False):
        """Waits for the reply to the request sent by _send() (second half of a call).

        Args:
            raw: for a caller that reads the slots of a whole batch itself
                (BatchedSubprocessEnv): a time step in the slot is returned as
                `IN_SLOT`, and the caller records it (`_record_row`).
        """
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            raise RuntimeError(f"{self._name()}: no request in flight")
        try:
            if in_flight.pending:  # owed since a restart: answered without the child
                return self._record(self._recovery.take(
                    reset=in_flight.command == protocol.RESET))
            failure = in_flight.failure
            if failure is None:
                try:
                    kind, payload = self._child.wait_reply(
                        in_flight.seq, in_flight.deadline, in_flight.command,
                        self._step_timeout, self._raise_if_closed)
                except protocol.ChildDied as e:
                    failure = str(e)
            if failure is not None:
                return self._recover(in_flight.command, failure)
            if kind == protocol.IN_SLOT:
                if raw:
                    return IN_SLOT
                if self._envs_per_process == 1:
                    return self._record(self._views.time_step(self._slot))
                return self._record(self._views.time_steps(self._slot, self._envs_per_process))
            if kind == protocol.ERROR:
                raise protocol.rebuild_exception(payload, self._where())
            if in_flight.command == protocol.CALL:
                return payload
            return self._record(payload)
        except SubprocessEnvClosedError:
            if self._child is not None:
                self._child.shutdown(0)
            raise
        finally:
            self._io_lock.release()

    def _record(self, time_step):
        self._last_time_step = time_step
        self._current_time_step = time_step
        return time_step

    def _write_action(self, action):
        if self._envs_per_process == 1:
            self._views.write_action(self._slot, action)
        else:
            self._views.write_actions(self._slot, action, self._envs_per_process)

    def _record_row(self, batch, row):
        """The caller saw row `row` of `batch` (after a raw receive)."""
        self._last_time_step = RowOf(batch, row)

    def _attach(self, child):
        """Hands `child` the shared segment and its slot (after READY); the
        first call lays the segment out (a spec it cannot hold raises
        TypeError in one line)."""
        self._views = self._shared.attach(self._time_step_spec, self._action_spec)
        self._seq += 1
        child.send(protocol.ATTACH, self._seq, self._shared.num_slots)
        child.send_fd(self._shared.fd)
        kind, payload = child.wait_reply(self._seq, time.monotonic() + self._init_timeout,
                                         protocol.ATTACH, self._init_timeout,
                                         self._raise_if_closed)
        if kind == protocol.ERROR:
            raise protocol.rebuild_exception(payload, self._where())

    def _raise_if_closed(self):
        if self._closed:
            raise SubprocessEnvClosedError(f"{self._name()} was closed during a call")

    def _wait_ready(self, child):
        kind, payload = child.wait_reply(protocol.READY_SEQ,
                                         time.monotonic() + self._init_timeout,
                                         "initialisation", self._init_timeout,
                                         self._raise_if_closed)
        if kind == protocol.ERROR:
            raise protocol.rebuild_exception(
                payload, f"environment process pid {child.pid} (env_index {self._env_index}) "
                         f"building the env")
        time_step_spec, action_spec = payload
        if self._time_step_spec is None:
            self._time_step_spec, self._action_spec = time_step_spec, action_spec
        elif (time_step_spec, action_spec) != (self._time_step_spec, self._action_spec):
            raise SubprocessEnvCrashError(
                f"{self._name()}: the restarted environment has different specs:\n"
                f"{time_step_spec}, {action_spec}\nvs\n{self._time_step_spec}, {self._action_spec}")

    def _recover(self, command, reason):
        """The child died during `command`: restart it and answer the call."""
        self._child.shutdown(0)  # dead or hung: no graceful close
        self._raise_if_closed()
        first = self._restart(reason)
        last = self._last_time_step
        if isinstance(last, RowOf):
            last = last.time_step()
        answer = self._recovery.recover(first, last,
                                        reset=command == protocol.RESET,
                                        answer=command != protocol.CALL)
        if command == protocol.CALL:
            raise SubprocessEnvError(
                f"{self._name()}: the environment process died during call() ({reason}); "
                "it was restarted, the next step() ends the episode in flight")
        return self._record(answer)

    def _restart(self, reason):
        """Recreates and resets the child; returns its FIRST time step."""
        while True:
            self._recovery.charge(reason)  # raises once the budget is spent
            with self._state_lock:
                self._raise_if_closed()
                self._child = child = self._new_child()
            try:
                self._wait_ready(child)
                if self._shared is not None:
                    self._attach(child)
                self._seq += 1
                child.send(protocol.RESET, self._seq, None)
                kind, payload = child.wait_reply(self._seq,
                                                 time.monotonic() + self._step_timeout,
                                                 protocol.RESET, self._step_timeout,
                                                 self._raise_if_closed)
            except protocol.ChildDied as e:
                child.shutdown(0)
                reason = f"the restarted process failed: {e}"
                continue
            if kind == protocol.ERROR:
                raise protocol.rebuild_exception(payload, self._where())
            return payload
