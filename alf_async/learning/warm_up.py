"""WarmUp: graph builds the learner hands to one helper thread, to overlap them
with its own work at start-up (see `Learner`)."""

import concurrent.futures
import logging

logger = logging.getLogger(__name__)


class WarmUp(object):
    """Runs named jobs, in order, on one helper thread ("alf_async_warm_up").

    A job is one bounded call — a trace, or a graph call that waits on
    nothing — so `wait` and `close` block at most that long.

    Threads: the learner's thread calls every method; the helper thread,
    started by the first `submit`, runs the jobs. `close` ends it.
    """

    def __init__(self):
        self._executor = None
        self._jobs = {}

    def submit(self, name, fn, *args):
        """Queues `fn(*args)` on the helper thread as job `name`."""
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="alf_async_warm_up")
        self._jobs[name] = self._executor.submit(fn, *args)

    def wait(self, name):
        """Waits for job `name` (if submitted and not waited for yet); raises
        its error, with its type."""
        future = self._jobs.pop(name, None)
        if future is not None:
            future.result()

    def close(self, reraise=True):
        """Waits for every job and ends the thread; raises the first job's error
        unless `reraise` is False (an error is in flight already: it is logged)."""
        jobs, self._jobs = self._jobs, {}
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        for name, future in jobs.items():
            error = future.exception()
            if error is None:
                continue
            if reraise:
                raise error
            logger.error("warm-up job %r failed too", name, exc_info=error)
