"""The host a benchmark ran on (`host()`, recorded with every figure), and
the kernels a benchmark runs (`add_kernel_flags`, `choose_kernels`). The
record and its one-line forms are alf_async.testing.bench.host's."""

import os
import sys

from alf_async import kernels
from alf_async.testing.bench.host import VECTOR_FLAGS, describe, kind, record  # noqa: F401


def host():
    """This host's record (`alf_async.testing.bench.host.record`) with the
    kernels in effect. Call it before TensorFlow and the environments load:
    the calibration then runs on a quiet process."""
    return record(kernels.in_effect())


def add_kernel_flags(parser):
    """A benchmark's --host_kind and --kernel_choice (`choose_kernels`)."""
    parser.add_argument("--host_kind", choices=kernels.HOST_KINDS,
                        help="emulate this host kind (this CPU's or one below it): only its "
                             "CPU flags are seen, oneDNN is capped at its instruction set, "
                             "'auto' torsos are float32 below avx512_bf16 (default: this "
                             "CPU's own kind)")
    parser.add_argument("--kernel_choice", choices=kernels.KERNEL_CHOICES, default="auto",
                        help="'off': TensorFlow's defaults on the (emulated) host and float32 "
                             "'auto' torsos, as before alf_async chose kernels")


def choose_kernels(args, gin_files, gin_bindings=()):
    """Before TensorFlow is imported: chooses the kernels for the gin files
    under `args.host_kind` and `args.kernel_choice` (`add_kernel_flags`) as
    alf-async-train does, in this process's environment (child processes
    inherit it), and prints the choice's line to stderr. Returns the gin
    bindings with `Runtime.kernel_choice` when it is 'off'. Exits 2 with one
    line for a host kind this CPU cannot emulate."""
    bindings = list(gin_bindings)
    if args.kernel_choice != "auto":
        bindings.append(f"Runtime.kernel_choice = '{args.kernel_choice}'")
    if args.host_kind:
        os.environ[kernels.HOST_KIND_VAR] = args.host_kind
    try:
        choice = kernels.choose_for_gin(gin_files, bindings)
    except kernels.ConfigError as e:
        print(f"{os.path.basename(sys.argv[0])}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    kernels.apply(choice)
    print(choice.line(), file=sys.stderr, flush=True)
    return bindings
