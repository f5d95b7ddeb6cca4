"""SubprocessEnv: one tf-agents environment in a child process, spoken to over a pipe.

Public API
----------
``SubprocessEnv(env_fn, ...)``
    A ``PyEnvironment`` whose ``reset()``/``step()`` run ``env_fn()``'s environment
    in a child process. A child that dies (crash, ``kill -9``, broken pipe, no
    reply within ``step_timeout``) is recreated and reset without stopping
    training; the episode in flight ends as a truncation (see below).
``create_subprocess_envs(env_fns, ...)``
    Starts all children first, then waits for all of them to initialise
    concurrently: N environments that each take 1 s to build are ready in ~1 s.
``BatchedSubprocessEnv(envs)``
    A batched ``PyEnvironment`` over several ``SubprocessEnv``: one step sends
    every action first, then receives every result (no thread pool per step).
``subprocess_env_f(env_fn, num_envs=1, ...)``
    The driver's ``env_f``: a thread-safe zero-arg callable returning a
    ``TFPyEnvironment`` over ``num_envs`` fresh ``SubprocessEnv``.
``current_env_index()``
    Inside a child: the index of the environment being built (None elsewhere).

``env_fn`` requirements
-----------------------
``env_fn`` is called with no arguments *in the child process*, possibly several
times (once per restart). It must return an unbatched tf-agents
``PyEnvironment`` or a ``gym.Env`` (wrapped in the child with
``suite_gym.wrap_env``). It is pickled with cloudpickle in the parent when the
``SubprocessEnv`` is built: a top-level function, a class, or a
``functools.partial`` of one is the safe choice (pickled by reference, imported
in the child); lambdas and closures work but are pickled by value, copying what
they capture. Whatever it needs to know about its position can be read in the
child with ``current_env_index()``. The gin configuration of the parent at
construction time (``gin.config_str()``) is parsed in the child before
``env_fn`` is called, so gin-configured environments build the same there.

Start method
------------
Children are started with the ``forkserver`` start method by default (``spawn``
where there is no forkserver). ``fork`` is not safe here: the parent runs
TensorFlow's thread pools and the driver's threads, and a forked child inherits
copies of the locks those threads hold at fork time, which can deadlock it.
The fork server is a fresh interpreter (started with fork+exec) that imports
this module -- hence tf-agents/TensorFlow -- once and then forks each child from
its own single-threaded state, so a child (or a restart) does not pay the
~2-3 s TensorFlow import again. As with ``spawn``, the main module is imported
(not run) in the children: scripts need the usual
``if __name__ == '__main__':`` guard. Nothing else is required: tf-agents'
``tf_agents.system.multiprocessing.handle_main`` may or may not be used.

Threads
-------
A ``SubprocessEnv`` is used by one thread at a time (its owner, e.g. an
EnvThread); a second concurrent call raises ``RuntimeError``. ``close()`` may be
called from any thread at any time: if the owner is blocked in a call, the
child is killed and that call raises ``SubprocessEnvClosedError`` at once.
``subprocess_env_f``'s callable may be called from several threads at once.

Blocking and shutdown
---------------------
Every read from a child waits at most ``step_timeout`` (``reset``/``step``/
``call``) or ``init_timeout`` (building the environment). ``close()`` asks the
child to close its environment, waits up to ``close_timeout``, then
terminates and finally kills it; it returns only when the child has exited.
Children are also shut down when their ``SubprocessEnv`` is garbage collected
and at interpreter exit (``weakref.finalize``), also after restarts and
failures.
"""

import collections
import concurrent.futures
import functools
import importlib
import itertools
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
from typing import Any, Callable, List, Optional, Sequence

import cloudpickle
import numpy as np
import tensorflow as tf
from tf_agents.environments import py_environment, tf_py_environment
from tf_agents.trajectories import time_step as ts
from tf_agents.utils import nest_utils

__all__ = [
    "BatchedSubprocessEnv",
    "SubprocessEnv",
    "SubprocessEnvClosedError",
    "SubprocessEnvCrashError",
    "SubprocessEnvError",
    "create_subprocess_envs",
    "current_env_index",
    "subprocess_env_f",
]

logger = logging.getLogger(__name__)

DEFAULT_START_METHOD = "forkserver"


class SubprocessEnvError(RuntimeError):
    """Base class of the errors SubprocessEnv raises about its child process."""


class SubprocessEnvCrashError(SubprocessEnvError):
    """A child process died or hung and cannot be (or may no longer be) restarted."""


class SubprocessEnvClosedError(SubprocessEnvError):
    """The SubprocessEnv was closed (possibly by another thread) during or before a call."""


# --------------------------------------------------------------------------- #
# Wire protocol. Parent -> child: (command, seq, payload). Child -> parent:
# (kind, seq, payload); a reply carries the seq of its request so that a reply
# to an abandoned request can never be taken for the answer to a newer one.
# --------------------------------------------------------------------------- #
_STEP, _RESET, _CALL, _CLOSE = "step", "reset", "call", "close"
_READY, _RESULT, _ERROR = "ready", "result", "error"
_READY_SEQ = 0

# Set in the child before env_fn is called; see current_env_index().
_CURRENT_ENV_INDEX: Optional[int] = None


def current_env_index() -> Optional[int]:
    """The index of the SubprocessEnv this process serves, None outside a child.

    Call it inside ``env_fn`` (or the environment's constructor) to give each
    environment its own seed, port, log file, ...; a restarted child gets the
    same index as the one it replaces.
    """
    return _CURRENT_ENV_INDEX


# ------------------------------- child side -------------------------------- #


def _as_py_environment(env):
    if isinstance(env, py_environment.PyEnvironment):
        if env.batched:
            raise TypeError(
                "env_fn must return an unbatched environment; SubprocessEnv batches "
                f"several children itself (got batched {type(env).__name__})")
        return env
    import gym  # only needed for gym environments
    if isinstance(env, gym.Env):
        from tf_agents.environments import suite_gym
        return suite_gym.wrap_env(env)
    raise TypeError("env_fn must return a tf_agents PyEnvironment or a gym.Env, "
                    f"got {type(env).__name__}")


def _pack_exception(exc: BaseException) -> dict:
    cls = type(exc)
    return dict(module=cls.__module__, qualname=cls.__qualname__, message=str(exc),
                traceback="".join(traceback.format_exception(cls, exc, exc.__traceback__)))


def _child_send(conn, kind, seq, payload):
    try:
        data = ForkingPickler.dumps((kind, seq, payload))
    except Exception as e:  # e.g. an unpicklable observation: report, don't die
        data = ForkingPickler.dumps((_ERROR, seq, _pack_exception(e)))
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


def _child_main(conn, env_fn_bytes, gin_config, env_index):
    """Entry point of a child process: build the env, then serve requests."""
    global _CURRENT_ENV_INDEX
    # Ctrl-C goes to the whole process group; the parent decides what to do
    # (close us). Without this every child would "crash" on Ctrl-C and be
    # restarted while the program is shutting down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch_parent()
    _CURRENT_ENV_INDEX = env_index
    env = None
    try:
        try:
            env_fn = cloudpickle.loads(env_fn_bytes)  # imports env_fn's module first
            if gin_config:
                import gin
                # Unknown configurables belong to the parent's other modules
                # (trainer, driver, ...) that this process never imports.
                gin.parse_config(gin_config, skip_unknown=True)
            env = _as_py_environment(env_fn())
            specs = (env.time_step_spec(), env.action_spec())
        except Exception as e:
            _child_send(conn, _ERROR, _READY_SEQ, _pack_exception(e))
            return
        _child_send(conn, _READY, _READY_SEQ, specs)
        while True:
            try:
                command, seq, payload = conn.recv()
            except (EOFError, OSError):
                return  # the parent is gone or closed the pipe
            if command == _CLOSE:
                return
            try:
                if command == _STEP:
                    result = env.step(payload)
                elif command == _RESET:
                    result = env.reset()
                elif command == _CALL:
                    name, args, kwargs = payload
                    result = getattr(env, name)(*args, **kwargs)
                else:
                    raise ValueError(f"unknown SubprocessEnv command {command!r}")
            except Exception as e:
                _child_send(conn, _ERROR, seq, _pack_exception(e))
            else:
                _child_send(conn, _RESULT, seq, result)
    finally:
        if env is not None:
            try:
                env.close()
            except Exception:
                pass
        conn.close()


# ------------------------------- parent side ------------------------------- #

_START_LOCK = threading.Lock()
_FORKSERVER_CONFIGURED = [False]
_GLOBAL_ENV_INDEX = itertools.count()


def _get_context(start_method: Optional[str]):
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


def _current_gin_config() -> str:
    try:
        import gin
        return gin.config_str()
    except Exception as e:  # pragma: no cover - gin is a dependency
        logger.warning("SubprocessEnv: could not read the gin config (%r); "
                       "children start without it", e)
        return ""


class _ChildDied(Exception):
    """Internal: the child died, hung or its pipe broke (reason in the message)."""


def _reap(owner_pid, process, conn, graceful_timeout):
    """Stop one child process; used by _shutdown_children and the finalizer."""
    _shutdown_processes(owner_pid, [(process, conn)], graceful_timeout)


def _shutdown_processes(owner_pid, pairs, graceful_timeout):
    """Ask each child to close, wait, then SIGTERM, then SIGKILL; close pipes.

    Children are handled together so that closing N slow children takes one
    timeout, not N.
    """
    if os.getpid() != owner_pid:  # a forked copy of the parent: not our children
        return
    try:
        if graceful_timeout > 0:
            for process, conn in pairs:
                try:
                    conn.send((_CLOSE, -1, None))
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


class _Child:
    """Parent-side handle of one child process: the process, our end of the pipe."""

    def __init__(self, ctx, env_fn_bytes, gin_config, env_index):
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        process = ctx.Process(target=_child_main, name=f"SubprocessEnv-{env_index}",
                              args=(child_conn, env_fn_bytes, gin_config, env_index),
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
        # Kills the child if this handle is garbage collected or at exit.
        self._finalizer = weakref.finalize(self, _reap, os.getpid(), process, parent_conn, 1.0)

    def detach(self):
        """Take over shutdown from the finalizer; False if it has already been done."""
        return self._finalizer.detach() is not None

    def shutdown(self, graceful_timeout):
        if self.detach():
            _shutdown_processes(os.getpid(), [(self.process, self.conn)], graceful_timeout)


def _shutdown_children(children: Sequence[_Child], graceful_timeout: float):
    pairs = [(c.process, c.conn) for c in children if c.detach()]
    if pairs:
        _shutdown_processes(os.getpid(), pairs, graceful_timeout)


class _InFlight(collections.namedtuple("_InFlight", "command seq deadline failure pending")):
    """One request sent to the child (or a locally answered one, pending=True)."""


def _rebuild_exception(info: dict, where: str) -> Exception:
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


class SubprocessEnv(py_environment.PyEnvironment):
    """A tf-agents PyEnvironment running ``env_fn()`` in a child process.

    Crash handling: when the child dies (crash, ``kill -9``, broken pipe) or
    does not answer within ``step_timeout`` seconds (it is killed), a new child
    is started with the same ``env_fn``, gin config and env index, and reset.
    If an episode was in flight, the call that noticed the crash returns a
    truncation -- ``LAST``, discount 1.0, reward 0, the last observation the
    parent saw -- and the next ``step()`` returns the new child's ``FIRST``
    time step (its action is ignored, as after any ``LAST``). A crash during
    ``reset()`` or right after a ``LAST`` needs no truncation: that call
    returns the new ``FIRST`` directly; a crash during ``call()`` raises
    ``SubprocessEnvError`` and the next ``step()`` continues as above. Each
    recreated child counts in ``restarts``. At most ``max_restarts`` restarts
    may happen within any ``restart_window_secs`` seconds; the crash that
    would exceed this raises ``SubprocessEnvCrashError``, as does every later
    call.

    Errors of the environment's own code (an exception in ``env_fn``,
    ``reset`` or ``step``) are not crashes: they are raised here with the same
    type (RuntimeError if the type cannot be rebuilt), the child's traceback
    in the message, and nothing is retried. The child stays up, unless the
    error happened while building the environment.

    Specs are known once the child has been initialised (``start=True``, or
    ``start()`` + ``initialize()``, or ``create_subprocess_envs``).
    """

    # Steps wait on a child process: the driver steps it off TF's inter-op
    # pool and closes it at once on stop (close() is safe from any thread).
    blocking_step = True

    def __init__(self,
                 env_fn: Callable[[], Any],
                 *,
                 env_index: Optional[int] = None,
                 step_timeout: float = 60.0,
                 init_timeout: float = 120.0,
                 max_restarts: int = 5,
                 restart_window_secs: float = 600.0,
                 close_timeout: float = 5.0,
                 gin_config: Optional[str] = None,
                 start_method: Optional[str] = None,
                 start: bool = True):
        """
        Args:
          env_fn: zero-arg picklable callable returning a PyEnvironment or a
            gym.Env; called in the child (see the module docstring).
          env_index: what ``current_env_index()`` returns in the child. Default:
            the next value of a process-wide counter.
          step_timeout: seconds to wait for the child's answer to one
            reset/step/call before it is considered hung, killed and restarted.
          init_timeout: seconds to wait for ``env_fn()`` to return in the child.
          max_restarts: restarts allowed within ``restart_window_secs``
            (0: never restart, raise on the first crash).
          restart_window_secs: the sliding window of ``max_restarts``.
          close_timeout: seconds ``close()`` waits for the child to close its
            environment before terminating / killing it.
          gin_config: gin config text parsed in the child before ``env_fn`` is
            called. Default: ``gin.config_str()`` now; "" for none.
          start_method: multiprocessing start method; default "forkserver".
          start: start the child and wait for it to be initialised now. With
            False, call ``start()`` then ``initialize()``.
        """
        super().__init__(handle_auto_reset=False)
        for name, value in (("step_timeout", step_timeout), ("init_timeout", init_timeout),
                            ("restart_window_secs", restart_window_secs)):
            if not value or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts!r}")
        if not callable(env_fn):
            raise TypeError(f"env_fn must be callable, got {env_fn!r}")
        try:
            self._env_fn_bytes = cloudpickle.dumps(env_fn)
        except Exception as e:
            raise TypeError(
                f"env_fn {env_fn!r} cannot be pickled for the child process ({e}); use a "
                "top-level function or a functools.partial of one") from e
        self._env_fn_repr = repr(env_fn)
        self._env_index = next(_GLOBAL_ENV_INDEX) if env_index is None else int(env_index)
        self._gin_config = _current_gin_config() if gin_config is None else gin_config
        self._ctx = _get_context(start_method)
        self._step_timeout = float(step_timeout)
        self._init_timeout = float(init_timeout)
        self._max_restarts = int(max_restarts)
        self._restart_window_secs = float(restart_window_secs)
        self._close_timeout = float(close_timeout)

        self._time_step_spec = None
        self._action_spec = None
        self._child: Optional[_Child] = None
        self._initialized = False
        # _io_lock is held from sending a request until its reply is handled;
        # close() uses it to tell whether another thread is blocked on the child.
        self._io_lock = threading.Lock()
        self._state_lock = threading.Lock()  # guards _closed and _child swaps
        self._closed = False
        self._failure: Optional[BaseException] = None
        self._seq = _READY_SEQ
        self._in_flight: Optional[_InFlight] = None
        # Time steps owed to the next step()/reset() after a restart: [FIRST] or
        # [truncation, FIRST] (the latter when the crash happened in call()).
        self._owed = collections.deque()
        self._last_time_step = None  # the last time step returned to the caller
        self._restarts = 0
        self._restart_times = collections.deque()
        if start:
            try:
                self.start()
                self.initialize()
            except BaseException:
                self.close()
                raise

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Starts the child process (it starts building the env at once). Non-blocking."""
        with self._state_lock:
            if self._closed:
                raise SubprocessEnvClosedError(f"{self._name()} is closed")
            if self._child is not None:
                raise RuntimeError(f"{self._name()} was started already")
            self._child = _Child(self._ctx, self._env_fn_bytes, self._gin_config,
                                 self._env_index)

    def initialize(self) -> None:
        """Waits (at most ``init_timeout``) until the child has built its env.

        Raises the env_fn's own exception (same type) if building failed, or
        SubprocessEnvCrashError if the child died or timed out.
        """
        if self._initialized:
            return
        if self._child is None:
            raise RuntimeError(f"{self._name()}: call start() before initialize()")
        try:
            self._wait_ready(self._child)
        except _ChildDied as e:
            self._child.shutdown(0)
            raise SubprocessEnvCrashError(
                f"{self._name()} failed to start: {e}") from None
        except BaseException:
            self._child.shutdown(0)
            raise
        self._initialized = True

    def close(self) -> None:
        """Stops the child; returns when it has exited. Idempotent, any thread."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            child = self._child
        if child is None:
            return
        if self._io_lock.acquire(blocking=False):
            try:
                _shutdown_children([child], self._close_timeout)
            finally:
                self._io_lock.release()
        else:
            # Another thread waits on this child: kill it so that the waiting
            # call wakes up (and raises SubprocessEnvClosedError).
            _shutdown_children([child], 0)

    # ------------------------------------------------------------ properties

    @property
    def restarts(self) -> int:
        """How many times the child process was recreated."""
        return self._restarts

    @property
    def env_index(self) -> int:
        return self._env_index

    @property
    def pid(self) -> Optional[int]:
        """The pid of the current child process (None before start())."""
        child = self._child
        return None if child is None else child.pid

    @property
    def closed(self) -> bool:
        return self._closed

    def observation_spec(self):
        return self._specs()[0].observation

    def action_spec(self):
        return self._specs()[1]

    def reward_spec(self):
        return self._specs()[0].reward

    def discount_spec(self):
        return self._specs()[0].discount

    def time_step_spec(self):
        return self._specs()[0]

    # ------------------------------------------------------------ calls

    def _reset(self):
        self._send(_RESET, None)
        return self._receive()

    def _step(self, action):
        self._send(_STEP, action)
        return self._receive()

    def call(self, name: str, *args, **kwargs):
        """Calls ``env.<name>(*args, **kwargs)`` in the child and returns the result."""
        self._send(_CALL, (name, args, kwargs))
        return self._receive()

    def render(self, mode: str = "rgb_array"):
        return self.call("render", mode)

    def seed(self, seed):
        return self.call("seed", seed)

    def get_info(self):
        return self.call("get_info")

    def __repr__(self):
        return f"SubprocessEnv({self._env_fn_repr}, env_index={self._env_index}, pid={self.pid})"

    # ------------------------------------------------------------ internals

    def _name(self):
        return f"SubprocessEnv(env_index={self._env_index}, env_fn={self._env_fn_repr})"

    def _specs(self):
        if self._time_step_spec is None:
            raise RuntimeError(f"{self._name()} is not initialised yet: its specs come from "
                               "the child; use start=True, initialize() or create_subprocess_envs")
        return self._time_step_spec, self._action_spec

    def _check_usable(self):
        if self._closed:
            raise SubprocessEnvClosedError(f"{self._name()} is closed")
        if self._failure is not None:
            raise SubprocessEnvCrashError(f"{self._name()} has failed: {self._failure}")
        if not self._initialized:
            self._specs()  # raises the "not initialised" error
            raise RuntimeError(f"{self._name()} is not initialised yet")

    def _send(self, command, payload):
        """Sends one request (first half of a call). Holds _io_lock until _receive()."""
        self._check_usable()
        if not self._io_lock.acquire(blocking=False):
            raise RuntimeError(f"{self._name()} is used by two threads at once, or a "
                               "request is in flight; it is not thread-safe")
        try:
            if command in (_STEP, _RESET) and self._owed:
                self._in_flight = _InFlight(command, None, None, None, True)
                return
            self._seq += 1
            data = ForkingPickler.dumps((command, self._seq, payload))  # errors: caller's
            failure = None
            try:
                self._child.conn.send_bytes(data)
            except (OSError, ValueError) as e:
                failure = f"sending {command!r} to pid {self._child.pid} failed ({e!r})"
            self._in_flight = _InFlight(command, self._seq,
                                        time.monotonic() + self._step_timeout, failure, False)
        except BaseException:
            self._io_lock.release()
            raise

    def _receive(self):
        """Waits for the reply to the request sent by _send() (second half of a call)."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            raise RuntimeError(f"{self._name()}: no request in flight")
        try:
            if in_flight.pending:
                if in_flight.command == _RESET:  # a reset wants the FIRST, not a truncation
                    while len(self._owed) > 1:
                        self._owed.popleft()
                return self._record(self._owed.popleft())
            failure = in_flight.failure
            if failure is None:
                try:
                    kind, payload = self._wait_reply(self._child, in_flight.seq,
                                                     in_flight.deadline, in_flight.command)
                except _ChildDied as e:
                    failure = str(e)
            if failure is not None:
                return self._recover(in_flight.command, failure)
            if kind == _ERROR:
                raise _rebuild_exception(payload, self._where())
            if in_flight.command == _CALL:
                return payload
            return self._record(payload)
        except SubprocessEnvClosedError:
            if self._child is not None:
                self._child.shutdown(0)
            raise
        finally:
            self._io_lock.release()

    def _where(self):
        return f"environment process pid {self._child.pid} (env_index {self._env_index})"

    def _record(self, time_step):
        self._last_time_step = time_step
        self._current_time_step = time_step
        return time_step

    def _raise_if_closed(self):
        if self._closed:
            raise SubprocessEnvClosedError(f"{self._name()} was closed during a call")

    def _wait_reply(self, child: _Child, seq: int, deadline: float, what: str):
        """Returns (kind, payload) of the reply numbered seq, or raises _ChildDied."""
        conn, sentinel = child.conn, child.process.sentinel
        while True:
            self._raise_if_closed()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timeout = self._init_timeout if seq == _READY_SEQ else self._step_timeout
                raise _ChildDied(f"pid {child.pid} did not answer {what!r} within "
                                 f"{timeout:g} s (hung)")
            try:
                ready = multiprocessing.connection.wait([conn, sentinel], timeout=remaining)
            except (OSError, ValueError) as e:  # our handles were closed under us
                self._raise_if_closed()
                raise _ChildDied(f"waiting for pid {child.pid} failed ({e!r})") from None
            self._raise_if_closed()
            if not ready:
                continue
            if conn in ready or conn.poll(0):  # read what it wrote, even if it then died
                try:
                    kind, reply_seq, payload = conn.recv()
                except (EOFError, OSError) as e:
                    raise _ChildDied(f"the pipe to pid {child.pid} broke during {what!r} "
                                     f"({type(e).__name__})") from None
                if reply_seq == seq:
                    return kind, payload
                continue  # a late reply to an abandoned request
            raise _ChildDied(f"pid {child.pid} exited (exit code {child.process.exitcode}) "
                             f"during {what!r}")

    def _wait_ready(self, child: _Child):
        kind, payload = self._wait_reply(child, _READY_SEQ,
                                         time.monotonic() + self._init_timeout, "initialisation")
        if kind == _ERROR:
            raise _rebuild_exception(payload, f"environment process pid {child.pid} "
                                              f"(env_index {self._env_index}) building the env")
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
        self._owed.clear()  # anything still owed came from the dead child
        last = self._last_time_step
        owed = [first]
        if command != _RESET and last is not None and not np.all(
                last.step_type == ts.StepType.LAST):
            owed.insert(0, self._truncation(last))  # an episode was in flight
        if command == _CALL:
            self._owed.extend(owed)
            raise SubprocessEnvError(
                f"{self._name()}: the environment process died during call() ({reason}); "
                "it was restarted, the next step() ends the episode in flight")
        self._owed.extend(owed[1:])
        return self._record(owed[0])

    def _truncation(self, last):
        spec = self._time_step_spec
        return ts.TimeStep(
            step_type=np.asarray(ts.StepType.LAST, dtype=spec.step_type.dtype),
            reward=tf.nest.map_structure(lambda s: np.zeros(s.shape, s.dtype), spec.reward),
            discount=np.asarray(1.0, dtype=spec.discount.dtype),
            observation=last.observation)

    def _restart(self, reason):
        """Recreates and resets the child; returns its FIRST time step."""
        while True:
            now = time.monotonic()
            while self._restart_times and now - self._restart_times[0] > self._restart_window_secs:
                self._restart_times.popleft()
            if len(self._restart_times) >= self._max_restarts:
                self._failure = SubprocessEnvCrashError(
                    f"{self._name()}: the environment process died ({reason}) and was "
                    f"already restarted {len(self._restart_times)} times in the last "
                    f"{self._restart_window_secs:g} s (max_restarts={self._max_restarts}); "
                    "giving up")
                raise self._failure
            self._restart_times.append(now)
            self._restarts += 1
            logger.warning("%s: environment process died (%s); restarting it (restart %d)",
                           self._name(), reason, self._restarts)
            with self._state_lock:
                self._raise_if_closed()
                self._child = child = _Child(self._ctx, self._env_fn_bytes,
                                             self._gin_config, self._env_index)
            try:
                self._wait_ready(child)
                self._seq += 1
                try:
                    child.conn.send((_RESET, self._seq, None))
                except (OSError, ValueError) as e:
                    raise _ChildDied(f"sending 'reset' to pid {child.pid} failed ({e!r})")
                kind, payload = self._wait_reply(child, self._seq,
                                                 time.monotonic() + self._step_timeout, _RESET)
            except _ChildDied as e:
                child.shutdown(0)
                reason = f"the restarted process failed: {e}"
                continue
            if kind == _ERROR:
                raise _rebuild_exception(payload, self._where())
            return payload


class BatchedSubprocessEnv(py_environment.PyEnvironment):
    """A batched PyEnvironment over SubprocessEnvs, stepped concurrently.

    ``step(actions)`` sends each environment its action, then receives every
    result, so the children step in parallel without threads. If some
    environments raise, the others' replies are still received (the pipes stay
    in sync) and the first error is raised. Owns its environments: ``close()``
    closes them all, together. Same threading rules as SubprocessEnv.
    """

    # Steps wait on a child process: the driver steps it off TF's inter-op
    # pool and closes it at once on stop (close() is safe from any thread).
    blocking_step = True

    def __init__(self, envs: Sequence[SubprocessEnv]):
        super().__init__(handle_auto_reset=False)
        if not envs:
            raise ValueError("BatchedSubprocessEnv needs at least one environment")
        self._envs = list(envs)
        first = self._envs[0]
        for env in self._envs[1:]:
            if (env.time_step_spec() != first.time_step_spec()
                    or env.action_spec() != first.action_spec()):
                raise ValueError(f"specs of {env!r} differ from those of {first!r}")

    @property
    def batched(self) -> bool:
        return True

    @property
    def batch_size(self) -> int:
        return len(self._envs)

    @property
    def envs(self) -> List[SubprocessEnv]:
        return list(self._envs)

    @property
    def restarts(self) -> int:
        """Total restarts of all children."""
        return sum(env.restarts for env in self._envs)

    @property
    def restarts_per_env(self) -> List[int]:
        return [env.restarts for env in self._envs]

    @property
    def pids(self) -> List[Optional[int]]:
        return [env.pid for env in self._envs]

    def observation_spec(self):
        return self._envs[0].observation_spec()

    def action_spec(self):
        return self._envs[0].action_spec()

    def reward_spec(self):
        return self._envs[0].reward_spec()

    def discount_spec(self):
        return self._envs[0].discount_spec()

    def time_step_spec(self):
        return self._envs[0].time_step_spec()

    def _reset(self):
        return self._all([(env, _RESET, None) for env in self._envs])

    def _step(self, actions):
        actions = nest_utils.unstack_nested_arrays(actions)
        if len(actions) != len(self._envs):
            raise ValueError(f"got {len(actions)} actions for {len(self._envs)} environments")
        return self._all([(env, _STEP, a) for env, a in zip(self._envs, actions)])

    def _all(self, requests):
        sent, error = [], None
        for env, command, payload in requests:
            try:
                env._send(command, payload)
            except BaseException as e:
                error = e
                break
            sent.append(env)
        results = []
        for env in sent:  # always drain every request that went out
            try:
                results.append(env._receive())
            except BaseException as e:
                if error is None:
                    error = e
        if error is not None:
            raise error
        return nest_utils.stack_nested_arrays(results)

    def close(self) -> None:
        _close_envs(self._envs)


def _close_envs(envs: Sequence[SubprocessEnv]):
    """Closes several SubprocessEnvs, waiting for their children together."""
    graceful, timeout = [], 0.0
    for env in envs:
        with env._state_lock:
            if env._closed:
                continue
            env._closed = True
            child = env._child
        if child is None:
            continue
        if env._io_lock.acquire(blocking=False):
            graceful.append((env, child))
            timeout = max(timeout, env._close_timeout)
        else:
            _shutdown_children([child], 0)
    try:
        _shutdown_children([child for _, child in graceful], timeout)
    finally:
        for env, _ in graceful:
            env._io_lock.release()


def create_subprocess_envs(env_fns: Sequence[Callable[[], Any]],
                           env_indices: Optional[Sequence[int]] = None,
                           **kwargs) -> List[SubprocessEnv]:
    """Creates one SubprocessEnv per env_fn, built in parallel.

    All children are started first (each starts building its env at once),
    then all are initialised concurrently, so the total time is that of the
    slowest, not the sum. If any fails, all are closed and its error raised.

    Args:
      env_fns: zero-arg picklable callables (see the module docstring).
      env_indices: env_index of each (default: the process-wide counter).
      **kwargs: passed to SubprocessEnv (step_timeout, max_restarts, ...).
    """
    env_fns = list(env_fns)
    if env_indices is None:
        env_indices = [None] * len(env_fns)
    if len(env_indices) != len(env_fns):
        raise ValueError("env_indices and env_fns differ in length")
    kwargs = dict(kwargs, start=False)
    if "gin_config" not in kwargs or kwargs["gin_config"] is None:
        kwargs["gin_config"] = _current_gin_config()
    envs = []
    try:
        for env_fn, index in zip(env_fns, env_indices):
            env = SubprocessEnv(env_fn, env_index=index, **kwargs)
            envs.append(env)
            env.start()
        if len(envs) == 1:
            envs[0].initialize()
        elif envs:
            with concurrent.futures.ThreadPoolExecutor(
                    len(envs), thread_name_prefix="SubprocessEnvInit") as pool:
                futures = [pool.submit(env.initialize) for env in envs]
                for future in futures:  # all finish (init_timeout bounds each)
                    future.exception()
            for future in futures:
                if future.exception() is not None:
                    raise future.exception()
    except BaseException:
        _close_envs(envs)
        raise
    return envs


class _SubprocessEnvFactory:
    """The zero-arg ``env_f`` returned by ``subprocess_env_f``; thread-safe."""

    def __init__(self, env_fn, num_envs, first_env_index, kwargs):
        self._env_fn = env_fn
        self._num_envs = num_envs
        self._kwargs = kwargs
        self._counter = itertools.count(first_env_index)
        self._lock = threading.Lock()

    def __call__(self) -> tf_py_environment.TFPyEnvironment:
        with self._lock:  # each call gets its own block of env indices
            indices = [next(self._counter) for _ in range(self._num_envs)]
        envs = create_subprocess_envs([self._env_fn] * self._num_envs, env_indices=indices,
                                      **self._kwargs)
        try:
            return tf_py_environment.TFPyEnvironment(BatchedSubprocessEnv(envs))
        except BaseException:
            _close_envs(envs)
            raise

    def __repr__(self):
        return f"subprocess_env_f({self._env_fn!r}, num_envs={self._num_envs})"


def subprocess_env_f(env_fn: Callable[[], Any], num_envs: int = 1, *,
                     first_env_index: int = 0, **kwargs) -> Callable[[], Any]:
    """The driver's ``env_f`` for environments in child processes.

    Returns a zero-arg callable; each call starts ``num_envs`` new children
    (in parallel, see ``create_subprocess_envs``) and returns a
    ``TFPyEnvironment`` over a ``BatchedSubprocessEnv`` of them (batch size
    ``num_envs``). The callable is thread-safe: the driver may call it from
    several env threads at once. The environments it makes get the indices
    ``first_env_index, first_env_index + 1, ...`` in call order (one block of
    ``num_envs`` per call), readable in the child with ``current_env_index()``.

    The returned TFPyEnvironment exposes ``restarts`` (total of its children),
    ``restarts_per_env``, ``pids`` and ``envs`` (through ``pyenv``), and its
    ``close()`` stops the children.

    Args:
      env_fn: zero-arg picklable callable returning a PyEnvironment or gym.Env,
        called in each child; see the module docstring.
      num_envs: environments per TFEnvironment (its batch size).
      first_env_index: the first env index handed out.
      **kwargs: SubprocessEnv options (step_timeout, init_timeout,
        max_restarts, restart_window_secs, close_timeout, gin_config,
        start_method).
    """
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    if "start" in kwargs or "env_index" in kwargs:
        raise TypeError("subprocess_env_f sets start and env_index itself")
    cloudpickle.dumps(env_fn)  # fail now, not in the driver's env thread
    return _SubprocessEnvFactory(env_fn, num_envs, first_env_index, kwargs)
