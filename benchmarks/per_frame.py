"""Learning per frame: a gin file's unroll agent (PPO, IMPALA) for a number of
env steps on either side, its training episodes and greedy evaluations
against frames, beside a published curve.

    python benchmarks/per_frame.py --gin_file gin_configs/ppo_pong.gin --sides tf_agents \
        --seeds 0 --env_steps 1000000 --out_dir runs/per_frame
    python benchmarks/per_frame.py --task Breakout-v5-ppo --sides tf_agents --seeds 0 \
        --env_steps 2500000 --out_dir runs/per_frame
    python benchmarks/per_frame.py --from_json runs/per_frame/*.json --marks 2.5 4

Needs pip install -e '.[atari,bench]'.

Published Atari curves plot the behaviour policy's training episodes (the
game score, unclipped) against frames, not a greedy evaluation; a greedy
Pong policy can stall at -21 (it never serves) while the one that
collects is far above it. So each run records both:

- training episodes: every finished episode of every game the agent
  collects with (`alf_async.driver.metrics.EpisodeLog` fed each batch of
  unrolls), its score and the env steps collected when it ended;
- evaluations: the gin file's greedy evaluation (`Evaluation.episodes`
  games of `Evaluation.env_kwargs`) every `--eval_every_steps` train steps.

The sides:

- tf_agents: tf-agents' synchronous loop for an unroll agent
  (`unroll_sync.SyncUnrollLoop`: a DynamicStepDriver collects a batch in
  lockstep, the agent trains on it, no policy lag); the collected batch
  goes to the EpisodeLog as it goes to the replayer.
- alf_async: `alf_async.trainer.train()`, the driver's dequeued batches
  fed to the EpisodeLog as to the learner's replayer.

A run stops at the first batch that brings --env_steps (1 env step = 4
frames). Each run is a process of its own, one at a time; its record is
saved as JSON in --out_dir (`per_frame_<name>_seed<N>_<side>.json`, with
the host's CPU model and a calibration: the seconds of a fixed amount of
Python and of numpy work) and `--from_json` merges records of earlier
invocations. The per-frame figures do not depend on the host's speed (the
synchronous side has no policy lag; alf_async's lag is counted in train
steps and depends on it a little); the wall-clock ones do.

What it prints: per run and mark (`--marks`, millions of frames), the mean
score of the last 10 training episodes ended by then, the median over
seeds, and each published curve's value there (`--reference`: ppo2 and
RL Baselines3 Zoo's PPO for PPO, the zoo's A2C for IMPALA, none for other
games); the frames each run, median and curve took to reach `--scores`;
and draws the runs' curves beside them (`per_frame_<names>.png`).
`--task` (a name of wall_clock_learning.py's) picks the gin file and, for
what is not given, the task's published curves, scores and marks (`TASKS`).
"""

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time

import unroll_sync  # benchmarks/ is this script's directory (imports no TensorFlow)
from host_info import add_kernel_flags, choose_kernels, describe, host
from wall_clock_learning import GIN_FILES

from alf_async.testing.bench.curves import (FRAMES_PER_STEP, TASKS, WINDOW, frames_to_scores,
                                            recent_mean, reference_at, references)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIDES = ("alf_async", "tf_agents")
# Published curves, name: (label, ((agent steps, training-episode score), ...));
# their sources in alf_async.testing.bench.curves.
REFERENCES = references()


# ---------------------------------------------------------------- child runs

def run_alf_async(seed, env_steps, root_dir, log):
    """`trainer.train()` until `env_steps`, the driver's batches fed to `log`."""
    import wall_clock_learning as wcl
    from alf_async import trainer
    from alf_async import settings

    start = time.monotonic()
    result = trainer.train(root_dir,
                           task=settings.Task(replayer_fn=unroll_sync.logged_one_time_replayer(log)),
                           schedule=settings.Schedule(num_env_steps=env_steps),
                           evaluation=settings.Evaluation(in_background=False),
                           runtime=settings.Runtime(seed=seed))
    lags = [v for _, v in wcl._scalars(os.path.join(root_dir, "train"), "Learner/policy_lag")]
    return dict(env_steps=result.env_steps, train_steps=result.global_step,
                loop_secs=time.monotonic() - start,
                evaluations=[(secs, steps, train_step, ret)
                             for secs, train_step, steps, ret, _ in result.evaluations],
                policy_lag=sum(lags) / len(lags) if lags else None)


def run_tf_agents(seed, env_steps, log):
    """The synchronous loop until `env_steps`, each collected batch fed to `log`."""
    import wall_clock_learning as wcl
    record = wcl.run_unroll_sync(seed, float("inf"), "gym_batch", 0,
                                 num_env_steps=env_steps, exp_observers=[log])
    return dict(env_steps=record["env_steps"], train_steps=record["train_steps"],
                loop_secs=record["loop_secs"], evaluations=record["evaluations"],
                policy_lag=0.0)


def one_run(args):
    machine = host()   # before TensorFlow and the games load
    from alf_async.bin.train import parse_gin
    parse_gin([args.gin_file], [f"Evaluation.interval = {args.eval_every_steps}",
                                "Outputs.checkpoint_interval = 1000000000",
                                "Evaluation.stop_at_return = None"]   # env steps stop a run
              + list(args.gin_bindings))
    import gin
    config = gin.config_str()
    if not unroll_sync.is_unroll_task():
        raise SystemExit(f"per_frame.py: {args.gin_file} does not train an unroll agent "
                         f"(Task.agent_fn = @ppo_agent or @impala_agent)")
    from alf_async.driver.metrics import EpisodeLog
    episode_log = EpisodeLog()
    start, printed = time.monotonic(), [0]

    def log(exp, env_ids):
        """Feeds the EpisodeLog; a progress line every 51,200 env steps (stderr)."""
        episode_log(exp, env_ids)
        steps = episode_log.env_steps
        if steps // 51_200 > printed[0]:
            printed[0] = steps // 51_200
            print(f"[per_frame] {steps:,} env steps, {time.monotonic() - start:.0f} s, "
                  f"training score (last {WINDOW}): "
                  f"{_fmt(recent_mean(episode_log.episodes, steps))}", file=sys.stderr,
                  flush=True)

    if args.one == "alf_async":
        record = run_alf_async(args.seed, args.env_steps, args.root_dir, log)
    else:
        record = run_tf_agents(args.seed, args.env_steps, log)
    record.update(side=args.one, seed=args.seed, name=args.name, gin_file=args.gin_file,
                  gin_bindings=list(args.gin_bindings), gin_config=config,
                  episodes=episode_log.episodes, host=machine, command=shlex.join(sys.argv))
    print(json.dumps(record), flush=True)


# ---------------------------------------------------------------- the report

def _lag(record):
    """The run's mean policy lag in train steps ('-' where not recorded)."""
    lag = record.get("policy_lag", 0.0 if record["side"] == "tf_agents" else None)
    return "-" if lag is None else f"{lag:.1f}"


def _fmt(value):
    return "-" if value is None else f"{value:+.1f}"


def report(records, marks, references, out_dir, scores=()):
    """Prints the table (a row per run, the median per name and side, a
    row per published curve), the frames to `scores`, and draws the picture."""
    steps_at = [m * 1e6 / FRAMES_PER_STEP for m in marks]
    head = " | ".join(f"{m:g}M frames" for m in marks)
    print(f"\nTraining-episode score (mean of the last {WINDOW} episodes) at | {head} | "
          f"env steps | last greedy evaluation | env steps/s | policy lag | host")
    groups = {}
    for r in sorted(records, key=lambda r: (r["name"], r["side"], r["seed"])):
        # A mark past the run's last env step reads nothing (not its last episodes).
        values = [recent_mean(r["episodes"], s) if s <= r["env_steps"] else None
                  for s in steps_at]
        groups.setdefault((r["name"], r["side"]), []).append(values)
        last_eval = r["evaluations"][-1][3] if r["evaluations"] else None
        print(f"{r['name']} {r['side']} seed {r['seed']} | "
              + " | ".join(_fmt(v) for v in values)
              + f" | {r['env_steps']:,} | {_fmt(last_eval)} | "
                f"{r['env_steps'] / r['loop_secs']:.0f} | {_lag(r)} | {describe(r['host'])}")
    for (name, side), rows in sorted(groups.items()):
        medians = [statistics.median([v[k] for v in rows if v[k] is not None])
                   if any(v[k] is not None for v in rows) else None for k in range(len(marks))]
        print(f"{name} {side} median of {len(rows)} | " + " | ".join(_fmt(m) for m in medians))
    for name in references:
        label, curve = REFERENCES[name]
        print(f"{label} | " + " | ".join(_fmt(reference_at(curve, s)) for s in steps_at))
    frames_to_scores(records, scores, references)
    _draw(records, references, out_dir)


def _draw(records, references, out_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no picture: pip install -e '.[bench]' brings matplotlib)")
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    names = sorted({(r["name"], r["side"]) for r in records})
    colors = {key: f"C{i}" for i, key in enumerate(names)}
    for r in sorted(records, key=lambda r: (r["name"], r["side"], r["seed"])):
        key = (r["name"], r["side"])
        episodes = r["episodes"]
        xs = [steps * FRAMES_PER_STEP / 1e6 for steps, _, _ in episodes]
        ys = [recent_mean(episodes, steps) for steps, _, _ in episodes]
        first = r is next(x for x in records if (x["name"], x["side"]) == key)
        left.plot(xs, ys, color=colors[key], lw=1.0, alpha=0.8,
                  label=f"{key[0]} ({key[1]})" if first else None)
        ev = r["evaluations"]
        right.plot([e[1] * FRAMES_PER_STEP / 1e6 for e in ev], [e[3] for e in ev],
                   color=colors[key], marker="o", ms=3, lw=1.0, alpha=0.8,
                   label=f"{key[0]} ({key[1]})" if first else None)
    # The published curves as far as the runs go (and their next point).
    last = max(r["env_steps"] for r in records)
    for name, style in zip(references, ("-", "--", ":")):
        label, curve = REFERENCES[name]
        shown = [p for k, p in enumerate(curve) if k == 0 or curve[k - 1][0] < last]
        for ax in (left, right):
            ax.plot([x * FRAMES_PER_STEP / 1e6 for x, _ in shown], [y for _, y in shown],
                    color="black", linestyle=style, lw=1.0, label=label)
    for ax in (left, right):
        ax.set_xlim(0, last * FRAMES_PER_STEP / 1e6 * 1.05)
        ax.set_xlabel("frames (millions)")
        ax.grid(alpha=0.3)
    left.set_ylabel("game score")
    left.set_title(f"training episodes (mean of the last {WINDOW})")
    right.set_title("greedy evaluations")
    left.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    path = os.path.join(out_dir, "per_frame_" + "_".join(sorted({n for n, _ in names})) + ".png")
    fig.savefig(path, dpi=110)
    print(f"picture: {path}")


# ---------------------------------------------------------------- the parent

def _last_json(path):
    """The last line of the file at `path` that is a JSON object (the child's record)."""
    with open(path) as f:
        lines = [line for line in f if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=sorted(TASKS),
                        help="the gin file and, unless given, --reference, --scores and "
                             "--marks of a task (default: --gin_file's, Pong's)")
    parser.add_argument("--gin_file", help="default: --task's, else gin_configs/ppo_pong.gin")
    parser.add_argument("--name", help="the runs' label (default: the gin file's name)")
    parser.add_argument("--sides", choices=SIDES, nargs="+", default=["tf_agents"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--env_steps", type=int, default=1_000_000,
                        help="env steps per run (4 frames each)")
    parser.add_argument("--eval_every_steps", type=int, default=1600,
                        help="train steps between greedy evaluations")
    parser.add_argument("--gin_bindings", nargs="*", default=[],
                        help="more gin bindings after the gin file's, on both sides")
    parser.add_argument("--out_dir", default="/tmp/alf_async_per_frame")
    parser.add_argument("--marks", type=float, nargs="+",
                        help="millions of frames at which the table reads the curves "
                             "(default: the task's, Pong's 1 2.5 4)")
    parser.add_argument("--reference", choices=sorted(REFERENCES) + ["none"], nargs="*",
                        help="published curves to read and draw ('none' or nothing: none; "
                             "default: the task's, Pong's ppo2_pong sb3_ppo_pong)")
    parser.add_argument("--scores", type=float, nargs="*",
                        help="training scores whose frames the report gives per run "
                             "(default: the task's, Pong's -19 -15 -10 0)")
    parser.add_argument("--from_json", nargs="+", metavar="JSON",
                        help="run nothing: report the records in these files, merged")
    parser.add_argument("--label", nargs="*", default=[], metavar="OLD=NEW",
                        help="with --from_json: report runs named OLD as NEW (the same "
                             "settings recorded under an earlier name)")
    parser.add_argument("--one", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--root_dir", help=argparse.SUPPRESS)
    add_kernel_flags(parser)
    args = parser.parse_args()
    references, scores, marks = TASKS[args.task or "Pong-v5-ppo"]
    args.gin_file = args.gin_file or GIN_FILES[args.task or "Pong-v5-ppo"]
    args.reference = list(references) if args.reference is None else args.reference
    args.scores = list(scores) if args.scores is None else args.scores
    args.marks = list(marks) if args.marks is None else args.marks
    args.name = args.name or os.path.splitext(os.path.basename(args.gin_file))[0]
    args.reference = [name for name in args.reference if name != "none"]
    if args.one:
        return one_run(args)
    os.makedirs(args.out_dir, exist_ok=True)
    if args.from_json:
        renamed = dict(pair.split("=", 1) for pair in args.label)
        records = []
        for path in args.from_json:
            with open(path) as f:
                record = json.load(f)
            record["name"] = renamed.get(record["name"], record["name"])
            records.append(record)
        return report(records, args.marks, args.reference, args.out_dir, args.scores)
    # Kernels as alf-async-train chooses them, for every run's child.
    args.gin_bindings = choose_kernels(args, [args.gin_file], args.gin_bindings)
    records = []
    for seed in args.seeds:
        for side in args.sides:
            stem = f"per_frame_{args.name}_seed{seed}_{side}"
            root_dir = os.path.join(args.out_dir, stem)
            shutil.rmtree(root_dir, ignore_errors=True)   # a left-over run would be resumed
            cmd = [sys.executable, os.path.abspath(__file__), "--one", side, "--seed",
                   str(seed), "--name", args.name, "--gin_file", args.gin_file,
                   "--env_steps", str(args.env_steps),
                   "--eval_every_steps", str(args.eval_every_steps), "--root_dir", root_dir,
                   "--gin_bindings", *args.gin_bindings]
            started = time.monotonic()
            log_path = os.path.join(args.out_dir, stem + ".log")
            with open(log_path, "w") as log:
                code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
            record = _last_json(log_path)
            if record is None:
                raise RuntimeError(f"{side} run, seed {seed} failed (exit {code}); see "
                                   f"{log_path}")
            shutil.rmtree(root_dir, ignore_errors=True)
            with open(os.path.join(args.out_dir, stem + ".json"), "w") as f:
                json.dump(record, f)
            records.append(record)
            print(f"  {args.name} seed {seed} {side}: {record['env_steps']:,} env steps, "
                  f"{len(record['episodes'])} training episodes, "
                  f"{time.monotonic() - started:.0f} s", flush=True)
    return report(records, args.marks, args.reference, args.out_dir, args.scores)


if __name__ == "__main__":
    sys.exit(main())
