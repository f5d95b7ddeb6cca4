"""Driver lifecycles stopped at random moments and random faults, in reduced
counts (ALF_ASYNC_STRESS_SCALE multiplies them; tests/stress/reliability.py
runs the full counts and prints the figures)."""

import os

import numpy as np
import pytest

from .driver_trials import fault_trial, lifecycle_trial

SCALE = float(os.environ.get("ALF_ASYNC_STRESS_SCALE", "1"))
pytestmark = [pytest.mark.stress, pytest.mark.timeout(240)]


def test_random_lifecycles_stop_within_5s_and_leave_nothing():
    rng = np.random.default_rng(2026)
    results = [lifecycle_trial(rng) for _ in range(max(1, int(24 * SCALE)))]
    assert {r["state"] for r in results} >= {"never_started", "running", "learner_blocked"}
    for r in results:
        assert r["stop_secs"] < 5.0, r
        assert r["threads_left"] == [] and r["queues_open"] == [], r
        assert not r["learner_left"] and r["error_seen"], r


def test_random_faults_surface_with_their_type_and_a_new_driver_works():
    rng = np.random.default_rng(7)
    results = [fault_trial(rng) for _ in range(max(1, int(12 * SCALE)))]
    assert {r["site"] for r in results} == {"env_step", "env_reset", "policy", "observer"}
    for r in results:
        assert r["type_ok"], r
        assert r["surfaced_secs"] < 5.0 and r["stop_secs"] < 5.0, r
        assert r["threads_left"] == [] and r["queues_open"] == [], r
        assert r["fresh_driver_ok"], r
