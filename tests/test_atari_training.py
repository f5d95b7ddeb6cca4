"""DQN on Atari (gin_configs/dqn_breakout.gin) through alf-async-train, as users
run it: a short Breakout job with the Nature CNN and the pixel replay that
provably reaches the learner (finite losses in the training summaries, two
epsilon-greedy evaluations written, game scores in the metrics)."""

import glob

import numpy as np
import pytest

from cli_runs import run_train_cli, third_party_lines  # tests/ is on sys.path
from test_trainer import read_scalars

# Small enough for CI, the rest of the config as published: 2 x 8 games x 8
# steps = 128 env steps and 32 train steps per iteration; training starts at
# iteration 2 (256 env steps) and runs through iteration 6.
SHORT = [
    "Schedule.num_env_steps = 768",
    "Schedule.initial_collect_steps = 256",
    "PixelReplayer.capacity_per_row = 200",
    "suite_atari.max_num_frames_per_episode = 400",  # 100 agent steps, training and eval games
    "Evaluation.env_kwargs = {'max_num_frames_per_episode': 200}",  # 50 steps, eval games only
    "Evaluation.episodes = 2",
    "Evaluation.interval = 64",            # train steps: evaluations at 64 and 128
    "Outputs.summary_interval = 16",
]


@pytest.mark.timeout(240)
def test_short_breakout_run_reaches_the_learner_and_evaluates(tmp_path):
    proc = run_train_cli(tmp_path, "dqn_breakout.gin", SHORT, timeout=230)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert ("stopped (num_env_steps) at iteration 6, train step 160, env steps 768"
            in proc.stdout), proc.stdout[-3000:]
    assert "A.L.E" not in proc.stdout + proc.stderr   # the emulator's banner is silenced
    assert third_party_lines(proc) == []  # a quiet run, from its start (issue 49)
    assert ("eval at train step 64" in proc.stdout and
            "epsilon-greedy policy (0.05) AverageReturn" in proc.stdout), proc.stdout[-3000:]

    train = read_scalars(str(tmp_path / "train"))
    losses = [v for _, v in train["Losses/td_loss"]]
    assert losses and np.all(np.isfinite(losses))
    # The agent writes a train step's loss at the step it starts from: the
    # last multiple of summary_interval (16) that trained is 144.
    assert max(step for step, _ in train["Losses/td_loss"]) == 144

    evaluation = read_scalars(str(tmp_path / "eval"))
    assert [step for step, _ in evaluation["Metrics/AverageReturn"]] == [64, 128]
    # Game scores: Breakout's bricks are worth 1, 4 or 7 points, never negative.
    assert all(v >= 0 for _, v in evaluation["Metrics/AverageReturn"])
    # Each evaluation game ends by its own 200-frame limit at the latest.
    assert all(0 < v <= 50 for _, v in evaluation["Metrics/AverageEpisodeLength"])

    config = open(glob.glob(str(tmp_path / "operative_config-*.gin"))[0]).read()
    assert "Task.env_name = 'ALE/Breakout-v5'" in config
    assert "dqn_agent.reward_clip = (-1.0, 1.0)" in config
    assert "Task.replayer_fn = @PixelReplayer" in config
