"""ExternalEnv.get_action_async (what the policy server's event loop calls): the
step is queued without a thread waiting, and the callback gets, exactly once,
what the blocking get_action would have returned or raised."""

import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

from alf_async.environments import ExternalEnvStoppedError
from test_external_env import (IdleEnv, ScriptedEnv, make_driver,
                               no_external_env_threads_left, policy_action)

pytestmark = pytest.mark.timeout(60)
_ = no_external_env_threads_left   # autouse


def call_async(ext, episode_id, observation, **kwargs):
    """get_action_async with a callback that records (action, error, thread name)."""
    calls = []
    done = threading.Event()

    def on_done(action, error):
        calls.append((action, error, threading.current_thread().name))
        done.set()

    pending = ext.get_action_async(episode_id, observation, on_done, **kwargs)
    return pending, calls, done


def test_the_slots_action_completes_it_once_on_the_slots_thread():
    ext = ScriptedEnv([], hold=True)
    driver = make_driver(ext)
    driver.start()
    try:
        eid = ext.start_episode("a")
        pending, calls, done = call_async(ext, eid, [1, 0])
        assert done.wait(20)
        [(action, error, thread)] = calls
        assert error is None and int(action) == policy_action(1, 0)
        assert thread != threading.current_thread().name   # the slot's (a driver thread)
        assert pending.expire() is None and len(calls) == 1
        # With a reward, as get_action(reward=...): the same one round trip.
        pending, calls, done = call_async(ext, eid, [1, 1], reward=0.5)
        assert done.wait(20) and int(calls[0][0]) == policy_action(1, 1)
        ext.end_episode(eid, [1, 2])
    finally:
        driver.stop()
        ext.join(5)


def test_its_deadline_closes_the_episode_with_the_blocking_calls_timeout_error():
    ext = IdleEnv(action_timeout=0.3)   # no driver: nobody ever acts
    other = ext.start_episode("blocking")
    with pytest.raises(TimeoutError) as blocking:
        ext.get_action(other, [0, 0])
    eid = ext.start_episode("slow")
    pending, calls, _ = call_async(ext, eid, [0, 0])
    left = pending.expire()   # early: nothing happens
    assert 0 < left <= 0.3 and not calls and ext.num_open_episodes == 1
    time.sleep(left)
    assert pending.expire() is None
    [(action, error, thread)] = calls
    assert action is None and type(error) is TimeoutError
    assert str(error) == str(blocking.value).replace("'blocking'", "'slow'")
    assert thread == threading.current_thread().name   # expire()'s caller
    with pytest.raises(ValueError, match=r"episode 'slow' has already finished \(get_action "
                                         r"got no answer within its timeout\)"):
        ext.get_action_async(eid, [0, 1], lambda *_: None)
    assert ext.num_open_episodes == 0
    assert pending.expire() is None and len(calls) == 1
    ext.stop()


def test_stop_completes_every_waiting_call_with_the_stop_error():
    ext = IdleEnv()
    waits = [call_async(ext, ext.start_episode(), [0, k]) for k in range(5)]
    assert ext.num_pending_steps == 5 and not any(calls for _, calls, _ in waits)
    ext.stop()
    for pending, calls, _ in waits:
        [(action, error, thread)] = calls
        assert action is None and type(error) is ExternalEnvStoppedError
        assert str(error) == "the ExternalEnv is stopped (stop() was called)"
        assert thread == threading.current_thread().name   # stop()'s caller
        assert pending.expire() is None and len(calls) == 1


def test_a_close_by_another_calls_timeout_fails_it_as_it_fails_a_blocked_call():
    ext = IdleEnv(action_timeout=30.0)
    eid = ext.start_episode("shared")
    _, calls, _ = call_async(ext, eid, [0, 0])
    with pytest.raises(TimeoutError):   # a second call for the episode times out: closed
        ext.get_action(eid, [0, 1], timeout=0.05)
    [(action, error, _)] = calls
    assert action is None and type(error) is ValueError
    assert str(error) == ("get_action: episode 'shared' was closed (get_action got no answer "
                          "within its timeout)")
    ext.stop()


class ClientsOnlyEnv(IdleEnv):
    """Its own loop does nothing: the test's calls are the clients."""

    def run(self):
        self.wait_stopped()


def test_back_pressure_returns_none_and_changes_nothing():
    ext = ClientsOnlyEnv(max_pending_steps=2)
    eid = ext.start_episode("bp")
    ext.log_action(eid, [0, 0], 1)
    ext.log_action(eid, [0, 1], 2)   # no slot takes them: 2 steps wait
    assert ext.get_action_async(eid, [0, 2], lambda *_: None, reward=5.0) is None
    assert ext.num_pending_steps == 2
    # Nothing was added: a slot (as the env thread steps it) takes the two
    # steps, and the next step logged carries no reward of the refused call.
    slot = ext.env_constructor()()
    try:
        first = slot.reset()
        assert int(first.step_type) == ts.StepType.FIRST and first.observation.numpy().tolist() == [[0, 0]]
        mid = slot.step(tf.constant([1]))
        assert mid.observation.numpy().tolist() == [[0, 1]] and float(mid.reward) == 0.0
        assert ext.num_pending_steps == 0
        ext.log_action(eid, [0, 2], 3)
        after = slot.step(tf.constant([2]))
        assert after.observation.numpy().tolist() == [[0, 2]] and float(after.reward) == 0.0
    finally:
        slot.close()
        ext.stop()


def test_refusals_raise_at_once_and_queue_nothing():
    ext = IdleEnv()
    eid = ext.start_episode("r")
    with pytest.raises(ValueError, match="episode 'nope' is unknown"):
        ext.get_action_async("nope", [0, 0], lambda *_: None)
    with pytest.raises(ValueError, match=r"observation: expected shape \(2,\), got \(3,\)"):
        ext.get_action_async(eid, [0, 0, 0], lambda *_: None)
    with pytest.raises(ValueError, match="before its first action"):
        ext.get_action_async(eid, [0, 0], lambda *_: None, reward=1.0)
    assert ext.num_pending_steps == 0
    ext.stop()
    with pytest.raises(ExternalEnvStoppedError):
        ext.get_action_async(eid, [0, 0], lambda *_: None)


def test_a_waiting_call_keeps_its_episode_from_the_idle_reaper():
    ext = IdleEnv(episode_idle_timeout=0.1)
    waiting = ext.start_episode("waiting")
    _, calls, _ = call_async(ext, waiting, np.array([0, 0]))
    idle = ext.start_episode("idle")
    time.sleep(0.3)
    ext.start_episode("third")   # closes idle unbound episodes first
    assert not calls and ext.num_open_episodes == 2
    with pytest.raises(ValueError, match=r"'idle' has already finished \(no call for 0.1 s"):
        ext.log_returns(idle, 1.0)
    ext.stop()
    assert len(calls) == 1 and type(calls[0][1]) is ExternalEnvStoppedError
