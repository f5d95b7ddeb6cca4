"""Crash recovery of environments whose worker can die: the restart budget, the
truncation of the episode in flight and the FIRST step owed after it.

SubprocessEnv (a child process) and RayBatchedEnv (Ray actors) recover the
same way, through one `CrashRecovery` each:

1. the worker died (or hung) during a call: the environment asks
   `charge(reason)` for a restart, which raises once `max_restarts` restarts
   happened within `restart_window_secs` (and every later `check()` raises
   the same failure);
2. it recreates the worker and resets it, getting a FIRST time step;
3. `recover(first, last, ...)` says what the interrupted call returns: the
   FIRST itself after a reset, or when no episode was in flight; otherwise a
   truncation of the episode in flight (LAST, discount 1, reward 0, the last
   observation the caller saw), and the FIRST is owed: the next step returns
   it (`owes()` / `take()`), ignoring its action as after any LAST.

A worker that serves several rows (a Ray actor of n environments) is
handled as a whole: `key` names the worker, `last` holds its rows.

Threads: a CrashRecovery is used by its environment's owner thread only;
`restarts` may be read by any thread.
"""

import collections
import logging
import time

import numpy as np
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

logger = logging.getLogger(__name__)

LAST = ts.StepType.LAST


def truncation(last):
    """The end of the episode in flight after `last`: step type LAST,
    reward 0, discount 1, `last`'s observation (batched or not)."""
    return ts.TimeStep(
        step_type=np.full_like(np.asarray(last.step_type), LAST),
        reward=tf.nest.map_structure(lambda r: np.zeros_like(np.asarray(r)), last.reward),
        discount=np.ones_like(np.asarray(last.discount)),
        observation=last.observation)


class CrashRecovery(object):
    """Restart budget, truncation and owed FIRST steps of one environment.

    Args:
        name: how messages name the environment.
        worker: how messages name what dies ("the environment process").
        max_restarts: restarts allowed within any `restart_window_secs`
            (0: the first crash fails).
        restart_window_secs: the sliding window of `max_restarts`.
        error_type: the exception type raised when the budget is spent.
        clock: a zero-arg callable returning seconds.
    """

    def __init__(self, name, worker, max_restarts, restart_window_secs, error_type,
                 clock=time.monotonic):
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts!r}")
        if not restart_window_secs or restart_window_secs <= 0:
            raise ValueError(f"restart_window_secs must be a positive number of seconds, "
                             f"got {restart_window_secs!r}")
        self._name = name
        self._worker = worker
        self._max_restarts = int(max_restarts)
        self._window = float(restart_window_secs)
        self._error_type = error_type
        self._clock = clock
        self._times = collections.deque()
        self._restarts = 0
        self._failure = None
        self._owed = {}  # key -> deque of time steps owed to the next calls

    @property
    def restarts(self):
        """Restarts charged so far."""
        return self._restarts

    @property
    def failure(self):
        """The error that spent the budget, or None."""
        return self._failure

    def check(self):
        """Raises `error_type` if the budget was spent earlier."""
        if self._failure is not None:
            raise self._error_type(f"{self._name} has failed: {self._failure}")

    def charge(self, reason):
        """Charges one restart for a worker that died (`reason`).

        Raises:
            error_type: `max_restarts` restarts happened within the window
                already; the environment stays failed (see `check`).
        """
        self.check()
        now = self._clock()
        while self._times and now - self._times[0] > self._window:
            self._times.popleft()
        if len(self._times) >= self._max_restarts:
            self._failure = self._error_type(
                f"{self._name}: {self._worker} died ({reason}) and was already restarted "
                f"{len(self._times)} times in the last {self._window:g} s "
                f"(max_restarts={self._max_restarts}); giving up")
            raise self._failure
        self._times.append(now)
        self._restarts += 1
        logger.warning("%s: %s died (%s); restarting it (restart %d)", self._name,
                       self._worker, reason, self._restarts)

    def recover(self, first, last, reset=False, key=0, answer=True):
        """What the call interrupted by a crash returns, once the new worker's
        FIRST time step is `first`.

        Args:
            first: the recreated worker's FIRST time step.
            last: the time step the caller saw last from this worker (None
                before any).
            reset: the interrupted call was a reset (it wants the FIRST).
            key: the worker (for environments with several).
            answer: False when the interrupted call returns no time step
                (it raises instead): everything is owed to the next calls.

        Returns:
            The time step to return now (None if `answer` is False).
        """
        steps = [first]
        in_flight = last is not None and not np.all(np.asarray(last.step_type) == LAST)
        if not reset and in_flight:
            steps.insert(0, truncation(last))
        owed = collections.deque(steps)
        self._owed[key] = owed
        result = owed.popleft() if answer else None
        if not owed:
            del self._owed[key]
        return result

    def owes(self, key=0):
        """True if the next call of worker `key` is answered by `take` (without the worker)."""
        return key in self._owed

    def take(self, key=0, reset=False):
        """The next time step owed for worker `key`; a reset skips to the FIRST."""
        owed = self._owed[key]
        if reset:
            while len(owed) > 1:
                owed.popleft()
        step = owed.popleft()
        if not owed:
            del self._owed[key]
        return step

    def forget(self, key=None):
        """Drops what is owed (for worker `key`, or all): e.g. on a reset of every worker."""
        if key is None:
            self._owed.clear()
        else:
            self._owed.pop(key, None)
