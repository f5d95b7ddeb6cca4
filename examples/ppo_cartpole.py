"""PPO on CartPole-v0 from Python: `train()` on gin_configs/ppo_cartpole.gin.

What it shows: the run `alf-async-train --root_dir runs/ppo_cartpole
--gin_file gin_configs/ppo_cartpole.gin` makes, from a Python program, and
what `train()` returns. In order, as the CLI does them:

1. TensorFlow's kernels are chosen from the gin file before TensorFlow is
   imported (`alf_async.kernels`);
2. the gin file and your `--gin_param` bindings are parsed (a binding
   overrides the file's);
3. `train()` runs: one env thread of 16 CartPoles, one actor thread, each
   batch 16 rows x 64 steps = 1024 env steps trained on once (4 epochs x 4
   minibatches = 16 train steps), a greedy evaluation every 16 train steps,
   stopping once one averages >= 195 (solved);
4. its `TrainResult` is read: the evaluations, and when the run solved.

Run it from the repository's root:

    python examples/ppo_cartpole.py [--root_dir runs/ppo_cartpole]
        [--gin_param 'Schedule.num_env_steps = 4096'] [--verbose]

It prints train()'s lines (the kernels, each evaluation, progress lines,
where it stopped), then its best evaluation and whether it solved
(examples/expected/ppo_cartpole.txt; docs/guides/examples.md shows a whole
run). Checkpoints and TensorBoard summaries go to ROOT_DIR/train and
ROOT_DIR/eval (`tensorboard --logdir runs`). Run again on the same
--root_dir and it resumes, or says the run is finished.
"""

import argparse
import os
import sys

from alf_async import kernels, quiet

GIN_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "gin_configs",
                        "ppo_cartpole.gin")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root_dir", default="runs/ppo_cartpole",
                        help="checkpoints, summaries, operative config; running again resumes")
    parser.add_argument("--gin_param", action="append", default=[],
                        help="a gin binding, e.g. 'Schedule.num_env_steps = 4096' (repeatable)")
    parser.add_argument("--verbose", action="store_true",
                        help="show third-party output (TensorFlow's banner, gym's notices)")
    args = parser.parse_args()
    kernels.apply(kernels.choose_for_gin([GIN_FILE], args.gin_param))  # before TensorFlow
    quiet.quiet(verbose=args.verbose)

    import gin  # pylint: disable=import-outside-toplevel
    from alf_async import trainer  # pylint: disable=import-outside-toplevel  (imports TensorFlow)

    gin.parse_config_files_and_bindings([GIN_FILE], args.gin_param)
    result = trainer.train(args.root_dir)   # every setting from gin
    if result.stopped_by == "already_finished":
        return   # train() said so
    if result.evaluations:   # (seconds, train step, env steps, return, episode length)
        _, step, _, best, _ = max(result.evaluations, key=lambda e: e[3])
        print(f"{len(result.evaluations)} evaluations, the best AverageReturn {best:.1f} at "
              f"train step {step}")
    if result.solved_secs is None:
        print(f"not solved in {result.env_steps} env steps")
    else:
        print(f"solved after {result.solved_secs:.1f} s of training, at train step "
              f"{result.global_step} ({result.env_steps} env steps)")


if __name__ == "__main__":
    main()
