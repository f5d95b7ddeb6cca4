"""The rows of a batch of SubprocessEnvs stepped by their env thread with no
worker threads (subprocess_rows.py): each row gets its own actions in every
actor batch size, a straggler never holds up the others, a hung child is
restarted as a truncation while the other rows go on, and stop ends rows
blocked in a step."""

import functools
import os
import threading
import time
import types

import numpy as np
import pytest

from alf_async.driver.env_rows import row_envs, row_stepper
from alf_async.environments import subprocess_env_constructor
from alf_async.testing import envs
from alf_async.testing.envs import OBS_STEP, BlockingCountingEnv, CountingEnv
from test_dynamic_batching import (BatchSizePolicy, assert_continuous_and_routed,
                                   assert_straggler_never_holds_up_the_others, batch_sizes,
                                   collect_until, every_batch_size_and_row, make, rows_by_env)

pytestmark = pytest.mark.timeout(120)

FIRST, LAST = 0, 2


def row_threads():
    return [t.name for t in threading.enumerate() if "_row" in t.name]


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead for our purposes
        return f.read().split(")")[-1].split()[0] != "Z"


def test_subprocess_rows_are_stepped_without_worker_threads():
    tf_env = subprocess_env_constructor(CountingEnv, num_envs=2)()
    try:
        stepper = row_stepper("env0", row_envs(tf_env), types.SimpleNamespace(record=None))
        assert type(stepper).__name__ == "SubprocessRows"
        stepper.close()
    finally:
        tf_env.close()


def one_thread_of_child_rows(env_constructor, B, T, **kwargs):
    """A driver of one env thread over B SubprocessEnv rows of `env_constructor`
    (SubprocessEnv options in kwargs) whose policy records its batch size."""
    return make(subprocess_env_constructor(env_constructor, num_envs=B, **kwargs),
                BatchSizePolicy, num_envs=1, unroll_length=T, learn_queue_cap=1)


def test_rows_in_child_processes_get_their_own_actions_in_every_batch_size():
    B, T = 4, 3
    driver = one_thread_of_child_rows(
        functools.partial(BlockingCountingEnv, latency=envs.uniform_latency), B, T)
    driver.start()
    try:
        batches = collect_until(driver, every_batch_size_and_row(B), 400)
        assert row_threads() == []   # the env thread waits on the pipes itself
    finally:
        driver.stop()
    assert batch_sizes(batches) == [1, 2, 3, 4]
    assert_continuous_and_routed(batches, B)


def test_a_straggler_child_never_holds_up_the_other_rows():
    B, T = 4, 2
    assert_straggler_never_holds_up_the_others(one_thread_of_child_rows(
        functools.partial(BlockingCountingEnv, latency=envs.straggler_latency), B, T), B, T)


def test_a_hung_child_is_restarted_as_a_truncation_while_the_other_rows_go_on():
    B, T = 3, 2
    driver = one_thread_of_child_rows(functools.partial(envs.first_env_hangs, hang_on_step=3),
                                      B, T, step_timeout=1.0)
    driver.start()
    try:
        # Row 0's third step hangs for step_timeout (1 s); rows 1 and 2 keep
        # stepping (the learner's batches are whatever rows completed), so
        # collect until row 0 has shown its truncation and a fresh episode.
        # (The new child hangs again at its own 3rd step, 1 s later, so row
        # 0 may be restarted twice by the time the restarts are read.)
        batches = collect_until(driver, lambda b: len(rows_by_env(b).get(0, [])) >= 3, 50_000)
        restarts = driver.environments[0].pyenv.restarts_per_env
    finally:
        driver.stop()
    assert restarts[0] in (1, 2) and restarts[1:] == [0, 0]
    rows = rows_by_env(batches)
    row0 = rows[0]
    next_step_type = np.concatenate([u.next_step_type for u in row0])
    step_type = np.concatenate([u.step_type for u in row0])
    discount = np.concatenate([u.discount for u in row0])
    obs = np.concatenate([u.observation for u in row0])
    # CountingEnv's episodes are 5 steps: LAST at step 5 would end one, so
    # the first LAST is the truncation at the hung 3rd step: discount 1.
    k = int(np.flatnonzero(next_step_type == LAST)[0])
    assert k == 2 and discount[k] == 1.0
    assert step_type[k + 1] == LAST and step_type[k + 2] == FIRST and obs[k + 2, OBS_STEP] == 0
    # While row 0 hung (1 s), the other rows stepped on: many more steps each.
    others = [len(rows[r]) * T for r in (1, 2)]
    assert min(others) >= 10 * len(row0) * T, (others, len(row0) * T)


def test_stop_ends_rows_blocked_in_their_children_and_leaves_no_child():
    driver = one_thread_of_child_rows(functools.partial(envs.first_env_hangs, hang_on_step=1),
                                      2, 2, step_timeout=60.0)
    driver.start()
    collect_until(driver, lambda b: False, 3)   # row 1 steps; row 0 hangs in its first step
    pids = list(driver.environments[0].pyenv.pids)
    start = time.monotonic()
    driver.stop()
    assert time.monotonic() - start < 5.0
    for pid in pids:
        assert not alive(pid), f"child {pid} left behind"
