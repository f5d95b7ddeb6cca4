"""The shared-memory transport of SubprocessEnv (issue 92), through the public API.

Exact tests on tiny deterministic environments (alf_async.testing.envs and
.shm_envs): trajectories equal the pickled pipe's row by row, in lockstep
and rows stepping, with one or two environments per process; a crash, an
exception or a hang behaves as with the pipe; no process, no ``/dev/shm``
entry and no segment descriptor is left, even when the driver's process is
killed; specs shared memory cannot hold are refused in one line.

Each test also checks that shared memory is really used (the children map
the segment), so that a comparison with the pipe compares two transports.
"""

import functools
import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.trajectories import time_step as ts
from tf_agents.utils import nest_utils

from alf_async.environments import (BatchedSubprocessEnv, SubprocessEnv, create_subprocess_envs,
                                    subprocess_env_constructor)
from alf_async.testing import envs, processes, shm_envs
from alf_async.testing.envs import OBS_ENV, OBS_STEP, CountingEnv

FIRST, MID, LAST = int(ts.StepType.FIRST), int(ts.StepType.MID), int(ts.StepType.LAST)
SHM, PIPE = "shared_memory", "pipe"
SEGMENT = "memfd:alf_async_env_slots"
N = 4   # rows of a batch

pytestmark = pytest.mark.timeout(30)


# ------------------------------------------------- processes and segments


def _shm_listing():
    return sorted(os.listdir("/dev/shm"))


def _segment_fds(pid="self"):
    """fd -> segment (its inode) of the descriptors of process `pid` open on
    a segment (an mmap holds a descriptor of its own)."""
    found = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/" + SEGMENT):
                found[fd] = os.stat(f"/proc/{pid}/fd/{fd}").st_ino
        except OSError:
            pass
    return found


def _segments(pid="self"):
    """The segments process `pid` holds a descriptor of."""
    return set(_segment_fds(pid).values())


def _maps_segment(pid="self"):
    with open(f"/proc/{pid}/maps") as f:
        return SEGMENT in f.read()


def _assert_transport(transport, pids):
    """The children map a segment with shared memory, and none with the pipe."""
    assert [_maps_segment(pid) for pid in pids] == [transport == SHM] * len(pids)


@pytest.fixture(scope="module", autouse=True)
def forkserver_started():
    """Starts the fork server (it imports TensorFlow once) before the tests."""
    SubprocessEnv(CountingEnv).close()


@pytest.fixture(autouse=True)
def leaves_nothing():
    """No process, /dev/shm entry or segment descriptor is left by a test."""
    shm, segments = _shm_listing(), _segments()
    yield
    assert processes.leftover_processes() == {}
    assert _shm_listing() == shm
    if not _segments() <= segments:
        gc.collect()   # slow with TensorFlow loaded: only when needed
        assert _segments() <= segments


# ------------------------------------------------------------- trajectories


def _action(nested, row, k):
    """Row `row`'s action at its `k`-th step: the same in every run."""
    move = np.int32((3 * row + 5 * k + k * k) % shm_envs.NUM_MOVES)
    if not nested:
        return move
    force = np.array([((row + k) % 5 - 2) / 2.0, ((row * k) % 3 - 1) / 4.0], np.float32)
    return {"move": move, "force": force}


def _actions(nested, rows, ks):
    return nest_utils.stack_nested_arrays([_action(nested, r, k) for r, k in zip(rows, ks)])


def _assert_same(a, b, where):
    """Same structure, and every leaf the same shape, dtype and values."""
    tf.nest.assert_same_structure(a, b)
    for leaf, (x, y) in enumerate(zip(tf.nest.flatten(a), tf.nest.flatten(b))):
        x, y = np.asarray(x), np.asarray(y)
        assert (x.dtype, x.shape) == (y.dtype, y.shape) and np.array_equal(x, y), \
            f"{where}, leaf {leaf}: {x!r} != {y!r}"


def _row(batch, r):
    return tf.nest.map_structure(lambda a: np.asarray(a)[r], batch)


def _assert_same_rows(runs, where):
    """Runs of batches (lists of batched time steps) equal row by row."""
    first = runs[0]
    for run in runs[1:]:
        assert len(run) == len(first)
        for k, (x, y) in enumerate(zip(first, run)):
            for r in range(N):
                _assert_same(_row(x, r), _row(y, r), f"{where}: step {k}, row {r}")


def _ctor(nested):
    return shm_envs.nested_echo_env if nested else shm_envs.EchoEnv


def _lockstep(batched, transport, nested, steps=14, hook=None):
    """Steps `batched` (closed after) `steps` times; returns its time steps."""
    try:
        _assert_transport(transport, batched.pids)
        out = [batched.reset()]
        for k in range(1, steps + 1):
            if hook is not None:
                hook(batched, k)
            out.append(batched.step(_actions(nested, range(N), [k] * N)))
        return out
    finally:
        batched.close()


def _own_segments(ctor, transport):
    """A BatchedSubprocessEnv over SubprocessEnvs that each have a segment."""
    return BatchedSubprocessEnv([SubprocessEnv(ctor, env_index=i, transport=transport)
                                 for i in range(N)])


def _one_segment(ctor, transport, **kwargs):
    return BatchedSubprocessEnv(create_subprocess_envs([ctor] * N, env_indices=range(N),
                                                       transport=transport, **kwargs))


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
@pytest.mark.parametrize("make", [_one_segment, _own_segments], ids=["one_segment", "own"])
def test_lockstep_trajectories_equal_the_pipes_row_by_row(make, nested):
    runs = [_lockstep(make(_ctor(nested), t), t, nested) for t in (PIPE, SHM)]
    _assert_same_rows(runs, "pipe vs shared memory")
    step_types = np.array([b.step_type for b in runs[1]])
    assert all((step_types[:, r] == LAST).sum() >= 2 for r in range(N))  # several episodes
    assert len({tuple(np.asarray(b.step_type)) for b in runs[1]}) > 2     # at different times


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
def test_envs_per_process_trajectories_equal(nested):
    runs = []
    for transport, k in ((PIPE, 2), (SHM, 2), (SHM, 1)):
        tf_env = subprocess_env_constructor(_ctor(nested), num_envs=N, envs_per_process=k,
                                            transport=transport)()
        assert [e.envs_per_process for e in tf_env.pyenv.envs] == [k] * (N // k)
        runs.append(_lockstep(tf_env.pyenv, transport, nested))
    _assert_same_rows(runs, "pipe k=2, shared memory k=2, shared memory k=1")


def _step_rows(subprocess_envs, nested, steps, before_send=None):
    """Steps each row `steps` times through SubprocessEnv.row_stepper, the
    rows at different times (row r waits r + 1 polls before each send).

    Returns:
        (each row's time steps, the rows of each send).
    """
    n = len(subprocess_envs)
    seqs = [[] for _ in range(n)]
    stepper = subprocess_envs[0].row_stepper(
        subprocess_envs, lambda row, time_step, applied: seqs[row].append(time_step))
    assert type(stepper).__name__ == "SubprocessRows"
    pending, sends, tick = set(range(n)), [], 0
    deadline = time.monotonic() + 20
    stepper.start()
    try:
        while pending or any(len(s) <= steps for s in seqs):
            assert time.monotonic() < deadline, [len(s) for s in seqs]
            for row, failed in stepper.recv(0.002):
                if failed is not None:
                    raise failed.error
                pending.discard(row)
            tick += 1
            due = [r for r in range(n) if r not in pending and len(seqs[r]) <= steps
                   and tick % (r + 1) == 0]
            if due:
                for r in due:
                    if before_send is not None:
                        before_send(r, len(seqs[r]))
                stepper.send(due, _actions(nested, due, [len(seqs[r]) for r in due]))
                pending.update(due)
                sends.append(due)
    finally:
        stepper.close()
    return seqs, sends


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
def test_rows_stepping_trajectories_equal_the_pipes_row_by_row(nested):
    steps, runs = 14, []
    for transport in (PIPE, SHM):
        created = create_subprocess_envs([_ctor(nested)] * N, env_indices=range(N),
                                         transport=transport)
        try:
            _assert_transport(transport, [e.pid for e in created])
            seqs, sends = _step_rows(created, nested, steps)
        finally:
            BatchedSubprocessEnv(created).close()
        assert any(len(rows) < N for rows in sends)   # rows stepped at different times
        runs.append(seqs)
    # Row r's k-th action is the same in lockstep: so are its time steps.
    lockstep = _lockstep(_one_segment(_ctor(nested), SHM), SHM, nested, steps)
    for r in range(N):
        assert len(runs[0][r]) == len(runs[1][r]) == steps + 1
        for k in range(steps + 1):
            _assert_same(runs[0][r][k], runs[1][r][k], f"pipe vs shm: row {r}, step {k}")
            _assert_same(_row(lockstep[k], r), runs[1][r][k], f"lockstep: row {r}, step {k}")


# ---------------------------------------------------------------- crashes


def _obs(time_step):
    """[env_index, step_in_episode] of each row of CountingEnv time steps."""
    return np.asarray(time_step.observation)[..., [OBS_ENV, OBS_STEP]].tolist()


def _kill(pid):
    os.kill(pid, signal.SIGKILL)


def test_kill_9_in_lockstep_truncates_then_first_as_the_pipe():
    def kill_row_1(batched, k):
        if k == 3:
            pids[transport] = batched.pids
            _kill(batched.envs[1].pid)

    runs, pids = {}, {}
    for transport in (PIPE, SHM):
        batched = _one_segment(CountingEnv, transport)
        runs[transport] = _lockstep(batched, transport, False, steps=5, hook=kill_row_1)
        assert batched.restarts_per_env == [0, 1, 0, 0]
        assert all(processes.gone(pid) for pid in pids[transport] + batched.pids)
    _assert_same_rows([runs[PIPE], runs[SHM]], "pipe vs shared memory")
    run = runs[SHM]
    assert [int(b.step_type[1]) for b in run] == [FIRST, MID, MID, LAST, FIRST, MID]
    truncation = _row(run[3], 1)
    assert (float(truncation.reward), float(truncation.discount)) == (0.0, 1.0)
    assert _obs(truncation) == [1, 2] == _obs(_row(run[2], 1))   # the last observation
    assert [_obs(b)[1] for b in run[4:]] == [[1, 0], [1, 1]]
    assert [_obs(b)[0] for b in run] == [[0, t] for t in range(6)]   # the others go on


def test_kill_9_in_rows_stepping_truncates_then_first_as_the_pipe():
    runs = {}
    for transport in (PIPE, SHM):
        created = create_subprocess_envs([CountingEnv] * 3, env_indices=range(3),
                                         transport=transport)
        killed = []

        def kill_row_1(row, k):
            if row == 1 and k == 3:
                killed.append(created[1].pid)
                _kill(created[1].pid)

        try:
            runs[transport], _ = _step_rows(created, False, 6, before_send=kill_row_1)
            assert [e.restarts for e in created] == [0, 1, 0]
            _assert_transport(transport, [e.pid for e in created])   # the restarted child too
        finally:
            BatchedSubprocessEnv(created).close()
        assert processes.gone(killed[0])
    for r in range(3):
        for k, (x, y) in enumerate(zip(runs[PIPE][r], runs[SHM][r])):
            _assert_same(x, y, f"pipe vs shared memory: row {r}, step {k}")
    row = runs[SHM][1]
    assert [int(t.step_type) for t in row] == [FIRST, MID, MID, LAST, FIRST, MID, MID]
    assert (float(row[3].reward), float(row[3].discount), _obs(row[3])) == (0.0, 1.0, [1, 2])
    assert [_obs(t) for t in row[4:]] == [[1, 0], [1, 1], [1, 2]]


def test_kill_9_with_two_envs_per_process_ends_both_rows_episodes():
    runs = {}
    for transport in (PIPE, SHM):
        tf_env = subprocess_env_constructor(CountingEnv, num_envs=N, envs_per_process=2,
                                            transport=transport)()
        batched = tf_env.pyenv
        runs[transport] = _lockstep(
            batched, transport, False, steps=5,
            hook=lambda b, k: _kill(b.envs[0].pid) if k == 3 else None)
        assert batched.restarts_per_env == [1, 0]
    _assert_same_rows([runs[PIPE], runs[SHM]], "pipe vs shared memory")
    run = runs[SHM]
    assert [np.asarray(b.step_type).tolist() for b in run[2:5]] == [
        [MID] * 4, [LAST, LAST, MID, MID], [FIRST, FIRST, MID, MID]]
    assert np.asarray(run[3].reward).tolist() == [0.0, 0.0, 1.0, 1.0]
    assert np.asarray(run[3].discount).tolist() == [1.0] * 4
    assert _obs(run[3]) == [[0, 2], [1, 2], [2, 3], [3, 3]]
    assert _obs(run[4])[:2] == [[0, 0], [1, 0]]


def test_env_exceptions_keep_their_type_and_the_childs_traceback():
    def assert_from_child(error, pid):
        assert type(error) is ValueError
        message = str(error)
        assert "injected failure at step 2" in message and f"pid {pid}" in message
        assert "Traceback (most recent call last)" in message and "in _step" in message

    env = SubprocessEnv(envs.raising_env, env_index=5, transport=SHM)
    try:
        env.reset()
        env.step(np.int32(0))
        with pytest.raises(ValueError) as info:
            env.step(np.int32(0))
        assert_from_child(info.value, env.pid)
        assert env.restarts == 0 and _obs(env.step(np.int32(0))) == [5, 2]   # still up
    finally:
        env.close()
    batched = BatchedSubprocessEnv(create_subprocess_envs(
        [envs.counting_env, envs.raising_env], env_indices=[0, 1], transport=SHM))
    try:
        batched.reset()
        batched.step(np.zeros(2, np.int32))
        with pytest.raises(ValueError) as info:
            batched.step(np.zeros(2, np.int32))
        assert_from_child(info.value, batched.pids[1])
        assert _obs(batched.step(np.zeros(2, np.int32))) == [[0, 3], [1, 2]]
    finally:
        batched.close()
    # Rows stepping: the row reports the error (RowFailed).
    env = SubprocessEnv(envs.raising_env, env_index=1, transport=SHM)
    stepper = env.row_stepper([env], lambda row, time_step, applied: None)
    try:
        stepper.start()
        for _ in range(2):   # the reset's reply, then the 1st step's
            assert stepper.recv(5.0) == [(0, None)]
            stepper.send([0], np.zeros(1, np.int32))
        [(row, failed)] = stepper.recv(5.0)
        assert row == 0 and failed is not None
        assert_from_child(failed.error, env.pid)
    finally:
        stepper.close()
        env.close()


_RAISES_AT_300 = functools.partial(CountingEnv, raise_on_step=300, episode_length=999)


@pytest.mark.parametrize("transport, make, match", [
    (PIPE, _RAISES_AT_300, "injected failure at step 300"),
    (SHM, _RAISES_AT_300, "injected failure at step 300"),
    (SHM, functools.partial(shm_envs.WrongObservationEnv, on_step=300), "does not match"),
], ids=["pipe", "shared_memory", "shared_memory_refusal"])
def test_an_error_after_256_requests_is_still_raised(transport, make, match):
    """The child's reply to a frame carries the request's number mod 256: an
    error reply must still be taken for the answer to its request."""
    env = SubprocessEnv(make, step_timeout=2.0, transport=transport)
    try:
        env.reset()
        for _ in range(299):
            env.step(np.int32(0))
        with pytest.raises(ValueError, match=match):
            env.step(np.int32(0))
        assert env.restarts == 0
    finally:
        env.close()


def test_step_timeout_restarts_a_hung_child():
    env = SubprocessEnv(envs.hanging_env, env_index=6, step_timeout=1.0, transport=SHM)
    batched = BatchedSubprocessEnv(create_subprocess_envs(
        [envs.counting_env, envs.hanging_env], env_indices=[0, 1], step_timeout=1.0,
        transport=SHM))
    try:
        env.reset()
        assert _obs(env.step(np.int32(0))) == [6, 1]
        hung = env.pid
        start = time.monotonic()
        step = env.step(np.int32(0))   # its 2nd step hangs
        assert 0.9 < time.monotonic() - start < 5.0
        assert (int(step.step_type), float(step.reward), float(step.discount),
                _obs(step)) == (LAST, 0.0, 1.0, [6, 1])
        assert env.restarts == 1 and processes.gone(hung)
        step = env.step(np.int32(0))
        assert (int(step.step_type), _obs(step)) == (FIRST, [6, 0])
        batched.reset()
        batched.step(np.zeros(2, np.int32))
        hung = batched.pids[1]
        step = batched.step(np.zeros(2, np.int32))
        assert np.asarray(step.step_type).tolist() == [MID, LAST]
        assert _obs(step) == [[0, 2], [1, 1]] and np.asarray(step.discount).tolist() == [1, 1]
        assert batched.restarts_per_env == [0, 1] and processes.gone(hung)
        _assert_transport(SHM, batched.pids)
        step = batched.step(np.zeros(2, np.int32))
        assert np.asarray(step.step_type).tolist() == [MID, FIRST]
    finally:
        env.close()
        batched.close()
    assert all(processes.gone(pid) for pid in [env.pid] + batched.pids)


# ------------------------------------------------------- segments left behind


def test_no_segment_is_left_after_close_or_after_a_restart():
    """One descriptor in the parent for a batch's segment, the same after a
    child's kill -9 and restart; none, and no mapping, once closed and
    collected (the fixture checks /dev/shm and processes)."""
    gc.collect()
    assert _segments() == set()
    batched = _one_segment(CountingEnv, SHM)
    pids = batched.pids
    assert len(_segments()) == 1 and _maps_segment()
    batched.reset()
    batched.step(np.zeros(N, np.int32))
    _kill(pids[2])
    batched.step(np.zeros(N, np.int32))
    assert batched.restarts == 1 and len(_segments()) == 1
    _assert_transport(SHM, batched.pids)
    batched.close()
    assert all(processes.gone(pid) for pid in pids + batched.pids)
    del batched
    gc.collect()
    assert _segment_fds() == {} and not _maps_segment()


_DRIVER = textwrap.dedent("""
    import time
    import numpy as np
    from alf_async.environments import SubprocessEnv, subprocess_env_constructor
    from alf_async.testing.envs import CountingEnv

    if __name__ == "__main__":
        batched = subprocess_env_constructor(CountingEnv, num_envs=4, envs_per_process=2)().pyenv
        single = SubprocessEnv(CountingEnv, env_index=9)
        batched.reset()
        single.reset()
        for _ in range(3):
            batched.step(np.zeros(4, np.int32))
            single.step(np.int32(0))
        print("PIDS", *batched.pids, single.pid, flush=True)
        time.sleep(60)
""")


@pytest.mark.timeout(60)
def test_sigkill_of_the_drivers_process_leaves_no_process_and_no_segment(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER)
    shm = _shm_listing()
    with open(tmp_path / "stderr", "w") as stderr:
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                                stderr=stderr, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("PIDS"), (line, (tmp_path / "stderr").read_text()[-3000:])
        pids = [int(p) for p in line.split()[1:]]
        below = processes.descendants(proc.pid)   # the children, the fork server, the resource tracker
        assert len(pids) == 3 and set(pids) <= set(below)
        assert all(_maps_segment(pid) for pid in pids) and len(_segments(proc.pid)) == 2
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 5
    while not all(processes.gone(pid) for pid in below):
        assert time.monotonic() < deadline, {p: below[p] for p in below if not processes.gone(p)}
        time.sleep(0.05)
    assert _shm_listing() == shm


# ---------------------------------------------------------------- refusals


def _one_line(error):
    assert "\n" not in str(error), str(error)
    return str(error)


@pytest.mark.parametrize("dtype", ["object", "str"])
def test_a_spec_shared_memory_cannot_hold_is_refused_in_one_line(dtype):
    ctor = functools.partial(shm_envs.UnsupportedDtypeEnv, dtype)
    for make in (lambda: SubprocessEnv(ctor),
                 lambda: subprocess_env_constructor(ctor, num_envs=2)()):
        with pytest.raises(TypeError) as info:
            make()
        message = _one_line(info.value)
        assert f"dtype {np.dtype(dtype)}" in message and "transport='pipe'" in message
    env = SubprocessEnv(ctor, transport=PIPE)   # the pipe carries it
    try:
        assert env.reset().observation == np.array("observation 1", dtype)
        assert env.step(np.int32(0)).observation == np.array("observation 2", dtype)
    finally:
        env.close()


@pytest.mark.parametrize("kwargs, got", [
    (dict(shape=(2,)), "shape (2,)"),
    (dict(shape=(3,), dtype="float64"), "dtype float64"),
    (dict(shape=(4,), on_step=2), "shape (4,)"),
], ids=["reset_shape", "reset_dtype", "step_shape"])
def test_an_observation_that_does_not_match_its_spec_is_refused_in_one_line(kwargs, got):
    env = SubprocessEnv(functools.partial(shm_envs.WrongObservationEnv, **kwargs), transport=SHM)
    try:
        with pytest.raises(ValueError) as info:
            env.reset()
            for _ in range(kwargs.get("on_step") or 0):
                env.step(np.int32(0))
        message = _one_line(info.value)
        assert got in message and "shape (3,)" in message and "int32" in message
        assert "does not match its spec" in message
        assert env.restarts == 0
    finally:
        env.close()


def test_bad_transport_and_envs_per_process_are_refused_in_one_line():
    for make in (lambda: SubprocessEnv(CountingEnv, transport="tcp"),
                 lambda: subprocess_env_constructor(CountingEnv, transport="tcp"),
                 lambda: create_subprocess_envs([CountingEnv], transport="tcp")):
        with pytest.raises(ValueError, match="transport") as info:
            make()
        assert "'tcp'" in _one_line(info.value)
    for make in (lambda: subprocess_env_constructor(CountingEnv, num_envs=4, envs_per_process=3),
                 lambda: create_subprocess_envs([CountingEnv] * 4, envs_per_process=3),
                 lambda: subprocess_env_constructor(CountingEnv, num_envs=4, envs_per_process=0),
                 lambda: SubprocessEnv(CountingEnv, envs_per_process=0)):
        with pytest.raises(ValueError, match="envs_per_process") as info:
            make()
        _one_line(info.value)


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
def test_a_wrong_batch_of_actions_is_refused_and_the_envs_stay_usable(nested, k):
    batched = subprocess_env_constructor(_ctor(nested), num_envs=N, envs_per_process=k)().pyenv
    try:
        _assert_transport(SHM, batched.pids)
        first = batched.reset()
        for rows in (N - 1, N + 1):
            with pytest.raises(ValueError):
                batched.step(_actions(nested, range(rows), [1] * rows))
        step = batched.step(_actions(nested, range(N), [1] * N))
        assert np.asarray(step.step_type).tolist() == [MID] * N
        counts = step.observation["counts"] if nested else step.observation[:, :3]
        first_counts = first.observation["counts"] if nested else first.observation[:, :3]
        assert np.asarray(counts).tolist() == [[r, 1, 1] for r in range(N)]
        assert np.asarray(first_counts).tolist() == [[r, 0, 0] for r in range(N)]
    finally:
        batched.close()


def test_python_numbers_and_wider_dtypes_are_cast_to_the_specs():
    env = SubprocessEnv(shm_envs.PythonNumbersEnv, transport=SHM)
    try:
        first = env.reset()
        steps = [env.step(np.int32(a)) for a in (2, 3)]
    finally:
        env.close()
    spec = env.time_step_spec()
    for time_step in [first] + steps:
        for value, leaf in zip(tf.nest.flatten(time_step), tf.nest.flatten(spec)):
            assert value.dtype == leaf.dtype and value.shape == leaf.shape
    assert [int(t.step_type) for t in [first] + steps] == [0, 1, 1]
    assert [float(t.reward) for t in steps] == [0.5, 1.0]
    assert [t.observation.tolist() for t in steps] == [[1.0, 2.0], [2.0, 3.0]]
