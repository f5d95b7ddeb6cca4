"""The host a benchmark ran on: hosts of one machine kind differ several-fold,
so every figure is recorded with this, with the kernels TensorFlow runs
there (imports no TensorFlow). benchmarks/host_info.py's `host()` is
`record(alf_async.kernels.in_effect())`."""

import importlib.metadata
import os
import platform
import time

# CPU features that change TensorFlow's kernels (oneDNN picks AVX-512, its
# bf16 and VNNI forms and AMX where the CPU has them).
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16",
                "amx_tile", "amx_bf16", "amx_int8")
# Environment variables that change numerics or thread pools.
ENV_PREFIXES = ("TF_ENABLE_ONEDNN_OPTS", "TF_NUM_", "OMP_", "OPENBLAS_", "MKL_", "KMP_",
                "ONEDNN_", "ALF_ASYNC_HOST_KIND", "ALF_ASYNC_KERNEL_CHOICE")


def record(kernels_in_effect):
    """The CPU model, its vector extensions, cores, TensorFlow's version, the
    environment variables that change numerics or threads, the kernels in
    effect (`kernels_in_effect`, what `alf_async.kernels.in_effect()`
    returns: the host kind, an emulated one, oneDNN, what 'auto' torsos
    compute in), and the seconds of a fixed Python loop and of a fixed numpy
    matmul (the calibration).

    Call it before TensorFlow and the environments load: the calibration
    then runs on a quiet process.
    """
    import numpy as np
    model, flags = platform.processor() or "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
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
    return dict(cpu=model, cores=os.cpu_count(),
                cpu_flags=[f for f in VECTOR_FLAGS if f in flags],
                tensorflow=_version("tensorflow-cpu") or _version("tensorflow"),
                env={k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
                kernels=kernels_in_effect,
                python_loop_secs=round(python_secs, 3), numpy_matmul_secs=round(numpy_secs, 3))


def _version(distribution):
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def kind(machine):
    """The CPU model and AMX or AVX-512 if it has them: what two runs must
    share to be compared (records made before the flags were kept have none)."""
    flags = machine.get("cpu_flags", [])
    extension = ("AMX" if "amx_tile" in flags else "AVX-512" if "avx512f" in flags else
                 "flags not recorded" if "cpu_flags" not in machine else "no AVX-512")
    return f"{machine['cpu']} ({extension})"


def describe(machine):
    """One short line for a table: the host's `kind`, the kernels (if
    recorded) and its calibration."""
    chosen = machine.get("kernels")
    kernel_text = "" if chosen is None else (
        (f", emulating {chosen['emulated_kind']}" if chosen["emulated_kind"] else "")
        + f", oneDNN {'on' if chosen['onednn'] else 'off'}"
        + (", kernel choice off" if chosen["choice"] == "off" else ""))
    return (f"{kind(machine)}{kernel_text}, calibration {machine['python_loop_secs']} s / "
            f"{machine['numpy_matmul_secs']} s")
