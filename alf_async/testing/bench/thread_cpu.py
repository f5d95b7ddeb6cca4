"""CPU seconds of this process, thread by thread, grouped by what each
thread does (imports no TensorFlow).

    first = sample()
    ...                       # the work
    last = sample()
    split(first, last)        # {"env threads": 12.1, ..., "unaccounted": 0.02}

A thread is named by Python (`threading.Thread.name`) or is native.
TensorFlow runs the kernels of every graph call on its own thread pools:
the actors' inference, the learner's gradient steps and alf_async's env
threads' graph loops (with the Python environments they step) alike, as
EnvPool's games run on its C++ threads. So a Python thread's own CPU is
what it does outside graph calls. Python threads are grouped by
alf_async's thread names (`env0`, `env0_row1`, `actor0`, `log`); the main
thread is the learner's on alf_async's side and the whole loop's on the
synchronous side.

Linux only: a thread's CPU clock comes from its kernel thread id (the
per-thread CPU-time clock id glibc's `pthread_getcpuclockid` builds, which
Python exposes for its own threads only), nanosecond-exact.
"""

import os
import re
import resource
import threading
import time

GROUPS = (("env threads", re.compile(r"env\d+(_row\d+)?$")),
          ("actor threads", re.compile(r"actor\d+$")),
          ("log thread", re.compile(r"log$")),
          ("main thread", re.compile(r"MainThread$")))
NATIVE = "native (TF pools, C++ games)"
OTHER = "other Python threads"
UNACCOUNTED = "unaccounted (ended threads)"


def _thread_cpu_secs(tid):
    """CPU seconds of kernel thread `tid` of this process; None once it has ended."""
    # Linux's clock id for a thread's CPU time: (~tid << 3) | CPUCLOCK_SCHED (2)
    # | CPUCLOCK_PERTHREAD_MASK (4), as glibc's pthread_getcpuclockid makes it.
    try:
        return time.clock_gettime((~tid << 3) | 6)
    except OSError:
        return None


def sample():
    """This process's CPU seconds, context switches, and each live thread's
    CPU seconds and group, now."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    threads = {}
    for entry in os.listdir("/proc/self/task"):
        tid = int(entry)
        secs = _thread_cpu_secs(tid)
        if secs is not None:
            threads[tid] = (secs, group(names.get(tid)))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return dict(time=time.monotonic(), cpu_secs=usage.ru_utime + usage.ru_stime,
                context_switches=usage.ru_nvcsw + usage.ru_nivcsw, threads=threads)


def group(name):
    """The group of a thread named `name` (None: a native thread)."""
    if name is None:
        return NATIVE
    for label, pattern in GROUPS:
        if pattern.match(name):
            return label
    return OTHER


def split(first, last):
    """CPU seconds between two samples, by group. A thread that began in
    between counts from 0; one that ended in between is lost to the
    threads' sum, and the process's total keeps it: `UNACCOUNTED` is the
    difference, so the groups sum to the process's CPU seconds."""
    groups = {}
    for tid, (secs, label) in last["threads"].items():
        before = first["threads"].get(tid, (0.0, label))[0]
        groups[label] = groups.get(label, 0.0) + secs - before
    groups[UNACCOUNTED] = (last["cpu_secs"] - first["cpu_secs"]) - sum(groups.values())
    return groups
