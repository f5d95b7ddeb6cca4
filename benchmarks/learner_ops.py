"""Where an unroll agent's learner spends its op time: TensorFlow's
profiler on `Learner.train` calls, the ops' time grouped by kind.

    python benchmarks/learner_ops.py --gin_file gin_configs/ppo_pong.gin --calls 3 \
        --json /tmp/learner_ops_ppo_pong.json

Run it alone on the machine. The learner is step_breakdown.py's "learner
alone" (`learner_on_random_batch`: the gin file's agent on a batch of
random experience of the learner's shape, `Schedule.train_steps_per_iteration`
gradient updates a call). After --warmup_calls, its calls are timed in
process CPU seconds (the least of 3 readings of --floor_secs / 3 each),
then --calls calls are traced by TensorFlow's profiler, whose events on
TF's compute threads give each op's time. Groups:

- convolutions (the op types with "Conv"), matmuls ("MatMul");
- the optimizer: ops named under the optimizer's scope (Keras' `Adam/`),
  `ResourceApply*` and the gradient clipping (`clip_by_global_norm/`);
- casts (`Cast`: the bfloat16 torso's and the pixels');
- the rest (the loss, advantages, gathers, activations' gradients).

It prints each group in ms per env step and as a share of the ops' time,
and the ops' time against the process CPU the calls took (the remainder is
TF's executor and thread pools outside the ops). Beside it, the learner's
floor in the same process, with the same kernels (`bare_network`: the
agent's networks alone, forward, backward and the optimizer's step at the
learner's batch), and the learner's process CPU over it.

Kernels: chosen as alf-async-train chooses them (`alf_async.kernels`);
--host_kind emulates another host kind and --kernel_choice off keeps
TensorFlow's defaults, as benchmarks/README.md says. The JSON's host
record says what ran.
"""

import argparse
import collections
import glob
import json
import os
import shlex
import sys
import tempfile

import bare_network
from host_info import add_kernel_flags, choose_kernels, describe, host

from alf_async.testing.bench.op_groups import GROUPS, group

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def op_seconds(logdir):
    """Seconds of op time per group in the profile under `logdir` (the op
    events of TF's compute threads)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    [path] = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    seconds = collections.Counter({g: 0.0 for g in GROUPS})
    for plane in space.planes:
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name = names.get(event.metadata_id, "")
                # Ops are 'name:OpType'; the executor's wrapper around each
                # op ('ExecutorState::Process') and Eigen's 'ParallelFor'
                # inside them are not ops.
                if ":" in name and "::" not in name:
                    seconds[group(name)] += event.duration_ps / 1e12
    return dict(seconds)


def measure(gin_file, gin_bindings, calls, warmup_calls, floor_secs, seed=0):
    """The gin file's learner: its process CPU (`cpu_ms`, the least of 3
    readings of `floor_secs` / 3 each), op time (`ops_ms`: `calls` calls
    traced) and op time by group (`groups_ms`), ms per env step, and
    `env_steps_per_call`; its floor (`floor_ms`, the bare networks timed
    alike, their readings taken in turn with the learner's) and the floor's
    batch and gradient steps."""
    from alf_async.bin.train import parse_gin
    parse_gin([gin_file], list(gin_bindings))
    import gin
    import tensorflow as tf

    import unroll_sync
    from alf_async.environments import suites
    from step_breakdown import learner_on_random_batch
    if not unroll_sync.is_unroll_task():
        raise SystemExit(f"learner_ops.py: {gin_file} does not train an unroll agent "
                         f"(Task.agent_fn = @ppo_agent or @impala_agent)")
    q = gin.query_parameter
    env = suites.load(q("Task.suite"), q("Task.env_name"), batch_size=1, seed=seed)
    agent, floor_agent = (unroll_sync.gin_agent_fn()(env.time_step_spec(), env.action_spec(),
                                                     tf.Variable(0, dtype=tf.int64))
                          for _ in range(2))
    env.close()
    agent.initialize()
    train, env_steps_per_call = learner_on_random_batch(agent, seed)
    for _ in range(warmup_calls):
        train()
    rows, steps = q("Schedule.rows_per_batch"), q("Schedule.unroll_length")
    floor_step, floor_steps_per_env_step = bare_network.learner_floor_step(floor_agent, rows,
                                                                         steps, seed)
    # The learner and its floor timed alike, their readings in turn.
    train_secs, step_secs = bare_network.least_cpu_per_call([train, floor_step], floor_secs)
    cpu_ms = 1000.0 * train_secs / env_steps_per_call
    floor_ms = 1000.0 * step_secs * floor_steps_per_env_step
    env_steps = calls * env_steps_per_call
    with tempfile.TemporaryDirectory(prefix="learner_ops_") as logdir:
        tf.profiler.experimental.start(logdir)
        for _ in range(calls):
            train()
        tf.profiler.experimental.stop()
        seconds = op_seconds(logdir)
    groups_ms = {g: 1000.0 * s / env_steps for g, s in seconds.items()}
    batch, gradient_steps = bare_network.learner_batch(agent, rows, steps)
    return dict(cpu_ms=cpu_ms, ops_ms=sum(groups_ms.values()), groups_ms=groups_ms,
                env_steps_per_call=env_steps_per_call, floor_ms=floor_ms,
                floor_batch=batch, floor_gradient_steps=gradient_steps)


def report(record):
    """Prints the table of one `measure` record."""
    print(f"\nThe learner's op time per env step, {record['gin_file']}; host: "
          f"{describe(record['host'])}")
    ops = record["ops_ms"]
    for g in GROUPS:
        ms = record["groups_ms"][g]
        print(f"  {g:14} {ms:8.3f} ms  {100.0 * ms / ops:5.1f}%")
    print(f"  {'all ops':14} {ops:8.3f} ms  of {record['cpu_ms']:.3f} ms of process CPU "
          f"per env step ({record['calls']} calls of {record['env_steps_per_call']} env steps)")
    steps = record["floor_gradient_steps"]
    print(f"  {'floor':14} {record['floor_ms']:8.3f} ms  the bare networks, {steps} "
          f"step{'s' if steps != 1 else ''} of {record['floor_batch']}: the learner's process "
          f"CPU is {record['cpu_ms'] / record['floor_ms']:.2f}x it")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gin_file", default=os.path.join(REPO, "gin_configs", "ppo_pong.gin"))
    parser.add_argument("--gin_bindings", nargs="*", default=[])
    parser.add_argument("--calls", type=int, default=3, help="train calls traced")
    parser.add_argument("--warmup_calls", type=int, default=3)
    parser.add_argument("--floor_secs", type=float, default=9.0,
                        help="CPU seconds the learner and its floor are each timed for")
    parser.add_argument("--json", help="write the record here")
    add_kernel_flags(parser)
    args = parser.parse_args()
    if args.calls < 1 or args.warmup_calls < 1:
        parser.error("--calls and --warmup_calls must be >= 1")
    bindings = choose_kernels(args, [args.gin_file], args.gin_bindings)   # before TensorFlow
    machine = host()   # before TensorFlow loads
    record = measure(args.gin_file, bindings, args.calls, args.warmup_calls, args.floor_secs)
    record.update(gin_file=args.gin_file, gin_bindings=bindings,
                  calls=args.calls, host=machine, command=shlex.join(sys.argv))
    report(record)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
