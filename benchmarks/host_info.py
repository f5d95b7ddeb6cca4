"""The host a benchmark ran on: hosts of one machine kind differ several-fold,
so every figure is recorded with this (imports no TensorFlow)."""

import os
import platform
import time


def host():
    """The CPU model, cores, and the seconds of a fixed Python loop and of a
    fixed numpy matmul (hosts of one machine kind differ several-fold)."""
    import numpy as np
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    start = time.perf_counter()
    total = 0
    for i in range(2_000_000):
        total += i & 7
    python_secs = time.perf_counter() - start
    a = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
    start = time.perf_counter()
    for _ in range(50):
        a @ a
    numpy_secs = time.perf_counter() - start
    return dict(cpu=model, cores=os.cpu_count(), python_loop_secs=round(python_secs, 3),
                numpy_matmul_secs=round(numpy_secs, 3))
