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

This script writes `CURVES_JSON` (the points, with the zoo's commit, the
paths read and each agent's config.yml) once; alf_async.testing.bench.curves
reads it (`load`) and holds the curves' arithmetic. Nothing here runs
TensorFlow.
"""

import argparse
import json
import subprocess

from alf_async.testing.bench.curves import (CURVES_JSON, EVERY_FRAMES, FRAMES_PER_STEP, WINDOW,
                                            ZOO_AGENTS, ZOO_REPO, curve_from_monitors)

# Frames (millions) main() prints each curve at.
MARKS = {"pong": (2.5, 4, 8, 12, 16, 20), "breakout": (2.5, 4, 7, 10, 12, 15, 20, 40)}


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
