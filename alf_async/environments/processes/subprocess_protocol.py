"""The child process of a SubprocessEnv and the wire protocol between the two.

Parent -> child: (command, seq, payload). Child -> parent: (kind, seq,
payload); a reply carries the seq of its request, so that a reply to an
abandoned request can never be taken for the answer to a newer one. The
child first sends READY (seq 0) with its specs, or ERROR with the
exception that building the environment raised.

    command  payload                      reply
    STEP     action                       RESULT time step | ERROR
    RESET    None                         RESULT time step | ERROR
    CALL     (name, args, kwargs)         RESULT value     | ERROR
    CLOSE    None                         (the child closes its env and exits)

An ERROR payload is the exception packed by `pack_exception` (type name,
message, traceback); `rebuild_exception` makes it the same type again in
the parent.

Parent side: `ChildProcess` starts one child (forkserver by default, see
subprocess_env.py for why not fork), sends requests, waits for replies with
a deadline (`ChildDied` when the child exits, hangs or its pipe breaks) and
shuts children down: ask, then SIGTERM, then SIGKILL.

Threads: a ChildProcess is used by one thread at a time (its SubprocessEnv's
owner); `shutdown` may be called from any thread and wakes a waiting
`wait_reply` (its pipe is closed under it).
"""

import functools
import importlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
import traceback
import weakref
from multiprocessing.reduction import ForkingPickler
from typing import Optional, Sequence

import cloudpickle

from alf_async.environments.processes import env_index
from alf_async.environments.suites.adapters import as_py_environment

logger = logging.getLogger(__name__)

DEFAULT_START_METHOD = "forkserver"

STEP, RESET, CALL, CLOSE = "step", "reset", "call", "close"
READY, RESULT, ERROR = "ready", "result", "error"
READY_SEQ = 0


# ------------------------------------------------------------- both sides


def pack_exception(exc: BaseException) -> dict:
    """An exception as a picklable dict (type, message, traceback)."""
    cls = type(exc)
    return dict(module=cls.__module__, qualname=cls.__qualname__, message=str(exc),
                traceback="".join(traceback.format_exception(cls, exc, exc.__traceback__)))


def rebuild_exception(info: dict, where: str) -> Exception:
    """The child's exception as the same type with the child's traceback in the message.

    Falls back to RuntimeError if the type cannot be imported here or cannot be
    built from a single message argument.
    """
    text = (f"{info['message']}\n\n--- traceback in {where} ---\n"
            f"{info['traceback'].rstrip()}\n--- end of traceback in {where} ---")
    exc = None
    try:
        module = sys.modules.get(info["module"]) or importlib.import_module(info["module"])
        cls = functools.reduce(getattr, info["qualname"].split("."), module)
        if isinstance(cls, type) and issubclass(cls, Exception):
            exc = cls(text)
    except Exception:
        exc = None
    if exc is None:
        exc = RuntimeError(f"{info['module']}.{info['qualname']}: {text}")
    try:
        exc.remote_traceback = info["traceback"]
    except Exception:
        pass
    return exc


# -------------------------------------------------------------- child side


def _child_send(conn, kind, seq, payload):
    try:
        data = ForkingPickler.dumps((kind, seq, payload))
    except Exception as e:  # e.g. an unpicklable observation: report, don't die
        data = ForkingPickler.dumps((ERROR, seq, pack_exception(e)))
    conn.send_bytes(data)


def _watch_parent():
    """Exit the child when the parent process dies, even if the env is stuck."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch():
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="SubprocessEnvParentWatch", daemon=True).start()


def child_main(conn, env_constructor_bytes, gin_config, index):
    """Entry point of a child process: build the env, then serve requests."""
    # Ctrl-C goes to the whole process group; the parent decides what to do
    # (close us). Without this every child would "crash" on Ctrl-C and be
    # restarted while the program is shutting down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch_parent()
    env_index.set_current_env_index(index)
    env = None
    try:
        try:
            # Imports the constructor's module first.
            env_constructor = cloudpickle.loads(env_constructor_bytes)
            if gin_config:
                import gin
                # Unknown configurables belong to the parent's other modules
                # (trainer, driver, ...) that this process never imports.
                gin.parse_config(gin_config, skip_unknown=True)
            env = as_py_environment(env_constructor())
            specs = (env.time_step_spec(), env.action_spec())
        except Exception as e:
            _child_send(conn, ERROR, READY_SEQ, pack_exception(e))
            return
        _child_send(conn, READY, READY_SEQ, specs)
        while True:
            try:
                command, seq, payload = conn.recv()
            except (EOFError, OSError):
                return  # the parent is gone or closed the pipe
            if command == CLOSE:
                return
            try:
                if command == STEP:
                    result = env.step(payload)
                elif command == RESET:
                    result = env.reset()
                elif command == CALL:
                    name, args, kwargs = payload
                    result = getattr(env, name)(*args, **kwargs)
                else:
                    raise ValueError(f"unknown SubprocessEnv command {command!r}")
            except Exception as e:
                _child_send(conn, ERROR, seq, pack_exception(e))
            else:
                _child_send(conn, RESULT, seq, result)
    finally:
        if env is not None:
            try:
                env.close()
            except Exception:
                pass
        conn.close()


# ------------------------------------------------------------- parent side

_START_LOCK = threading.Lock()
_FORKSERVER_CONFIGURED = [False]


def get_context(start_method: Optional[str]):
    """The multiprocessing context for children (forkserver, else spawn)."""
    method = start_method or DEFAULT_START_METHOD
    if method == "forkserver" and method not in multiprocessing.get_all_start_methods():
        method = "spawn"
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        with _START_LOCK:
            if not _FORKSERVER_CONFIGURED[0]:
                _FORKSERVER_CONFIGURED[0] = True
                # Preload this module (TensorFlow, tf-agents, gin, cloudpickle)
                # in the fork server, keeping whatever was configured already
                # (default ['__main__']). Has no effect if the server runs already.
                from multiprocessing import forkserver
                preload = list(getattr(forkserver._forkserver, "_preload_modules", ["__main__"]))
                if __name__ not in preload:
                    ctx.set_forkserver_preload(preload + [__name__])
    return ctx


def current_gin_config() -> str:
    """The parent's gin configuration text, parsed in each child ("" if unreadable)."""
    try:
        import gin
        return gin.config_str()
    except Exception as e:  # pragma: no cover - gin is a dependency
        logger.warning("SubprocessEnv: could not read the gin config (%r); "
                       "children start without it", e)
        return ""


class ChildDied(Exception):
    """The child died, hung or its pipe broke (the reason is the message)."""


def _reap(owner_pid, process, conn, graceful_timeout):
    """Stops one child process (the finalizer of a ChildProcess)."""
    _shutdown_processes(owner_pid, [(process, conn)], graceful_timeout)


def _shutdown_processes(owner_pid, pairs, graceful_timeout):
    """Asks each child to close, waits, then SIGTERM, then SIGKILL; closes pipes.

    Children are handled together so that closing N slow children takes one
    timeout, not N.
    """
    if os.getpid() != owner_pid:  # a forked copy of the parent: not our children
        return
    try:
        if graceful_timeout > 0:
            for process, conn in pairs:
                try:
                    conn.send((CLOSE, -1, None))
                except Exception:
                    pass
            deadline = time.monotonic() + graceful_timeout
            for process, _ in pairs:
                process.join(max(0.0, deadline - time.monotonic()))
        for stop, wait in (("terminate", 1.0), ("kill", 5.0)):
            alive = [p for p, _ in pairs if p.exitcode is None]
            if not alive:
                break
            for process in alive:
                try:
                    getattr(process, stop)()
                except Exception:
                    pass
            deadline = time.monotonic() + wait
            for process in alive:
                process.join(max(0.0, deadline - time.monotonic()))
    finally:
        for process, conn in pairs:
            conn.close()
            if process.exitcode is not None:
                try:
                    process.close()
                except ValueError:
                    pass
            else:
                logger.error("SubprocessEnv: child process %s did not exit", process.pid)


class ChildProcess(object):
    """Parent-side handle of one child process: the process, our end of the pipe.

    The child is killed if the handle is garbage collected or at exit
    (`weakref.finalize`), unless `shutdown` ran first.
    """

    def __init__(self, ctx, env_constructor_bytes, gin_config, index):
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        process = ctx.Process(target=child_main, name=f"SubprocessEnv-{index}",
                              args=(child_conn, env_constructor_bytes, gin_config, index),
                              daemon=True)
        try:
            with _START_LOCK:  # Process.start() is not documented thread-safe
                process.start()
        except BaseException:
            parent_conn.close()
            raise
        finally:
            child_conn.close()  # so that our end sees EOF when the child dies
        self.process = process
        self.conn = parent_conn
        self.pid = process.pid
        self._finalizer = weakref.finalize(self, _reap, os.getpid(), process, parent_conn, 1.0)

    def send(self, command, seq, payload):
        """Sends one request; raises ChildDied if the pipe is broken. An
        unpicklable payload raises its pickling error (nothing was sent)."""
        data = ForkingPickler.dumps((command, seq, payload))
        try:
            self.conn.send_bytes(data)
        except (OSError, ValueError) as e:
            raise ChildDied(f"sending {command!r} to pid {self.pid} failed ({e!r})") from None

    def wait_reply(self, seq, deadline, what, timeout_secs, interrupted):
        """Returns (kind, payload) of the reply numbered `seq`.

        Args:
            seq: the request's number.
            deadline: `time.monotonic()` after which the child counts as hung.
            what: the request, for messages.
            timeout_secs: the timeout the deadline came from, for messages.
            interrupted: zero-arg callable, called before and after every
                wait; raises to end the wait (e.g. the env was closed).

        Raises:
            ChildDied: the child exited, hung past the deadline, or its pipe broke.
        """
        conn, sentinel = self.conn, self.process.sentinel
        while True:
            interrupted()
            try:
                # The reply is often there already (SubprocessRows waited for
                # it): one poll of one pipe, not a selector over two.
                waiting = not conn.poll(0)
                remaining = deadline - time.monotonic()
                if waiting and remaining <= 0:
                    raise ChildDied(f"pid {self.pid} did not answer {what!r} within "
                                    f"{timeout_secs:g} s (hung)")
                ready = (multiprocessing.connection.wait([conn, sentinel], timeout=remaining)
                         if waiting else [conn])
            except (OSError, ValueError) as e:  # our handles were closed under us
                interrupted()
                raise ChildDied(f"waiting for pid {self.pid} failed ({e!r})") from None
            interrupted()
            if not ready:
                continue
            if conn in ready or conn.poll(0):  # read what it wrote, even if it then died
                try:
                    kind, reply_seq, payload = conn.recv()
                except (EOFError, OSError) as e:
                    raise ChildDied(f"the pipe to pid {self.pid} broke during {what!r} "
                                    f"({type(e).__name__})") from None
                if reply_seq == seq:
                    return kind, payload
                continue  # a late reply to an abandoned request
            raise ChildDied(f"pid {self.pid} exited (exit code {self.process.exitcode}) "
                            f"during {what!r}")

    def detach(self):
        """Takes over shutdown from the finalizer; False if it has already been done."""
        return self._finalizer.detach() is not None

    def shutdown(self, graceful_timeout):
        """Stops the child (see `shutdown_children`); idempotent."""
        shutdown_children([self], graceful_timeout)


def shutdown_children(children: Sequence[ChildProcess], graceful_timeout: float):
    """Stops several children together: asks each to close, waits up to
    `graceful_timeout` (0: no asking), then terminates, then kills; returns
    when they have exited. Children shut down already are skipped."""
    pairs = [(c.process, c.conn) for c in children if c.detach()]
    if pairs:
        _shutdown_processes(os.getpid(), pairs, graceful_timeout)
