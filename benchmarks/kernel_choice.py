"""oneDNN off against on, per workload, on this host or an emulated host
kind: what `alf_async.kernels` turns on, measured.

    python benchmarks/kernel_choice.py --host_kind avx2 --rounds 3
    python benchmarks/kernel_choice.py --host_kind avx2 --rounds 3 \
        --gin_files gin_configs/ppo_pong.gin --whole_secs 150 --json /tmp/whole.json

Run it alone on the machine. For each gin file, rounds of child
processes alternate TF_ENABLE_ONEDNN_OPTS=0 and =1 (each child a fresh
TensorFlow: the setting is read at import), both under --host_kind's
emulation (`kernels.emulated_flags`: oneDNN, and the oneDNN matmul Eigen's
kernels call, capped at the kind's instruction set). Each child times, in
process CPU seconds (the least of 3 readings of --part_secs / 3):

- the learner alone: `Learner.train` calls of the gin file's agent on
  random experience (step_breakdown.py's for unroll agents, a replayer of
  random steps for replay agents), in CPU ms per env step (unroll agents)
  or per train step (replay agents);
- inference alone: the collect policy's action on the rows one actor
  batches, CPU ms per env step;
- with --whole_secs (unroll agents): the whole alf_async run, as
  step_breakdown.py's window (its child), in env steps/s and CPU ms per
  env step.

It prints each setting's median over the rounds, the ratio off / on
(above 1: oneDNN is faster) and which setting the kernel choice picks for
the gin file on that host kind.
"""

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile

import host_info
from alf_async import kernels
from child_runs import json_result

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_GIN_FILES = ["ppo_pong.gin", "impala_pong.gin", "dqn_breakout.gin", "dqn_cartpole.gin",
                     "sac_halfcheetah.gin", "ppo_cartpole.gin"]
SETTINGS = ("0", "1")   # TF_ENABLE_ONEDNN_OPTS


def parts(gin_file, part_secs, seed=0):
    """In the child: {part: CPU ms} of the gin file's learner and inference."""
    from alf_async.bin.train import parse_gin
    parse_gin([gin_file], [])
    import gin
    import numpy as np
    import tensorflow as tf

    import step_breakdown
    import unroll_sync
    import wall_clock_learning as wcl
    from alf_async.environments import suites
    from alf_async.learning.learner import Learner
    q = gin.query_parameter
    rows = step_breakdown.forward_rows("alf_async")
    env = suites.load(q("Task.suite"), q("Task.env_name"), batch_size=1, seed=seed)
    agent = wcl._agent(env, tf.Variable(0, dtype=tf.int64))
    env.close()
    agent.initialize()
    result = {"inference": step_breakdown.inference_alone(
        agent.collect_policy, agent.time_step_spec, rows, part_secs)}
    if unroll_sync.is_unroll_task():
        result["learner"] = step_breakdown.learner_alone(agent, part_secs, seed)
        result["learner_unit"] = "env step"
        return result
    num_rows = q("Layout.env_threads") * q("Layout.rows_per_env_thread")
    replayer = wcl._replayer_class(agent)(agent.collect_data_spec, num_rows,
                                          capacity_per_row=1000)
    replayer(wcl._random_experience(agent.collect_data_spec, num_rows, 1000, seed),
             np.arange(num_rows, dtype=np.int32))
    calls = q("Schedule.train_steps_per_iteration")
    learner = Learner(agent, driver=None, replayer=replayer,
                      sample_batch_size=wcl._query("Schedule.sample_batch_size", 64))
    result["learner"] = 1000.0 * step_breakdown.cpu_per_call(
        lambda: learner.train(calls), part_secs) / calls
    result["learner_unit"] = "train step"
    return result


def _child(gin_file, setting, args, environ):
    env = dict(environ, TF_ENABLE_ONEDNN_OPTS=setting, TF_CPP_MIN_LOG_LEVEL="2")
    label = f"{os.path.basename(gin_file)} with TF_ENABLE_ONEDNN_OPTS={setting}"
    record = json_result([sys.executable, os.path.abspath(__file__), "--one", gin_file,
                          "--part_secs", str(args.part_secs)], 1800, f"the child for {label}",
                         env)
    if args.whole_secs:
        with tempfile.TemporaryDirectory(prefix="kernel_choice_") as root_dir:
            whole = json_result(
                [sys.executable, os.path.join(REPO, "benchmarks", "step_breakdown.py"),
                 "--one", "alf_async", "--gin_file", gin_file,
                 "--seconds", str(args.whole_secs), "--warmup_secs", str(args.warmup_secs),
                 "--part_secs", str(args.part_secs), "--root_dir", root_dir, "--gin_bindings"],
                args.whole_secs + 3600, f"the whole run of {label}", env)
        record.update(env_steps_per_sec=whole["env_steps_per_sec"], whole_ms=whole["whole_ms"],
                      cores=whole["cores"], whole_alone_ms=whole["alone_ms"],
                      whole_floors=whole["floors"])
    return record


def report(results, host_kind):
    """Prints the medians and ratios of `results` ({gin file: {setting: [records]}})."""
    print(f"\nTF_ENABLE_ONEDNN_OPTS=0 against =1 on the {host_kind} kind "
          f"(medians; ratio off / on, above 1: oneDNN is faster)")
    print(f"{'gin file':24}{'part':12}{'unit':>12}{'oneDNN off':>12}{'on':>10}{'ratio':>8}"
          f"   the choice")
    for gin_file, by_setting in results.items():
        name = os.path.basename(gin_file)
        networks, _ = kernels.gin_settings([gin_file])
        picks = kernels.choose(kernels.emulated_flags(kernels.real_flags(), host_kind)
                               if host_kind else kernels.real_flags(), {}, networks)
        fields = [("learner", by_setting["0"][0]["learner_unit"]), ("inference", "env step")]
        if "env_steps_per_sec" in by_setting["0"][0]:
            fields += [("whole_ms", "env step"), ("env_steps_per_sec", "1/s")]
        for i, (field, unit) in enumerate(fields):
            off, on = (statistics.median(r[field] for r in by_setting[s]) for s in SETTINGS)
            ratio = on / off if field == "env_steps_per_sec" else off / on
            label = {"whole_ms": "whole run", "env_steps_per_sec": "env steps/s"}.get(field, field)
            tail = f"   oneDNN {'on' if picks.onednn else 'off'}" if i == 0 else ""
            print(f"{name if i == 0 else '':24}{label:12}{unit:>12}{off:12.3f}{on:10.3f}"
                  f"{ratio:8.2f}{tail}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gin_files", nargs="+",
                        default=[os.path.join(REPO, "gin_configs", f) for f in DEFAULT_GIN_FILES])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--part_secs", type=float, default=6.0,
                        help="CPU seconds each part is timed for")
    parser.add_argument("--whole_secs", type=float, default=0.0,
                        help="also time the whole alf_async run of unroll gin files for this "
                             "long (0: not)")
    parser.add_argument("--warmup_secs", type=float, default=50.0,
                        help="seconds of a whole run before its window opens")
    parser.add_argument("--host_kind", choices=kernels.HOST_KINDS,
                        help="emulate this host kind (default: this CPU's own)")
    parser.add_argument("--json", help="write the records here")
    parser.add_argument("--from_json", metavar="JSON",
                        help="run nothing: print the report of an earlier --json")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(parts(args.one, args.part_secs)), flush=True)
        return 0
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        print(f"host: {host_info.describe(dict(saved['host'], kernels=None))}")
        report(saved["results"], saved["host_kind"])
        return 0
    if args.whole_secs and args.whole_secs <= args.warmup_secs:
        parser.error("--whole_secs must be more than --warmup_secs")
    environ = {k: v for k, v in os.environ.items()
               if k not in (kernels.ONEDNN_VAR, kernels.CHOICE_VAR, kernels.CHOSEN_VAR)}
    if args.host_kind:
        try:
            kernels.emulated_flags(kernels.real_flags(), args.host_kind)
        except kernels.ConfigError as e:
            print(f"kernel_choice.py: error: {e}", file=sys.stderr)
            return 2
        environ[kernels.HOST_KIND_VAR] = args.host_kind
        cap = kernels.choose(kernels.real_flags(), environ, "narrow").environ.get(
            kernels.ISA_VAR)
        if cap and kernels.ISA_VAR not in environ:
            environ[kernels.ISA_VAR] = cap
    machine = host_info.host()
    results = {}
    for gin_file in args.gin_files:
        results[gin_file] = {s: [] for s in SETTINGS}
        for round_ in range(args.rounds):
            for setting in SETTINGS:
                record = _child(gin_file, setting, args, environ)
                results[gin_file][setting].append(record)
                print(f"  {os.path.basename(gin_file)} round {round_ + 1} "
                      f"TF_ENABLE_ONEDNN_OPTS={setting}: " + ", ".join(
                          f"{k} {v:.3f}" for k, v in record.items()
                          if isinstance(v, float)), flush=True)
    print(f"host: {host_info.describe(dict(machine, kernels=None))}")   # oneDNN alternates
    report(results, args.host_kind)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(results=results, host=machine, host_kind=args.host_kind,
                           emulation={k: environ[k] for k in (kernels.HOST_KIND_VAR,
                                                              kernels.ISA_VAR) if k in environ},
                           command=shlex.join(sys.argv)), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
