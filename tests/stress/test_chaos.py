"""Chaos at reduced counts (ALF_ASYNC_STRESS_SCALE multiplies them;
`python tests/stress/chaos.py` or tests/stress/reliability.py runs the full
counts): children of SubprocessEnvs kill -9'ed during a DQN training run, and
the training CLI kill -9'ed at random moments and resumed."""

import os

import numpy as np
import pytest

from .chaos import FIRST, LAST, MID, check_row, checkpoint_trial, kill_trial

SCALE = float(os.environ.get("ALF_ASYNC_STRESS_SCALE", "1"))


def test_check_row_finds_lost_repeated_and_malformed_steps():
    # A truncation (LAST, discount 1), the boundary step, then a fresh episode.
    st = np.array([FIRST, MID, MID, LAST, FIRST, MID])
    nst = np.array([MID, MID, LAST, FIRST, MID, MID])
    disc = np.ones(6, np.float32)
    t = np.array([0, 1, 2, 2, 0, 1])
    assert check_row(st, nst, disc, t) == (1, [])
    assert check_row(st, nst, disc, np.array([0, 1, 2, 2, 0, 2]))[1]  # a lost step
    assert check_row(st, nst, disc, np.array([0, 1, 1, 1, 0, 1]))[1]  # a repeated step
    terminated = disc.copy()
    terminated[2] = 0.0
    assert check_row(st, nst, terminated, t)[1]  # an end that is not a truncation


@pytest.mark.stress
@pytest.mark.timeout(120)
def test_killed_children_are_one_restart_and_one_truncation_each():
    num_kills = max(1, int(5 * SCALE))
    r = kill_trial(num_kills, interval=0.5, seed=3)
    assert r["error"] is None and r["chaos_error"] is None, r
    assert r["kills"] == num_kills, r
    assert r["restarts"] == r["truncations"] == num_kills, r
    assert r["mismatched_envs"] == [], r["per_env"]
    assert r["num_step_errors"] == 0, r["step_errors"]
    assert r["env_index_errors"] == [], r
    assert r["train_steps"] > 0 and r["loss_finite"], r
    assert r["children_left"] == [], r
    assert r["segments_left"] == [], r
    assert r["stop_secs"] < 10, r


@pytest.mark.stress
@pytest.mark.timeout(150)
def test_killed_training_resumes_from_the_last_checkpoint(tmp_path):
    r = checkpoint_trial(max(1, int(3 * SCALE)), seed=5, root_dir=str(tmp_path),
                         max_kill_delay=1.5, final_iterations=20, run_timeout=60)
    assert r["problems"] == [], "\n".join(r["problems"])
    assert r["kills"] == r["cycles"] - 1
    assert r["resumes"] >= 1, r
    assert r["final"] is not None, r
