"""Published Atari training curves from RL Baselines3 Zoo's trained agents,
for `per_frame.py`'s pictures and tables.

    python benchmarks/published_curves.py --zoo_dir /path/to/rl-trained-agents

The zoo (github.com/DLR-RM/rl-trained-agents) keeps, beside each trained
agent, the Stable-Baselines3 `Monitor` log of every game it trained with:
one CSV a game, a line an episode (score `r`, length `l` in frames, wall
time `t`). Its A2C (16 games, 5-step rollouts, RMSprop with TF1's epsilon,
A2C's loss) is the published curve an A2C-like IMPALA is read against; its
PPO (8 games x 128 steps, 4 epochs) is a second published PPO beside
OpenAI baselines' ppo2, on Pong and on Breakout (the same hyperparameters
for both, in their config.yml). All train a NoFrameskip-v4 game (no sticky
actions) with SB3's AtariWrapper (fire reset, terminal on life loss,
clipped rewards) over a Monitor that scores whole games, unclipped, as the
published Atari curves and `per_frame.py` do.

A curve point is the mean score of the last `WINDOW` episodes (over all
games) ended by a frame count, every `EVERY_FRAMES` frames. The games step
in lockstep (one vectorised environment), so an episode of game k ends at
`num_games x` game k's own frames so far, in the run's frames.

This module writes `CURVES_JSON` (the points, with the zoo's commit, the
paths read and each agent's config.yml) once; `load` reads it. Nothing
here runs TensorFlow.
"""

import argparse
import csv
import io
import json
import os
import subprocess

from wall_clock_report import FRAMES_PER_STEP  # benchmarks/ (imports no TensorFlow)

HERE = os.path.dirname(os.path.abspath(__file__))
CURVES_JSON = os.path.join(HERE, "results", "published_sb3_zoo.json")
ZOO_REPO = "DLR-RM/rl-trained-agents"
WINDOW = 10                # episodes a point averages (per_frame.py's runs too)
EVERY_FRAMES = 250_000     # frames between points
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
# Frames (millions) main() prints each curve at.
MARKS = {"pong": (2.5, 4, 8, 12, 16, 20), "breakout": (2.5, 4, 7, 10, 12, 15, 20, 40)}


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
        ended by then (points before the first `window` episodes are left out).
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


def _git_show(zoo_dir, path):
    return subprocess.run(["git", "-C", zoo_dir, "show", f"HEAD:{path}"], check=True,
                          capture_output=True, text=True).stdout


def write(zoo_dir, path=CURVES_JSON):
    """Reads the zoo's Monitor logs from a clone at `zoo_dir` and writes the curves."""
    commit = subprocess.run(["git", "-C", zoo_dir, "rev-parse", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
    curves = {}
    for name, (agent_dir, num_games, label) in ZOO_AGENTS.items():
        paths = [f"{agent_dir}/{k}.monitor.csv" for k in range(num_games)]
        env_id = agent_dir.split("/")[1].rsplit("_", 1)[0]
        curves[name] = dict(
            label=label, source=f"github.com/{ZOO_REPO} at {commit}", paths=paths,
            config=_git_show(zoo_dir, f"{agent_dir}/{env_id}/config.yml"),
            window=WINDOW, every_frames=EVERY_FRAMES,
            points=curve_from_monitors([_git_show(zoo_dir, p) for p in paths]))
    with open(path, "w") as f:
        json.dump(curves, f, indent=1)
        f.write("\n")
    return curves


def load(name, path=CURVES_JSON):
    """(label, ((agent steps, score), ...)) of a curve in `CURVES_JSON`."""
    with open(path) as f:
        curve = json.load(f)[name]
    return curve["label"], tuple(tuple(p) for p in curve["points"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--zoo_dir", required=True,
                        help=f"a git clone of github.com/{ZOO_REPO}")
    parser.add_argument("--out", default=CURVES_JSON)
    args = parser.parse_args()
    for name, curve in write(args.zoo_dir, args.out).items():
        points = dict(curve["points"])
        marks = MARKS[name.rsplit("_", 1)[1]]
        print(f"{name}: " + ", ".join(
            f"{m:g}M frames {points[int(m * 1e6) // FRAMES_PER_STEP]:+.1f}" for m in marks
            if int(m * 1e6) // FRAMES_PER_STEP in points))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
