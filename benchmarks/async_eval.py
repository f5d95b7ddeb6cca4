"""What `Evaluation.in_background` changes: the same gin file's run for the same wall
time with evaluations on the learner's thread (off) and on their own (on).

    python benchmarks/async_eval.py --gin_file gin_configs/ppo_hopper.gin \
        --seconds 180 --rounds 2 --gin_param "Evaluation.interval = 3200"
    python benchmarks/async_eval.py --gin_file gin_configs/dqn_cartpole.gin \
        --seconds 60 --rounds 2 --slow_cartpole_ms 1 \
        --gin_param "Task.env_name = 'SlowCartPole-v0'"

`--slow_cartpole_ms` registers gym's `SlowCartPole-v0`: CartPole-v0 whose
every step first sleeps that long (`alf_async.testing.envs.slow_cartpole`),
a simulator that waits rather than computes; evaluations then take time in
proportion.

Each run is its own process (`alf_async.trainer.train()` stopped by a timer
`--seconds` after it was called), one at a time, off and on alternating
within each round. A row: train steps and env steps per second of the whole
run (start-up and evaluations included), the evaluations written and their
mean length in seconds (the wall time from the snapshot's train step to
the result, on; the learner's pause, off), the process's CPU cores, and the
ratio on/off of train steps per second, per round. The figures it measured
are in docs/results/learning.md.
"""

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import threading
import time

from child_runs import json_result, time_evaluations  # benchmarks/ is this script's directory
from host_info import host

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_one(gin_file, gin_params, async_eval, seconds, seed, slow_cartpole_ms=None):
    """One timed train() run in this process; returns its record."""
    import gin
    import gym

    if slow_cartpole_ms is not None:
        # Imported before gin parses: the module registers gin configurables.
        from alf_async.testing import envs  # noqa: F401
        gym.register(id="SlowCartPole-v0", entry_point="alf_async.testing.envs:slow_cartpole",
                     kwargs={"step_secs": slow_cartpole_ms / 1000.0})

    from alf_async import trainer
    from alf_async import settings

    gin.parse_config_files_and_bindings([gin_file], gin_params)
    eval_secs = time_evaluations()
    stop = threading.Event()
    timer = threading.Timer(seconds, stop.set)
    cpu = time.process_time()
    start = time.monotonic()
    timer.start()
    try:
        result = trainer.train(tempfile.mkdtemp(prefix="alf_async_async_eval_"),
                               evaluation=settings.Evaluation(in_background=async_eval, stop_at_return=None),
                               runtime=settings.Runtime(seed=seed), stop_event=stop,
                               print_fn=lambda line: None)
    finally:
        timer.cancel()
    wall = time.monotonic() - start
    return {"async_eval": async_eval, "wall_secs": wall,
            "train_steps": result.global_step, "env_steps": result.env_steps,
            "evaluations": len(result.evaluations),
            "eval_secs_mean": statistics.mean(eval_secs) if eval_secs else 0.0,
            "cores": (time.process_time() - cpu) / wall,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gin_file", required=True)
    parser.add_argument("--gin_param", action="append", default=[])
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slow_cartpole_ms", type=float,
                        help="register SlowCartPole-v0 with steps this much slower")
    parser.add_argument("--out", help="a JSON file for the records")
    parser.add_argument("--one", choices=["off", "on"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        record = run_one(args.gin_file, args.gin_param, args.one == "on", args.seconds,
                         args.seed, args.slow_cartpole_ms)
        print(json.dumps(record))
        return
    machine = host()   # before the runs, on a quiet machine
    records = []
    for round_ in range(args.rounds):
        order = ["off", "on"] if round_ % 2 == 0 else ["on", "off"]
        by_side = {}
        for side in order:
            command = [sys.executable, os.path.abspath(__file__), "--one", side,
                       "--gin_file", args.gin_file, "--seconds", str(args.seconds),
                       "--seed", str(args.seed)] + (
                           ["--slow_cartpole_ms", str(args.slow_cartpole_ms)]
                           if args.slow_cartpole_ms is not None else []) + sum(
                           (["--gin_param", p] for p in args.gin_param), [])
            record = json_result(command, args.seconds + 300,
                                 f"round {round_} async_eval {side} run",
                                 env=dict(os.environ, PYTHONPATH=REPO))
            record["round"] = round_
            records.append(record)
            by_side[side] = record
            print(f"round {round_} async_eval {side:3}: "
                  f"{record['train_steps'] / record['wall_secs']:7.1f} train steps/s, "
                  f"{record['env_steps'] / record['wall_secs']:7.1f} env steps/s, "
                  f"{record['evaluations']:3d} evaluations of {record['eval_secs_mean']:5.2f} s, "
                  f"{record['cores']:.2f} cores, {record['peak_rss_gb']:.2f} GB", flush=True)
        off, on = by_side["off"], by_side["on"]
        print(f"round {round_} on/off: train steps/s "
              f"{(on['train_steps'] / on['wall_secs']) / (off['train_steps'] / off['wall_secs']):.2f}x,"
              f" env steps/s "
              f"{(on['env_steps'] / on['wall_secs']) / (off['env_steps'] / off['wall_secs']):.2f}x",
              flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gin_file": args.gin_file, "gin_params": args.gin_param,
                       "slow_cartpole_ms": args.slow_cartpole_ms, "seconds": args.seconds,
                       "records": records, "host": machine}, f, indent=1)


if __name__ == "__main__":
    main()
