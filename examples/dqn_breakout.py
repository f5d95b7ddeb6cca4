"""A short Atari run: DQN on Breakout with gin_configs/dqn_breakout.gin's settings.

What it shows: the pixel path end to end in a minute or so. 16
ALE/Breakout-v5 games (gymnasium + ale-py, Machado et al.'s protocol,
84x84x4 uint8 frames) in 2 env threads of 8, one actor thread batching
both, the Nature CNN, the `PixelReplayer` (each frame stored once, stacks
rebuilt when sampled), a train step per 4 env steps. Everything is the gin
file's except `SHORT` below: a small replay, a short warm-up, a few
thousand env steps and no evaluation (a whole run is
`alf-async-train --root_dir runs/dqn_breakout --gin_file gin_configs/dqn_breakout.gin`:
days on two cores, and a replay of about 7 GiB). Your `--gin_param`
bindings go over both. Needs ale-py: `pip install -e '.[atari]'`.

Run it from the repository's root:

    python examples/dqn_breakout.py [--root_dir runs/dqn_breakout_short]
        [--gin_param 'Schedule.num_env_steps = 4096'] [--verbose]

It prints train()'s lines (the kernels, progress lines, where it stopped)
and the size of the last checkpoint, which holds the replay too
(examples/expected/dqn_breakout.txt; docs/guides/examples.md shows a run).
"""

import argparse
import os
import sys

from alf_async import kernels, quiet

GIN_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "gin_configs",
                        "dqn_breakout.gin")
SHORT = [
    "PixelReplayer.capacity_per_row = 1000",   # 16 rows x 1000 steps (the file: 62500)
    "Schedule.initial_collect_steps = 1024",   # env steps before the first train step
    "Schedule.num_env_steps = 2048",           # then 8 iterations of 128 env steps, 32 train steps
    "Evaluation.episodes = 0",                 # no evaluation games
    "Outputs.log_interval_secs = 5.0",         # seconds between progress lines
]


def checkpoint_bytes(root_dir):
    """(path, bytes) of ROOT_DIR/train's latest checkpoint."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    path = tf.train.latest_checkpoint(os.path.join(root_dir, "train"))
    directory, prefix = os.path.split(path)
    return path, sum(os.path.getsize(os.path.join(directory, name))
                     for name in os.listdir(directory) if name.startswith(prefix + "."))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root_dir", default="runs/dqn_breakout_short",
                        help="checkpoints, summaries, operative config; running again resumes")
    parser.add_argument("--gin_param", action="append", default=[],
                        help="a gin binding over the file's and SHORT's, e.g. "
                             "'Schedule.num_env_steps = 4096' (repeatable)")
    parser.add_argument("--verbose", action="store_true",
                        help="show third-party output (TensorFlow's banner, the ALE's)")
    args = parser.parse_args()
    bindings = SHORT + args.gin_param
    kernels.apply(kernels.choose_for_gin([GIN_FILE], bindings))  # before TensorFlow
    quiet.quiet(verbose=args.verbose)

    import gin  # pylint: disable=import-outside-toplevel
    from alf_async import trainer  # pylint: disable=import-outside-toplevel  (imports TensorFlow)

    gin.parse_config_files_and_bindings([GIN_FILE], bindings)
    result = trainer.train(args.root_dir)
    if result.stopped_by == "already_finished":
        return   # train() said so
    path, size = checkpoint_bytes(args.root_dir)
    print(f"checkpoint {path}: {size / 2**20:.1f} MiB (the agent, its optimizer and the replay)")


if __name__ == "__main__":
    main()
