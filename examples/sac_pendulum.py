"""SAC on Pendulum-v1, then its trained policy loaded back from the checkpoint.

What it shows: two things a Python program does around a run.

1. `train()` on gin_configs/sac_pendulum.gin (tf-agents' SAC settings:
   256x256 networks, a train step per env step; one env thread of 4
   Pendulums, one actor thread, batches of 4 rows x 4 steps), with your
   `--gin_param` bindings over the file's, as `alf-async-train` runs it. It
   stops once a greedy evaluation of 10 episodes averages >= -200 (a
   swing-up), or after 100000 env steps.
2. The trained policy restored from ROOT_DIR/train's latest checkpoint into
   a new agent of the same settings (`tf.train.Checkpoint(agent=...,
   global_step=...)`: the names train() checkpoints under), then played on
   fresh Pendulums with its mean action.

Run it from the repository's root:

    python examples/sac_pendulum.py [--root_dir runs/sac_pendulum] [--episodes 5]
        [--gin_param 'Schedule.num_env_steps = 20000'] [--verbose]

It prints train()'s lines (the kernels, progress lines, each evaluation,
where it stopped), then the train step it restored and the return of the
restored policy (examples/expected/sac_pendulum.txt; docs/guides/examples.md
shows a whole run). Returns range from about -1600 (the pendulum left
hanging) to 0.
"""

import argparse
import os
import sys

from alf_async import kernels, quiet

GIN_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "gin_configs",
                        "sac_pendulum.gin")


def play(root_dir, episodes, seed=12345):
    """Restores the latest checkpoint's agent into a new one and plays
    `episodes` Pendulum episodes with its mean action; returns (train step,
    checkpoint path, average return)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from alf_async.environments import suites  # pylint: disable=import-outside-toplevel
    from alf_async.learning.evaluation import Evaluator, eval_policy  # pylint: disable=import-outside-toplevel
    from alf_async.settings import Task  # pylint: disable=import-outside-toplevel

    task = Task()   # the gin file's: Pendulum-v1 and sac_agent with its settings
    env = suites.load(task.suite, task.env_name, batch_size=episodes, seed=seed)
    try:
        step = tf.Variable(0, dtype=tf.int64)
        agent = task.agent_fn(env.time_step_spec(), env.action_spec(), step)
        agent.initialize()
        path = tf.train.latest_checkpoint(os.path.join(root_dir, "train"))
        # Only the agent and the step are read; the checkpoint's replay,
        # metrics and counters are left (expect_partial).
        tf.train.Checkpoint(agent=agent, global_step=step).restore(path).expect_partial()
        average_return, _ = Evaluator(env, eval_policy(agent.policy, greedy=True))()
    finally:
        env.close()
    return int(step.numpy()), path, average_return


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root_dir", default="runs/sac_pendulum",
                        help="checkpoints, summaries, operative config; running again resumes")
    parser.add_argument("--gin_param", action="append", default=[],
                        help="a gin binding, e.g. 'Schedule.num_env_steps = 20000' (repeatable)")
    parser.add_argument("--episodes", type=int, default=5,
                        help="episodes the restored policy plays")
    parser.add_argument("--verbose", action="store_true",
                        help="show third-party output (TensorFlow's banner, gym's notices)")
    args = parser.parse_args()
    kernels.apply(kernels.choose_for_gin([GIN_FILE], args.gin_param))  # before TensorFlow
    quiet.quiet(verbose=args.verbose)

    import gin  # pylint: disable=import-outside-toplevel
    from alf_async import trainer  # pylint: disable=import-outside-toplevel  (imports TensorFlow)

    gin.parse_config_files_and_bindings([GIN_FILE], args.gin_param)
    trainer.train(args.root_dir)
    step, path, average_return = play(args.root_dir, args.episodes)
    print(f"restored train step {step} from {path}")
    print(f"the restored policy's mean action: AverageReturn {average_return:.1f} over "
          f"{args.episodes} episodes")


if __name__ == "__main__":
    main()
