"""Tests of alf_async.environments.processes.subprocess_env.

Exact assertions on the tiny deterministic envs of alf_async.testing.envs
(`_obs` keeps observation[env_index, step_in_episode]).
After every test the process table is checked: no process may be left below
this one except multiprocessing's fork server and resource tracker.
"""

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import gin
import numpy as np
import pytest
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

from alf_async.environments import (
    BatchedSubprocessEnv, SubprocessEnv, SubprocessEnvClosedError, SubprocessEnvCrashError,
    create_subprocess_envs, subprocess_env_constructor)
from alf_async.testing import envs, processes
from alf_async.testing.envs import OBS_ENV, OBS_STEP

FIRST, MID, LAST = ts.StepType.FIRST, ts.StepType.MID, ts.StepType.LAST


@pytest.fixture(scope="module", autouse=True)
def forkserver_started():
    """Starts the fork server (it imports TensorFlow once, ~3 s) before timing anything."""
    SubprocessEnv(envs.counting_env).close()


@pytest.fixture(autouse=True)
def no_children_left():
    yield
    assert processes.leftover_processes() == {}
    assert [p for p in multiprocessing.active_children()
            if p.name.startswith("SubprocessEnv")] == []


def _obs(time_step):
    """[env_index, step_in_episode] of each row."""
    return np.asarray(time_step.observation)[..., [OBS_ENV, OBS_STEP]].astype(int).tolist()


def _assert_time_step(time_step, step_type, observation, reward, discount):
    assert int(time_step.step_type) == step_type
    assert _obs(time_step) == observation
    assert float(time_step.reward) == reward
    assert float(time_step.discount) == discount


# ------------------------------------------------------------------- tests


@pytest.mark.timeout(30)
def test_steps_exact_episode_and_specs():
    env = SubprocessEnv(envs.counting_env, env_index=7)
    try:
        assert env.observation_spec().shape == (3,)
        assert env.action_spec().dtype == np.int32
        _assert_time_step(env.reset(), FIRST, [7, 0], 0.0, 1.0)
        _assert_time_step(env.step(np.int32(1)), MID, [7, 1], 1.0, 1.0)
        for t in (2, 3, 4):
            _assert_time_step(env.step(0), MID, [7, t], 1.0, 1.0)
        _assert_time_step(env.step(0), LAST, [7, 5], 1.0, 0.0)
        _assert_time_step(env.step(0), FIRST, [7, 0], 0.0, 1.0)  # the child auto-resets
        assert env.get_info()["total_steps"] == 5
        assert env.restarts == 0
    finally:
        env.close()
    assert processes.gone(env.pid)
    env.close()  # idempotent
    with pytest.raises(SubprocessEnvClosedError):
        env.step(0)


@pytest.mark.timeout(30)
def test_parallel_start_of_slow_envs():
    start = time.monotonic()
    created = create_subprocess_envs([envs.slow_counting_env] * 4, env_indices=[10, 11, 12, 13])
    elapsed = time.monotonic() - start
    try:
        assert elapsed < 2.5, f"4 envs taking 1 s each were ready after {elapsed:.2f} s"
        assert [_obs(e.reset()) for e in created] == [[10, 0], [11, 0], [12, 0], [13, 0]]
        assert len({e.pid for e in created}) == 4
    finally:
        for e in created:
            e.close()


@pytest.mark.timeout(30)
def test_kill_9_mid_episode_truncates_then_restarts():
    env = SubprocessEnv(envs.counting_env, env_index=3)
    try:
        env.reset()
        env.step(0)
        _assert_time_step(env.step(0), MID, [3, 2], 1.0, 1.0)
        old_pid = env.pid
        os.kill(old_pid, signal.SIGKILL)
        # The episode in flight ends as a truncation: LAST, discount 1, reward 0,
        # the last observation the parent saw.
        _assert_time_step(env.step(0), LAST, [3, 2], 0.0, 1.0)
        assert env.restarts == 1
        assert env.pid != old_pid and processes.gone(old_pid)
        # Then a fresh episode from the new child, and stepping continues.
        _assert_time_step(env.step(0), FIRST, [3, 0], 0.0, 1.0)
        _assert_time_step(env.step(0), MID, [3, 1], 1.0, 1.0)
        _assert_time_step(env.step(0), MID, [3, 2], 1.0, 1.0)
        assert env.restarts == 1
    finally:
        env.close()


@pytest.mark.timeout(30)
def test_kill_9_between_episodes_needs_no_truncation():
    env = SubprocessEnv(envs.counting_env, env_index=4)
    try:
        os.kill(env.pid, signal.SIGKILL)  # before the first reset
        _assert_time_step(env.reset(), FIRST, [4, 0], 0.0, 1.0)
        assert env.restarts == 1
        env.step(0)
        for _ in range(3):
            env.step(0)
        _assert_time_step(env.step(0), LAST, [4, 5], 1.0, 0.0)
        os.kill(env.pid, signal.SIGKILL)  # after a LAST: no episode in flight
        _assert_time_step(env.step(0), FIRST, [4, 0], 0.0, 1.0)
        _assert_time_step(env.step(0), MID, [4, 1], 1.0, 1.0)
        assert env.restarts == 2
    finally:
        env.close()


@pytest.mark.timeout(30)
def test_env_exception_is_raised_with_child_traceback_and_not_retried():
    env = SubprocessEnv(envs.raising_env, env_index=5)
    try:
        env.reset()
        env.step(0)
        pid = env.pid
        with pytest.raises(ValueError) as info:
            env.step(0)
        assert type(info.value) is ValueError
        message = str(info.value)
        assert "injected failure at step 2" in message
        assert "Traceback (most recent call last)" in message
        assert "envs.py" in message and "in _step" in message
        assert f"pid {pid}" in message
        assert env.restarts == 0 and env.pid == pid and not processes.gone(pid)
        # The child is still up and usable.
        _assert_time_step(env.reset(), FIRST, [5, 0], 0.0, 1.0)
        _assert_time_step(env.step(0), MID, [5, 1], 1.0, 1.0)
    finally:
        env.close()
    assert processes.gone(pid)


@pytest.mark.timeout(30)
def test_unrebuildable_exception_becomes_runtime_error():
    env = SubprocessEnv(envs.counting_env)
    try:
        with pytest.raises(RuntimeError) as info:
            env.call("raise_unrebuildable")
        assert type(info.value) is RuntimeError
        assert "LocalError" in str(info.value)
        assert "unimportable exception type" in str(info.value)
        assert "in raise_unrebuildable" in str(info.value)
        assert env.restarts == 0
    finally:
        env.close()


@pytest.mark.timeout(30)
def test_build_error_is_raised_and_leaves_no_child():
    with pytest.raises(ValueError, match="injected build error") as info:
        SubprocessEnv(envs.build_error_env)
    assert "Traceback (most recent call last)" in str(info.value)
    with pytest.raises(ValueError, match="injected build error"):
        create_subprocess_envs([envs.counting_env, envs.build_error_env, envs.counting_env])


@pytest.mark.timeout(30)
def test_restart_limit_raises_dedicated_error():
    env = SubprocessEnv(envs.crashing_env, max_restarts=2, restart_window_secs=60)
    try:
        index = env.env_index
        env.reset()
        for restarts in (1, 2):
            _assert_time_step(env.step(0), LAST, [index, 0], 0.0, 1.0)  # crashed: truncation
            assert env.restarts == restarts
            _assert_time_step(env.step(0), FIRST, [index, 0], 0.0, 1.0)
        with pytest.raises(SubprocessEnvCrashError, match=r"max_restarts=2"):
            env.step(0)
        with pytest.raises(SubprocessEnvCrashError):  # and it stays failed
            env.step(0)
        assert env.restarts == 2
    finally:
        env.close()


@pytest.mark.timeout(30)
def test_restart_window_forgets_old_restarts():
    # Real time (test_recovery.py slides the window on a fake clock): 3 s is
    # far above one restart (~0.07 s idle), even on a loaded machine.
    env = SubprocessEnv(envs.crashing_env, max_restarts=1, restart_window_secs=3.0)
    try:
        env.reset()
        assert int(env.step(0).step_type) == LAST
        assert int(env.step(0).step_type) == FIRST
        time.sleep(3.1)  # the first restart leaves the window
        assert int(env.step(0).step_type) == LAST
        assert env.restarts == 2
        assert int(env.step(0).step_type) == FIRST
        with pytest.raises(SubprocessEnvCrashError, match=r"max_restarts=1"):  # 2 in 3 s
            env.step(0)
        assert env.restarts == 2
    finally:
        env.close()


@pytest.mark.timeout(30)
def test_hung_child_times_out_and_is_restarted():
    env = SubprocessEnv(envs.hanging_env, env_index=6, step_timeout=1.0)
    try:
        env.reset()
        _assert_time_step(env.step(0), MID, [6, 1], 1.0, 1.0)
        hung_pid = env.pid
        start = time.monotonic()
        _assert_time_step(env.step(0), LAST, [6, 1], 0.0, 1.0)  # the 2nd step hangs
        assert 0.9 < time.monotonic() - start < 5.0
        assert env.restarts == 1 and processes.gone(hung_pid)
        _assert_time_step(env.step(0), FIRST, [6, 0], 0.0, 1.0)
        _assert_time_step(env.step(0), MID, [6, 1], 1.0, 1.0)
    finally:
        env.close()


@pytest.mark.timeout(30)
def test_close_from_another_thread_interrupts_a_blocked_step():
    env = SubprocessEnv(envs.hanging_env, step_timeout=30.0)
    env.reset()
    env.step(0)
    errors = []

    def step():
        try:
            env.step(0)  # hangs in the child
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=step)
    thread.start()
    time.sleep(0.5)
    start = time.monotonic()
    env.close()
    thread.join(10)
    assert not thread.is_alive()
    assert time.monotonic() - start < 5.0
    assert len(errors) == 1 and isinstance(errors[0], SubprocessEnvClosedError)
    assert env.restarts == 0


@pytest.mark.timeout(30)
def test_close_leaves_no_child_after_restart_and_after_failure():
    env = SubprocessEnv(envs.counting_env)
    limited = SubprocessEnv(envs.crashing_env, max_restarts=0)
    pids = [env.pid, limited.pid]
    try:
        env.reset()
        os.kill(env.pid, signal.SIGKILL)
        env.reset()
        pids.append(env.pid)
        limited.reset()
        with pytest.raises(SubprocessEnvCrashError, match="max_restarts=0"):
            limited.step(0)
        assert processes.leftover_processes().keys() == {env.pid}
    finally:
        env.close()
        limited.close()
    assert all(processes.gone(pid) for pid in pids)


@pytest.mark.timeout(30)
def test_subprocess_env_constructor_batched_concurrent_calls_and_restart():
    env_constructor = subprocess_env_constructor(envs.counting_env, num_envs=2,
                                                 step_timeout=10.0)
    tf_envs = [None, None]

    def make(i):
        tf_envs[i] = env_constructor()

    threads = [threading.Thread(target=make, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert all(e is not None and e.batch_size == 2 for e in tf_envs)
        first = [_obs(e.reset()) for e in tf_envs]
        indices = sorted(row[0] for obs in first for row in obs)
        assert indices == [0, 1, 2, 3]  # distinct envs ...
        assert sorted(obs[0][0] for obs in first) == [0, 2]  # ... in blocks of num_envs
        assert all(row[1] == 0 for obs in first for row in obs)

        tf_env = tf_envs[0]
        base = first[0][0][0]
        step = tf_env.step(tf.zeros([2], tf.int32))
        assert _obs(step) == [[base, 1], [base + 1, 1]]
        assert step.step_type.numpy().tolist() == [MID, MID]

        os.kill(tf_env.pyenv.envs[0].pid, signal.SIGKILL)
        step = tf_env.step(tf.zeros([2], tf.int32))
        assert step.step_type.numpy().tolist() == [LAST, MID]
        assert step.discount.numpy().tolist() == [1.0, 1.0]
        assert step.reward.numpy().tolist() == [0.0, 1.0]
        assert _obs(step) == [[base, 1], [base + 1, 2]]
        assert tf_env.restarts == 1 and tf_env.restarts_per_env == [1, 0]
        step = tf_env.step(tf.zeros([2], tf.int32))
        assert step.step_type.numpy().tolist() == [FIRST, MID]
        assert _obs(step) == [[base, 0], [base + 1, 3]]
        assert tf_envs[1].restarts == 0
    finally:
        for e in tf_envs:
            if e is not None:
                e.close()


@pytest.mark.timeout(30)
def test_batched_env_drains_all_replies_when_one_raises():
    created = create_subprocess_envs([envs.counting_env, envs.raising_env], env_indices=[0, 1])
    batched = BatchedSubprocessEnv(created)
    try:
        batched.reset()
        batched.step(np.zeros([2], np.int32))
        with pytest.raises(ValueError, match="injected failure"):
            batched.step(np.zeros([2], np.int32))
        # Both pipes are still in step: the next step answers normally.
        step = batched.step(np.zeros([2], np.int32))
        assert _obs(step) == [[0, 3], [1, 2]]
    finally:
        batched.close()


@pytest.mark.timeout(30)
def test_gym_env_is_wrapped_in_the_child():
    env = SubprocessEnv(envs.counting_gym_env, env_index=9)
    try:
        assert env.observation_spec().dtype == np.float32
        _assert_time_step(env.reset(), FIRST, [9, 0], 0.0, 1.0)
        _assert_time_step(env.step(np.int64(1)), MID, [9, 1], 1.0, 1.0)
        _assert_time_step(env.step(np.int64(1)), MID, [9, 2], 1.0, 1.0)
        _assert_time_step(env.step(np.int64(1)), LAST, [9, 3], 1.0, 0.0)
    finally:
        env.close()


@gin.configurable
def parent_only_configurable(value=0):
    """Configured in the parent; never imported in the child (its binding is skipped there)."""
    return value


@pytest.mark.timeout(30)
def test_gin_config_reaches_the_child():
    gin.parse_config("""
        gin_counting_env.episode_length = 2
        parent_only_configurable.value = 3
    """)
    try:
        env = SubprocessEnv(envs.gin_counting_env, env_index=1)
    finally:
        gin.clear_config()
    try:
        env.reset()
        _assert_time_step(env.step(0), MID, [1, 1], 1.0, 1.0)
        _assert_time_step(env.step(0), LAST, [1, 2], 1.0, 0.0)  # episode_length 2, not 5
        os.kill(env.pid, signal.SIGKILL)  # a restarted child gets the same config
        env.step(0)
        env.step(0)
        _assert_time_step(env.step(0), LAST, [1, 2], 1.0, 0.0)
        assert env.restarts == 1
    finally:
        env.close()


@pytest.mark.timeout(10)
def test_unpicklable_env_constructor_is_refused_in_the_parent():
    lock = threading.Lock()
    with pytest.raises(TypeError, match="cannot be pickled"):
        SubprocessEnv(lambda: lock)
    with pytest.raises(ValueError):
        SubprocessEnv(envs.counting_env, step_timeout=0)


_EXIT_SCRIPT = textwrap.dedent("""
    import threading
    from tf_agents.system import multiprocessing as tfa_multiprocessing
    from alf_async.environments.processes.subprocess_env import SubprocessEnv
    from alf_async.testing import envs

    def main(argv):
        env = SubprocessEnv(envs.counting_env)
        env.reset()
        env.step(0)
        hung = SubprocessEnv(envs.hanging_env, step_timeout=60)
        hung.reset()
        hung.step(0)
        threading.Thread(target=hung.step, args=(0,), daemon=True).start()  # blocks
        print("PIDS", env.pid, hung.pid, flush=True)
        # No close(): interpreter exit must stop both children.

    if __name__ == "__main__":
        tfa_multiprocessing.handle_main(main)
""")


@pytest.mark.timeout(60)
def test_interpreter_exit_without_close_leaves_no_child(tmp_path):
    script = tmp_path / "exit_without_close.py"
    script.write_text(_EXIT_SCRIPT)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=50)
    assert result.returncode == 0, result.stderr[-3000:]
    pids = [int(p) for line in result.stdout.splitlines() if line.startswith("PIDS")
            for p in line.split()[1:]]
    assert len(pids) == 2
    deadline = time.monotonic() + 5
    while not all(processes.gone(p) or processes.process_table().get(p, (0, "", ""))[1] == "Z" for p in pids):
        assert time.monotonic() < deadline, f"children {pids} survived the interpreter"
        time.sleep(0.1)
