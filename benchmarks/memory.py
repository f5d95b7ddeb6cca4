"""Memory per env step of the driver: does a long run grow?

Runs an AsyncOffPolicyDriver (2 env threads x CountingEnv(B=4), the
CountingPolicy, unroll 8, learn_queue_cap 2; no training) with a learner
that only calls run_async(), for --seconds, and samples the process RSS every
--sample_secs. Prints, per configuration, the RSS slope in bytes per env step
from the first sample after warm-up to the last one (a flat process gives
~0; allocator noise is a few MB at most, i.e. < 1 B/step over a million
steps).

Configurations, each in its own process, run one after another:
- graph: env threads run the graph-mode loop (in-process Python envs);
- blocking: the envs declare blocking_step = True, so env threads run the
  Python loop with eager queue ops (the SubprocessEnv / ExternalEnv path);
each with alf_async's EagerTensor leak fix (the default) and without it
(ALF_ASYNC_EAGER_TENSOR_FIX=0, i.e. TF 2.15's own deallocator).

    python benchmarks/memory.py [--seconds 120] [--sample_secs 10]
"""

import argparse
import json
import os
import sys
import threading
import time

from child_runs import json_result  # benchmarks/ is this script's directory
from soak import rss_mb  # benchmarks/ is this script's directory


def one_run(blocking, seconds, sample_secs):
    """In the child: the driver loop; returns the samples (secs, env steps, RSS MiB)."""
    from alf_async import AsyncOffPolicyDriver
    from alf_async.tf215_py311_fixes import eager_tensor_fix
    from alf_async.testing.envs import CountingEnvConstructor
    from alf_async.testing.policies import CountingPolicy

    class BlockingConstructor(CountingEnvConstructor):
        def __call__(self):
            env = super().__call__()
            for e in env.counting_envs:
                e.blocking_step = True
            return env

    env_constructor = (BlockingConstructor if blocking else CountingEnvConstructor)(batch_size=4)
    probe = CountingEnvConstructor(batch_size=4)()
    driver = AsyncOffPolicyDriver(
        env_constructor, CountingPolicy(probe.time_step_spec(), probe.action_spec()),
        num_envs=2, unroll_length=8, learn_queue_cap=2)
    steps, samples, done = [0], [], threading.Event()

    def sampler():
        start = time.monotonic()
        while not done.wait(0 if not samples else sample_secs):
            samples.append((time.monotonic() - start, steps[0], rss_mb(os.getpid())))

    driver.start()
    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            steps[0] += driver.run_async()
    finally:
        done.set()
        thread.join()
        driver.stop()
    samples.append((samples[-1][0] + sample_secs, steps[0], rss_mb(os.getpid())))
    return dict(samples=samples, fix=eager_tensor_fix.install())


def spawn(blocking, fix, args):
    env = dict(os.environ, ALF_ASYNC_EAGER_TENSOR_FIX="1" if fix else "0")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "blocking" if blocking else "graph",
           "--seconds", str(args.seconds), "--sample_secs", str(args.sample_secs)]
    return json_result(cmd, args.seconds + 300, "child", env=env)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--sample_secs", type=float, default=10.0)
    parser.add_argument("--child", choices=["graph", "blocking"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_run(args.child == "blocking", args.seconds, args.sample_secs)))
        return
    print(f"Driver memory per env step ({args.seconds:g} s per run, RSS every "
          f"{args.sample_secs:g} s, slope from the second sample to the last)\n")
    print("| env threads | EagerTensor leak fix | env steps measured | RSS | bytes per env step |")
    print("|---|---|---:|---|---:|")
    for blocking in (False, True):
        for fix in (True, False):
            result = spawn(blocking, fix, args)
            (_, n0, r0), (_, n1, r1) = result["samples"][1], result["samples"][-1]
            label = "on" if result["fix"] else "off"
            print(f"| {'blocking (Python loop)' if blocking else 'graph loop'} | {label} | "
                  f"{n1 - n0:,} | {r0:.1f} -> {r1:.1f} MiB | "
                  f"{(r1 - r0) * 2**20 / max(n1 - n0, 1):.1f} |", flush=True)


if __name__ == "__main__":
    main()
