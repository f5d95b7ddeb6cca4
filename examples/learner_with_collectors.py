"""A learner with two collector processes on this machine, through Reverb.

What it shows: `train()` on gin_configs/dqn_cartpole_distributed.gin
(`Collectors.count = 2`, `Collectors.launcher = 'local'`): this process
holds a Reverb server with the replay table, samples it, trains,
evaluates and checkpoints, and steps no environment but the evaluation's.
It starts two collector processes (`python -m alf_async.bin.collect`),
each an AsyncOffPolicyDriver over 16 CartPoles acting with the learner's
policy, pulled from Reverb; they write every row's unrolls to the replay
table and report their episodes. A collector that dies is restarted. The
run stops once a greedy evaluation averages >= 195 (solved), and stops
its collectors. Needs dm-reverb: `pip install -e '.[reverb]'`.

The same from the CLI, which also stops it all cleanly on Ctrl-C:

    alf-async-train --root_dir runs/dqn_cartpole_distributed \\
        --gin_file gin_configs/dqn_cartpole_distributed.gin

Run it from the repository's root:

    python examples/learner_with_collectors.py [--root_dir runs/dqn_cartpole_distributed]
        [--gin_param 'Schedule.num_env_steps = 4096'] [--verbose]

It prints train()'s lines (the kernels, the open Reverb port, the address
collectors connect to, progress lines, each evaluation, where it stopped),
then what each collector said when it stopped, from its
ROOT_DIR/collectors/<i>/log.txt (examples/expected/learner_with_collectors.txt;
docs/guides/examples.md shows a whole run).
"""

import argparse
import os
import sys

from alf_async import kernels, quiet

GIN_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "gin_configs",
                        "dqn_cartpole_distributed.gin")
PREFIX = "[alf_async collector] "


def collector_reports(root_dir, count):
    """Each collector's last "stopped" line from its log, or None."""
    reports = []
    for i in range(count):
        try:
            with open(os.path.join(root_dir, "collectors", str(i), "log.txt"),
                      encoding="utf-8") as f:
                lines = [line.rstrip("\n") for line in f
                         if line.startswith(PREFIX + "stopped ")]
        except FileNotFoundError:
            lines = []
        reports.append(lines[-1][len(PREFIX):] if lines else None)
    return reports


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root_dir", default="runs/dqn_cartpole_distributed",
                        help="checkpoints, summaries, the replay, the collectors' logs")
    parser.add_argument("--gin_param", action="append", default=[],
                        help="a gin binding, e.g. 'Schedule.num_env_steps = 4096' (repeatable)")
    parser.add_argument("--verbose", action="store_true",
                        help="show third-party output (TensorFlow's banner, gym's notices)")
    args = parser.parse_args()
    kernels.apply(kernels.choose_for_gin([GIN_FILE], args.gin_param))  # before TensorFlow
    quiet.quiet(verbose=args.verbose)   # the collectors inherit it

    import gin  # pylint: disable=import-outside-toplevel
    from alf_async import trainer  # pylint: disable=import-outside-toplevel  (imports TensorFlow)
    # Registers ReverbReplayer, replay_table and the learner's and collectors'
    # settings (Collectors.*, collect.*, LearnerServer.*, ...) with gin.
    from alf_async.distributed import learner_role  # pylint: disable=import-outside-toplevel
    from alf_async.settings import Collectors  # pylint: disable=import-outside-toplevel
    del learner_role

    gin.parse_config_files_and_bindings([GIN_FILE], args.gin_param)
    result = trainer.train(args.root_dir)
    if result.stopped_by == "already_finished":
        return   # train() said so
    for i, report in enumerate(collector_reports(args.root_dir, Collectors().count)):
        print(f"collector {i}: " + (report or "no report (it had not started collecting)"))


if __name__ == "__main__":
    main()
