"""SAC on MuJoCo (gin_configs/sac_halfcheetah.gin) through alf-async-train, as
users run it: a short HalfCheetah-v5 job that provably reaches the learner
(finite losses in the training summaries, a greedy evaluation written)."""

import glob

import numpy as np
import pytest

pytest.importorskip("mujoco", reason="needs the [mujoco] extra")

from cli_runs import run_train_cli, third_party_lines  # noqa: E402  (tests/ on sys.path)
from test_trainer import read_scalars  # noqa: E402

# Small enough for CI, the rest of the config as published: 4 envs x 4 steps
# = 16 env steps and 16 train steps per iteration; training starts at
# iteration 4 (64 random env steps) and runs through iteration 14.
SHORT = [
    "Schedule.num_env_steps = 224",
    "Schedule.initial_collect_steps = 64",
    "UniformReplayer.capacity_per_row = 1000",
    "alf_async.environments.suites.load.max_episode_steps = 50",  # training and eval envs
    "Evaluation.episodes = 2",
    "Evaluation.interval = 64",            # train steps: evaluations at 64 and 128
    "Outputs.summary_interval = 16",
]


@pytest.mark.timeout(180)
def test_short_halfcheetah_run_reaches_the_learner_and_evaluates(tmp_path):
    proc = run_train_cli(tmp_path, "sac_halfcheetah.gin", SHORT, timeout=170)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert ("stopped (num_env_steps) at iteration 14, train step 176, env steps 224"
            in proc.stdout), proc.stdout[-3000:]
    # A quiet run, from its start (issue 49): MuJoCo's settotalmass notice is dropped.
    assert third_party_lines(proc) == []

    train = read_scalars(str(tmp_path / "train"))
    losses = [v for _, v in train["Losses/critic_loss"]]
    assert losses and np.all(np.isfinite(losses))
    # The agent writes a train step's loss at the step it starts from: the
    # last multiple of summary_interval (16) that trained is 160.
    assert max(step for step, _ in train["Losses/critic_loss"]) == 160

    evaluation = read_scalars(str(tmp_path / "eval"))
    assert [step for step, _ in evaluation["Metrics/AverageReturn"]] == [64, 128]
    assert np.all(np.isfinite([v for _, v in evaluation["Metrics/AverageReturn"]]))
    # Greedy episodes of the shortened HalfCheetah (it never terminates early).
    assert [v for _, v in evaluation["Metrics/AverageEpisodeLength"]] == [50.0, 50.0]

    config = open(glob.glob(str(tmp_path / "operative_config-*.gin"))[0]).read()
    assert "Task.env_name = 'HalfCheetah-v5'" in config
    assert "Evaluation.greedy = True" in config
    assert "Schedule.random_initial_collect = True" in config
