"""Throughput of loading logged episodes straight into a replayer (not timed at length).

Writes --steps logged steps of CartPole-shaped episodes (observation float32
[4], action int64 in {0, 1}, --episode_length steps each, every tenth cut
short) with EpisodeLogWriter to a temporary file, then loads them with
`alf_async.environments.external.offline.load_into_replayer` into a UniformReplayer
of --rows rows, --repeats times, and prints logged steps per second of each
load (the first includes tracing the replayer's write). docs/results/collection.md
has the current figures.

    python benchmarks/offline_load.py [--steps 100000] [--rows 4] [--repeats 3]
"""

import argparse
import os
import tempfile
import time

import numpy as np


def write_logs(path, steps, episode_length):
    from alf_async.environments.external.offline import EpisodeLogWriter  # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(0)
    with EpisodeLogWriter(path) as log:
        written, e = 0, 0
        while written < steps:
            n = min(episode_length, steps - written)
            terminated = e % 10 != 9
            for s in range(n):
                done = terminated and s == n - 1
                log.write_step(f"e{e}", rng.standard_normal(4).astype(np.float32),
                               int(rng.integers(2)), 1.0, done,
                               next_observation=np.zeros(4, np.float32) if done else None)
            written += n
            e += 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--episode_length", type=int, default=40)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    # pylint: disable=import-outside-toplevel
    import tensorflow as tf
    from tf_agents.specs import tensor_spec
    from tf_agents.trajectories import trajectory
    from alf_async.environments.external.offline import load_into_replayer
    from alf_async.learning.replayers import UniformReplayer
    data_spec = trajectory.Trajectory(
        step_type=tf.TensorSpec((), tf.int32), observation=tf.TensorSpec((4,), tf.float32),
        action=tensor_spec.BoundedTensorSpec((), tf.int64, 0, 1), policy_info=(),
        next_step_type=tf.TensorSpec((), tf.int32), reward=tf.TensorSpec((), tf.float32),
        discount=tf.TensorSpec((), tf.float32))
    with tempfile.TemporaryDirectory(prefix="offline_load_") as tmp:
        path = os.path.join(tmp, "log.jsonl")
        write_logs(path, args.steps, args.episode_length)
        for i in range(args.repeats):
            replayer = UniformReplayer(data_spec, num_rows=args.rows,
                                       capacity_per_row=args.steps // args.rows + 4096)
            start = time.perf_counter()
            stats = load_into_replayer([path], replayer, data_spec, num_rows=args.rows)
            secs = time.perf_counter() - start
            print(f"load {i}: {stats.logged_steps} logged steps ({stats.episodes} episodes, "
                  f"{stats.transitions} transitions) in {secs:.2f} s: "
                  f"{stats.logged_steps / secs:,.0f} steps/s", flush=True)


if __name__ == "__main__":
    main()
