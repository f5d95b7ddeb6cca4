"""suite_atari: specs, seeding, the frame stack, step types at game over and
at the time limit, unclipped scores, errors, and child processes.

Episodes are kept short: Breakout with FIRE loses a life in ~25 steps and
the game in ~120; a 40-frame limit truncates after 10 steps without no-ops;
Asterix scores 50 within a few steps.
"""

import sys

import gin
import numpy as np
import pytest
from tf_agents.specs import array_spec
from tf_agents.trajectories.time_step import StepType

from alf_async.environments.suites import suite_atari
from alf_async.environments import suites
from alf_async.environments.suites.suite_gymnasium import spec_from_space

BREAKOUT = "ALE/Breakout-v5"
NOOP, FIRE = 0, 1
FIRST, MID, LAST = int(StepType.FIRST), int(StepType.MID), int(StepType.LAST)


def py_env(env_name=BREAKOUT, batch_size=1, seed=0, **knobs):
    """The batched PyEnvironment under `suites.load` (stepped without TF's overhead)."""
    return suites.load("suite_atari", env_name, batch_size=batch_size, seed=seed,
                       **knobs).pyenv


def run(env, actions):
    """Resets `env`, steps it with each action (the same for every row);
    returns the time steps, the reset's first."""
    steps = [env.reset()]
    for a in actions:
        steps.append(env.step(np.full(env.batch_size, a, np.int64)))
    return steps


def test_specs_and_observations():
    env = suites.load("suite_atari", BREAKOUT, batch_size=2, seed=0)
    obs_spec = env.pyenv.observation_spec()
    assert isinstance(obs_spec, array_spec.BoundedArraySpec)
    assert obs_spec.shape == (84, 84, 4) and obs_spec.dtype == np.uint8
    assert np.all(obs_spec.minimum == 0) and np.all(obs_spec.maximum == 255)
    action_spec = env.pyenv.action_spec()
    game = suite_atari.make_env(BREAKOUT)
    assert action_spec == spec_from_space(game.action_space, name="action")
    game.close()
    assert action_spec.shape == () and action_spec.dtype == np.int64
    assert (int(action_spec.minimum), int(action_spec.maximum)) == (0, 3)
    time_step = env.reset()
    assert time_step.observation.shape == (2, 84, 84, 4)
    assert time_step.observation.dtype.name == "uint8"
    assert list(time_step.step_type.numpy()) == [FIRST] * 2
    env.close()


def test_seeded_runs_are_reproducible_and_rows_get_seed_plus_b():
    actions = np.random.RandomState(0).randint(4, size=60)
    obs = lambda env: np.stack([s.observation for s in run(env, actions)])
    a = obs(py_env(batch_size=2, seed=3))
    b = obs(py_env(batch_size=2, seed=3))
    c = obs(py_env(batch_size=1, seed=4))
    assert a.tobytes() == b.tobytes()
    assert not np.array_equal(a[:, 0], a[:, 1])  # seeds 3 and 4 differ
    assert a[:, 1].tobytes() == c[:, 0].tobytes()  # row 1 of seed 3 is seed 4


def test_frame_stack_is_channels_last_and_shifts():
    steps = run(py_env(seed=1), [FIRE] * 20)
    assert np.all(steps[0].observation[0] == steps[0].observation[0][..., -1:])  # padded
    for before, after in zip(steps, steps[1:]):
        assert after.step_type[0] == MID
        np.testing.assert_array_equal(after.observation[0][..., :3],
                                      before.observation[0][..., 1:])
    newest = [s.observation[0][..., -1] for s in steps]
    assert any(not np.array_equal(x, y) for x, y in zip(newest, newest[1:]))


@pytest.mark.parametrize("terminal_on_life_loss", [True, False])
def test_game_over_is_last_with_discount_0_then_first(terminal_on_life_loss):
    steps = run(py_env(seed=2, terminal_on_life_loss=terminal_on_life_loss), [FIRE] * 400)
    types = [int(s.step_type[0]) for s in steps]
    end = types.index(LAST)
    assert types[1:end] == [MID] * (end - 1)
    assert all(s.discount[0] == 1.0 for s in steps[1:end])
    assert steps[end].discount[0] == 0.0
    assert types[end + 1] == FIRST
    assert (steps[end + 1].reward[0], steps[end + 1].discount[0]) == (0.0, 1.0)


def test_time_limit_is_last_with_discount_1():
    # 40 frames, 4 per step, no no-ops: every episode truncates at its 10th step.
    steps = run(py_env(seed=0, max_num_frames_per_episode=40, noop_max=0), [NOOP] * 21)
    types = [int(s.step_type[0]) for s in steps]
    assert types == ([FIRST] + [MID] * 9 + [LAST]) * 2
    assert [float(steps[i].discount[0]) for i in (10, 21)] == [1.0, 1.0]


def test_rewards_are_the_unclipped_game_score():
    # Asterix's first catch is worth 50 points.
    rewards = [float(s.reward[0]) for s in run(py_env("ALE/Asterix-v5", seed=0), [FIRE] * 100)]
    assert max(rewards) == 50.0


@pytest.mark.parametrize("env_name", ["ALE/NoSuchGame-v5", "Breakout-v5", "CartPole-v1"])
def test_an_unknown_game_id_is_one_line_naming_it(env_name):
    with pytest.raises(ValueError) as error:
        suite_atari.load(env_name, batch_size=1, seed=0)
    message = str(error.value)
    assert repr(env_name) in message and "\n" not in message
    with pytest.raises(ValueError, match="unknown Atari game id|not an Atari game"):
        suites.load("suite_atari", env_name, batch_size=1, seed=0)


def test_an_unknown_or_bad_knob_is_one_line():
    with pytest.raises(ValueError, match=r"unknown preprocessing knob\(s\) \['frameskip'\]"):
        suite_atari.load(BREAKOUT, frameskip=4)
    with pytest.raises(ValueError) as error:
        suite_atari.load(BREAKOUT, frame_skip=0)
    assert str(error.value) == "suite_atari: frame_skip must be an int >= 1, got 0"


def test_missing_extra_names_the_install(monkeypatch):
    monkeypatch.setattr(suite_atari, "_gymnasium", None)
    monkeypatch.setitem(sys.modules, "ale_py", None)  # import ale_py raises ImportError
    with pytest.raises(ValueError) as error:
        suite_atari.load(BREAKOUT)
    assert str(error.value) == "suite_atari needs ale-py and opencv: pip install -e '.[atari]'"


def test_gin_bindings_set_the_knobs():
    gin.clear_config()
    try:
        gin.bind_parameter("suite_atari.stack_size", 2)
        assert suite_atari.knob_values()["stack_size"] == 2
        assert suite_atari.knob_values(stack_size=3)["stack_size"] == 3  # explicit wins
        assert py_env().observation_spec().shape == (84, 84, 2)
    finally:
        gin.clear_config()


def test_subprocess_constructor_matches_in_process_and_gets_gin_bindings():
    # Bound in the parent only: the children get the resolved knobs.
    gin.clear_config()
    try:
        gin.bind_parameter("suite_atari.max_num_frames_per_episode", 40)
        constructor = suites.make_subprocess_env_constructor(
            "suite_atari", BREAKOUT, batch_size=2, seed=5, env_kwargs=dict(noop_max=0))
    finally:
        gin.clear_config()
    env = constructor()
    try:
        local = py_env(batch_size=2, seed=5, noop_max=0, max_num_frames_per_episode=40)
        assert env.pyenv.observation_spec() == local.observation_spec()
        assert env.pyenv.action_spec() == local.action_spec()
        actions = np.random.RandomState(1).randint(4, size=11)
        remote = run(env.pyenv, actions)
        for r, l in zip(remote, run(local, actions)):
            assert r.observation.tobytes() == l.observation.tobytes()
            np.testing.assert_array_equal(r.step_type, l.step_type)
        assert list(remote[10].step_type) == [LAST] * 2
        assert list(remote[10].discount) == [1.0, 1.0]
        assert list(remote[11].step_type) == [FIRST] * 2
    finally:
        env.close()
