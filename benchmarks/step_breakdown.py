"""Where an env step's CPU goes: an unroll agent's training (PPO, IMPALA)
on both sides, part by part, beside each part's floor.

    python benchmarks/step_breakdown.py --gin_file gin_configs/ppo_pong.gin --seconds 180 \
        --json /tmp/step_breakdown_ppo_pong.json

Run it alone on the machine. Each side runs in a child process of its own,
one after the other, and each child measures:

1. **The whole.** The side trains for --seconds: alf_async's
   `trainer.train()`, or tf-agents' synchronous loop (`unroll_sync`:
   `DynamicStepDriver` collects a batch, the agent trains on it). From
   --warmup_secs on, at each batch the learner takes (at most every 0.5 s),
   the process's CPU seconds, context switches and each thread's CPU
   seconds are sampled (alf_async.testing.bench.thread_cpu); the window between the first and
   the last sample gives CPU per env step, whole and by thread group.
   Evaluations and checkpoints are off; summaries are the gin file's.
2. **The parts alone**, in the same process after the run, each timed in
   process CPU seconds (all threads), the least of 3 readings of
   --part_secs / 3 each (other work on the host only adds to a reading):
   - env stepping: the gin file's environment layer, one batch of the
     side's rows, stepped from Python with random actions;
   - actor inference: the collect policy's action on a batch of the side's
     rows (one tf.function call per batch);
   - the learner: `Learner.train` calls on a batch of random experience of
     the learner's shape (forward and backward, optimizer, advantages; no
     summaries);
   - the driver: the whole minus these three (queues, threads, copies,
     the environment's and the policy's graph wrapping, contention).
3. **The floors**, in the same process, with the same kernels. Env
   stepping: an EnvPool pool of the same game, stepped alone (Atari
   games, envpool installed). Inference and the learner: the bare
   network (`bare_network`, on a fresh agent of the gin file): the actor
   network's forward pass on the side's rows, and the networks' forward,
   backward and optimizer step at the learner's batch (PPO's minibatch),
   times the gradient steps per env step. PPO's value pass over the batch
   is above the floor. The driver's floor is 0.

Kernels: chosen as alf-async-train chooses them (`alf_async.kernels`);
--host_kind emulates another host kind, --kernel_choice off keeps
TensorFlow's defaults; both sides' children run under the same choice,
which each record's host says.

The sides' rows (`forward_rows`): alf_async's actors batch `actor_queue_cap`
env threads of `env_batch_size` games (an env thread acting itself, its own
`env_batch_size`); the synchronous loop steps and acts on all
`num_envs x env_batch_size` games at once. What it prints: benchmarks/README.md.
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time

import bare_network
import unroll_sync  # benchmarks/ is this script's directory (imports no TensorFlow)
from bare_network import cpu_per_call, inference_alone
from host_info import add_kernel_flags, choose_kernels, describe, host

from alf_async.testing.bench import thread_cpu
from alf_async.testing.bench.layout_rows import forward_rows

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIDES = ("alf_async", "tf_agents")
PARTS = ("env stepping", "actor inference", "learner")
DRIVER = "driver (the rest)"
SAMPLE_GAP_SECS = 0.5
ENVPOOL_IDS = {"ALE/Pong-v5": "Pong-v5", "ALE/Breakout-v5": "Breakout-v5"}


class Window(object):
    """An exp observer: counts env steps and samples `thread_cpu` at batches
    taken --warmup_secs after it was made. Called on the learner's thread."""

    def __init__(self, warmup_secs):
        self._start = time.monotonic() + warmup_secs
        self.env_steps = 0
        self.first = self.last = None   # (env steps, thread_cpu sample)

    def __call__(self, exp, env_ids):
        shape = exp.step_type.shape
        self.env_steps += int(shape[0]) * int(shape[1])
        now = time.monotonic()
        if now < self._start:
            return
        if self.first is None:
            self.first = (self.env_steps, thread_cpu.sample())
        elif now - (self.last or self.first)[1]["time"] >= SAMPLE_GAP_SECS:
            self.last = (self.env_steps, thread_cpu.sample())

    def record(self):
        """CPU ms per env step of the window: whole, and by thread group."""
        if self.first is None or self.last is None:
            raise RuntimeError("step_breakdown.py: fewer than two batches after the warm-up; "
                               "give --seconds more than --warmup_secs")
        (steps0, first), (steps1, last) = self.first, self.last
        steps, secs = steps1 - steps0, last["time"] - first["time"]
        per_step = lambda cpu: 1000.0 * cpu / steps
        return dict(window_env_steps=steps, window_secs=secs, env_steps_per_sec=steps / secs,
                    cores=(last["cpu_secs"] - first["cpu_secs"]) / secs,
                    whole_ms=per_step(last["cpu_secs"] - first["cpu_secs"]),
                    context_switches_per_step=(last["context_switches"]
                                               - first["context_switches"]) / steps,
                    threads_ms={k: per_step(v) for k, v in thread_cpu.split(first, last).items()})


def env_alone(py_env, secs, seed=0):
    """CPU ms per env step of a batched Python environment stepped alone,
    with random actions drawn beforehand."""
    import itertools

    import numpy as np
    from tf_agents.specs import array_spec
    rng = np.random.RandomState(seed)
    spec, rows = py_env.action_spec(), py_env.batch_size or 1
    draw = lambda: array_spec.sample_bounded_spec(spec, rng)
    actions = itertools.cycle([np.stack([draw() for _ in range(rows)]) if py_env.batched
                               else draw() for _ in range(64)])
    py_env.reset()
    return 1000.0 * cpu_per_call(lambda: py_env.step(next(actions)), secs) / rows


def learner_on_random_batch(agent, seed=0):
    """The learner as it is timed alone: a `Learner` of `agent` on one batch
    of random experience of the learner's shape (`Schedule.rows_per_batch`
    unrolls, replayed for every call). Returns a function making one train
    call (`Schedule.train_steps_per_iteration` updates) and the env steps a
    call trains on."""
    import gin
    import numpy as np

    import wall_clock_learning as wcl
    from alf_async.learning import replayers
    from alf_async.learning.learner import Learner
    q = gin.query_parameter
    rows, steps = q("Schedule.rows_per_batch"), q("Schedule.unroll_length")
    replayer = replayers.OneTimeReplayer()
    replayer(wcl._random_experience(agent.collect_data_spec, rows, steps, seed),
             np.arange(rows, dtype=np.int32))
    learner = Learner(agent, driver=None, replayer=replayer, sample_batch_size=rows)
    calls = q("Schedule.train_steps_per_iteration")
    return (lambda: learner.train(calls)), rows * steps


def learner_alone(agent, secs, seed=0):
    """CPU ms per env step of the learner's train call on one batch of
    random experience of its shape (`learner_on_random_batch`)."""
    train, env_steps = learner_on_random_batch(agent, seed)
    return 1000.0 * cpu_per_call(train, secs) / env_steps


def forward_flops(policy, time_step_spec):
    """FLOPs of one time step through the policy's action (TF's profiler on
    its graph: convolutions, matmuls and elementwise ops)."""
    import tensorflow as tf
    from tf_agents.specs import tensor_spec
    specs = tensor_spec.add_outer_dims_nest(time_step_spec, (1,))
    graph = tf.function(lambda ts: policy.action(ts, policy.get_initial_state(1))
                        ).get_concrete_function(specs).graph
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    return tf.compat.v1.profiler.profile(graph=graph, cmd="op", options=options).total_float_ops


def floors(agent, time_step_spec, secs, rows):
    """Each part's floor, CPU ms per env step, with what it rests on: the
    bare network (`bare_network`) for inference and the learner, EnvPool
    alone for env stepping, 0 for the driver."""
    import gin
    import tensorflow as tf
    q = gin.query_parameter
    learner_rows = q("Schedule.rows_per_batch")
    steps = q("Schedule.unroll_length")
    forward = forward_flops(agent.collect_policy, time_step_spec)
    # A fresh agent of the same config: the floor's steps train its networks.
    fresh = unroll_sync.gin_agent_fn()(time_step_spec, agent.action_spec,
                                       tf.Variable(0, dtype=tf.int64))
    learner_ms, step_ms = bare_network.learner_floor(fresh, learner_rows, steps, secs)
    batch, gradient_steps = bare_network.learner_batch(agent, learner_rows, steps)
    result = dict(forward_flops=forward, bare_batch=batch, bare_step_ms=step_ms,
                  bare_gradient_steps=gradient_steps,
                  # a training pass: ~3 forward passes' FLOPs
                  bare_train_gflops_per_cpu_sec=3 * forward * batch / step_ms / 1e6,
                  ms={"actor inference": bare_network.inference_floor(fresh, rows, secs),
                      "learner": learner_ms, DRIVER: 0.0})
    env_name = q("Task.env_name")
    envpool_id = ENVPOOL_IDS.get(env_name, env_name if env_name in ENVPOOL_IDS.values() else None)
    if envpool_id is not None:
        try:
            from alf_async.environments.suites import suite_envpool
            pool = suite_envpool.make_env(envpool_id, batch_size=rows, seed=0,
                                          recv_batch_size=rows)
        except ValueError as e:   # envpool not installed
            print(f"[step_breakdown] no EnvPool floor: {e}", file=sys.stderr)
        else:
            result["ms"]["env stepping"] = env_alone(pool, secs)
            pool.close()
    return result


# ---------------------------------------------------------------- child runs

def run_side(side, seed, seconds, window, root_dir):
    """The whole: `side` trains for `seconds` with `window` observing its batches."""
    if side == "alf_async":
        from alf_async import trainer
        from alf_async import settings
        from alf_async.learning import replayers

        class ObservedReplayer(replayers.OneTimeReplayer):
            def __call__(self, exp, env_ids):
                window(exp, env_ids)
                super().__call__(exp, env_ids)

        stop = threading.Event()
        timer = threading.Timer(seconds, stop.set)
        timer.start()
        try:
            trainer.train(root_dir, task=settings.Task(replayer_fn=ObservedReplayer),
                          evaluation=settings.Evaluation(in_background=False),
                          runtime=settings.Runtime(seed=seed), stop_event=stop)
        finally:
            timer.cancel()
        return
    import wall_clock_learning as wcl
    wcl.run_unroll_sync(seed, seconds, "gym_batch", 0, exp_observers=[window])


def one_run(args):
    machine = host()   # before TensorFlow and the games load
    from alf_async.bin.train import parse_gin
    parse_gin([args.gin_file], ["Evaluation.interval = 1000000000",
                                "Outputs.checkpoint_interval = 1000000000",
                                "Schedule.num_env_steps = 1000000000",
                                "Evaluation.stop_at_return = None"] + list(args.gin_bindings))
    import gin
    if not unroll_sync.is_unroll_task():
        raise SystemExit(f"step_breakdown.py: {args.gin_file} does not train an unroll agent "
                         f"(Task.agent_fn = @ppo_agent or @impala_agent)")
    config = gin.config_str()
    window = Window(args.warmup_secs)
    run_side(args.one, args.seed, args.seconds, window, args.root_dir)
    record = window.record()

    import tensorflow as tf
    from alf_async.environments import suites
    q = gin.query_parameter
    rows = forward_rows(args.one)
    env = suites.load(q("Task.suite"), q("Task.env_name"), batch_size=rows, seed=args.seed)
    agent = unroll_sync.gin_agent_fn()(env.time_step_spec(), env.action_spec(),
                                       tf.Variable(0, dtype=tf.int64))
    agent.initialize()
    alone = {"env stepping": env_alone(env.pyenv, args.part_secs),
             "actor inference": inference_alone(agent.collect_policy, env.time_step_spec(),
                                                rows, args.part_secs),
             "learner": learner_alone(agent, args.part_secs)}
    alone[DRIVER] = record["whole_ms"] - sum(alone.values())
    record.update(side=args.one, seed=args.seed, gin_file=args.gin_file, rows=rows,
                  gin_bindings=list(args.gin_bindings), gin_config=config, alone_ms=alone,
                  floors=floors(agent, env.time_step_spec(), args.part_secs, rows),
                  host=machine, command=shlex.join(sys.argv))
    env.close()
    print(json.dumps(record), flush=True)


# ---------------------------------------------------------------- the parent

def report(records):
    """Prints the table of `records` (one per side)."""
    sides = [r["side"] for r in records]
    floor = records[0]["floors"]
    floor_sum = sum(floor["ms"].values()) if "env stepping" in floor["ms"] else None
    print(f"\nCPU ms per env step, {records[0]['gin_file']}; host: "
          f"{describe(records[0]['host'])}")
    print(f"{'':34}" + "".join(f"{s:>12}" for s in sides)
          + f"   floor (in {sides[0]}'s process)")
    row = lambda label, values, tail="": print(
        f"{label:34}" + "".join(f"{v:12.3f}" for v in values) + tail)
    row("whole run", [r["whole_ms"] for r in records],
        f"   {floor_sum:.3f} (sum)" if floor_sum is not None else "")
    notes = {"env stepping": "EnvPool alone",
             "actor inference": "the bare actor network",
             "learner": f"the bare networks: {floor['bare_gradient_steps']} step"
                        f"{'s' if floor['bare_gradient_steps'] != 1 else ''} of "
                        f"{floor['bare_batch']}", DRIVER: ""}
    for part in PARTS + (DRIVER,):
        value = floor["ms"].get(part)
        row(f"  {part}" + (" alone" if part != DRIVER else ""),
            [r["alone_ms"][part] for r in records],
            f"   {value:.3f} {notes[part]}" if value is not None else "   (no EnvPool)")
    print(f"  the bare networks train at {floor['bare_train_gflops_per_cpu_sec']:.1f} GFLOP per "
          f"CPU second ({floor['forward_flops']:.3g} FLOP a forward pass, x3 a training pass)")
    # Each side over the floors measured in its own process.
    row("learner alone / its floor", [r["alone_ms"]["learner"] / r["floors"]["ms"]["learner"]
                                      for r in records])
    if floor_sum:
        row("whole / sum of floors", [r["whole_ms"] / sum(r["floors"]["ms"].values())
                                      for r in records])
    print("in the run, by thread (graph calls run on TF's pools):")
    for label in records[0]["threads_ms"]:
        values = [r["threads_ms"].get(label, 0.0) for r in records]
        if any(abs(v) >= 0.0005 for v in values):
            row(f"  {label}", values)
    row("context switches per env step", [r["context_switches_per_step"] for r in records])
    row("env steps/s", [r["env_steps_per_sec"] for r in records])
    row("cores", [r["cores"] for r in records])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gin_file", default=os.path.join(REPO, "gin_configs", "ppo_pong.gin"))
    parser.add_argument("--sides", choices=SIDES, nargs="+", default=list(SIDES))
    parser.add_argument("--seconds", type=float, default=180.0, help="each side's run")
    parser.add_argument("--warmup_secs", type=float, default=60.0,
                        help="seconds of each run before the window opens")
    parser.add_argument("--part_secs", type=float, default=15.0,
                        help="CPU seconds each part alone (and each floor) is timed for")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gin_bindings", nargs="*", default=[])
    parser.add_argument("--json", help="write the records here")
    parser.add_argument("--one", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--root_dir", help=argparse.SUPPRESS)
    add_kernel_flags(parser)
    args = parser.parse_args()
    if args.one:
        return one_run(args)
    if args.warmup_secs >= args.seconds:
        parser.error("--warmup_secs must be less than --seconds")
    args.gin_bindings = choose_kernels(args, [args.gin_file], args.gin_bindings)
    records = []
    for side in args.sides:
        with tempfile.TemporaryDirectory(prefix="step_breakdown_") as root_dir:
            cmd = [sys.executable, os.path.abspath(__file__), "--one", side,
                   "--gin_file", args.gin_file, "--seconds", str(args.seconds),
                   "--warmup_secs", str(args.warmup_secs), "--part_secs", str(args.part_secs),
                   "--seed", str(args.seed), "--root_dir", root_dir,
                   "--gin_bindings", *args.gin_bindings]
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, timeout=args.seconds + 30 * args.part_secs + 600)
        lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
        if proc.returncode or not lines:
            sys.stderr.write(proc.stderr[-4000:])
            raise SystemExit(f"step_breakdown.py: the {side} run failed (exit {proc.returncode})")
        records.append(json.loads(lines[-1]))
        print(f"{side}: {records[-1]['window_env_steps']} env steps in the window", flush=True)
    report(records)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
