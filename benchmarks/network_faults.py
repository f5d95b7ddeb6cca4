"""Faults across a network: the learner of dqn_cartpole_distributed.gin
(alf_async.testing.distributed_jobs' TINY settings) and two collectors, each on a
host of its own (network namespaces, alf_async.testing.netns; root and `ip
netns` needed), each collector connected through a relay on its own host
(alf_async.testing.relay, no delay), one learner run per fault:

    python benchmarks/network_faults.py --faults partition loss1 loss5 flap learner_kill \\
        [--fault_secs 30] [--window_secs 10] [--json out.json]

- `partition`: collector0's link down at the switch for --fault_secs (30);
- `loss1`, `loss5`: 1% / 5% of collector0's chunks held back 200 ms (a lost
  segment's retransmission) for --fault_secs (60);
- `flap`: collector0's connections reset, then refused for 3 s, then let
  in for 3 s, and so on for --fault_secs (30);
- `learner_kill`: the learner SIGKILLed, started again at once on the same
  root_dir and port; the collectors are left running on their hosts.

The environments are `envs.counting_rows` (observations [row, counter, t]),
so that after the run every item of the learner's last replay checkpoint
(its SIGINT's) is checked (`replay_audit`): one row's consecutive steps
each, and the steps of a row that no item holds between its first and
last are counted. Per fault it prints the learner's train steps/s before,
during and after, how long after the heal (or the resumed learner's start)
each collector's traffic reached the switch again (more than 20 kB), the
outages each collector said it saw, spliced items, steps missing, and
every exit status after SIGINT. Run it alone on the machine.
"""

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time

import host_info  # benchmarks/ is this script's directory
from alf_async.distributed.collector import STATS_TABLE, VARIABLE_TABLE
from alf_async.distributed.reverb_replayer import REPLAY_TABLE
from alf_async.testing import replay_audit
from alf_async.testing.distributed_jobs import (PROGRESS, RELAY_PORT, collector_on, relay_on,
                                                remote_learner, stop, stop_all)
from alf_async.testing.envs import COUNTING_ROWS
from alf_async.testing.netns import TestHosts, unavailable

FAULTS = ("partition", "loss1", "loss5", "flap", "learner_kill")
LEARNER_PORT = 41300
FLAP_SECS = 3.0
PARAMS = [f"Task.env_name = '{COUNTING_ROWS}'", f"collect/Task.env_name = '{COUNTING_ROWS}'",
          f"LearnerServer.port = {LEARNER_PORT}",
          "replay_table.max_size = 2000000"]   # nothing evicted: the audit sees every item


# learner_kill: checkpoints (the agent's and the replay table's) every
# 500 train steps, so that the resumed learner restores one; the steps the
# collectors wrote after it are lost with the killed process.
KILL_PARAMS = ["Outputs.checkpoint_interval = 500"]

IMPAIRMENTS = {"loss1": ["--loss", "0.01"], "loss5": ["--loss", "0.05"],
               "flap": ["--flap_secs", str(FLAP_SECS)]}   # the relay's flags per fault


class Lines(object):
    """A process's stdout, read line by line by a thread."""

    def __init__(self, proc):
        self.lines = []
        threading.Thread(target=lambda: self.lines.extend(l.rstrip("\n") for l in proc.stdout),
                         daemon=True).start()


def rate(learner, secs):
    """The learner's train steps/s over the next `secs` seconds."""
    step, start = learner.train_step(), time.monotonic()
    time.sleep(secs)
    return (learner.train_step() - step) / (time.monotonic() - start)


def wait_for_bytes(hosts, name, above, secs):
    """Seconds until host `name` sent more than `above` bytes (None: not within `secs`)."""
    start = time.monotonic()
    while time.monotonic() - start < secs:
        if hosts.bytes_from(name) > above:
            return time.monotonic() - start
        time.sleep(0.1)
    return None


def one_fault(fault, fault_secs, window_secs):
    names = ["learner", "collector0", "collector1"]
    row = dict(fault=fault, fault_secs=fault_secs)
    with tempfile.TemporaryDirectory() as root_dir, TestHosts(names) as hosts:
        learner_params = PARAMS + (KILL_PARAMS if fault == "learner_kill" else [])
        learner, address = remote_learner(hosts, root_dir, *learner_params)
        relays, collectors, said = [], [], []
        try:
            for i, name in enumerate(names[1:]):
                relays.append(relay_on(hosts, name, address, "--impair_on_signal",
                                       *IMPAIRMENTS.get(fault, [])))
                collectors.append(collector_on(hosts, name, f"127.0.0.1:{RELAY_PORT}", *PARAMS,
                                               env={"ALF_ASYNC_FIRST_ROW": str(1000 * i)}))
                said.append(Lines(collectors[-1]))
            try:
                learner.wait_for(lambda l: (m := PROGRESS.match(l)) and int(m.group(1)) > 0,
                                 180, "training")
            except AssertionError:
                for c in collectors:
                    if c.poll() is not None:
                        print(c.stderr.read()[-3000:], file=sys.stderr)
                raise
            row["before"] = rate(learner, window_secs)
            if fault == "learner_kill":
                learner.kill()
                killed = time.monotonic()
                learner, _ = remote_learner(hosts, root_dir, *learner_params)
                row["listening_after_kill"] = time.monotonic() - killed
                sent = {n: hosts.bytes_from(n) for n in names[1:]}
                row["back"] = {n: wait_for_bytes(hosts, n, sent[n] + 20_000, 60)
                               for n in names[1:]}
                learner.wait_for(lambda l: (m := PROGRESS.match(l)) and int(m.group(1)) > 0,
                                 120, "the resumed learner training")
                row["resumed"] = [l for l in learner.lines if "restored" in l or "resum" in l]
                row["during"] = None
            else:
                if fault == "partition":
                    hosts.cut("collector0")
                else:
                    relays[0].send_signal(signal.SIGHUP)
                sent = hosts.bytes_from("collector0")
                row["during"] = rate(learner, fault_secs)
                row["bytes_during"] = hosts.bytes_from("collector0") - sent
                if fault == "partition":
                    hosts.heal("collector0")
                else:
                    relays[0].send_signal(signal.SIGHUP)
                sent = hosts.bytes_from("collector0")
                row["back"] = {"collector0": wait_for_bytes(hosts, "collector0",
                                                            sent + 20_000, 60)}
            row["after"] = rate(learner, window_secs)
            row["collectors_alive"] = [c.poll() is None for c in collectors]
        finally:
            stop_all(collectors)
            time.sleep(1.0)
            stop(learner.process)
            stop_all(relays)
        row["exit"] = dict(learner=learner.process.returncode,
                           collectors=[c.returncode for c in collectors])
        row["outages"] = [[l for l in s.lines if " answer" in l] for s in said]
        items = replay_audit.read_checkpoint(os.path.join(root_dir, "replay"), REPLAY_TABLE,
                                             [VARIABLE_TABLE, STATS_TABLE])
        audit = replay_audit.row_runs(items)
    row.update(items=audit["items"], spliced=audit["spliced"], rows=len(audit["rows"]),
               missing={str(k): [len(v), v[0], v[-1]] for k, v in audit["missing"].items()})
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--faults", nargs="+", choices=FAULTS, default=list(FAULTS))
    parser.add_argument("--fault_secs", type=float, default=None,
                        help="how long each fault lasts (default: 60 s for loss, else 30 s)")
    parser.add_argument("--window_secs", type=float, default=10.0,
                        help="how long the rates before and after are measured")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    reason = unavailable()
    if reason:
        parser.error(reason)
    rows = []
    for fault in args.faults:
        secs = args.fault_secs or (60.0 if fault.startswith("loss") else 30.0)
        row = one_fault(fault, secs, args.window_secs)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(host=host_info.host(), args=vars(args), rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
