"""What benchmarks/driver_cost.py counts of the driver: the eager queue ops
and own-action calls its Python loops make, and its entries into Python
(row-worker steps, stepper receives, numpy_function callbacks), through
wrappers patched in before it starts.
"""

import collections
import threading

from alf_async.testing.bench.graph_ops import graph_ops


class Counter(object):
    """Thread-safe counts of the calls the patches below see."""

    def __init__(self):
        self._lock = threading.Lock()
        self.counts = collections.Counter()

    def add(self, what, n=1):
        with self._lock:
            self.counts[what] += n

    def wrap(self, what, fn, ops=1):
        def counted(*args, **kwargs):
            self.add(what)
            if what.startswith("eager"):
                self.add("eager_ops", ops)
            return fn(*args, **kwargs)
        return counted


def patch_eager_queue_ops(counter):
    """Counts, process-wide, the eager queue ops the Python loops call;
    returns an undo."""
    import tensorflow as tf   # pylint: disable=import-outside-toplevel
    saved = []
    for name in ("QueueEnqueueV2", "QueueDequeueV2", "QueueEnqueueManyV2"):
        saved.append((tf.raw_ops, name, getattr(tf.raw_ops, name)))
        setattr(tf.raw_ops, name, counter.wrap("eager_" + name, getattr(tf.raw_ops, name)))

    def undo():
        for owner, name, value in saved:
            setattr(owner, name, value)
    return undo


def count_env_steps(tf_env, counter):
    """Counts the Python steps of `tf_env`: its rows' where the driver steps
    them one by one (a worker thread's or a stepper's), else the batch's
    (a numpy_function's callback)."""
    from alf_async.driver import env_rows   # pylint: disable=import-outside-toplevel
    rows = env_rows.row_envs(tf_env)
    if isinstance(rows, list):
        for env in rows:
            env.step = counter.wrap("row_step", env.step)
    elif rows is not None:    # a RowStepping batch (EnvPool): its receives
        make = rows.make_row_stepper

        def counted_stepper(on_rows):
            stepper = make(on_rows)
            stepper.recv = counter.wrap("stepper_recv", stepper.recv)
            return stepper
        rows.make_row_stepper = counted_stepper
    elif getattr(tf_env, "pyenv", None) is not None:
        tf_env.pyenv.step = counter.wrap("numpy_function", tf_env.pyenv.step)


def count_driver_parts(driver, counter):
    """Counts the own-action calls (and their graph's ops) and the Python
    steps of `driver`'s env threads (before it starts)."""
    for t in driver._env_threads:   # pylint: disable=protected-access
        own = t._own_action   # pylint: disable=protected-access
        if own is not None:
            ops = sum(graph_ops(own).values())
            t._own_action = counter.wrap("eager_own_action", own, ops=ops)  # pylint: disable=protected-access
        count_env_steps(t._env, counter)   # pylint: disable=protected-access


def python_entries(counts):
    """The counted entries into Python (see driver_cost.py's docstring)."""
    return sum(n for what, n in counts.items() if what != "eager_ops")
