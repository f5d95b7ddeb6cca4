"""Throughput across a link: the learner of dqn_cartpole_distributed.gin
(alf_async.testing.distributed_jobs' TINY settings) and K collectors, each on a
host of its own (network namespaces, alf_async.testing.netns; root and `ip
netns` needed), every collector's link given a one-way latency by a relay
on its host (alf_async.testing.relay: the collector connects to the relay
on its own loopback, the relay to the learner), beside the same run over
loopback (the collectors on the learner's host, no relay).

    python benchmarks/across_network.py --collectors 1 2 --latency_ms 0 5 20 \\
        [--rate_kbps 0] [--seconds 20] [--rounds 1] [--json out.json] [--gin_param ...]

Per row: the learner's train steps/s and env steps/s (the collectors'
inserted steps, from its progress lines) over --seconds once it trains,
and the variable age the collectors act with: how many train steps their
variables were behind the learner's at their reports (the learner's
Collectors/variable_age summaries over those seconds: the median of its
mean over collectors, and the largest of any collector).
Rows run one after the other (loopback first for each K); run it alone.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import tensorflow as tf

import host_info  # benchmarks/ is this script's directory
from alf_async.testing.distributed_jobs import (RELAY_PORT, collector_on, relay_on,
                                                remote_learner, stop, stop_all)
from alf_async.testing.netns import TestHosts, unavailable

LINE = re.compile(r"\[alf_async\] iteration \d+ \| env steps (\d+) .*\| train steps (\d+) ")


def counts(learner):
    """(env steps, train steps) of the learner's last progress line."""
    for line in reversed(list(learner.lines)):
        m = LINE.match(line)
        if m:
            return int(m.group(1)), int(m.group(2))
    return 0, 0


def variable_ages(root_dir, first_step):
    """(median Collectors/variable_age, max Collectors/variable_age_max) of
    the learner's summaries at train steps >= `first_step` (None: none)."""
    points = {"Collectors/variable_age": [], "Collectors/variable_age_max": []}
    pattern = os.path.join(root_dir, "train", "events.out.tfevents.*")
    for path in sorted(tf.io.gfile.glob(pattern)):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag in points and event.step >= first_step:
                    points[value.tag].append(float(tf.make_ndarray(value.tensor)))
    if not points["Collectors/variable_age"]:
        return None, None
    return (statistics.median(points["Collectors/variable_age"]),
            max(points["Collectors/variable_age_max"]))


def one_row(num_collectors, latency_ms, rate_kbps, seconds, params):
    """One run: None latency = loopback (collectors on the learner's host)."""
    names = ["learner"] + [f"collector{i}" for i in range(num_collectors)]
    procs = []
    with tempfile.TemporaryDirectory() as root_dir, TestHosts(names) as hosts:
        learner, address = remote_learner(hosts, root_dir, *params)
        try:
            for name in names[1:]:
                if latency_ms is None:
                    procs.append(collector_on(hosts, "learner", address, *params))
                    continue
                procs.append(relay_on(hosts, name, address, "--delay_ms", str(latency_ms),
                                      "--rate_kbps", str(rate_kbps)))
                procs.append(collector_on(hosts, name, f"127.0.0.1:{RELAY_PORT}", *params))
            learner.wait_for(lambda l: (m := LINE.match(l)) and int(m.group(2)) > 0, 180,
                             "training")
            time.sleep(2.0)
            env0, train0 = counts(learner)
            start = time.monotonic()
            time.sleep(seconds)
            env1, train1 = counts(learner)
            secs = time.monotonic() - start
            alive = all(p.poll() is None for p in procs)
        finally:
            stop_all(procs)
            stop(learner.process)
        age, age_max = variable_ages(root_dir, train0)
    return dict(collectors=num_collectors, latency_ms=latency_ms, rate_kbps=rate_kbps,
                train_steps_per_sec=(train1 - train0) / secs,
                env_steps_per_sec=(env1 - env0) / secs, variable_age=age,
                variable_age_max=age_max, all_alive=alive,
                learner_exit=learner.process.returncode)


def _median_or_none(values):
    values = [v for v in values if v is not None]
    return f"{statistics.median(values):.1f}" if values else "none"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--collectors", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--latency_ms", type=float, nargs="+", default=[0.0, 5.0, 20.0])
    parser.add_argument("--rate_kbps", type=float, default=0.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of every row, alternating (medians are printed)")
    parser.add_argument("--gin_param", action="append", default=[],
                        help="more bindings, for the learner and its collectors alike")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    reason = unavailable()
    if reason:
        parser.error(reason)
    rows = []
    links = [None] + list(args.latency_ms)
    for round_index in range(args.rounds):
        for k in args.collectors:
            for latency in links:
                row = one_row(k, latency, args.rate_kbps, args.seconds, args.gin_param)
                row["round"] = round_index
                rows.append(row)
                print(f"round {round_index} K={k} "
                      f"{'loopback' if latency is None else f'{latency:g} ms one-way'}: "
                      f"train steps/s {row['train_steps_per_sec']:.1f}, env steps/s "
                      f"{row['env_steps_per_sec']:.0f}, variable age {row['variable_age']} "
                      f"(max {row['variable_age_max']}), all alive {row['all_alive']}",
                      flush=True)
    print(f"\nmedians of {args.rounds} round(s); the ratio is each round's against its own "
          f"loopback row, then the median")
    print(f"{'K':>2} {'link':>16} {'train steps/s':>14} {'vs loopback':>12} {'env steps/s':>12} "
          f"{'variable age':>13}")
    for k in args.collectors:
        for latency in links:
            mine = [r for r in rows if r["collectors"] == k and r["latency_ms"] == latency]
            ratios = []
            for r in mine:
                base = next(b for b in rows if b["collectors"] == k and b["latency_ms"] is None
                            and b["round"] == r["round"])
                ratios.append(r["train_steps_per_sec"] / max(base["train_steps_per_sec"], 1e-9))
            link = "loopback" if latency is None else f"{latency:g} ms one-way"
            print(f"{k:>2} {link:>16} "
                  f"{statistics.median(r['train_steps_per_sec'] for r in mine):>14.1f} "
                  f"{statistics.median(ratios):>11.2f}x "
                  f"{statistics.median(r['env_steps_per_sec'] for r in mine):>12.0f} "
                  f"{_median_or_none([r['variable_age'] for r in mine]):>13}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(host=host_info.host(), args=vars(args), rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
