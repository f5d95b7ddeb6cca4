"""SubprocessEnv: one tf-agents environment (or several) in a child process.

Public API
----------
``SubprocessEnv(env_constructor, ...)``
    A ``PyEnvironment`` whose ``reset()``/``step()`` run ``env_constructor()``'s
    environment in a child process. A child that dies (crash, ``kill -9``,
    broken pipe, no reply within ``step_timeout``) is recreated and reset
    without stopping training; the episode in flight ends as a truncation
    (see `SubprocessEnv`).
``close_subprocess_envs(envs)``
    Closes several, waiting for their children together.
``create_subprocess_envs``, ``BatchedSubprocessEnv``, ``subprocess_env_constructor``
    (subprocess_batched.py; also from ``alf_async.environments``): several
    built in parallel, stepped concurrently as one batched environment, and
    the driver's env constructor over them.
``current_env_index()``
    Inside a child: the index of the environment it serves (env_index.py).

In the driver, the rows of a ``BatchedSubprocessEnv`` are stepped one by one,
whichever children have answered, by their env thread alone
(``SubprocessEnv.row_stepper``, subprocess_rows.py: one epoll set over the
pipes, no worker thread per row).

How a call reaches the child and comes back over shared memory or pipes
(``transport``), and the restart when the child dies, are in
subprocess_calls.py (`SubprocessCalls`, a base class of `SubprocessEnv`);
the wire protocol is subprocess_protocol.py's, the child's side
subprocess_child.py's, the shared slots shared_slots.py's.

``env_constructor`` requirements
--------------------------------
``env_constructor`` is called with no arguments *in the child process*,
possibly several times (once per restart). It must return an unbatched
tf-agents ``PyEnvironment`` or a gym / gymnasium environment (made a
PyEnvironment by `adapters.as_py_environment`). It is pickled with
cloudpickle in the parent when the ``SubprocessEnv`` is built: a top-level
function, a class, or a ``functools.partial`` of one is the safe choice
(pickled by reference, imported in the child); lambdas and closures work but
are pickled by value, copying what they capture. Whatever it needs to know
about its position can be read in the child with ``current_env_index()``.
The gin configuration of the parent at construction time
(``gin.config_str()``) is parsed in the child before ``env_constructor`` is
called, so gin-configured environments build the same there.

Start method
------------
Children are started with the ``forkserver`` start method by default
(``spawn`` where there is none; why not ``fork``: `subprocess_protocol.get_context`).
As with ``spawn``, the main module is imported (not run) in the children:
scripts need the usual ``if __name__ == '__main__':`` guard. Nothing else is
required: tf-agents' ``tf_agents.system.multiprocessing.handle_main`` may or
may not be used.

Threads
-------
A ``SubprocessEnv`` is used by one thread at a time (its owner, e.g. an
EnvThread); a second concurrent call raises ``RuntimeError``. ``close()`` may be
called from any thread at any time: if the owner is blocked in a call, the
child is killed and that call raises ``SubprocessEnvClosedError`` at once.

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

import itertools
import threading
from typing import Any, Callable, Optional, Sequence, Tuple, Union

import cloudpickle
from tf_agents.environments import py_environment

from alf_async.environments.processes import subprocess_protocol as protocol
from alf_async.environments.capabilities import BlockingStep, OffersRowStepper, Restartable
from alf_async.environments.processes.env_index import current_env_index
from alf_async.environments.processes.recovery import CrashRecovery
from alf_async.environments.processes.shared_slots import SharedSlots
from alf_async.environments.processes.subprocess_calls import (InFlight, SubprocessCalls,
                                                               SubprocessEnvClosedError,
                                                               SubprocessEnvCrashError,
                                                               SubprocessEnvError)

__all__ = [
    "SubprocessEnv",
    "SubprocessEnvClosedError",
    "SubprocessEnvCrashError",
    "SubprocessEnvError",
    "close_subprocess_envs",
    "current_env_index",
]

_GLOBAL_ENV_INDEX = itertools.count()


class SubprocessEnv(SubprocessCalls, py_environment.PyEnvironment, Restartable, BlockingStep,
                    OffersRowStepper):
    """A tf-agents PyEnvironment running ``env_constructor()`` in a child process.

    Crash handling (`recovery.CrashRecovery`): when the child dies (crash,
    ``kill -9``, broken pipe) or does not answer within ``step_timeout``
    seconds (it is killed), a new child is started with the same constructor,
    gin config and env index, and reset. If an episode was in flight, the
    call that noticed the crash returns a truncation -- ``LAST``, discount
    1.0, reward 0, the last observation the parent saw -- and the next
    ``step()`` returns the new child's ``FIRST`` time step (its action is
    ignored, as after any ``LAST``). A crash during ``reset()`` or right
    after a ``LAST`` needs no truncation: that call returns the new ``FIRST``
    directly; a crash during ``call()`` raises ``SubprocessEnvError`` and the
    next ``step()`` continues as above. Each recreated child counts in
    ``restarts``. At most ``max_restarts`` restarts may happen within any
    ``restart_window_secs`` seconds; the crash that would exceed this raises
    ``SubprocessEnvCrashError``, as does every later call.

    Errors of the environment's own code (an exception in the constructor,
    ``reset`` or ``step``) are not crashes: they are raised here with the same
    type (RuntimeError if the type cannot be rebuilt), the child's traceback
    in the message, and nothing is retried. The child stays up, unless the
    error happened while building the environment.

    Specs are known once the child has been initialised (``start=True``, or
    ``start()`` + ``initialize()``, or ``create_subprocess_envs``).

    With ``envs_per_process=K > 1`` (or a list of K constructors) the child
    builds K environments and this is a batched environment of batch size
    K: each step steps the K of them in turn in the child, for one wake-up
    of the process instead of K. A crash ends the episodes of all K rows
    (as a Ray actor of several environments does, recovery.py); their
    rows step together, so the driver steps such environments in lockstep,
    not one row at a time.
    """


    def __init__(self,
                 env_constructor: Union[Callable[[], Any], Sequence[Callable[[], Any]]],
                 *,
                 env_index: Optional[int] = None,
                 envs_per_process: int = 1,
                 step_timeout: float = 60.0,
                 init_timeout: float = 120.0,
                 max_restarts: int = 5,
                 restart_window_secs: float = 600.0,
                 close_timeout: float = 5.0,
                 gin_config: Optional[str] = None,
                 start_method: Optional[str] = None,
                 transport: str = "shared_memory",
                 slots: Optional[Tuple[SharedSlots, int]] = None,
                 start: bool = True):
        """
        Args:
          env_constructor: zero-arg picklable callable returning a
            PyEnvironment or a gym / gymnasium environment; called in the
            child (see the module docstring). Or a list of them, one per
            environment of the child (then ``envs_per_process`` is its length).
          env_index: what ``current_env_index()`` returns in the child while
            it builds its (first) environment; the others get the next
            indices. Default: the next value of a process-wide counter.
          envs_per_process: environments the child builds with
            ``env_constructor`` and steps (see the class docstring).
          step_timeout: seconds to wait for the child's answer to one
            reset/step/call before it is considered hung, killed and restarted.
          init_timeout: seconds to wait for ``env_constructor()`` to return in
            the child.
          max_restarts: restarts allowed within ``restart_window_secs``
            (0: never restart, raise on the first crash).
          restart_window_secs: the sliding window of ``max_restarts``.
          close_timeout: seconds ``close()`` waits for the child to close its
            environment before terminating / killing it.
          gin_config: gin config text parsed in the child before the
            constructor is called. Default: ``gin.config_str()`` now; "" for none.
          start_method: multiprocessing start method; default "forkserver".
          transport: how steps travel. "shared_memory" (the default): the
            action and the time step are written in place in a shared
            segment (shared_slots.py) and each side wakes the other with a
            4-byte frame; nothing is pickled on a step. Specs must be bool,
            integer or float arrays (others are refused at start, in one
            line). "pipe": every request and reply is pickled over the pipe
            (any picklable specs). Calls (`call`, `render`, ...) are pickled
            either way.
          slots: (SharedSlots, slot): the segment and the first of the rows
            this environment uses, when several environments share one
            (create_subprocess_envs); default: a segment of its own.
          start: start the child and wait for it to be initialised now. With
            False, call ``start()`` then ``initialize()``.
        """
        super().__init__(handle_auto_reset=False)
        protocol.check_transport(transport)
        for name, value in (("step_timeout", step_timeout), ("init_timeout", init_timeout)):
            if not value or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if callable(env_constructor):
            if not isinstance(envs_per_process, int) or envs_per_process < 1:
                raise ValueError(f"envs_per_process must be a positive integer, "
                                 f"got {envs_per_process!r}")
            constructors = [env_constructor] * envs_per_process
        else:
            constructors = list(env_constructor) if isinstance(env_constructor, (list, tuple)) \
                else [None]
            if not constructors or not all(callable(c) for c in constructors):
                raise TypeError(f"env_constructor must be callable or a list of callables, "
                                f"got {env_constructor!r}")
            if envs_per_process not in (1, len(constructors)):
                raise ValueError(f"envs_per_process={envs_per_process!r} but "
                                 f"{len(constructors)} constructors were given")
            env_constructor = constructors[0] if len(constructors) == 1 else constructors
        self._envs_per_process = len(constructors)
        try:
            self._constructor_bytes = cloudpickle.dumps(constructors)
        except Exception as e:
            raise TypeError(
                f"env constructor {env_constructor!r} cannot be pickled for the child "
                f"process ({e}); use a top-level function or a functools.partial of one") from e
        self._constructor_repr = repr(env_constructor)
        self._env_index = next(_GLOBAL_ENV_INDEX) if env_index is None else int(env_index)
        self._recovery = CrashRecovery(self._name(), "the environment process", max_restarts,
                                       restart_window_secs, SubprocessEnvCrashError)
        self._gin_config = protocol.current_gin_config() if gin_config is None else gin_config
        self._ctx = protocol.get_context(start_method)
        self._shared, self._slot = None, 0
        if transport == "shared_memory":
            self._shared, self._slot = slots or (
                SharedSlots(self._envs_per_process, self._name()), 0)
            self._shared.acquire()
        self._views = None  # the shared slots' views, once attached
        self._step_timeout = float(step_timeout)
        self._init_timeout = float(init_timeout)
        self._close_timeout = float(close_timeout)

        self._time_step_spec = None
        self._action_spec = None
        self._child: Optional[protocol.ChildProcess] = None
        self._initialized = False
        # _io_lock is held from sending a request until its reply is handled;
        # close() uses it to tell whether another thread is blocked on the child.
        self._io_lock = threading.Lock()
        self._state_lock = threading.Lock()  # guards _closed and _child swaps
        self._closed = False
        self._seq = protocol.READY_SEQ
        self._in_flight: Optional[InFlight] = None
        self._last_time_step = None  # the last time step returned to the caller
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
            self._child = self._new_child()

    def initialize(self) -> None:
        """Waits (at most ``init_timeout``) until the child has built its env.

        Raises the constructor's own exception (same type) if building failed,
        or SubprocessEnvCrashError if the child died or timed out.
        """
        if self._initialized:
            return
        if self._child is None:
            raise RuntimeError(f"{self._name()}: call start() before initialize()")
        try:
            self._wait_ready(self._child)
            if self._shared is not None:
                self._attach(self._child)
        except protocol.ChildDied as e:
            self._child.shutdown(0)
            raise SubprocessEnvCrashError(
                f"{self._name()} failed to start: {e}") from None
        except BaseException:
            self._child.shutdown(0)
            raise
        self._initialized = True

    def close(self) -> None:
        """Stops the child; returns when it has exited. Idempotent, any thread."""
        close_subprocess_envs([self])

    # ------------------------------------------------------------ properties

    @property
    def restarts(self) -> int:
        """How many times the child process was recreated."""
        return self._recovery.restarts

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

    @property
    def batched(self) -> bool:
        return self._envs_per_process > 1

    @property
    def batch_size(self) -> Optional[int]:
        return self._envs_per_process if self._envs_per_process > 1 else None

    @property
    def envs_per_process(self) -> int:
        """How many environments the child steps (the batch size, or 1)."""
        return self._envs_per_process

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
        return self.reset_async()()

    def _step(self, action):
        return self.step_async(action)()

    def step_async(self, action, in_slot=False):
        """Sends a step to the child and returns at once, with `receive`: a
        callable that waits for the time step and returns it. Call it
        exactly once, before any other call of this environment (until
        then the environment counts as in use). For stepping several
        environments concurrently (`BatchedSubprocessEnv`, `SubprocessRows`);
        unlike `step()` it does not update `current_time_step()`.

        Args:
            action: the action (ignored if `in_slot`).
            in_slot: the caller wrote the action into this environment's
                shared slot already (a batch writing all its rows at once).
        """
        self._send(protocol.STEP, action, in_slot)
        return self._receive

    def reset_async(self):
        """Like `step_async`, for a reset."""
        self._send(protocol.RESET, None)
        return self._receive

    def reply_waitable(self):
        """What to wait on for the reply to the request in flight, for a caller
        waiting for several environments at once (SubprocessRows).

        Returns:
            (connection, deadline): the reply can be received without waiting
                once the connection is readable (the child answered, or died) or
                `time.monotonic()` has passed `deadline` (the child is hung);
                or None when the receive needs no wait: the step is answered
                without the child (owed since a restart), or the child died as
                the request was sent (the receive restarts it).
        """
        in_flight = self._in_flight
        if in_flight is None or in_flight.pending or in_flight.failure is not None:
            return None
        return self._child.conn, in_flight.deadline

    def row_stepper(self, rows, on_step):
        """How an env thread steps `rows` (this environment among them) one by
        one (`OffersRowStepper`): a SubprocessRows (subprocess_rows.py, no
        worker threads) when every row is a SubprocessEnv, else None (the
        driver's row workers then)."""
        if not all(isinstance(r, SubprocessEnv) and not r.batched for r in rows):
            return None
        from alf_async.environments.rows.subprocess_rows import SubprocessRows  # pylint: disable=import-outside-toplevel
        return SubprocessRows(rows, on_step)

    def call(self, name: str, *args, **kwargs):
        """Calls ``env.<name>(*args, **kwargs)`` in the child and returns the result."""
        self._send(protocol.CALL, (name, args, kwargs))
        return self._receive()

    def render(self, mode: str = "rgb_array"):
        return self.call("render", mode)

    def seed(self, seed):
        return self.call("seed", seed)

    def get_info(self):
        return self.call("get_info")

    def __repr__(self):
        return (f"SubprocessEnv({self._constructor_repr}, env_index={self._env_index}, "
                f"pid={self.pid})")


def close_subprocess_envs(envs: Sequence[SubprocessEnv]):
    """Closes several SubprocessEnvs, waiting for their children together.

    A child whose env is blocked in a call (another thread waits on it) is
    killed at once, which wakes that call (it raises SubprocessEnvClosedError);
    the others are asked to close their environments first (at most the
    largest `close_timeout`). Returns when every child has exited; any thread.
    """
    graceful, timeout, closing = [], 0.0, []
    for env in envs:
        with env._state_lock:
            if env._closed:
                continue
            env._closed = True
            child = env._child
        closing.append(env)
        if child is None:
            continue
        if env._io_lock.acquire(blocking=False):
            graceful.append((env, child))
            timeout = max(timeout, env._close_timeout)
        else:
            child.shutdown(0)
    try:
        protocol.shutdown_children([child for _, child in graceful], timeout)
    finally:
        for env, _ in graceful:
            env._io_lock.release()
        for env in closing:
            if env._shared is not None:
                env._shared.release()
