"""A partition across a network: the learner of dqn_cartpole_distributed.gin
(alf_async.testing.distributed_jobs' TINY settings) and two collectors, each on a
host of its own (network namespaces, alf_async.testing.netns; root and `ip
netns` needed), with collector0's link cut at the switch for --cut_secs
while the learner trains.

    python benchmarks/partition_trial.py --cut_secs 30

Prints the learner's train steps/s before, during and after the cut, how
long after the heal collector0's traffic reached the switch again (more than
20 kB of it), and every process's exit status after SIGINT (collectors
first, then the learner). Run it alone on the machine.
"""

import argparse
import sys
import time

from network_faults import rate  # benchmarks/ is this script's directory
from alf_async.testing.distributed_jobs import (PROGRESS, collector_on, remote_learner, stop,
                                                stop_all, wait_until)
from alf_async.testing.netns import TestHosts, unavailable


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cut_secs", type=float, default=30.0)
    parser.add_argument("--window_secs", type=float, default=5.0,
                        help="how long the rates before and after are measured")
    args = parser.parse_args()
    reason = unavailable()
    if reason:
        parser.error(reason)
    import tempfile   # pylint: disable=import-outside-toplevel
    with tempfile.TemporaryDirectory() as root_dir, \
            TestHosts(["learner", "collector0", "collector1"]) as hosts:
        learner, address = remote_learner(hosts, root_dir)
        collectors = []
        try:
            collectors = [collector_on(hosts, name, address)
                          for name in ("collector0", "collector1")]
            learner.wait_for(lambda l: (m := PROGRESS.match(l)) and int(m.group(1)) > 0, 120,
                             "training")
            before = rate(learner, args.window_secs)
            hosts.cut("collector0")
            cut_bytes = hosts.bytes_from("collector0")
            during = rate(learner, args.cut_secs)
            leaked = hosts.bytes_from("collector0") - cut_bytes
            hosts.heal("collector0")
            healed = time.monotonic()
            back = wait_until(lambda: hosts.bytes_from("collector0") > cut_bytes + 20_000, 60,
                              "collector0 back") - healed
            after = rate(learner, args.window_secs)
            alive = [c.poll() is None for c in collectors]
        finally:
            stop_all(collectors)
            stop(learner.process)
    print(f"cut {args.cut_secs:.0f} s: train steps/s before {before:.1f}, during {during:.1f}, "
          f"after {after:.1f}; bytes through the cut link {leaked}; collector0 sending again "
          f"{back:.2f} s after the heal; collectors alive {alive}; exit status learner "
          f"{learner.process.returncode}, collectors {[c.returncode for c in collectors]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
