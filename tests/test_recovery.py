"""CrashRecovery on its own (the SubprocessEnv and Ray tests run it through
real crashes): the restart budget's window, and what an interrupted call
returns and what is owed after it."""

import numpy as np
import pytest
from tf_agents.trajectories import time_step as ts

from alf_async.environments.processes.recovery import CrashRecovery, truncation

FIRST, MID, LAST = ts.StepType.FIRST, ts.StepType.MID, ts.StepType.LAST


class Clock(object):
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Crash(RuntimeError):
    pass


def recovery(max_restarts=2, window=10.0, clock=None):
    return CrashRecovery("env 0", "the worker", max_restarts, window, Crash,
                         clock=clock or Clock())


def step(step_type, obs, batch=None):
    shape = () if batch is None else (batch,)
    return ts.TimeStep(np.full(shape, step_type, np.int32), np.ones(shape, np.float32),
                       np.ones(shape, np.float32), np.full(shape + (2,), obs, np.float32))


def test_the_budget_allows_max_restarts_within_any_window_then_fails_for_good():
    clock = Clock()
    r = recovery(max_restarts=2, window=10.0, clock=clock)
    r.charge("a")
    clock.now = 5.0
    r.charge("b")
    with pytest.raises(Crash, match=r"already restarted 2 times .*max_restarts=2"):
        r.charge("c")
    assert r.restarts == 2
    clock.now = 100.0  # the window moved on, but a spent budget stays spent
    with pytest.raises(Crash, match="has failed"):
        r.check()
    with pytest.raises(Crash):
        r.charge("d")


def test_restarts_that_left_the_window_no_longer_count():
    clock = Clock()
    r = recovery(max_restarts=1, window=10.0, clock=clock)
    r.charge("a")
    clock.now = 10.5
    r.charge("b")
    assert r.restarts == 2
    clock.now = 11.0
    with pytest.raises(Crash):
        r.charge("c")


def test_max_restarts_0_fails_on_the_first_crash():
    with pytest.raises(Crash, match="max_restarts=0"):
        recovery(max_restarts=0).charge("a")


def test_an_episode_in_flight_is_truncated_and_the_first_step_owed():
    r = recovery()
    first = step(FIRST, 9.0)
    answer = r.recover(first, last=step(MID, 3.0))
    assert int(answer.step_type) == LAST and float(answer.discount) == 1.0
    assert float(answer.reward) == 0.0 and answer.observation.tolist() == [3.0, 3.0]
    assert r.owes() and r.take() is first and not r.owes()


def test_after_a_last_step_a_reset_or_nothing_seen_the_first_step_comes_at_once():
    r = recovery()
    first = step(FIRST, 9.0)
    assert r.recover(first, last=step(LAST, 3.0)) is first
    assert r.recover(first, last=step(MID, 3.0), reset=True) is first
    assert r.recover(first, last=None) is first
    assert not r.owes()


def test_a_call_that_answers_nothing_owes_both_and_a_reset_skips_the_truncation():
    r = recovery()
    first = step(FIRST, 9.0)
    assert r.recover(first, last=step(MID, 3.0), answer=False) is None
    assert int(r.take().step_type) == LAST and r.take() is first
    r.recover(first, last=step(MID, 3.0), answer=False)
    assert r.take(reset=True) is first and not r.owes()


def test_workers_are_owed_separately_and_batched_rows_truncate_together():
    r = recovery()
    first = step(FIRST, 9.0, batch=2)
    answer = r.recover(first, last=step(MID, 3.0, batch=2), key=1)
    assert answer.step_type.tolist() == [LAST, LAST]
    assert answer.discount.tolist() == [1.0, 1.0] and answer.reward.tolist() == [0.0, 0.0]
    assert r.owes(1) and not r.owes(0)
    r.forget()
    assert not r.owes(1)


def test_truncation_keeps_dtypes_and_nested_rewards():
    last = ts.TimeStep(np.int32(MID), {"a": np.float64(2.0), "b": np.ones(3, np.float32)},
                       np.float32(0.5), np.arange(4))
    t = truncation(last)
    assert t.step_type.dtype == np.int32 and int(t.step_type) == LAST
    assert t.reward["a"].dtype == np.float64 and t.reward["b"].tolist() == [0.0] * 3
    assert t.discount.dtype == np.float32 and float(t.discount) == 1.0
    assert t.observation is last.observation
