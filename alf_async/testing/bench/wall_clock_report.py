"""The reporting half of benchmarks/wall_clock_learning.py: its table,
picture and JSON.

Records are the dicts a run prints (see wall_clock_learning.one_run), keyed
here by (side, seed). Nothing here runs TensorFlow.
"""

import json
import os
import statistics

from alf_async.testing.bench import curves
from alf_async.testing.bench.curves import BASELINES_PPO2_PONG, FRAMES_PER_STEP
from alf_async.testing.bench.host import describe, kind

SIDES = ("alf_async", "tf_agents")

# Atari tasks: pixels, scores of whole games, a frame is a quarter agent step.
ATARI = ("Breakout-v5", "Breakout-v5-envpool", "Pong-v5-ppo", "Pong-v5-impala",
         "Breakout-v5-ppo")
# Training episodes a training score averages (the published curves' window,
# curves.WINDOW).
TRAINING_WINDOW = 10
# A reference for the Atari pictures: Dopamine's DQN baseline (the Nature CNN
# and the settings dqn_breakout.gin copies), baselines/atari/data/breakout.json,
# iteration 0 (its first 1M frames, training episodes): 1.57, 1.65, 1.65, 1.64,
# 1.70 over 5 seeds. Iterations 1 and 2 (1-3M frames) average 3.1 and 3.9.
DOPAMINE_DQN_BREAKOUT_FIRST_1M_FRAMES = 1.64


def algorithm(task):
    if task.endswith("-ppo"):
        return "PPO"
    if task.endswith("-impala"):
        return "IMPALA"
    return "DQN" if task in ATARI else "SAC"


def runs_of(records, side):
    """The records of `side`'s runs, in seed order."""
    return [r for (sd, _), r in sorted(records.items()) if sd == side]


def return_at(evaluations, secs):
    """The return of the last evaluation started by `secs` (None if none)."""
    before = [r for t, _, _, r in evaluations if t <= secs]
    return before[-1] if before else None


def training_score_at(episodes, secs, window=TRAINING_WINDOW):
    """The mean score of the last `window` training episodes ended by `secs`
    (`episodes`: [(secs, env steps, score)] in order); None before `window`
    have ended."""
    before = [value for t, _, value in training_curve(episodes, window) if t <= secs]
    return before[-1] if before else None


def training_curve(episodes, window=TRAINING_WINDOW):
    """[(seconds, env steps, training score)] at each training episode's end
    from the `window`-th on (`episodes`: [(secs, env steps, score)] in
    order), the score as `training_score_at` reads it."""
    return [(secs, steps, sum(score for _, _, score in episodes[k + 1 - window:k + 1]) / window)
            for k, (secs, steps, _) in enumerate(episodes) if k + 1 >= window]


def secs_to_training_score(curve, score):
    """Seconds to the first point of a `training_curve` that reads `score` or
    more (None if none does)."""
    return next((secs for secs, _, value in curve if value >= score), None)


def print_training_scores(task, records, report_minutes, budget_secs):
    """The runs' training scores (the behaviour policy's episodes, whole games,
    as published Atari curves plot) at `report_minutes`, per run and the
    median per side, then when each run first reached alf_async's median at
    the last of them (`print_time_to_median`); nothing for records without
    training episodes."""
    runs = [(key, r) for key, r in by_seed(records) if r.get("training_episodes") is not None]
    if not runs:
        return
    minutes = [m for m in report_minutes if m * 60 <= budget_secs + 1e-6]
    print(f"\n{algorithm(task)} {task}: training score (mean of the last {TRAINING_WINDOW} "
          f"training episodes) against wall-clock time")
    print(f"{'side':10s} {'seed':>4s} " + " ".join(f"{'T@' + format(m, 'g') + 'min':>9s}"
                                                   for m in minutes) + f" {'episodes':>8s}")
    scores = {}
    for (side, seed), record in runs:
        row = [training_score_at(record["training_episodes"], m * 60) for m in minutes]
        scores.setdefault(side, []).append(row)
        print(f"{side:10s} {seed:4d} " + " ".join(
            f"{'-' if v is None else format(v, '.1f'):>9s}" for v in row) +
              f" {len(record['training_episodes']):8d}")
    last = {}
    for side, rows in scores.items():
        medians = [statistics.median(col) if None not in col else None for col in zip(*rows)]
        print(f"{side:10s} {'med':>4s} " + " ".join(
            f"{'-' if v is None else format(v, '.1f'):>9s}" for v in medians))
        last[side] = medians[-1] if medians else None
    if last.get("alf_async") is not None and "tf_agents" in last:
        print_time_to_median(runs, last["alf_async"], minutes[-1])


def print_time_to_median(runs, score, minutes):
    """When each run's training score first read `score`, alf_async's median
    at `minutes`, as a multiple of those minutes: the synchronous loop's
    wall time to alf_async's result ('never' where a run ended lower, with
    its last training score)."""
    print(f"to alf_async's median at {minutes:g} min ({score:.1f}), minutes and multiple of "
          f"{minutes:g} min:")
    for (side, seed), record in runs:
        curve = training_curve(record["training_episodes"])
        secs = secs_to_training_score(curve, score)
        if secs is not None:
            print(f"{side:10s} {seed:4d} {secs / 60:.1f} min ({secs / 60 / minutes:.2f}x)")
        else:
            ended = f" (ends at {curve[-1][2]:.1f})" if curve else ""
            print(f"{side:10s} {seed:4d} never{ended}")


def time_to_reach(evaluations, target):
    """Seconds to the first evaluation with a return >= target (None if none)."""
    for t, _, _, r in evaluations:
        if r >= target:
            return t
    return None


def env_rate(record):
    """Env steps per second over the whole loop, evaluations included."""
    return record["env_steps"] / record["loop_secs"]


def by_seed(records):
    """`records`' items in seed order, alf_async before tf_agents."""
    return sorted(records.items(), key=lambda kv: (kv[0][1], kv[0][0]))


def train_rate(record):
    """Train steps per second outside evaluations."""
    return record["train_steps"] / max(record["loop_secs"] - record["eval_secs"], 1e-9)


def score_ratio(med):
    """' (ratio r)' of the two medians where both are positive scores, else ''
    (a ratio of Pong's negative scores says nothing)."""
    if med["alf_async"] > 0 and med["tf_agents"] > 0:
        return f" (ratio {med['alf_async'] / med['tf_agents']:.2f})"
    return ""


def duty_cycle(record):
    return train_rate(record) / record["raw_rate"]


def _optional(value, spec):
    """`value` formatted, or '-' where a record predates the field."""
    return "-" if value is None else format(value, spec)


def print_table(task, records, report_minutes, budget_secs):
    atari = task in ATARI
    what = "game score (evaluation games)" if atari else "eval return (greedy)"
    print(f"\n{algorithm(task)} {task}: {what} against wall-clock time, "
          f"{budget_secs / 60:g} min per run")
    header = (f"{'side':10s} {'seed':>4s} " +
              " ".join(f"{'R@' + format(m, 'g') + 'min':>9s}" for m in report_minutes) +
              f" {'env steps':>10s}" + (f" {'frames':>10s}" if atari else "") +
              f" {'env/s':>6s} {'train steps':>11s} {'train/s':>8s} {'raw/s':>7s}"
              f" {'duty':>5s} {'cores':>5s} {'lag':>5s} {'eval s':>7s} {'RSS GB':>6s}"
              f" {'to sync final':>14s}")
    print(header)
    print("-" * len(header))
    for (side, seed), record in by_seed(records):
        evaluations = record["evaluations"]
        cells = []
        for m in report_minutes:
            r = return_at(evaluations, m * 60) if m * 60 <= budget_secs + 1e-6 else None
            cells.append(f"{'-' if r is None else format(r, '.1f' if atari else '.0f'):>9s}")
        reach = "-"
        sync = records.get(("tf_agents", seed))
        if side == "alf_async" and sync and sync["evaluations"]:
            target = sync["evaluations"][-1][3]
            t = time_to_reach(evaluations, target)
            reach = "not reached" if t is None else f"{t / budget_secs:.2f} of budget"
        frames = f" {record['env_steps'] * FRAMES_PER_STEP:10d}" if atari else ""
        rss = record.get("peak_rss_mb", float("nan")) / 1024
        cores = _optional(record.get("cores"), ".2f")
        lag = _optional(record.get("policy_lag"), ".1f")
        print(f"{side:10s} {seed:4d} " + " ".join(cells) +
              f" {record['env_steps']:10d}{frames} {env_rate(record):6.0f}"
              f" {record['train_steps']:11d} {train_rate(record):8.1f}"
              f" {record['raw_rate']:7.1f} {duty_cycle(record):5.2f} {cores:>5s} {lag:>5s}"
              f" {record['eval_secs']:7.1f} {rss:6.1f} {reach:>14s}")
    finals = {side: [return_at(r["evaluations"], budget_secs) or 0.0
                     for r in runs_of(records, side)] for side in SIDES}
    if all(finals.values()):
        med = {side: statistics.median(v) for side, v in finals.items()}
        reach_secs = [time_to_reach(r["evaluations"], med["tf_agents"])
                      for r in runs_of(records, "alf_async")]
        print(f"median at {budget_secs / 60:g} min: alf_async {med['alf_async']:.2f}, tf_agents "
              f"{med['tf_agents']:.2f}{score_ratio(med)};"
              f" alf_async runs reaching the tf_agents median, at budget fractions: "
              f"{[None if t is None else round(t / budget_secs, 2) for t in reach_secs]}")
        steps = {side: statistics.median(r["train_steps"] for r in runs_of(records, side))
                 for side in SIDES}
        print(f"median train steps: alf_async {steps['alf_async']:.0f}, tf_agents "
              f"{steps['tf_agents']:.0f} (ratio {steps['alf_async'] / steps['tf_agents']:.2f})")
        rates = {side: statistics.median(env_rate(r) for r in runs_of(records, side))
                 for side in SIDES}
        print(f"median env steps/s: alf_async {rates['alf_async']:.0f}, tf_agents "
              f"{rates['tf_agents']:.0f} (ratio {rates['alf_async'] / rates['tf_agents']:.2f})")
        cores = {side: [r["cores"] for r in runs_of(records, side) if r.get("cores")]
                 for side in SIDES}
        if all(cores.values()):
            sync_cores = statistics.median(cores["tf_agents"])
            print(f"median cores used: alf_async {statistics.median(cores['alf_async']):.2f}, "
                  f"tf_agents {sync_cores:.2f}; the two-core ceiling for alf_async: "
                  f"{2.0 / sync_cores:.2f}x the synchronous rate, reached "
                  f"{rates['alf_async'] / rates['tf_agents'] / (2.0 / sync_cores):.0%}")


def print_hosts(records):
    """Which host each run ran on, and each seed's env steps/s ratio where
    both sides ran on one kind of host: medians over runs on different kinds
    of host compare different machines (hosts of one machine kind differ
    several-fold)."""
    host_kind = {}   # (side, seed) -> kind, for the runs that recorded their host
    kinds = {}       # kind -> its runs, in seed order
    for (side, seed), record in by_seed(records):
        host = record.get("host")
        if host:
            host_kind[side, seed] = kind(host)
            print(f"  {side} seed {seed}: {describe(host)}")
        kinds.setdefault(host_kind.get((side, seed), "host not recorded"), []).append((side, seed))
    if len(kinds) > 1:
        print(f"the runs span {len(kinds)} kinds of host (" + "; ".join(
            f"{name}: {', '.join(f'{side} {seed}' for side, seed in keys)}"
            for name, keys in kinds.items()) + "): medians mixing them compare different machines")
    for seed in sorted({seed for _, seed in records}):
        pair_kinds = {host_kind.get((side, seed)) for side in SIDES}
        if len(pair_kinds) == 1 and None not in pair_kinds:
            rates = [env_rate(records[side, seed]) for side in SIDES]
            print(f"seed {seed}, both sides on {pair_kinds.pop()}: env steps/s alf_async "
                  f"{rates[0]:.0f}, tf_agents {rates[1]:.0f} (ratio {rates[0] / rates[1]:.2f})")


def plot(task, records, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    pong = task.startswith("Pong") or task == "Breakout-v5-ppo"   # a by-frames panel
    if pong:
        fig, (ax, by_frames) = plt.subplots(1, 2, figsize=(13, 5))
    else:
        fig, ax = plt.subplots(figsize=(8, 5))
    styles = {"alf_async": dict(color="tab:blue", linestyle="-"),
              "tf_agents": dict(color="tab:orange", linestyle="--")}
    labelled = set()
    for (side, seed), record in sorted(records.items()):
        evaluations = record["evaluations"]
        if not evaluations:
            continue
        xs = [t / 60 for t, _, _, _ in evaluations]
        ys = [r for _, _, _, r in evaluations]
        label = None if side in labelled else {
            "alf_async": "alf_async (async trainer)",
            "tf_agents": "tf-agents synchronous loop"}[side]
        labelled.add(side)
        ax.plot(xs, ys, marker="o", markersize=3, label=label, **styles[side])
        ax.annotate(f"seed {seed}", (xs[-1], ys[-1]), fontsize=7, color=styles[side]["color"])
        if pong:
            frames = [steps * FRAMES_PER_STEP / 1e6 for _, steps, _, _ in evaluations]
            by_frames.plot(frames, ys, marker="o", markersize=3, label=label, **styles[side])
        # The training score (the published curves' measure) as a thin line.
        curve = training_curve(record.get("training_episodes") or [])
        if curve:
            thin = dict(color=styles[side]["color"], linewidth=0.8, alpha=0.6,
                        label=None if f"{side} training" in labelled else
                        f"{side}: training score (last {TRAINING_WINDOW} games)")
            labelled.add(f"{side} training")
            ax.plot([t / 60 for t, _, _ in curve], [v for _, _, v in curve], **thin)
            if pong:
                by_frames.plot([steps * FRAMES_PER_STEP / 1e6 for _, steps, _ in curve],
                               [v for _, _, v in curve], **dict(thin, label=None))
    if task.startswith("Breakout") and algorithm(task) == "DQN":
        ax.axhline(DOPAMINE_DQN_BREAKOUT_FIRST_1M_FRAMES, color="gray", linestyle=":",
                   label="Dopamine DQN, mean training score over its first 1M frames")
    ax.set_xlabel("wall-clock minutes (loop start, evaluations included)")
    trained = any(r.get("training_episodes") for r in records.values())
    ax.set_ylabel(("game score (evaluation games; thin: training games)" if trained else
                   "game score (evaluation games)") if task in ATARI else "greedy eval return")
    ax.set_title(f"{algorithm(task)} {task}: {'score' if trained else 'evaluation'} vs "
                 f"wall-clock time")
    ax.grid(alpha=0.3)
    ax.legend()
    if pong:
        if task.startswith("Pong"):
            label, curve = ("OpenAI baselines ppo2, PongNoFrameskip-v4 (no sticky actions), "
                            "openrlbenchmark", BASELINES_PPO2_PONG)
        else:
            label, curve = curves.load("sb3_ppo_breakout")
            label += ", training episodes"
        most = max([1.0] + [r["env_steps"] * FRAMES_PER_STEP / 1e6
                            for r in records.values()]) * 1.05
        shown = [(steps * FRAMES_PER_STEP / 1e6, score) for steps, score in curve
                 if steps * FRAMES_PER_STEP / 1e6 <= most]   # the runs' frames only
        by_frames.plot([f for f, _ in shown], [score for _, score in shown], color="gray",
                       linestyle=":", marker="x", markersize=3, label=label)
        by_frames.set_xlim(0, most)
        by_frames.set_xlabel("frames (millions; 4 per agent step)")
        by_frames.set_ylabel("game score")
        by_frames.set_title("the same runs against frames")
        by_frames.grid(alpha=0.3)
        by_frames.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_frames_to_scores(task, records):
    """Per frame, from the same runs' training episodes: per_frame.py's table
    of the frames each run took to its task's training scores, beside the
    published curves (nothing for a task per_frame.py has no curve for)."""
    if task not in curves.TASKS:
        return
    references, scores, _ = curves.TASKS[task]
    runs = [dict(name=task, side=side, seed=seed, env_steps=record["env_steps"],
                 episodes=[(steps, score, None) for _, steps, score in record["training_episodes"]])
            for (side, seed), record in by_seed(records) if record.get("training_episodes")]
    if runs:
        curves.frames_to_scores(runs, scores, references)


def report(task, records, report_minutes, budget, out_dir):
    """Prints the table, draws the picture and writes the JSON of `records`."""
    print_table(task, records, report_minutes, budget)
    print_training_scores(task, records, report_minutes, budget)
    print_frames_to_scores(task, records)
    print_hosts(records)
    png = os.path.join(out_dir, f"wall_clock_{task}.png")
    plot(task, records, png)
    with open(os.path.join(out_dir, f"wall_clock_{task}.json"), "w") as f:
        json.dump({f"{side}_{seed}": r for (side, seed), r in records.items()}, f, indent=1)
    print(f"\nwrote {png}")


def load_records(paths):
    """{(side, seed): record} from wall_clock_<task>.json files.

    Raises:
        ValueError: a run appears twice, or two runs were configured
            differently (their parsed gin bindings differ).
    """
    records, configs = {}, {}
    for path in paths:
        with open(path) as f:
            for key, record in json.load(f).items():
                side, seed = key.rsplit("_", 1)
                if (side, int(seed)) in records:
                    raise ValueError(f"--from_json: run {key} appears twice ({path})")
                records[(side, int(seed))] = record
                configs.setdefault(record.get("gin_config"), path)
    if len(configs) > 1:
        raise ValueError(f"--from_json: {' and '.join(configs.values())} hold runs with "
                         f"different gin configs; merge only runs of one config")
    return records
