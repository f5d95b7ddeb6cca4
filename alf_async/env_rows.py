"""Rows of a batched environment stepped one by one, whichever are ready first.

When the environments of a batch block on something outside the process (a
child process, a remote simulator, a sleep), stepping the batch in lockstep
makes every row wait for the slowest one. EnvPool's asynchronous mode
instead sends each environment its action as soon as it has one and returns
whichever environments are ready. `RowWorkers` does that for a list of
unbatched PyEnvironments: one Python worker thread per row, each stepping its
own environment (a blocking step releases the GIL while it waits), and one
shared ready queue that the env thread drains.

`row_envs(tf_env)` says which environments are stepped this way: a
TFPyEnvironment whose Python environment has `envs` (tf-agents'
BatchedPyEnvironment, our BatchedSubprocessEnv), every one of them unbatched
and whose step blocks (`capabilities.steps_block`), none of them an
`AppliedStep` (those are stepped as one batch by the env thread's Python
loop, which reads what each step applied).

Threads: `start()`, `send()`, `recv()` and `close()` are called by the
owning env thread only. Each worker thread blocks on its inbox
(`queue.SimpleQueue.get`) and in its environment's step; `recv` blocks at
most `timeout` seconds. `close()` tells the workers to exit and joins them:
a worker inside a step exits when the step returns (the driver closes
blocking environments on stop, which ends such a step).
"""

import queue
import threading

from tf_agents.environments import py_environment

from alf_async.environments import capabilities

_RESET = object()
_STOP = object()


class RowFailed(object):
    """What a worker reports instead of a time step when its environment raised."""

    def __init__(self, error):
        self.error = error


def row_envs(tf_env):
    """The unbatched environments of `tf_env`'s rows if they are to be stepped
    one by one (see the module docstring), else None."""
    pyenv = capabilities.python_env(tf_env)
    envs = getattr(pyenv, "envs", None) if pyenv is not None else None
    if not envs or getattr(tf_env, "_pool", None) is not None:
        return None
    if all(isinstance(e, py_environment.PyEnvironment) and not e.batched and
           capabilities.steps_block(e) and not isinstance(e, capabilities.AppliedStep)
           for e in envs):
        return list(envs)
    return None


class RowWorkers(object):
    """One worker thread per environment row; results come back on one queue."""

    def __init__(self, name, envs, on_step):
        """
        Args:
            name: prefix of the worker threads' names.
            envs: unbatched PyEnvironments, one per row.
            on_step: callable(row, time_step), called by the row's worker
                after each reset and step, before the row is reported ready.
        """
        self._envs = list(envs)
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

    def send(self, row, action):
        """Has row `row` step with `action` (a nest for one unbatched environment)."""
        self._inboxes[row].put(action)

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

    def close(self):
        """Tells every worker to exit once it is idle and waits until they have.

        A worker inside a step exits when the step returns; one that never
        returns keeps the caller here, as a step of its own would.
        """
        for inbox in self._inboxes:
            inbox.put(_STOP)
        for t in self._threads:
            if t.is_alive():
                t.join()

    def _work(self, row):
        env, inbox, ready, on_step = (self._envs[row], self._inboxes[row], self._ready,
                                      self._on_step)
        while True:
            action = inbox.get()
            if action is _STOP:
                return
            try:
                on_step(row, env.reset() if action is _RESET else env.step(action))
            except BaseException as e:  # pylint: disable=broad-except
                ready.put((row, RowFailed(e)))
                return
            ready.put((row, None))
