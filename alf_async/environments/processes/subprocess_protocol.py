"""The wire protocol between a SubprocessEnv and its child process, and the
parent's handle of the child.

Every message on the child's socket starts with a 4-byte frame
(`FRAME`: tag, sequence number mod 256, slot). Two kinds:

- Rare messages (tag `PICKLED`) are followed by a pickle in
  `multiprocessing.connection`'s framing (a length, then the bytes).
  Parent -> child: (command, seq, payload); child -> parent: (kind, seq,
  payload). A reply carries the seq of its request, so that a reply to an
  abandoned request can never be taken for the answer to a newer one. The
  child first sends READY (seq 0) with its specs, or ERROR with the
  exception that building the environment raised.

      command  payload                      reply
      ATTACH   (slot, num_slots), then the  RESULT None | ERROR
               segment's fd (SCM_RIGHTS)
      STEP     action                       RESULT time step | ERROR
      RESET    None                         RESULT time step | ERROR
      CALL     (name, args, kwargs)         RESULT value     | ERROR
      CLOSE    None                         (the child closes its env and exits)

- With shared memory (shared_slots.py, after ATTACH) a step and a reset
  are frames alone: `STEP_IN_SLOT` (the action is in the child's slot) or
  `RESET_IN_SLOT`, answered by `RESULT_IN_SLOT` (the time step is in the
  slot) or by a pickled ERROR numbered `short_seq` (the frame's seq). Nothing is pickled on this path: one
  4-byte write and one read each way.

An ERROR payload is the exception packed by `pack_exception` (type name,
message, traceback); `rebuild_exception` makes it the same type again in
the parent. The child's side is subprocess_child.py.

Parent side: `ChildProcess` starts one child (forkserver by default, see
subprocess_env.py for why not fork), sends requests, waits for replies with
a deadline (`ChildDied` when the child exits, hangs or its pipe breaks) and
shuts children down: ask, then SIGTERM, then SIGKILL.

Threads: a ChildProcess is used by one thread at a time (its SubprocessEnv's
owner); `shutdown` may be called from any thread and wakes a waiting
`wait_reply` (its pipe is closed under it).
"""

import ctypes
import errno
import functools
import importlib
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.reduction
import os
import select
import socket
import struct
import sys
import threading
import time
import traceback
import weakref
from multiprocessing.reduction import ForkingPickler
from typing import Optional, Sequence


logger = logging.getLogger(__name__)

DEFAULT_START_METHOD = "forkserver"
CHILD_MODULE = "alf_async.environments.processes.subprocess_child"

STEP, RESET, CALL, CLOSE, ATTACH = "step", "reset", "call", "close", "attach"
READY, RESULT, ERROR = "ready", "result", "error"
READY_SEQ = 0

TRANSPORTS = ("shared_memory", "pipe")   # SubprocessEnv(transport=...): frames and slots, or pickles


def check_transport(transport):
    """Raises ValueError (one line) unless `transport` is one of TRANSPORTS."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(map(repr, TRANSPORTS))}, "
                         f"got {transport!r}")


FRAME = struct.Struct("<BBH")    # tag, seq mod 256, slot
PICKLED, STEP_IN_SLOT, RESET_IN_SLOT, RESULT_IN_SLOT = b"P"[0], b"S"[0], b"R"[0], b"T"[0]
IN_SLOT = "in slot"   # the kind of a reply whose time step is in the shared slot
_LENGTH = struct.Struct("!i")    # multiprocessing.connection's length prefix


# The frames of a step are sent and taken with libc's send/recv called
# through ctypes.PyDLL, which keeps the GIL: os.write/os.read release it
# around every call, and taking it back waits for whichever thread holds it
# (an actor's Python, the log thread) -- on a frame that never blocks (a
# 4-byte send into an empty socket buffer, MSG_DONTWAIT; a recv of a
# frame that is there or not, MSG_DONTWAIT) that wait is pure loss. A call
# that would block falls back to os.read/os.write and a poll, which do
# release the GIL.
_LIBC = ctypes.PyDLL(None, use_errno=True)
_SEND, _RECV = _LIBC.send, _LIBC.recv
for _f in (_SEND, _RECV):
    _f.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    _f.restype = ctypes.c_ssize_t
_DONTWAIT = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL


def send_frame_now(fd, frame):
    """Sends a 4-byte frame without releasing the GIL (see above); falls
    back to a blocking write if the socket's buffer is full. OSError if
    the pipe broke."""
    n = _SEND(fd, frame, len(frame), _DONTWAIT)
    if n == len(frame):
        return
    if n < 0 and ctypes.get_errno() not in (errno.EAGAIN, errno.EWOULDBLOCK):
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    write_all(fd, frame[max(n, 0):])


def recv_frame_now(fd):
    """A frame's 4 bytes if they are there, without releasing the GIL; None
    if nothing has come; EOFError if the peer closed; a frame that came in
    part is completed with blocking reads."""
    buffer = ctypes.create_string_buffer(FRAME.size)
    n = _RECV(fd, buffer, FRAME.size, _DONTWAIT)
    if n == FRAME.size:
        return buffer.raw
    if n == 0:
        raise EOFError
    if n < 0:
        if ctypes.get_errno() in (errno.EAGAIN, errno.EWOULDBLOCK):
            return None
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return buffer.raw[:n] + read_exact(fd, FRAME.size - n)


def short_seq(seq_mod_256):
    """The seq a pickled reply to a frame carries: the child knows only the
    request's number mod 256 (its frame's), marked so (negative) that it is
    compared as such."""
    return -1 - seq_mod_256


def reply_matches(reply_seq, seq):
    """Whether a pickled reply numbered `reply_seq` answers request `seq`."""
    return reply_seq == seq or (reply_seq < 0 and -1 - reply_seq == seq & 0xFF)


def write_all(fd, data):
    """Writes every byte of `data` to `fd` (a blocking socket)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_exact(fd, size):
    """Reads exactly `size` bytes from `fd`; EOFError if it closes first."""
    data = os.read(fd, size)
    while len(data) < size:
        more = os.read(fd, size - len(data))
        if not more:
            raise EOFError
        data += more
    return data


def pickled_message(message):
    """The bytes of a rare message: its frame, then the pickle of `message`
    in multiprocessing.connection's framing (pickling errors raise here)."""
    data = ForkingPickler.dumps(message)
    return FRAME.pack(PICKLED, 0, 0) + _LENGTH.pack(len(data)) + bytes(data)


def send_pickled(fd, message):
    """Sends a rare message; pickling errors are raised before anything is sent."""
    write_all(fd, pickled_message(message))


def read_frame(fd, conn, frame=None):
    """Reads one message: (tag, seq mod 256, slot, the unpickled message or
    None); `frame`: its first 4 bytes if they were read already."""
    tag, seq, slot = FRAME.unpack(frame or read_exact(fd, FRAME.size))
    if tag == PICKLED:
        return tag, seq, slot, conn.recv()
    return tag, seq, slot, None


# ------------------------------------------------------------- both sides


def pack_exception(exc: BaseException, with_traceback: bool = True) -> dict:
    """An exception as a picklable dict (type, message, traceback). Without
    the traceback, the parent raises it as one line (a refusal, such as a time
    step that does not match its spec, not a bug in the environment's code)."""
    cls = type(exc)
    tb = "".join(traceback.format_exception(cls, exc, exc.__traceback__)) if with_traceback else ""
    return dict(module=cls.__module__, qualname=cls.__qualname__, message=str(exc), traceback=tb)


def rebuild_exception(info: dict, where: str) -> Exception:
    """The child's exception as the same type with the child's traceback in the message.

    Falls back to RuntimeError if the type cannot be imported here or cannot be
    built from a single message argument.
    """
    if info["traceback"]:
        text = (f"{info['message']}\n\n--- traceback in {where} ---\n"
                f"{info['traceback'].rstrip()}\n--- end of traceback in {where} ---")
    else:
        text = f"{where}: {info['message']}"
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


# ------------------------------------------------------------- parent side

_START_LOCK = threading.Lock()
_FORKSERVER_CONFIGURED = [False]


def get_context(start_method: Optional[str]):
    """The multiprocessing context for children (forkserver, else spawn).

    ``fork`` is not safe here: the parent runs TensorFlow's thread pools and
    the driver's threads, and a forked child inherits copies of the locks
    those threads hold at fork time, which can deadlock it. The fork server
    is a fresh interpreter (started with fork+exec) that imports the child's
    module -- hence tf-agents and TensorFlow -- once and then forks each
    child from its own single-threaded state, so a child (or a restart) does
    not pay the TensorFlow import again.
    """
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
                if CHILD_MODULE not in preload:
                    ctx.set_forkserver_preload(preload + [CHILD_MODULE])
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
                    send_pickled(conn.fileno(), (CLOSE, -1, None))
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

    def __init__(self, ctx, child_main, env_constructor_bytes, gin_config, index):
        """
        Args:
            ctx: the multiprocessing context (`get_context`).
            child_main: the child's entry point (subprocess_child.child_main),
                called as child_main(conn, env_constructor_bytes, gin_config, index).
            env_constructor_bytes: the pickled list of env constructors.
            gin_config: gin text the child parses first.
            index: the child's (first) env index.
        """
        parent_conn, child_conn = ctx.Pipe(duplex=True)   # a socket pair: it carries fds too
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
        self.fd = parent_conn.fileno()
        self.pid = process.pid
        # One poll set over the pipe and the process's sentinel, made once:
        # a wait is then one system call.
        self._poll = select.poll()
        self._poll.register(self.fd, select.POLLIN)
        self._poll.register(process.sentinel, select.POLLIN)
        self._finalizer = weakref.finalize(self, _reap, os.getpid(), process, parent_conn, 1.0)

    def send(self, command, seq, payload):
        """Sends one pickled request; raises ChildDied if the pipe is broken.
        An unpicklable payload raises its pickling error (nothing was sent)."""
        data = pickled_message((command, seq, payload))
        try:
            write_all(self.fd, data)
        except (OSError, ValueError) as e:
            raise ChildDied(f"sending {command!r} to pid {self.pid} failed ({e!r})") from None

    def send_frame(self, tag, seq, slot):
        """Sends a request that is a frame alone (`STEP_IN_SLOT`, `RESET_IN_SLOT`)."""
        try:
            send_frame_now(self.fd, FRAME.pack(tag, seq & 0xFF, slot))
        except (OSError, ValueError) as e:
            raise ChildDied(f"sending a step to pid {self.pid} failed ({e!r})") from None

    def send_fd(self, fd):
        """Hands the child a file descriptor (SCM_RIGHTS); ChildDied if the pipe broke."""
        try:
            multiprocessing.reduction.send_handle(self.conn, fd, self.pid)
        except (OSError, ValueError) as e:
            raise ChildDied(f"sending a descriptor to pid {self.pid} failed ({e!r})") from None

    def wait_reply(self, seq, deadline, what, timeout_secs, interrupted):
        """Returns (kind, payload) of the reply numbered `seq`; kind `IN_SLOT`
        (payload None) when the time step is in the shared slot.

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
        fd = self.fd
        while True:
            interrupted()
            try:
                frame = recv_frame_now(fd)   # the reply is often there already
                if frame is None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise ChildDied(f"pid {self.pid} did not answer {what!r} within "
                                        f"{timeout_secs:g} s (hung)")
                    events = self._poll.poll(max(1, int(remaining * 1000 + 0.999)))
                    interrupted()
                    if not events:
                        continue
                    frame = recv_frame_now(fd)
                    if frame is None:
                        if self.process.exitcode is None and not any(
                                f == self.process.sentinel for f, _ in events):
                            continue
                        raise ChildDied(f"pid {self.pid} exited (exit code "
                                        f"{self.process.exitcode}) during {what!r}")
                tag, short_seq, _, message = read_frame(fd, self.conn, frame)
            except (EOFError, OSError, ValueError) as e:  # a broken pipe, or closed under us
                interrupted()
                raise ChildDied(f"the pipe to pid {self.pid} broke during {what!r} "
                                f"({type(e).__name__})") from None
            if tag == RESULT_IN_SLOT:
                if short_seq == seq & 0xFF:
                    return IN_SLOT, None
                continue  # a late reply to an abandoned request
            kind, reply_seq, payload = message
            if reply_matches(reply_seq, seq):
                return kind, payload

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
