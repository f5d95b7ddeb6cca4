"""Atari learning curves: published ones and a run's, read per frame
(benchmarks/per_frame.py's report, wall_clock_report's frames table, and
benchmarks/published_curves.py, which writes `CURVES_JSON`). Nothing here
runs TensorFlow.

A curve is ((agent steps, score), ...); an agent step is `FRAMES_PER_STEP`
frames. A point is the mean score of the last `WINDOW` training episodes
(over all games) ended by then, as the published Atari curves plot.
"""

import csv
import functools
import io
import json
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
# The published curves benchmarks/published_curves.py wrote from RL Baselines3
# Zoo's Monitor logs (the checkout's benchmarks/results/).
CURVES_JSON = os.path.join(REPO, "benchmarks", "results", "published_sb3_zoo.json")
FRAMES_PER_STEP = 4
WINDOW = 10                # episodes a point averages (per_frame.py's runs too)
EVERY_FRAMES = 250_000     # frames between points
ZOO_REPO = "DLR-RM/rl-trained-agents"
# name: (the agent's directory in the zoo, <algo>/<env id>_<run>; its games; the curve's label)
ZOO_AGENTS = {
    "sb3_a2c_pong": ("a2c/PongNoFrameskip-v4_1", 16,
                     "RL Baselines3 Zoo A2C, PongNoFrameskip-v4 (16 games' training logs)"),
    "sb3_ppo_pong": ("ppo/PongNoFrameskip-v4_1", 8,
                     "RL Baselines3 Zoo PPO, PongNoFrameskip-v4 (8 games' training logs)"),
    "sb3_ppo_breakout": ("ppo/BreakoutNoFrameskip-v4_1", 8,
                         "RL Baselines3 Zoo PPO, BreakoutNoFrameskip-v4 (8 games' training "
                         "logs)"),
}
# A reference for the Pong pictures: OpenAI baselines' ppo2 (the Nature CNN, 8
# games, 4 epochs; Schulman et al. 2017's Atari settings) on PongNoFrameskip-v4
# (no sticky actions), mean over seeds, as openrlbenchmark plots it
# (static/cleanrl_vs_baselines_atari.png, the PongNoFrameskip-v4 panel, blue:
# openrlbenchmark/baselines/baselines-ppo2-cnn). Read off the picture's pixels
# against its grid lines (about +-0.5 in score, +-0.05M in steps); its x-axis
# is agent steps (4 frames each). (agent steps, score):
BASELINES_PPO2_PONG = ((0, -20.5), (400_000, -20.0), (640_000, -9.5), (790_000, -3.8),
                       (1_000_000, 3.0), (1_250_000, 6.3), (1_540_000, 9.6),
                       (2_110_000, 12.7), (2_960_000, 15.9), (4_110_000, 19.0))
# per_frame.py's --task: {task: (published curves, training scores to reach, marks in millions of frames)}.
TASKS = {
    "Pong-v5-ppo": (("ppo2_pong", "sb3_ppo_pong"), (-19, -15, -10, 0), (1.0, 2.5, 4.0)),
    "Pong-v5-impala": (("sb3_a2c_pong",), (-19, -15, -10, 0), (1.0, 2.5, 4.0)),
    "Breakout-v5-ppo": (("sb3_ppo_breakout",), (10, 20, 40, 55, 100), (2.5, 4.0, 7.0, 10.0)),
}


@functools.lru_cache(maxsize=None)
def references(path=CURVES_JSON):
    """The published curves, {name: (label, ((agent steps, training-episode
    score), ...))}: OpenAI baselines' ppo2 (`BASELINES_PPO2_PONG`) and the
    zoo's (`ZOO_AGENTS`, read from `path`)."""
    return {
        "ppo2_pong": ("OpenAI baselines ppo2, PongNoFrameskip-v4 (openrlbenchmark)",
                      BASELINES_PPO2_PONG),
        **{name: load(name, path) for name in ZOO_AGENTS},
    }


def monitor_episodes(text):
    """The (frames, score) of each episode in a Monitor CSV's text, in order."""
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    return [(int(row["l"]), float(row["r"])) for row in csv.DictReader(io.StringIO(
        "\n".join(lines)))]


def curve_from_monitors(texts, every_frames=EVERY_FRAMES, window=WINDOW):
    """The curve of one run's games (a Monitor CSV text per game).

    Returns:
        ((agent steps, score), ...): at every `every_frames` frames up to the
            last episode's end, the mean score of the last `window` episodes
            ended by then (points before the first `window` episodes are left
            out).
    """
    num_games = len(texts)
    ended = []                       # (run frames at the episode's end, score)
    for text in texts:
        own = 0
        for frames, score in monitor_episodes(text):
            own += frames
            ended.append((num_games * own, score))
    ended.sort(key=lambda e: e[0])
    points, k = [], 0
    for mark in range(every_frames, ended[-1][0] + 1, every_frames):
        while k < len(ended) and ended[k][0] <= mark:
            k += 1
        if k >= window:
            scores = [score for _, score in ended[k - window:k]]
            points.append((mark // FRAMES_PER_STEP, sum(scores) / window))
    return tuple(points)


def load(name, path=CURVES_JSON):
    """(label, ((agent steps, score), ...)) of a curve in `CURVES_JSON`."""
    with open(path) as f:
        curve = json.load(f)[name]
    return curve["label"], tuple(tuple(p) for p in curve["points"])


def recent_mean(episodes, env_steps, window=WINDOW):
    """The mean score of the last `window` training episodes ended by
    `env_steps` (None if none had)."""
    scores = [ret for steps, ret, _ in episodes if steps <= env_steps][-window:]
    return sum(scores) / len(scores) if scores else None


def steps_to(points, score):
    """The env steps at which a curve [(env steps, score), ...] first reads
    `score` or more, linearly between its points (None if it never does)."""
    previous = None
    for steps, value in points:
        if value >= score:
            if previous is None or previous[1] == value:
                return steps
            x0, y0 = previous
            return x0 + (steps - x0) * (score - y0) / (value - y0)
        previous = (steps, value)
    return None


def run_curve(episodes):
    """A run's curve: (env steps, mean of the last `WINDOW` scores) at each
    training episode's end from the `WINDOW`-th on."""
    return [(steps, recent_mean(episodes, steps)) for steps, _, _ in episodes[WINDOW - 1:]]


def _frames(steps):
    return "-" if steps is None else f"{steps * FRAMES_PER_STEP / 1e6:.2f}M"


def frames_to_scores(records, scores, names):
    """Prints, per score, the frames each run's curve took to reach it, the
    median over a group's seeds (`median_steps`) and that of each published
    curve in `names` (`references`)."""
    if not scores:
        return
    print(f"\nFrames (millions) to a training score (mean of the last {WINDOW}) of | "
          + " | ".join(f"{s:+g}" for s in scores))
    groups = {}
    for r in sorted(records, key=lambda r: (r["name"], r["side"], r["seed"])):
        curve = run_curve(r["episodes"])
        reached = [steps_to(curve, s) for s in scores]
        groups.setdefault((r["name"], r["side"]), []).append(reached)
        print(f"{r['name']} {r['side']} seed {r['seed']} (to {_frames(r['env_steps'])}) | "
              + " | ".join(_frames(x) for x in reached))
    for (name, side), rows in sorted(groups.items()):
        medians = [median_steps([row[k] for row in rows]) for k in range(len(scores))]
        print(f"{name} {side} median of {len(rows)} | " + " | ".join(_frames(m) for m in medians))
    for name in names:
        label, curve = references()[name]
        print(f"{label} | " + " | ".join(_frames(steps_to(curve, s)) for s in scores))


def median_steps(reached):
    """The median of seeds' env steps to a score, a seed that stopped
    before it (None) counting as later than all the others (None if the
    median falls on such a seed)."""
    ordered = sorted(reached, key=lambda x: float("inf") if x is None else x)
    low, high = ordered[(len(ordered) - 1) // 2], ordered[len(ordered) // 2]
    return None if low is None or high is None else (low + high) / 2


def reference_at(curve, env_steps):
    """The published curve's score at `env_steps`, linearly between its
    points (None outside them)."""
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x0 <= env_steps <= x1:
            return y0 + (y1 - y0) * (env_steps - x0) / (x1 - x0)
    return None
