"""suite_envpool: one EnvPool pool as one batched TFEnvironment, with
suite_atari's and suite_gymnasium's specs, tf-agents' step semantics, seeded
reproducibility, lockstep under tf-agents' DynamicStepDriver, and EnvPool's
asynchronous mode as the driver's row stepping: each row a continuous stream,
no Python thread per row, a row that is not ready holding up no other, and a
stop that returns at once; with `stepping='lockstep'` the same continuous
streams from the env thread's graph loop."""

import os
import sys
import threading
import time
import types
import zlib

import gin
import numpy as np
import pytest
import tensorflow as tf
from tf_agents.drivers import dynamic_step_driver
from tf_agents.policies import random_tf_policy

from alf_async import AsyncOffPolicyDriver
from alf_async.driver.env_rows import row_envs, row_stepper
from alf_async.environments.suites import suite_envpool
from alf_async.environments import suites
from alf_async.environments.capabilities import steps_block
from conftest import driver_threads
from test_dynamic_batching import collect_until, rows_by_env

pytestmark = pytest.mark.timeout(120)

FIRST, LAST = 0, 2


def random_actions(env, rng, n):
    """n random actions of `env`'s (unbatched) action spec."""
    spec = env.action_spec()
    if spec.dtype == np.int64:
        return rng.integers(spec.minimum, spec.maximum + 1, n).astype(np.int64)
    return rng.uniform(spec.minimum, spec.maximum, (n,) + spec.shape).astype(spec.dtype)


def run_lockstep(env, steps, seed=0):
    """Steps a batched PyEnvironment with seeded random actions; the time steps
    (the reset's first), as numpy."""
    rng = np.random.default_rng(seed)
    out = [env.reset()]
    for _ in range(steps):
        out.append(env.step(random_actions(env, rng, env.batch_size)))
    return out


def row(time_steps, b):
    """Row b's step types, rewards, discounts and observations over `time_steps`."""
    return (np.array([t.step_type[b] for t in time_steps]),
            np.array([t.reward[b] for t in time_steps]),
            np.array([t.discount[b] for t in time_steps]),
            np.array([t.observation[b] for t in time_steps]))


def assert_one_line_value_error(match, fn, *args, **kwargs):
    with pytest.raises(ValueError, match=match) as info:
        fn(*args, **kwargs)
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------ specs


def test_atari_specs_and_settings_are_suite_atari_s():
    tf_env = suites.load("suite_envpool", "Breakout-v5", batch_size=2, seed=1, num_threads=None)
    env = tf_env.pyenv
    try:
        obs_spec, action_spec = env.observation_spec(), env.action_spec()
        assert (obs_spec.shape, obs_spec.dtype) == ((84, 84, 4), np.uint8)
        assert (np.min(obs_spec.minimum), np.max(obs_spec.maximum)) == (0, 255)
        assert (action_spec.shape, action_spec.dtype) == ((), np.int64)
        assert (action_spec.minimum, action_spec.maximum) == (0, 3)   # Breakout's 4 actions
        assert tf_env.time_step_spec().reward.dtype == tf.float32
        assert tf_env.batch_size == 2 and env.recv_batch_size == 1
        assert env.num_threads == min(2, len(os.sched_getaffinity(0)))
        # Machado et al.'s protocol in EnvPool's own knobs (its defaults differ).
        settings = env.settings
        assert {k: settings[k] for k in (
            "repeat_action_probability", "max_episode_steps", "noop_max", "frame_skip",
            "img_height", "img_width", "stack_num", "episodic_life", "use_fire_reset",
            "reward_clip", "zero_discount_on_life_loss", "gray_scale", "full_action_space",
            "seed", "num_envs")} == dict(
            repeat_action_probability=0.25, max_episode_steps=27_000, noop_max=30,
            frame_skip=4, img_height=84, img_width=84, stack_num=4, episodic_life=False,
            use_fire_reset=False, reward_clip=False, zero_discount_on_life_loss=False,
            gray_scale=True, full_action_space=False, seed=1, num_envs=2)
        first = env.reset()
        assert first.observation.shape == (2, 84, 84, 4) and first.observation.dtype == np.uint8
        # The reset frame fills the stack, channels last.
        for k in range(1, 4):
            np.testing.assert_array_equal(first.observation[..., k], first.observation[..., 0])
        assert env.mode == "lockstep"
    finally:
        tf_env.close()
    assert env.mode is None


@pytest.mark.parametrize("name", ["HalfCheetah-v5", "Hopper-v5"])
def test_mujoco_specs_equal_suite_gymnasium_s(name):
    pool = suites.load("suite_envpool", name, batch_size=2, seed=1)
    reference = suites.load("suite_gymnasium", name, batch_size=1, seed=1)
    try:
        assert pool.time_step_spec() == reference.time_step_spec()
        assert pool.action_spec() == reference.action_spec()
        assert pool.pyenv.observation_spec() == reference.pyenv.observation_spec()
        assert pool.pyenv.action_spec() == reference.pyenv.action_spec()
        assert pool.pyenv.action_spec().dtype == np.float32
        steps = run_lockstep(pool.pyenv, 3)
        assert steps[-1].observation.dtype == pool.pyenv.observation_spec().dtype
        assert steps[-1].reward.dtype == np.float32
    finally:
        pool.close()
        reference.close()


# ---------------------------------------------------------- reproducibility


def test_same_seed_same_actions_same_observations_and_row_b_is_seeded_seed_plus_b():
    a = suite_envpool.make_env("Breakout-v5", 3, seed=7)
    b = suite_envpool.make_env("Breakout-v5", 3, seed=7)
    c = suite_envpool.make_env("Breakout-v5", 1, seed=8)
    d = suite_envpool.make_env("Breakout-v5", 3, seed=9)
    try:
        runs = [run_lockstep(e, 40) for e in (a, b, d)]
        for t_a, t_b in zip(runs[0], runs[1]):
            np.testing.assert_array_equal(t_a.observation, t_b.observation)
            np.testing.assert_array_equal(t_a.reward, t_b.reward)
            np.testing.assert_array_equal(t_a.step_type, t_b.step_type)
        # Another seed plays differently (sticky actions, no-ops).
        assert any(not np.array_equal(x.observation, y.observation)
                   for x, y in zip(runs[0], runs[2]))
        # Row 1 of seed 7 is row 0 of seed 8, given the same actions.
        rng = np.random.default_rng(0)   # run_lockstep's actions, row 1's
        row1_actions = [random_actions(a, rng, 3)[1:2] for _ in range(40)]
        c_steps = [c.reset()] + [c.step(act) for act in row1_actions]
        np.testing.assert_array_equal(row(runs[0], 1)[3], row(c_steps, 0)[3])
    finally:
        for e in (a, b, c, d):
            e.close()


def test_rows_stepped_asynchronously_are_the_lockstep_streams():
    """Each environment has its own random generator: stepped row by row in
    EnvPool's asynchronous mode, in whatever order rows come back, each row is
    exactly the stream lockstep gives with the same actions."""
    B, n = 4, 30
    rng = np.random.default_rng(3)
    actions = rng.integers(0, 4, (n, B))
    lockstep_env = suite_envpool.make_env("Breakout-v5", B, seed=11)
    rows_env = suite_envpool.make_env("Breakout-v5", B, seed=11, recv_batch_size=2)
    try:
        lockstep = [lockstep_env.reset()]
        for t in range(n):
            lockstep.append(lockstep_env.step(actions[t]))
        streams = {r: [] for r in range(B)}
        def on_rows(rows, time_step):
            for j, r in enumerate(rows):
                streams[int(r)].append(tf.nest.map_structure(lambda f: f[j], time_step))

        stepper = rows_env.make_row_stepper(on_rows)
        stepper.start()
        while min(len(s) for s in streams.values()) < n + 1:
            received = stepper.recv(1.0)
            assert all(failed is None for _, failed in received)
            # Every row received is sent again, as the env thread does.
            rows = [r for r, _ in received]
            stepper.send(rows, np.array([actions[min(len(streams[r]), n) - 1, r] for r in rows]))
        assert rows_env.mode == "rows"
        stepper.close()
        for r in range(B):
            got = streams[r][:n + 1]
            want = row(lockstep, r)
            np.testing.assert_array_equal([int(t.step_type) for t in got], want[0])
            np.testing.assert_array_equal([float(t.reward) for t in got], want[1])
            np.testing.assert_array_equal([float(t.discount) for t in got], want[2])
            np.testing.assert_array_equal(np.stack([t.observation for t in got]), want[3])
    finally:
        lockstep_env.close()
        rows_env.close()


# ------------------------------------------------------------- step types


def assert_episode_ends(steps, b, discount):
    """Row b's episodes: FIRST only right after LAST (reward 0, discount 1, the
    reset frame filling the stack), LAST with `discount`, MID with 1.
    Returns how many episodes ended."""
    step_type, reward, disc, obs = row(steps, b)
    assert step_type[0] == FIRST
    ends = 0
    for t in range(1, len(steps)):
        assert (step_type[t] == FIRST) == (step_type[t - 1] == LAST), (b, t)
        if step_type[t] == FIRST:
            assert (reward[t], disc[t]) == (0.0, 1.0)
            if obs.ndim == 4:
                np.testing.assert_array_equal(obs[t][..., 3], obs[t][..., 0])
        elif step_type[t] == LAST:
            assert disc[t] == discount, (b, t)
            ends += 1
        else:
            assert disc[t] == 1.0
    return ends


def test_game_over_is_last_with_discount_0_then_first():
    # A random Breakout game is over after ~130-200 steps.
    env = suite_envpool.make_env("Breakout-v5", 2, seed=3)
    try:
        steps = run_lockstep(env, 700)
        for b in range(2):
            assert assert_episode_ends(steps, b, discount=0.0) >= 1
    finally:
        env.close()


def test_life_loss_is_a_termination_with_terminal_on_life_loss():
    env = suite_envpool.make_env("Breakout-v5", 2, seed=3, terminal_on_life_loss=True)
    try:
        steps = run_lockstep(env, 200)
        assert env.settings["episodic_life"] is True
        for b in range(2):
            assert assert_episode_ends(steps, b, discount=0.0) >= 1
    finally:
        env.close()


def test_time_limit_is_last_with_discount_1_then_first():
    # 20 frames = 5 agent steps of 4 frames.
    env = suite_envpool.make_env("Breakout-v5", 2, seed=3, max_num_frames_per_episode=20)
    try:
        steps = run_lockstep(env, 12)
        assert env.settings["max_episode_steps"] == 5
        for b in range(2):
            step_type = row(steps, b)[0]
            np.testing.assert_array_equal(step_type, [0, 1, 1, 1, 1, 2, 0, 1, 1, 1, 1, 2, 0])
            assert assert_episode_ends(steps, b, discount=1.0) == 2
    finally:
        env.close()


def test_mujoco_time_limit_and_termination():
    cheetah = suite_envpool.make_env("HalfCheetah-v5", 2, seed=1, max_episode_steps=3)
    hopper = suite_envpool.make_env("Hopper-v5", 2, seed=1)   # falls within ~100 steps
    try:
        steps = run_lockstep(cheetah, 8)
        for b in range(2):
            np.testing.assert_array_equal(row(steps, b)[0], [0, 1, 1, 2, 0, 1, 1, 2, 0])
            assert assert_episode_ends(steps, b, discount=1.0) == 2
        steps = run_lockstep(hopper, 300)
        for b in range(2):
            assert assert_episode_ends(steps, b, discount=0.0) >= 1
    finally:
        cheetah.close()
        hopper.close()


def test_lockstep_under_tf_agents_dynamic_step_driver():
    B = 4
    tf_env = suite_envpool.load("Breakout-v5", B, seed=5, max_num_frames_per_episode=40)
    policy = random_tf_policy.RandomTFPolicy(tf_env.time_step_spec(), tf_env.action_spec())
    seen = []
    driver = dynamic_step_driver.DynamicStepDriver(
        tf_env, policy, observers=[lambda traj: seen.append(
            tf.nest.map_structure(lambda t: t.numpy(), traj))], num_steps=B * 24)
    try:
        driver.run()
        assert tf_env.pyenv.mode == "lockstep"
    finally:
        tf_env.close()
    assert len(seen) >= 24   # boundary steps (LAST -> FIRST) do not count
    for b in range(B):
        step_type = np.array([traj.step_type[b] for traj in seen])
        next_type = np.array([traj.next_step_type[b] for traj in seen])
        np.testing.assert_array_equal(step_type[1:], next_type[:-1])
        # 40 frames = 10 steps: FIRST, 9 MID, then LAST; then the next episode.
        np.testing.assert_array_equal(step_type[:12], [0] + [1] * 9 + [2, 0])


# ------------------------------------------------------------ the driver


class LoggingPool(object):
    """An EnvPool pool whose receives (and resets) are logged per environment:
    (elapsed_step, crc32 of the newest frame), in the order they came."""

    def __init__(self, pool, log):
        self._pool = pool
        self._log = log

    def recv(self, *args, **kwargs):
        return self._logged(self._pool.recv(*args, **kwargs))

    def reset(self, *args, **kwargs):   # a synchronous pool's reset returns its frames
        return self._logged(self._pool.reset(*args, **kwargs))

    def _logged(self, out):
        obs, info = out[0], out[-1]
        for j, env_id in enumerate(info["env_id"]):
            self._log.setdefault(int(env_id), []).append(
                (int(info["elapsed_step"][j]), zlib.crc32(obs[j][-1].tobytes())))
        return out

    def __getattr__(self, name):
        return getattr(self._pool, name)


@pytest.fixture
def pool_log(monkeypatch):
    import envpool
    log = {}
    make = envpool.make
    monkeypatch.setattr(envpool, "make",
                        lambda *args, **kwargs: LoggingPool(make(*args, **kwargs), log))
    return log


def envpool_driver(B, T, recv_batch_size=None, **knobs):
    def constructor():
        return suites.load("suite_envpool", "Breakout-v5", batch_size=B, seed=21,
                           recv_batch_size=recv_batch_size, **knobs)

    env = constructor()   # the pool is made on first use: this one never makes it
    policy = random_tf_policy.RandomTFPolicy(env.time_step_spec(), env.action_spec())
    env.close()
    return AsyncOffPolicyDriver(constructor, policy, num_envs=1, unroll_length=T,
                                learn_queue_cap=1)


@pytest.mark.parametrize("recv_batch_size, stepping", [(1, "rows"), (None, "rows"),
                                                       (None, "lockstep")])
def test_each_driver_row_is_the_pool_s_continuous_stream(pool_log, recv_batch_size, stepping):
    B, T = 4, 8
    # 48 frames = 12 steps an episode: every row crosses episode boundaries.
    driver = envpool_driver(B, T, recv_batch_size, max_num_frames_per_episode=48,
                            stepping=stepping)
    pyenv = driver.environments[0].pyenv
    if stepping == "rows":
        assert type(pyenv) is suite_envpool.EnvPoolEnv
        assert row_envs(driver.environments[0]) is pyenv
    else:   # the whole pool is stepped in the env thread's graph loop
        assert type(pyenv) is suite_envpool.LockstepEnvPoolEnv
        assert row_envs(driver.environments[0]) is None and not steps_block(pyenv)
    driver.start()
    try:
        batches = collect_until(driver, lambda b: len(rows_by_env(b)) == B and len(b) >= 10,
                                100)
        mode = pyenv.mode   # EnvPool's asynchronous pool, or its synchronous one
    finally:
        driver.stop()
    assert mode == stepping
    rows = rows_by_env(batches)
    assert sorted(rows) == list(range(B))
    for env_id, unrolls in rows.items():
        obs = np.concatenate([u.observation for u in unrolls])
        step_type = np.concatenate([u.step_type for u in unrolls])
        next_type = np.concatenate([u.next_step_type for u in unrolls])
        discount = np.concatenate([u.discount for u in unrolls])
        n = len(obs)
        # Exactly the pool's stream of this environment, in order: no step
        # lost, repeated or taken from another row.
        log = pool_log[env_id][:n]
        assert [zlib.crc32(o[..., -1].tobytes()) for o in obs] == [crc for _, crc in log]
        elapsed = [e for e, _ in log]
        assert step_type[0] == FIRST and elapsed[0] == 0
        np.testing.assert_array_equal(next_type[:-1], step_type[1:])
        for t in range(1, n):
            assert (step_type[t] == FIRST) == (step_type[t - 1] == LAST), (env_id, t)
            if step_type[t] == FIRST:
                assert elapsed[t] == 0
            else:
                assert elapsed[t] == elapsed[t - 1] + 1, (env_id, t)
                # The frame stack shifts by one frame per step within an episode.
                np.testing.assert_array_equal(obs[t][..., :3], obs[t - 1][..., 1:])
        assert (step_type == LAST).sum() >= 2
        np.testing.assert_array_equal(discount, 1.0)   # time limits only
    if recv_batch_size is None:
        assert driver.environments[0].pyenv.recv_batch_size == B // 2


def test_a_row_that_is_not_ready_holds_up_no_other():
    """Row 0 is never sent an action (never ready again); rows 1-3 keep being
    received, whichever receive size: EnvPool fills a receive with the first
    steps to finish. (Which of them finishes first is the host's scheduling:
    on a loaded host one row got 7 of 59 receives, so the test receives until
    each has 10, for up to 30 s.)"""
    for k in (1, 2):
        env = suite_envpool.make_env("Breakout-v5", 4, seed=2, recv_batch_size=k)
        try:
            counts = np.zeros(4, int)
            ignore = types.SimpleNamespace(record_rows=lambda rows, time_step: None)
            stepper = row_stepper("env0", env, ignore)
            assert type(stepper).__name__ == "EnvPoolRows"
            stepper.start()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                rows = [r for r, _ in stepper.recv(1.0)]
                counts[rows] += 1
                again = [r for r in rows if r != 0]
                if again:
                    stepper.send(again, np.ones(len(again), np.int64))
                if all(counts[1:] >= 10):
                    break
            assert counts[0] == 1   # its reset only
            assert all(counts[1:] >= 10), counts
            stepper.close()
        finally:
            env.close()


def test_no_python_thread_per_row():
    B = 8

    def threads_while_running(driver):
        before = threading.active_count()
        driver.start()
        try:
            driver.run_async()
            return threading.active_count() - before
        finally:
            driver.stop()

    rows_driver = envpool_driver(B, 4)
    graph_env = suites.load("suite_gym", "CartPole-v0", batch_size=B, seed=1)
    graph_driver = AsyncOffPolicyDriver(
        lambda: suites.load("suite_gym", "CartPole-v0", batch_size=B, seed=1),
        random_tf_policy.RandomTFPolicy(graph_env.time_step_spec(), graph_env.action_spec()),
        num_envs=1, unroll_length=4, learn_queue_cap=1)
    assert row_envs(graph_driver.environments[0]) is None   # its env thread is a graph loop
    with_rows = threads_while_running(rows_driver)
    without_rows = threads_while_running(graph_driver)
    assert with_rows == without_rows == len(rows_driver.threads)
    assert not [t.name for t in threading.enumerate() if "_row" in t.name]


@pytest.mark.parametrize("stepping", ["rows", "lockstep"])
def test_stop_returns_within_5_s_while_the_pool_steps(stepping):
    driver = envpool_driver(8, 4, stepping=stepping)
    driver.start()
    driver.run_async()
    time.sleep(0.3)   # rows in flight, the learn queue full behind them
    start = time.monotonic()
    driver.stop()
    assert time.monotonic() - start < 5.0
    assert not driver_threads()
    assert driver.environments[0].pyenv.mode is None   # the pool freed


# ------------------------------------------------------------------ errors


def test_unknown_ids_and_knobs_are_one_line_value_errors():
    ale_id = (r"unknown EnvPool task id 'ALE/Breakout-v5'; EnvPool ids have no 'ALE/' "
              r"prefix: try 'Breakout-v5'")
    assert_one_line_value_error(ale_id, suite_envpool.load, "ALE/Breakout-v5")
    with pytest.raises(ValueError, match=ale_id):   # gin adds a line of its own
        suites.load("suite_envpool", "ALE/Breakout-v5")
    assert_one_line_value_error(r"unknown EnvPool task id 'Breakout-v6'; did you mean "
                                r"'Breakout-v5'", suite_envpool.load, "Breakout-v6")
    assert_one_line_value_error(r"unknown knob\(s\) \['stack'\]", suite_envpool.load,
                                "Breakout-v5", stack=4)
    assert_one_line_value_error(r"\['noop_max'\] are Atari knobs; 'HalfCheetah-v5' is not",
                                suite_envpool.load, "HalfCheetah-v5", noop_max=3)
    assert_one_line_value_error("time limit is the knob max_num_frames_per_episode",
                                suite_envpool.load, "Pong-v5", max_episode_steps=10)
    assert_one_line_value_error("recv_batch_size 5 is more than batch_size 4",
                                suite_envpool.load, "Pong-v5", 4, recv_batch_size=5)
    assert_one_line_value_error("repeat_action_probability must be in", suite_envpool.load,
                                "Pong-v5", repeat_action_probability=2)
    assert_one_line_value_error(r"stepping must be one of \['rows', 'lockstep'\], got "
                                r"'lock'", suite_envpool.load, "Pong-v5", stepping="lock")


def test_envpool_missing_is_one_line_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)   # import envpool raises ImportError
    with pytest.raises(ValueError) as info:
        suite_envpool.load("Breakout-v5", batch_size=2)
    assert str(info.value) == "suite_envpool needs envpool: pip install -e '.[envpool]'"
    with pytest.raises(ValueError, match=r"^suite_envpool needs envpool: pip install"):
        suites.load("suite_envpool", "Breakout-v5", batch_size=2)


def test_gin_binds_the_knobs_and_keywords_win():
    gin.parse_config(["suite_envpool.noop_max = 5", "suite_envpool.num_threads = 1"])
    try:
        env = suite_envpool.make_env("Pong-v5", 2, seed=0, noop_max=7)
        assert (env.settings["noop_max"], env.num_threads) == (7, 1)
    finally:
        gin.clear_config()
