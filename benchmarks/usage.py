"""Wall time, CPU time and context switches of this whole process and its
child processes, per env step.

`resource.getrusage(RUSAGE_SELF)` sums every thread of the process (Linux),
so the figures include the env, actor, log and TF threads. Environments in
child processes (SubprocessEnv, tf-agents' ParallelPyEnvironment) do their
work there, so the live descendants' CPU and context switches are added
(read from /proc at the start and the end; a child that starts or exits in
between counts only from or until then). `Usage.per_step` gives both the
sum and its two parts: this process's (the driver's, which bounds what one
process can feed) and its descendants'.
"""

import glob
import os
import resource
import time

_TICK = os.sysconf("SC_CLK_TCK")


def _descendants(pid="self"):
    """The pids of every live descendant of `pid` (Linux /proc)."""
    found = []
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(path) as f:
                children = f.read().split()
        except OSError:
            continue
        for child in children:
            found.append(child)
            found.extend(_descendants(child))
    return found


def _process_usage(pid):
    """{pid: (CPU seconds, context switches)} of process `pid`; {} if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/status") as f:
            cs = sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
    except OSError:
        return {}
    return {pid: ((int(fields[11]) + int(fields[12])) / _TICK, cs)}


def _children_usage():
    usage = {}
    for pid in _descendants():
        usage.update(_process_usage(pid))
    return usage


class Usage(object):
    """Starts counting on construction."""

    def __init__(self):
        self._children = _children_usage()
        self._start = self._read()

    @staticmethod
    def _read():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return time.perf_counter(), r.ru_utime + r.ru_stime, r.ru_nvcsw + r.ru_nivcsw

    def elapsed(self):
        return time.perf_counter() - self._start[0]

    def per_step(self, steps):
        """Per env step since construction.

        Returns:
            dict(rate=steps/s, cpu_us=CPU us per step and cs=context switches
            per step of this process and its live descendants together,
            parent_cpu_us and parent_cs: this process's part, children_cpu_us
            and children_cs: its descendants' part, cpu_pct=CPU % of one
            core, all of them together).
        """
        now = self._read()
        wall, parent_cpu, parent_cs = (b - a for a, b in zip(self._start, now))
        children_cpu, children_cs = 0.0, 0
        for pid, (child_cpu, child_cs) in _children_usage().items():
            before_cpu, before_cs = self._children.get(pid, (0.0, 0))
            children_cpu += child_cpu - before_cpu
            children_cs += child_cs - before_cs
        cpu, cs = parent_cpu + children_cpu, parent_cs + children_cs
        steps = max(steps, 1)
        return dict(rate=steps / wall, cpu_us=cpu / steps * 1e6, cs=cs / steps,
                    cpu_pct=100 * cpu / wall,
                    parent_cpu_us=parent_cpu / steps * 1e6,
                    children_cpu_us=children_cpu / steps * 1e6,
                    parent_cs=parent_cs / steps, children_cs=children_cs / steps)


def measure_driver(driver, seconds, warm_up_batches=3, probe=None):
    """Starts `driver`, times `run_async()` for `seconds`, stops it.

    Args:
        probe: None, or callable(driver) -> dict of cumulative counters,
            read as the timed part starts and as it ends.

    Returns:
        `Usage.per_step` of the timed part, plus `batch`: the mean actor
        batch in rows, and with `probe`, `probe`: the counters' growth
        over the timed part, per env step.
    """
    driver.start()
    try:
        for _ in range(warm_up_batches):
            driver.run_async()
        before = probe(driver) if probe else None
        steps, usage = 0, Usage()
        while usage.elapsed() < seconds:
            steps += driver.run_async()
        result = usage.per_step(steps)
        if probe:
            result["probe"] = {k: (v - before[k]) / max(1, steps)
                               for k, v in probe(driver).items()}
        stats = driver.get_perf_stats()
    finally:
        driver.stop()
    result["batch"] = stats["actor_rows"] / max(1, stats["actor_batches"])
    return result


def measure_dynamic_step_driver(tf_env, policy, steps_per_run, seconds):
    """Times tf-agents' DynamicStepDriver (as a tf.function) on `tf_env` for `seconds`."""
    from tf_agents.drivers import dynamic_step_driver  # pylint: disable=import-outside-toplevel
    from tf_agents.utils import common  # pylint: disable=import-outside-toplevel

    driver = dynamic_step_driver.DynamicStepDriver(tf_env, policy, num_steps=steps_per_run)
    run = common.function(driver.run)
    time_step, policy_state = run()  # trace + warm up
    steps, usage = 0, Usage()
    while usage.elapsed() < seconds:
        time_step, policy_state = run(time_step, policy_state)
        steps += steps_per_run
    return usage.per_step(steps)


def measure_env_only(py_env, seconds, seed=0):
    """Steps the batched PyEnvironment `py_env` in a plain Python loop with
    uniformly random actions (drawn beforehand) and no TF: the rate of the
    environment alone, a ceiling for any collector whose env steps hold the GIL.
    """
    import numpy as np  # pylint: disable=import-outside-toplevel
    spec = py_env.action_spec()
    rng = np.random.default_rng(seed)
    actions = [rng.integers(spec.minimum, spec.maximum + 1, size=py_env.batch_size,
                            dtype=spec.dtype) for _ in range(256)]
    py_env.reset()
    steps, usage, i = 0, Usage(), 0
    while usage.elapsed() < seconds:
        for _ in range(16):
            py_env.step(actions[i % 256])
            i += 1
        steps += 16 * py_env.batch_size
    return usage.per_step(steps)


def parse_layout(text):
    """A collection benchmark's --layouts entry: '2x8' -> (2 env threads, 8
    environments each, 1 actor queue); '2x8:0' -> (2, 8, 0: the env threads
    act themselves, num_actor_queues=0)."""
    shape, _, queues = text.partition(":")
    threads, per_thread = (int(x) for x in shape.split("x"))
    return threads, per_thread, int(queues or 1)
