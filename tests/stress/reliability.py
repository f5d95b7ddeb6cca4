"""Reliability figures at full counts (the stress tests beside this script
run the same trials reduced; benchmarks/reliability.py runs this script).

    python tests/stress/reliability.py [--lifecycles 200] [--faults 100] [--seed 0]
        [--chaos_kills 100] [--checkpoint_kills 20] [--abuse_bad_requests 10000] ...

benchmarks/soak.py is the long-running companion (RSS, threads, fds, children).

- lifecycles: drivers stopped at random moments (never started, warm-up,
  running, learner blocked in run_async, right after an env error, actor
  queues full): stop() time, threads left alive, TF queues left open.
- faults: an exception injected at a random moment into env step, env reset,
  the policy or an observer: does it reach the learner with its type, how
  fast, does stop() stay clean, does a new driver in the same process work.
- crashing simulators and checkpoints (chaos.py): a training
  run on SubprocessEnvs whose children are kill -9'ed, every kill one
  restart and one truncation, no other step lost; kill -9 of the training
  CLI and resume from the same root_dir (--chaos_* / --checkpoint_kills).
- serving under abuse (serving_abuse.py): hypothesis-fuzzed
  bad requests interleaved with good clients, and clients that vanish
  mid-episode (--abuse_* flags; 0 skips a trial).
"""

import argparse
import collections
import time

import numpy as np

import chaos  # this script's directory (tests/stress/)
import serving_abuse
from driver_trials import fault_trial, lifecycle_trial


def lifecycles(n, rng):
    results = [lifecycle_trial(rng) for _ in range(n)]
    by_state = collections.Counter(r["state"] for r in results)
    worst = max(r["stop_secs"] for r in results)
    bad = [r for r in results if r["stop_secs"] >= 5 or r["threads_left"] or r["queues_open"]
           or r["learner_left"] or not r["error_seen"]]
    print(f"\nStart/stop: {n} driver lifecycles stopped at random moments")
    print(f"  states: {dict(by_state)}")
    print(f"  stop() seconds: median {np.median([r['stop_secs'] for r in results]):.3f}, "
          f"p99 {np.percentile([r['stop_secs'] for r in results], 99):.3f}, max {worst:.3f}")
    print(f"  over 5 s, threads left, queues open, learner hung, error lost: {len(bad)}")
    return bad


def faults(n, rng):
    results = [fault_trial(rng) for _ in range(n)]
    print(f"\nFaults: {n} exceptions injected at random sites and moments")
    print(f"  {'site':10s} {'n':>4s} {'type kept':>10s} {'max s to learner':>17s} "
          f"{'max stop s':>11s} {'clean':>6s} {'new driver ok':>14s}")
    bad = []
    for site in sorted({r["site"] for r in results}):
        rs = [r for r in results if r["site"] == site]
        clean = sum(not r["threads_left"] and not r["queues_open"] for r in rs)
        print(f"  {site:10s} {len(rs):4d} {sum(r['type_ok'] for r in rs):10d} "
              f"{max(r['surfaced_secs'] for r in rs):17.3f} "
              f"{max(r['stop_secs'] for r in rs):11.3f} {clean:6d} "
              f"{sum(r['fresh_driver_ok'] for r in rs):14d}")
        bad += [r for r in rs if not (r["type_ok"] and r["fresh_driver_ok"]) or
                r["threads_left"] or r["queues_open"] or r["stop_secs"] >= 5]
    return bad


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lifecycles", type=int, default=200)
    parser.add_argument("--faults", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    chaos.add_flags(parser)
    serving_abuse.add_arguments(parser)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    start = time.time()
    bad = lifecycles(args.lifecycles, rng) + faults(args.faults, rng)
    bad += chaos.print_full_figures(args)
    bad += serving_abuse.print_full_figures(args)
    print(f"\n{len(bad)} failures in {time.time() - start:.0f} s")
    for r in bad:
        print("  ", r)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
