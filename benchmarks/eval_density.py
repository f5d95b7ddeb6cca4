"""What denser evaluations cost the main job: time to solve against eval-curve points.

For each seed, the main job (default gin_configs/dqn_cartpole.gin, alf_async's
trainer) runs once per evaluation interval in --intervals, in turns (the
first interval first on odd seeds, last on even ones), each run its own
process, one at a time. A run stops at its first evaluation with
AverageReturn >= 195. Per run it prints the seconds to solve (from the loop's
start, evaluations included), the train steps, the evaluations made (the
points of the eval curve in TensorBoard) and the seconds spent in them;
then, per interval: the median time to solve and its quartiles, the ratio
of medians against the first interval, the eval curve's points (median,
min, runs with >= 20) and the share of the run spent evaluating.

    python benchmarks/eval_density.py --seeds $(seq 1 30) --intervals 64 24 [--cap 120]

docs/results/learning.md has what it measured.
"""

import argparse
import json
import os
import shutil
import statistics
import sys

from child_runs import json_result, time_evaluations  # benchmarks/ is this script's directory
from time_to_solve import DEFAULT_GIN, _parse_gin, run_async


def one_run(args):
    """One capped trainer.train() run in this process (time_to_solve's);
    prints its JSON line."""
    eval_secs = time_evaluations()
    _parse_gin(args.gin_file, args.gin_param + [f"Evaluation.interval = {args.interval}"])
    result = run_async(args.seed, args.cap, args.root_dir)
    print(json.dumps({"secs": result.solved_secs, "train_steps": int(result.global_step),
                      "points": len(result.evaluations), "eval_secs": sum(eval_secs)}),
          flush=True)


def spawn(seed, interval, args, root_dir):
    cmd = [sys.executable, os.path.abspath(__file__), "--one", "--seed", str(seed),
           "--interval", str(interval), "--cap", str(args.cap), "--gin_file", args.gin_file,
           "--root_dir", root_dir] + sum((["--gin_param", p] for p in args.gin_param), [])
    return json_result(cmd, args.cap + 180, f"run for seed {seed}, interval {interval}")


def summarize(runs, intervals, cap):
    """Prints one line per interval (see the module docstring)."""
    medians = {}
    for interval in intervals:
        rows = runs[interval]
        secs = [cap if r["secs"] is None else r["secs"] for r in rows]
        medians[interval] = statistics.median(secs)
        quartiles = statistics.quantiles(secs) if len(secs) > 1 else [secs[0]] * 3
        points = sorted(r["points"] for r in rows)
        share = statistics.median(r["eval_secs"] / r["secs"] for r in rows if r["secs"])
        print(f"every {interval:4d}: {len(rows)} runs ({sum(r['secs'] is None for r in rows)} "
              f"not solved within {cap:.0f} s); to solve median {medians[interval]:.2f} s "
              f"(quartiles {quartiles[0]:.2f}-{quartiles[2]:.2f}), "
              f"{medians[interval] / medians[intervals[0]]:.2f}x every {intervals[0]}; "
              f"train steps median {statistics.median(r['train_steps'] for r in rows):.0f}; "
              f"eval points median {statistics.median(points):.0f}, min {points[0]}, "
              f">= 20 in {sum(p >= 20 for p in points)}; evaluating "
              f"{statistics.median(r['eval_secs'] for r in rows):.3f} s "
              f"({share:.1%} of the run)", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(1, 11)))
    parser.add_argument("--intervals", type=int, nargs="+", default=[64, 24],
                        help="Evaluation.interval values to compare, the first the reference")
    parser.add_argument("--cap", type=float, default=120.0, help="seconds per run")
    parser.add_argument("--gin_file", default=DEFAULT_GIN)
    parser.add_argument("--gin_param", action="append", default=[])
    parser.add_argument("--work_dir", default="/tmp/alf_async_eval_density")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--interval", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--root_dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return one_run(args)
    print(f"{args.gin_file}: seeds {args.seeds}, evaluations every {args.intervals} train "
          f"steps, cap {args.cap:.0f} s per run", flush=True)
    runs = {interval: [] for interval in args.intervals}
    for seed in args.seeds:
        order = args.intervals if seed % 2 else list(reversed(args.intervals))
        for interval in order:
            root_dir = os.path.join(args.work_dir, f"every{interval}_{seed}")
            shutil.rmtree(root_dir, ignore_errors=True)
            result = spawn(seed, interval, args, root_dir)
            shutil.rmtree(root_dir, ignore_errors=True)
            runs[interval].append(result)
            shown = "not solved" if result["secs"] is None else f"{result['secs']:.2f} s"
            print(f"  seed {seed:3d} every {interval:4d}: {shown:>10s}, "
                  f"{result['train_steps']} train steps, {result['points']} eval points, "
                  f"{result['eval_secs']:.3f} s evaluating", flush=True)
    summarize(runs, args.intervals, args.cap)


if __name__ == "__main__":
    main()
