"""The cost of one SummaryHook write: its scalars one eager `tf.summary.scalar`
at a time (as tf-agents' `tf_summaries` writes them) against one
`ScalarSummaries.write` (one graph call).

The points are those of the main job's writes (dqn_cartpole.gin: the
driver's four metrics, each against the train step and the two step
metrics, and the driver's health), with values that change every write.
Alternating rounds of --writes writes each; prints wall and CPU
milliseconds per write of each way, and their ratio, per round.

    python benchmarks/summary_writes.py [--rounds 5] [--writes 200]
"""

import argparse
import statistics
import tempfile
import time

import tensorflow as tf

from alf_async.learning.scalar_summaries import ScalarSummaries

METRICS = ("NumberOfEpisodes", "EnvironmentSteps", "AverageReturn", "AverageEpisodeLength")
HEALTH = ("Perf/env_steps_per_sec", "Perf/train_steps_per_sec", "Perf/action_wait_fraction",
          "Perf/actor_inference_ms_per_batch", "Perf/actor_batch_size",
          "Queues/learn_queue_occupancy", "Queues/actor_queue_occupancy",
          "Queues/log_queue_size")


def points(k):
    """The k-th write's {tag: (value, step)}."""
    step, episodes, env_steps = 32 * k, 5 * k, 256 * k
    out = {}
    for i, name in enumerate(METRICS):
        value = float(k * (i + 1))
        out[f"Metrics/{name}"] = (value, step)
        for step_name, step_value in (("NumberOfEpisodes", episodes),
                                      ("EnvironmentSteps", env_steps)):
            if step_name != name:
                out[f"Metrics_vs_{step_name}/{name}"] = (value, step_value)
    out.update((tag, (0.5 * k + i, step)) for i, tag in enumerate(HEALTH))
    return out


def eager(writer):
    def write(points_):
        with writer.as_default(), tf.summary.record_if(True):
            for tag, (value, step) in points_.items():
                tf.summary.scalar(tag, value, step=tf.constant(step, tf.int64))
    return write


def timed(write, first, writes):
    start, cpu = time.perf_counter(), time.process_time()
    for k in range(first, first + writes):
        write(points(k))
    return (time.perf_counter() - start) / writes, (time.process_time() - cpu) / writes


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--writes", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        ways = {"eager": eager(tf.summary.create_file_writer(directory + "/eager")),
                "graph": ScalarSummaries(tf.summary.create_file_writer(
                    directory + "/graph")).write}
        print(f"{len(points(1))} scalars per write")
        for write in ways.values():   # traced and warm
            timed(write, 1, 3)
        ratios, first = [], 10
        for r in range(args.rounds):
            results = {}
            for name in (("eager", "graph") if r % 2 == 0 else ("graph", "eager")):
                results[name] = timed(ways[name], first, args.writes)
                first += args.writes
            ratios.append(results["eager"][0] / results["graph"][0])
            print(f"round {r}: eager {results['eager'][0] * 1e3:.2f} ms wall, "
                  f"{results['eager'][1] * 1e3:.2f} ms CPU per write; graph "
                  f"{results['graph'][0] * 1e3:.2f} ms wall, {results['graph'][1] * 1e3:.2f} ms "
                  f"CPU; eager / graph {ratios[-1]:.1f}x", flush=True)
        print(f"median eager / graph: {statistics.median(ratios):.1f}x")


if __name__ == "__main__":
    main()
