"""wall_clock_learning.py's report names each run's host and compares the
two sides per seed only where they ran on one kind of host."""

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import wall_clock_report  # noqa: E402  (benchmarks/, imports no TensorFlow)

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
