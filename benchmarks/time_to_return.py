"""Seconds to a gin file's `Evaluation.stop_at_return`, one side against another:
the same `alf-async-train` command with different gin bindings (e.g. child
processes over shared memory against pickled pipes).

Each run is its own `alf-async-train` process on a fresh root_dir, sides
alternating per seed. The figure is the training clock of the evaluation that
reached the return (its "eval at train step ... (S s, ...)" line), which
starts when the loop starts, so start-up (imports, children, tracing) is
not in it; a run that never reaches it within `Schedule.num_env_steps`
counts as not solved.

    python benchmarks/time_to_return.py --gin_file gin_configs/sac_pendulum_subprocess.gin \\
        --side "shared memory=" --side "pipe=make_subprocess_env_constructor.transport = 'pipe'" \\
        --seeds 1 2 [--cap 900]
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import host_info  # benchmarks/ is this script's directory

_EVAL = re.compile(r"\[alf_async\] eval at train step (\d+) \(([\d.]+) s, (\d+) env steps\): "
                   r".*? AverageReturn (-?[\d.]+)")
_STOPPED = re.compile(r"\[alf_async\] stopped \((\w+)\)")


def run(gin_file, bindings, seed, cap, work_dir):
    """One run: (seconds to the solving evaluation or None, env steps, last return)."""
    root = tempfile.mkdtemp(dir=work_dir)
    cmd = [sys.executable, "-m", "alf_async.bin.train", "--root_dir", root,
           "--gin_file", gin_file, "--gin_param", f"Runtime.seed = {seed}"]
    for binding in bindings:
        cmd += ["--gin_param", binding]
    err = ""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=cap)
        out, err = done.stdout, done.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    evals = [(float(s), int(env), float(r)) for _, s, env, r in _EVAL.findall(out)]
    stopped = _STOPPED.search(out)
    if not evals:   # say why
        sys.stderr.write("".join((out + err).splitlines(keepends=True)[-5:]))
        return None, 0, None
    secs, env_steps, last = evals[-1]
    solved = stopped is not None and stopped.group(1) == "stop_at_eval_return"
    return (secs if solved else None), env_steps, last


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gin_file", required=True)
    parser.add_argument("--side", action="append", required=True,
                        help="NAME=BINDING[;BINDING...] (an empty binding: the gin file as is)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--cap", type=float, default=900.0, help="seconds per run")
    parser.add_argument("--work_dir", default=None)
    args = parser.parse_args()
    machine = host_info.host()   # before the runs: its calibration on a quiet machine
    sides = []
    for text in args.side:
        name, _, bindings = text.partition("=")
        sides.append((name, [b for b in bindings.split(";") if b.strip()]))
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="alf_async_time_to_return_")
    os.makedirs(work_dir, exist_ok=True)
    results = {name: [] for name, _ in sides}
    for seed in args.seeds:
        for name, bindings in sides:
            began = time.monotonic()
            secs, env_steps, last = run(args.gin_file, bindings, seed, args.cap, work_dir)
            results[name].append(secs)
            print(f"  seed {seed:3d} {name:<16}: "
                  + (f"{secs:7.1f} s" if secs is not None else "not solved")
                  + f"  ({env_steps} env steps, last AverageReturn {last}; "
                  f"{time.monotonic() - began:.0f} s with start-up)", flush=True)
    print(f"\n{args.gin_file}: seconds to Evaluation.stop_at_return, seeds {args.seeds}; "
          f"{host_info.describe(machine)}")
    for name, secs in results.items():
        solved = [s for s in secs if s is not None]
        median = f"{statistics.median(solved):.1f} s" if solved else "-"
        print(f"{name:<16}: median {median} over {len(solved)} solved of {len(secs)} runs")


if __name__ == "__main__":
    main()
