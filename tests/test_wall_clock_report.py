"""wall_clock_learning.py's report names each run's host and compares the
two sides per seed only where they ran on one kind of host."""

import pytest

from alf_async.testing.bench import wall_clock_report

pytestmark = pytest.mark.timeout(30)

XEON = dict(cpu="Xeon", cores=2, cpu_flags=["avx512f", "amx_tile"], python_loop_secs=0.084,
            numpy_matmul_secs=0.4)
EPYC = dict(cpu="EPYC", cores=2, cpu_flags=["avx512f"], python_loop_secs=0.079,
            numpy_matmul_secs=0.091)


def run(env_steps, host):
    record = dict(evaluations=[(60.0, env_steps // 2, 1, -21.0), (120.0, env_steps, 2, -5.0)],
                  env_steps=env_steps, train_steps=2, loop_secs=100.0, eval_secs=10.0,
                  raw_rate=1.0)
    if host:
        record["host"] = host
    return record


def test_hosts_are_named_and_seeds_compared_only_on_one_kind_of_host(capsys):
    records = {("alf_async", 0): run(48000, XEON), ("tf_agents", 0): run(40000, EPYC),
               ("alf_async", 1): run(60000, EPYC), ("tf_agents", 1): run(50000, EPYC),
               ("alf_async", 2): run(30000, None), ("tf_agents", 2): run(30000, XEON)}
    wall_clock_report.print_hosts(records)
    assert capsys.readouterr().out.splitlines() == [
        "  alf_async seed 0: Xeon (AMX), calibration 0.084 s / 0.4 s",
        "  tf_agents seed 0: EPYC (AVX-512), calibration 0.079 s / 0.091 s",
        "  alf_async seed 1: EPYC (AVX-512), calibration 0.079 s / 0.091 s",
        "  tf_agents seed 1: EPYC (AVX-512), calibration 0.079 s / 0.091 s",
        "  tf_agents seed 2: Xeon (AMX), calibration 0.084 s / 0.4 s",
        "the runs span 3 kinds of host (Xeon (AMX): alf_async 0, tf_agents 2; EPYC (AVX-512): "
        "tf_agents 0, alf_async 1, tf_agents 1; host not recorded: alf_async 2): medians mixing "
        "them compare different machines",
        "seed 1, both sides on EPYC (AVX-512): env steps/s alf_async 600, tf_agents 500 "
        "(ratio 1.20)",
    ]


def test_runs_on_one_kind_of_host_print_no_warning(capsys):
    records = {("alf_async", 0): run(48000, XEON),
               ("tf_agents", 0): run(40000, dict(XEON, numpy_matmul_secs=0.2))}
    wall_clock_report.print_hosts(records)
    assert capsys.readouterr().out.splitlines() == [
        "  alf_async seed 0: Xeon (AMX), calibration 0.084 s / 0.4 s",
        "  tf_agents seed 0: Xeon (AMX), calibration 0.084 s / 0.2 s",
        "seed 0, both sides on Xeon (AMX): env steps/s alf_async 480, tf_agents 400 "
        "(ratio 1.20)"]


def test_training_scores_average_the_last_ten_episodes_ended_by_each_minute(capsys):
    """Episode k (from 0) ends at 10 k seconds scoring k: at 2 minutes the last
    ten ended are 3..12 (mean 7.5), at 3 minutes 9..18; at 1 minute only 7
    have ended (none)."""
    episodes = [(10.0 * k, 100 * k, float(k)) for k in range(20)]
    assert wall_clock_report.training_score_at(episodes, 60.0) is None
    assert wall_clock_report.training_score_at(episodes, 120.0) == 7.5
    assert wall_clock_report.training_score_at(episodes, 119.9) == 6.5
    records = {("alf_async", 0): dict(run(200, None), training_episodes=episodes),
               ("tf_agents", 0): dict(run(200, None), training_episodes=episodes[:15]),
               ("tf_agents", 1): dict(run(200, None), training_episodes=[
                   (s, n, 2 * r) for s, n, r in episodes[:15]])}
    wall_clock_report.print_training_scores("Breakout-v5-ppo", records, [1, 2, 3], 180.0)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == ("PPO Breakout-v5-ppo: training score (mean of the last 10 training "
                        "episodes) against wall-clock time")
    assert lines[3].split() == ["alf_async", "0", "-", "7.5", "13.5", "20"]
    assert lines[4].split() == ["tf_agents", "0", "-", "7.5", "9.5", "15"]
    assert lines[5].split() == ["tf_agents", "1", "-", "15.0", "19.0", "15"]
    assert lines[6].split() == ["alf_async", "med", "-", "7.5", "13.5"]
    assert lines[7].split() == ["tf_agents", "med", "-", "11.2", "14.2"]
    capsys.readouterr()
    wall_clock_report.print_training_scores("Breakout-v5-ppo", {("alf_async", 0): run(200, None)},
                                            [1], 60.0)
    assert capsys.readouterr().out == ""   # records without training episodes print nothing


def test_time_to_alf_async_median_is_each_runs_first_training_score_at_or_above_it(capsys):
    """Episode k ends at 10 k seconds scoring k (the training score at its end,
    from the tenth on: k - 4.5). alf_async's median at 3 minutes is 13.5,
    first read at episode 18 (3.0 min); the synchronous seed 0 stops at
    episode 14 (9.5), seed 1 (scores doubled) reads 15.0 at episode 12."""
    episodes = [(10.0 * k, 100 * k, float(k)) for k in range(20)]
    curve = wall_clock_report.training_curve(episodes)
    assert curve[0] == (90.0, 900, 4.5) and curve[-1] == (190.0, 1900, 14.5) and len(curve) == 11
    assert wall_clock_report.secs_to_training_score(curve, 13.5) == 180.0
    assert wall_clock_report.secs_to_training_score(curve, 14.6) is None
    assert wall_clock_report.training_curve(episodes[:9]) == []
    records = {("alf_async", 0): dict(run(200, None), training_episodes=episodes),
               ("tf_agents", 0): dict(run(200, None), training_episodes=episodes[:15]),
               ("tf_agents", 1): dict(run(200, None), training_episodes=[
                   (s, n, 2 * r) for s, n, r in episodes[:15]])}
    wall_clock_report.print_training_scores("Breakout-v5-ppo", records, [1, 2, 3], 180.0)
    assert capsys.readouterr().out.splitlines()[-4:] == [
        "to alf_async's median at 3 min (13.5), minutes and multiple of 3 min:",
        "alf_async     0 3.0 min (1.00x)",
        "tf_agents     0 never (ends at 9.5)",
        "tf_agents     1 2.0 min (0.67x)"]
    # One side only: no comparison.
    wall_clock_report.print_training_scores("Breakout-v5-ppo", {("alf_async", 0): records[
        "alf_async", 0]}, [1, 2, 3], 180.0)
    assert "to alf_async's median" not in capsys.readouterr().out


def test_frames_to_scores_of_the_hour_runs_stand_beside_the_published_curve(capsys):
    """The same episodes, 100,000 env steps apart: +10 is read between
    episodes 14 (9.5) and 15 (10.5), at 1.45M env steps = 5.80M frames."""
    episodes = [(10.0 * k, 100_000 * k, float(k)) for k in range(20)]
    records = {("alf_async", 0): dict(run(1_900_000, None), training_episodes=episodes),
               ("tf_agents", 0): run(1_900_000, None)}   # no training episodes: no row
    wall_clock_report.print_frames_to_scores("Breakout-v5-ppo", records)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == ("Frames (millions) to a training score (mean of the last 10) of | "
                        "+10 | +20 | +40 | +55 | +100")
    assert lines[2] == "Breakout-v5-ppo alf_async seed 0 (to 7.60M) | 5.80M | - | - | - | -"
    assert lines[3] == "Breakout-v5-ppo alf_async median of 1 | 5.80M | - | - | - | -"
    assert lines[4] == ("RL Baselines3 Zoo PPO, BreakoutNoFrameskip-v4 (8 games' training logs) "
                        "| 0.93M | 2.46M | 4.93M | 5.74M | 9.27M")
    assert len(lines) == 5
    wall_clock_report.print_frames_to_scores("HalfCheetah-v5", records)   # no published curve
    assert capsys.readouterr().out == ""
