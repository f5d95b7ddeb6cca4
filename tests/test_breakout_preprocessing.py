"""Breakout's preprocessing where it differs from Pong's (gin_configs/
ppo_breakout.gin): FIRE at a game's start, a lost life as a training
boundary inside the game's episode, and the action set. Each is checked
exactly on scripted episodes, against EnvPool's own pool of the same seed
and settings stepped with the same actions, and through alf_async's
metrics, which score whole games."""

import numpy as np
import pytest
from tf_agents.trajectories import trajectory as trajectory_lib

from alf_async.driver import metrics as metrics_lib

envpool = pytest.importorskip("envpool")
from alf_async.environments.suites import suite_envpool  # noqa: E402

pytestmark = pytest.mark.timeout(120)
FIRST, MID, LAST = 0, 1, 2
NOOP, FIRE = 0, 1


def scripted(actions, num_steps, **knobs):
    """Steps 2 Breakout games (seed 3, no sticky actions) in lockstep with
    `actions(t)` ([2] int64) beside a raw EnvPool pool of the same settings.

    Returns:
        ({field: [T + 1, 2]} of the time steps (the reset's first), the env's
        settings, {field: [T + 1, 2]} of the raw pool: lives, reward, game over).
    """
    env = suite_envpool.make_env("Breakout-v5", 2, seed=3, stepping="lockstep",
                                 repeat_action_probability=0.0, **knobs)
    raw = envpool.make("Breakout-v5", env_type="gymnasium", batch_size=2, **env.settings)
    try:
        ours = [env.reset()]
        _, info = raw.reset()
        theirs = [(info["lives"], np.zeros(2), np.zeros(2, bool))]
        for t in range(num_steps):
            action = np.asarray(actions(t), np.int64)
            ours.append(env.step(action))
            _, reward, _, _, info = raw.step(action.astype(np.int32))
            theirs.append((info["lives"], reward, info["terminated"].astype(bool)))
        steps = {name: np.array([getattr(s, name) for s in ours])
                 for name in ("step_type", "reward", "discount")}
        raw_steps = {name: np.array([x[k] for x in theirs])
                     for k, name in enumerate(("lives", "reward", "game_over"))}
        return steps, env.settings, raw_steps
    finally:
        env.close()
        raw.close()


def lives_lost(raw, b):
    """The steps (indices into the time steps) whose frames lose row b a life."""
    lives = raw["lives"][:, b]
    return [t for t in range(1, len(lives)) if lives[t] < lives[t - 1]]


def test_fire_reset_serves_each_games_first_ball_and_only_that():
    """NOOP only: with fire_reset the first ball is served and lost (one life,
    discount 0 on exactly the step that loses it), then nothing serves; without
    it no ball is ever in play."""
    noop = lambda t: [NOOP, NOOP]
    served, settings, raw = scripted(noop, 300, fire_reset=True,
                                     zero_discount_on_life_loss=True)
    assert settings["use_fire_reset"] is True
    for b in range(2):
        lost = lives_lost(raw, b)
        assert len(lost) == 1 and raw["lives"][-1, b] == 4
        np.testing.assert_array_equal(np.flatnonzero(served["discount"][:, b] == 0), lost)
        np.testing.assert_array_equal(served["step_type"][:, b], [FIRST] + [MID] * 300)
    idle, settings, raw = scripted(noop, 300, zero_discount_on_life_loss=True)
    assert settings["use_fire_reset"] is False
    np.testing.assert_array_equal(raw["lives"], np.full((301, 2), 5))
    np.testing.assert_array_equal(idle["discount"], np.ones((301, 2)))
    np.testing.assert_array_equal(idle["reward"], np.zeros((301, 2)))


def test_a_lost_life_is_a_training_boundary_and_a_game_is_one_episode():
    """Seeded random actions over whole games: discount 0 on exactly the steps
    that lose a life; LAST only where the game is over, after four lost lives
    inside the episode; rewards the game's own (unclipped); and alf_async's
    metrics count games, scoring each with the raw pool's game score."""
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 4, (900, 2))
    steps, _, raw = scripted(lambda t: actions[t], 900, fire_reset=True,
                             zero_discount_on_life_loss=True)
    game_scores = []
    for b in range(2):
        step_type, discount = steps["step_type"][:, b], steps["discount"][:, b]
        lost = lives_lost(raw, b)
        ends = np.flatnonzero(raw["game_over"][:, b])
        assert len(ends) >= 2   # at least two whole games in 900 steps
        np.testing.assert_array_equal(np.flatnonzero(discount == 0), lost)
        np.testing.assert_array_equal(np.flatnonzero(step_type == LAST), ends)
        np.testing.assert_array_equal(np.flatnonzero(step_type == FIRST), [0] + list(ends + 1))
        start = 0
        for end in ends:
            inside = [t for t in lost if start < t < end]
            assert len(inside) == 4 and all(step_type[t] == MID for t in inside)
            assert discount[end] == 0.0 and end in lost   # the fifth life ends the game
            game_scores.append(float(raw["reward"][start + 1:end + 1, b].sum()))
            start = end + 1
        not_first = step_type != FIRST
        np.testing.assert_array_equal(steps["reward"][not_first, b],
                                      raw["reward"][not_first, b])
    assert max(game_scores) > 1.0   # scored games, not empty ones

    # The whole run as one unroll per row, as the driver hands batches to the
    # metrics (rows by env id) and to EpisodeLog (per_frame.py's scores).
    episodes, log = metrics_lib.NumberOfEpisodes(), metrics_lib.EpisodeLog()
    T = len(steps["step_type"]) - 1
    traj = trajectory_lib.Trajectory(
        step_type=steps["step_type"][:-1].T, observation=np.zeros((2, T), np.float32),
        action=actions[:T].T, policy_info=(), next_step_type=steps["step_type"][1:].T,
        reward=steps["reward"][1:].T, discount=steps["discount"][1:].T)
    episodes(traj, np.array([0, 1]))
    log(traj, np.array([0, 1]))
    assert int(episodes.result()) == len(game_scores)
    assert [ret for _, ret, _ in log.episodes] == game_scores   # row 0's games, then row 1's


def test_the_action_set_is_the_games_minimal_one():
    def actions(game, **knobs):
        env = suite_envpool.make_env(game, 1, seed=1, **knobs)
        try:
            spec = env.action_spec()
            return int(spec.minimum), int(spec.maximum)
        finally:
            env.close()

    assert actions("Breakout-v5") == (0, 3)    # NOOP, FIRE, RIGHT, LEFT
    assert actions("Pong-v5") == (0, 5)        # NOOP, FIRE, RIGHT, LEFT, RIGHTFIRE, LEFTFIRE
    assert actions("Breakout-v5", full_action_space=True) == (0, 17)


@pytest.mark.parametrize("knobs, message", [
    (dict(terminal_on_life_loss=True, zero_discount_on_life_loss=True),
     "terminal_on_life_loss (each life an episode) and zero_discount_on_life_loss (a lost "
     "life a boundary inside the game's episode) exclude each other: set one"),
    (dict(fire_reset="yes"), "fire_reset must be True or False, got 'yes'"),
    (dict(zero_discount_on_life_loss=1), "zero_discount_on_life_loss must be True or False, "
                                         "got 1"),
])
def test_the_life_and_fire_knobs_refuse_bad_values_in_one_line(knobs, message):
    with pytest.raises(ValueError) as info:
        suite_envpool.make_env("Breakout-v5", 1, seed=1, **knobs)
    assert str(info.value) == f"suite_envpool: {message}"


def test_the_life_and_fire_knobs_are_atari_knobs():
    with pytest.raises(ValueError, match=r"\['fire_reset', 'zero_discount_on_life_loss'\] are "
                                         r"Atari knobs; 'HalfCheetah-v5' is not an Atari game"):
        suite_envpool.make_env("HalfCheetah-v5", 1, seed=1, fire_reset=True,
                               zero_discount_on_life_loss=True)
