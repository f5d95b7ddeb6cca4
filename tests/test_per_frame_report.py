"""per_frame.py's report on tiny hand-made records and published_curves.py's
reading of RL Baselines3 Zoo's Monitor logs (alf_async.testing.bench.curves;
no TensorFlow, no games)."""

import pytest

from alf_async.testing.bench import curves

pytestmark = pytest.mark.timeout(60)

GAME_A = '#{"t_start": 0, "env_id": "PongNoFrameskip-v4"}\nr,l,t\n-21.0,100,1.0\n-20.0,200,3.0\n'
GAME_B = '#{"t_start": 0, "env_id": "PongNoFrameskip-v4"}\nr,l,t\n-19.0,150,1.5\n-18.0,150,3.0\n'


def test_monitor_episodes_are_frames_and_scores_in_order():
    assert curves.monitor_episodes(GAME_A) == [(100, -21.0), (200, -20.0)]


def test_zoo_curve_counts_the_run_frames_of_lockstep_games():
    # Two games in lockstep: A's episodes end at 2 x 100 and 2 x 300 run frames,
    # B's at 2 x 150 and 2 x 300.
    curve = curves.curve_from_monitors([GAME_A, GAME_B], every_frames=200, window=2)
    # 200 frames: one episode ended (fewer than the window, no point); 400: A's
    # first and B's first; 600: A's second and B's second. Points in agent steps.
    assert curve == ((100, -20.0), (150, -19.0))


def test_committed_zoo_curves_load_in_agent_steps_up_to_their_10m():
    for name in curves.ZOO_AGENTS:
        label, curve = curves.load(name)
        assert label.startswith("RL Baselines3 Zoo")
        steps = [s for s, _ in curve]
        assert steps == sorted(steps) and steps[0] == 62_500 and steps[-1] >= 9_900_000
        low, high = (0.0, 864.0) if name.endswith("breakout") else (-21.0, 21.0)
        assert all(low <= v <= high for _, v in curve)   # the games' score ranges
    assert set(curves.references()) == {"ppo2_pong", "sb3_a2c_pong", "sb3_ppo_pong",
                                        "sb3_ppo_breakout"}
    # The zoo's Breakout PPO, read exactly (its 8 games' Monitor logs).
    points = dict(curves.load("sb3_ppo_breakout")[1])
    assert [round(points[int(m * 1e6) // 4], 1) for m in (2.5, 4, 7, 10, 12, 15)] == [
        20.3, 27.7, 38.8, 77.8, 165.5, 231.3]


def test_steps_to_a_score_interpolate_between_points():
    curve = [(0, -21.0), (100, -11.0), (200, -11.0), (300, 0.0)]
    assert curves.steps_to(curve, -21.0) == 0
    assert curves.steps_to(curve, -16.0) == 50.0
    assert curves.steps_to(curve, -11.0) == 100
    assert curves.steps_to(curve, -5.5) == 250.0
    assert curves.steps_to(curve, 1.0) is None


def test_run_curve_starts_at_the_windows_last_episode():
    episodes = [[10 * k, float(-21 + k), 100] for k in range(1, 13)]
    curve = curves.run_curve(episodes)
    assert curve[0] == (100, sum(range(-20, -10)) / 10)
    assert curve[-1] == (120, sum(range(-18, -8)) / 10) and len(curve) == 3


def test_median_steps_counts_a_stopped_seed_as_later_than_all():
    assert curves.median_steps([300, None, 100]) == 300
    assert curves.median_steps([100, None, None]) is None
    assert curves.median_steps([100, 200]) == 150
    assert curves.median_steps([100, None]) is None
    assert curves.median_steps([None]) is None
