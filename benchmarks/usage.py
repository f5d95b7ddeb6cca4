"""Wall time, CPU time and context switches of this whole process, per env step.

`resource.getrusage(RUSAGE_SELF)` sums every thread of the process (Linux),
so the figures include the env, actor, log and TF threads.
"""

import resource
import time


class Usage(object):
    """Starts counting on construction."""

    def __init__(self):
        self._start = self._read()

    @staticmethod
    def _read():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return time.perf_counter(), r.ru_utime + r.ru_stime, r.ru_nvcsw + r.ru_nivcsw

    def elapsed(self):
        return time.perf_counter() - self._start[0]

    def per_step(self, steps):
        """dict(rate=steps/s, cpu_us=CPU us per step, cs=context switches per step,
        cpu_pct=CPU % of one core) since construction."""
        now = self._read()
        wall, cpu, cs = (b - a for a, b in zip(self._start, now))
        steps = max(steps, 1)
        return dict(rate=steps / wall, cpu_us=cpu / steps * 1e6, cs=cs / steps,
                    cpu_pct=100 * cpu / wall)
