"""SubprocessRows: the rows of a batch of SubprocessEnvs stepped with no worker threads.

An env thread steps the rows of a batch of blocking environments one by one,
whichever are ready first (env_rows.py). For SubprocessEnvs the waiting
happens in the child processes, so the env thread needs no worker thread per
row to wait for them: `send` writes the row's action to its child's pipe and
returns at once (`SubprocessEnv.step_async`), and `recv` waits on every
pipe with a request in flight at once (one `epoll` set) and receives the
replies that came, as EnvPool's asynchronous mode returns whichever
environments are ready. Each step so costs the env thread two pipe
operations and no thread hand-off; RowWorkers would add a worker's wake-up
and two GIL hand-offs per step.

Everything SubprocessEnv does on its own still holds, because each reply is
taken by the environment's own receive (`step_async`'s callable): crash
recovery (a child that dies is restarted and the row's episode ends as a
truncation), errors raised with their type, `step_timeout` (a row whose
deadline passes is received, which kills and restarts its hung child).
Those rare cases block the env thread while they run (a restart waits for
the new child to build its environment); the common path never does.

Threads: every method is called by the owning env thread only; `recv`
blocks at most `timeout` seconds in `epoll.poll`. The driver's stop closes
the environments from its own thread (their children are killed, their
pipes closed): a row whose environment was closed is received once `recv`'s
wait ends, and reports the SubprocessEnvClosedError that raises.
"""

import functools
import select
import time

from alf_async.environments.capabilities import RowFailed, row_action
from alf_async.roles import RowStepper

CHECK_SECS = 0.1  # how often recv looks for hung or closed rows while others answer


class SubprocessRows(RowStepper):
    """A RowStepper over SubprocessEnvs, with no threads."""

    def __init__(self, envs, on_step):
        """
        Args:
            envs: unbatched SubprocessEnvs, one per row.
            on_step: callable(row, time_step, applied), called in `recv` for
                each row whose reset or step came (`applied` is always None:
                a SubprocessEnv applies the action it is given).
        """
        self._envs = list(envs)
        self._on_step = on_step
        self._receive = [None] * len(self._envs)   # row -> its reply's receive, or None
        self._deadline = [None] * len(self._envs)  # row -> when its child counts as hung
        self._fd_row = {}    # fd of a pipe with a reply awaited -> row
        self._row_fd = [None] * len(self._envs)    # row -> that fd, or None
        # Pipes stay in the epoll set between steps (no register/unregister
        # per step): row -> the connection registered for it.
        self._registered = [None] * len(self._envs)
        self._now = []       # rows whose reply needs no wait (or whose send failed)
        self._failed = {}    # row -> the error its send raised
        self._poll = select.epoll()
        self._check_at = 0.0  # when recv next looks for hung or closed rows

    def start(self):
        """Sends every row a reset; each reports once its first time step came."""
        for row, env in enumerate(self._envs):
            self._issue(row, env.reset_async)

    def send(self, rows, actions):
        """Sends each row of `rows` its action (`actions` batched over
        `rows`); their time steps come from a later `recv`."""
        for j, row in enumerate(rows):
            self._issue(row, functools.partial(self._envs[row].step_async,
                                               row_action(actions, j)))

    def recv(self, timeout):
        """Waits up to `timeout` seconds for a reply; returns every row whose
        reply came (or whose child is past its deadline, or closed).

        Returns:
            A list of (row, None or RowFailed), possibly empty (timed out).
        """
        rows, self._now = self._now, []
        if not rows and self._fd_row:
            events = self._poll.poll(timeout)
            rows = []
            for fd, _ in events:
                row = self._fd_row.get(fd)
                if row is not None:
                    rows.append(row)
                else:   # a pipe with no reply awaited (its child died): stop watching it
                    self._drop_fd(fd)
        elif not rows:
            time.sleep(timeout)  # nothing in flight: as a queue with nothing to come
        now = time.monotonic()
        if not rows or now >= self._check_at:
            # Rows that no pipe event will ever report: a hung child past its
            # deadline (other rows' replies may keep the poll busy, hence a
            # check at least every CHECK_SECS), or a child whose pipe the
            # driver's stop closed.
            self._check_at = now + CHECK_SECS
            rows += [r for r in self._fd_row.values() if r not in rows and (
                now >= self._deadline[r] or self._envs[r].closed)]
        return [(row, self._take(row)) for row in rows]

    def close(self, wait=True):
        """Forgets the requests in flight: their children are ended when the
        driver closes the environments (a closed SubprocessEnv with a request
        in flight kills its child at once)."""
        del wait
        for fd in list(self._fd_row):
            self._unwatch(fd)
        self._receive = [None] * len(self._envs)
        self._now = []
        self._poll.close()

    # ------------------------------------------------------------ internals

    def _issue(self, row, request):
        try:
            self._receive[row] = request()
        except BaseException as e:  # pylint: disable=broad-except
            self._failed[row] = e
            self._now.append(row)
            return
        waitable = self._envs[row].reply_waitable()
        if waitable is None:
            self._now.append(row)
            return
        conn, self._deadline[row] = waitable
        fd = conn.fileno()
        if self._registered[row] is not conn:   # first step, or a restarted child
            self._drop_fd(fd)   # the fd number of a closed pipe may be reused
            self._poll.register(fd, select.EPOLLIN)
            self._registered[row] = conn
        self._fd_row[fd] = row
        self._row_fd[row] = fd

    def _unwatch(self, fd):
        """The reply on `fd` is taken: it stays registered for the next step."""
        self._row_fd[self._fd_row.pop(fd)] = None

    def _drop_fd(self, fd):
        for row, conn in enumerate(self._registered):
            if conn is None:
                continue
            if conn.closed or conn.fileno() == fd:
                self._registered[row] = None
        try:
            self._poll.unregister(fd)
        except (OSError, ValueError):  # not registered, or closed under us
            pass

    def _take(self, row):
        """Receives `row`'s reply and records it; None, or RowFailed."""
        if self._row_fd[row] is not None:
            self._unwatch(self._row_fd[row])
        if row in self._failed:
            return RowFailed(self._failed.pop(row))
        receive, self._receive[row] = self._receive[row], None
        try:
            self._on_step(row, receive(), None)
        except BaseException as e:  # pylint: disable=broad-except
            return RowFailed(e)
        return None
