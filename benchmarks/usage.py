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


def measure_driver(driver, seconds, warm_up_batches=3):
    """Starts `driver`, times `run_async()` for `seconds`, stops it.

    Returns:
        `Usage.per_step` of the timed part, plus `batch`: the mean actor
        batch in rows.
    """
    driver.start()
    try:
        for _ in range(warm_up_batches):
            driver.run_async()
        steps, usage = 0, Usage()
        while usage.elapsed() < seconds:
            steps += driver.run_async()
        result = usage.per_step(steps)
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
