"""The learning tables (dqn, sac, ppo, impala, learning), read from
benchmarks/results/ (render_results.py writes them; pictures_learning.py
lists the pictures beside them).

Each table is a function `(results_dir) -> [Row]` in `TABLES`. The figures come
from the readers the benchmarks report with: time_to_solve.py's summary
lines, alf_async.testing.bench.wall_clock_report (wall_clock_learning.py's
`--from_json`) and alf_async.testing.bench.curves (per_frame.py's).
"""

import functools
import glob
import os
import re
import statistics

from result_rows import Row, count, frames, load_json, meta_of, ratio, read_text, score, secs
from result_rows import rate as rate_of

from alf_async.testing.bench import curves
from alf_async.testing.bench.curves import FRAMES_PER_STEP, median_steps, recent_mean, run_curve
from alf_async.testing.bench.wall_clock_report import (SIDES, env_rate, load_records, return_at,
                                                       runs_of, secs_to_training_score,
                                                       time_to_reach, training_curve,
                                                       training_score_at)

# Tables without a results file of this version yet: the command that would make one.
NO_FILE_YET = {}
_MEDIAN = re.compile(r"^(\S+)\s+: median ([\d.]+) s over (\d+) runs, (\d+) not solved", re.M)
_RATIO = re.compile(r"^ratio of medians \S+ / \S+: ([\d.]+)$", re.M)


def solve_times(text, heading=None):
    """time_to_solve.py's summary of one run in `text`: {side: (median
    seconds, runs, not solved)} and the ratio of medians.

    Args:
        text: a time_to_solve_*.txt file's text.
        heading: the `## ...` heading of the run to read, for files that
            keep several; None reads the first summary.

    Raises:
        ValueError: the file has no complete summary (there, or at all).
    """
    if heading is not None:
        start = text.index(f"\n{heading}\n")
        text = text[start + 1:]
        following = text.find("\n## ", 1)
        text = text if following < 0 else text[:following]
    medians = {side: (float(median), int(runs), int(unsolved))
               for side, median, runs, unsolved in _MEDIAN.findall(text)}
    found = _RATIO.search(text)
    if len(medians) < 2 or found is None:
        where = f" under {heading}" if heading else ""
        raise ValueError(f"no complete time_to_solve summary{where}")
    return medians, float(found.group(1))


def files_matching(results_dir, pattern):
    """The results files matching `pattern`, sorted, relative to `results_dir`."""
    found = sorted(os.path.basename(p) for p in glob.glob(os.path.join(results_dir, pattern)))
    if not found:
        raise FileNotFoundError(2, "no results file", os.path.join(results_dir, pattern))
    return tuple(found)


def _row(key, what, ours, theirs, files, results_dir, command=None, short=""):
    """A Row whose host and date are its files'; its command theirs unless given."""
    meta = meta_of(files, results_dir)
    if command is not None:
        meta["command"] = command
    return Row(key=key, what=what, ours=ours, theirs=theirs, files=tuple(files), short=short,
               **meta)


def _solve_row(key, what, short, name, results_dir, heading=None):
    medians, ratio_of_medians = solve_times(read_text(name, results_dir), heading)
    ours, theirs = medians["async"], next(v for k, v in medians.items() if k != "async")
    return _row(key, what,
                f"{secs(ours[0])}, {ratio(ratio_of_medians)} the synchronous loop's time; "
                f"median of {ours[1]} runs, {ours[2]} unsolved",
                f"tf-agents' synchronous loop: {secs(theirs[0])}; {theirs[2]} unsolved",
                (name,), results_dir, short=short)


def _wall_clock(results_dir, pattern):
    """(files, {(side, seed): record}) of the wall_clock_*.json files matching `pattern`."""
    files = files_matching(results_dir, pattern)
    paths = tuple(os.path.join(results_dir, f) for f in files)
    return files, _records(paths, tuple(os.stat(p).st_mtime_ns for p in paths))


@functools.lru_cache(maxsize=None)
def _records(paths, stamps):
    """wall_clock_report.load_records of `paths`, read once per version
    (`stamps`: their modification times) however many rows read them."""
    return load_records(list(paths))


def from_json_command(task, minutes, report_minutes, pattern):
    """wall_clock_learning.py's command that prints a row's figures and draws its picture."""
    return (f"python benchmarks/wall_clock_learning.py --task {task} --minutes {minutes} "
            f"--report_minutes {report_minutes} --from_json benchmarks/results/{pattern}")


def _rates(rate):
    """alf_async's env steps/s and its ratio to the synchronous loop's."""
    return (f"{rate_of(rate['alf_async'], 'env steps/s')}, "
            f"{ratio(rate['alf_async'] / rate['tf_agents'])}")


def _by_side(records, read):
    """{side: the median over its runs of `read(run)`}."""
    return {side: statistics.median([read(r) for r in runs_of(records, side)]) for side in SIDES}


def _scores_at(records, side, minutes, read):
    """The median over `side`'s runs of `read(run, seconds)` at each of `minutes`."""
    return [statistics.median([read(r, m * 60) for r in runs_of(records, side)]) for m in minutes]


def _greedy(record, seconds):
    return return_at(record["evaluations"], seconds)


def _training(record, seconds):
    return training_score_at(record["training_episodes"], seconds)


def _minutes(seconds):
    return "not reached" if seconds is None else f"{seconds / 60:.1f} min"


def dqn_breakout(results_dir):
    pattern = "wall_clock_Breakout-v5_seed?_30min.json"
    files, records = _wall_clock(results_dir, pattern)
    steps = _by_side(records, lambda r: r["train_steps"])
    final = {side: _scores_at(records, side, [30], _greedy)[0] for side in SIDES}
    return _row("dqn.breakout_30min",
                "DQN Breakout-v5 (`dqn_breakout.gin`), 30 minutes of training, seeds 0-2: "
                "train steps made, and the game score at the end (median)",
                f"{count(steps['alf_async'])} train steps, "
                f"{ratio(steps['alf_async'] / steps['tf_agents'])}; score {final['alf_async']:.1f}",
                f"tf-agents' synchronous loop: {count(steps['tf_agents'])} train steps; "
                f"score {final['tf_agents']:.1f}", files, results_dir,
                from_json_command("Breakout-v5", 30, "10 20 30", pattern))


def dqn(results_dir):
    """DQN: CartPole's time to solve, Breakout's half hour."""
    return [_solve_row(
        "dqn.cartpole_time_to_solve",
        "DQN CartPole-v0 (`dqn_cartpole.gin`), seconds of training to the first evaluation "
        "at 195, seeds 1-8", "DQN CartPole-v0, seconds of training to solve",
        "time_to_solve_dqn_cartpole.txt", results_dir), dqn_breakout(results_dir)]


def sac_halfcheetah(results_dir):
    pattern = "wall_clock_HalfCheetah-v5_seeds*_8min.json"
    files, records = _wall_clock(results_dir, pattern)
    seeds = sorted({seed for _, seed in records})
    rate = _by_side(records, env_rate)
    at = {side: _scores_at(records, side, [4, 8], _greedy) for side in SIDES}
    return _row("sac.halfcheetah_8min",
                f"SAC HalfCheetah-v5 (`sac_halfcheetah.gin`), 8 minutes of training, seeds "
                f"{', '.join(map(str, seeds))} a side: median greedy return at 4 / 8 minutes, "
                "and env steps/s (a train step per env step on both sides)",
                f"{' / '.join(count(v) for v in at['alf_async'])}; {_rates(rate)}",
                f"tf-agents' synchronous loop: {' / '.join(count(v) for v in at['tf_agents'])}; "
                f"{rate_of(rate['tf_agents'], 'env steps/s')}", files, results_dir,
                from_json_command("HalfCheetah-v5", 8, "4 8", pattern),
                short="SAC HalfCheetah-v5, median greedy return at 4 / 8 minutes of training")


def sac(results_dir):
    """SAC: HalfCheetah against the wall clock."""
    return [sac_halfcheetah(results_dir)]


def _quarters(values, fmt=score):
    return " / ".join("-" if v is None else fmt(v) for v in values)


def ppo_pong_hour(results_dir):
    pattern = "wall_clock_Pong-v5-ppo_seed?_*_60min.json"
    files, records = _wall_clock(results_dir, pattern)
    marks = (15, 30, 45, 60)
    cells = {}
    for side in SIDES:
        reach = median_steps([time_to_reach(r["evaluations"], 18) for r in runs_of(records, side)])
        cells[side] = (f"{_quarters(_scores_at(records, side, marks, _greedy))}; "
                       f"to +18 in {_minutes(reach)}")
    return _row("ppo.pong_hour",
                "PPO Pong-v5 (`ppo_pong.gin`, its earlier layout: two env threads of 4 and an "
                "actor), 60 minutes of training, seeds 0-2 a side: median greedy score at "
                "15 / 30 / 45 / 60 minutes, and median time to +18",
                cells["alf_async"], f"tf-agents' synchronous loop: {cells['tf_agents']}",
                files, results_dir, from_json_command("Pong-v5-ppo", 60, "15 30 45 60", pattern),
                short="PPO Pong-v5, median score at 15 / 30 / 45 / 60 minutes of training")


def ppo_breakout_hour(results_dir):
    pattern = "wall_clock_Breakout-v5-ppo_paced_seed?_*_60min.json"
    files, records = _wall_clock(results_dir, pattern)
    marks = (15, 30, 45, 60)
    target = _scores_at(records, "alf_async", [60], _training)[0]
    reach = {side: median_steps([secs_to_training_score(training_curve(r["training_episodes"]),
                                                        target)
                                 for r in runs_of(records, side)]) for side in SIDES}
    late = ("" if None in reach.values() else
            f"; reads alf_async's 60-minute median at "
            f"{ratio(reach['tf_agents'] / reach['alf_async'])} alf_async's time (medians)")
    return _row("ppo.breakout_hour",
                "PPO Breakout-v5 (`ppo_breakout.gin`, its paced layout), 60 minutes of "
                "training, seeds 0-2 a side: median training score (last 10 games) at "
                "15 / 30 / 45 / 60 minutes",
                _quarters(_scores_at(records, "alf_async", marks, _training)),
                f"tf-agents' synchronous loop: "
                f"{_quarters(_scores_at(records, 'tf_agents', marks, _training))}{late}",
                files, results_dir, from_json_command("Breakout-v5-ppo", 60, "15 30 45 60", pattern),
                short="PPO Breakout-v5, median training score at 15 / 30 / 45 / 60 minutes "
                      "of training")


def ppo_hopper(results_dir):
    pattern = "wall_clock_Hopper-v5-ppo_seed?_*_15min.json"
    files, records = _wall_clock(results_dir, pattern)
    rate = _by_side(records, env_rate)
    final = {side: _scores_at(records, side, [15], _greedy)[0] for side in SIDES}
    return _row("ppo.hopper_15min",
                "PPO Hopper-v5 (`ppo_hopper.gin`), 15 minutes of training, seeds 0-2 a side: "
                "median env steps/s and greedy return at the end",
                f"{_rates(rate)}; return {count(final['alf_async'])}",
                f"tf-agents' synchronous loop: {rate_of(rate['tf_agents'], 'env steps/s')}; "
                f"return {count(final['tf_agents'])}", files, results_dir,
                from_json_command("Hopper-v5-ppo", 15, "5 10 15", pattern))


def _per_frame(results_dir, names, labels=None):
    """(files, records) of per_frame_*.json files, runs renamed by `labels`."""
    records = []
    for name in names:
        path = os.path.join(results_dir, name)
        record = _record(path, os.stat(path).st_mtime_ns)
        records.append({**record, "name": (labels or {}).get(record["name"], record["name"]),
                        "curve": _curve(path, os.stat(path).st_mtime_ns)})
    return tuple(names), records


@functools.lru_cache(maxsize=None)
def _curve(path, stamp):
    """curves.run_curve of the per_frame_*.json at `path`, once per version."""
    return run_curve(_record(path, stamp)["episodes"])


@functools.lru_cache(maxsize=None)
def _record(path, stamp):
    """The parsed per_frame_*.json at `path`, read once per version (`stamp`)."""
    return load_json(os.path.basename(path), os.path.dirname(path))


def _frames_to(records, side, scores):
    """The median over `side`'s runs of the frames to each training score, a
    cell ('-' where the median run never reached it)."""
    runs = [r["curve"] for r in records if r["side"] == side]
    return _frames_cell([median_steps([curves.steps_to(c, s) for c in runs]) for s in scores])


def _at_frames(records, side, millions):
    """The median over `side`'s runs of the training score at `millions` of frames."""
    steps = millions * 1e6 / FRAMES_PER_STEP
    values = [recent_mean(r["episodes"], steps) for r in records
              if r["side"] == side and r["env_steps"] >= steps]
    return statistics.median(values) if values else None


def _frames_cell(steps):
    return _quarters(steps, lambda s: frames(s * FRAMES_PER_STEP))


def _published(name, scores):
    label, curve = curves.references()[name]
    return f"{label}: {_frames_cell([curves.steps_to(curve, s) for s in scores])}"


PONG_PER_FRAME = ("per_frame_ppo2_exact_seed0_tf_agents.json",
                  "per_frame_ppo_pong_seed1_tf_agents.json",
                  "per_frame_ppo_pong_seed2_tf_agents.json",
                  "per_frame_ppo_pong_seed0_alf_async.json",
                  "per_frame_ppo_pong_seed1_alf_async.json",
                  "per_frame_ppo_pong_seed2_alf_async.json")


def ppo_pong_per_frame(results_dir):
    files, records = _per_frame(results_dir, PONG_PER_FRAME, {"ppo2_exact": "ppo_pong"})
    scores = (-19, -15, -10, 0)
    return _row("ppo.pong_per_frame",
                "PPO Pong-v5 per frame (`ppo_pong.gin`: ppo2's settings), seeds 0-2 a side: "
                "median frames to a training score (last 10 games) of -19 / -15 / -10 / 0",
                _frames_to(records, "alf_async", scores),
                f"tf-agents' synchronous loop: {_frames_to(records, 'tf_agents', scores)}; "
                f"{_published('ppo2_pong', scores)}; {_published('sb3_ppo_pong', scores)}",
                files, results_dir,
                "python benchmarks/per_frame.py --from_json " + " ".join(
                    f"benchmarks/results/{f}" for f in files)
                + " --label ppo2_exact=ppo_pong --marks 1 2 2.5 4 --scores -19 -15 -10 0")


def ppo_breakout_per_frame(results_dir):
    names = files_matching(results_dir, "per_frame_ppo_breakout_seed?_*.json")
    files, records = _per_frame(results_dir, names)
    scores = (10, 20, 40)
    at4 = {side: _at_frames(records, side, 4) for side in SIDES}
    return _row("ppo.breakout_per_frame",
                "PPO Breakout-v5 per frame (`ppo_breakout.gin`), seeds 0-1 a side: median frames "
                "to a training score of +10 / +20 / +40, and the score at 4M frames",
                f"{_frames_to(records, 'alf_async', scores)}; {score(at4['alf_async'])} at 4M",
                f"tf-agents' synchronous loop: {_frames_to(records, 'tf_agents', scores)}; "
                f"{score(at4['tf_agents'])} at 4M; {_published('sb3_ppo_breakout', scores)}",
                files, results_dir,
                "python benchmarks/per_frame.py --task Breakout-v5-ppo --from_json "
                "benchmarks/results/per_frame_ppo_breakout_seed*.json --marks 1 2.5 4 7 10")


def ppo(results_dir):
    """PPO: CartPole's time to solve, Pong and Breakout in an hour and per frame, Hopper."""
    return [_solve_row("ppo.cartpole_time_to_solve",
                       "PPO CartPole-v0 (`ppo_cartpole.gin`), seconds of training to the first "
                       "evaluation at 195, seeds 1-16",
                       "PPO CartPole-v0, seconds of training to solve",
                       "time_to_solve_ppo_cartpole_one_env_thread.txt", results_dir,
                       "## run 8: the file (one env thread of 16), seeds 1-16"),
            ppo_pong_hour(results_dir), ppo_pong_per_frame(results_dir),
            ppo_breakout_hour(results_dir), ppo_breakout_per_frame(results_dir),
            ppo_hopper(results_dir)]


def impala_pong_hour(results_dir):
    pattern = "wall_clock_Pong-v5-impala_seed0_*_60min.json"
    files, records = _wall_clock(results_dir, pattern)
    rate = {side: env_rate(runs_of(records, side)[0]) for side in SIDES}
    best = {side: max(e[3] for e in runs_of(records, side)[0]["evaluations"]) for side in SIDES}
    return _row("impala.pong_hour",
                "IMPALA Pong-v5 (`impala_pong.gin`'s earlier settings, the A3C network), 60 "
                "minutes of training, seed 0: env steps/s and the best greedy score",
                f"{_rates(rate)}; best score {score(best['alf_async'])}",
                f"tf-agents' synchronous loop: {rate_of(rate['tf_agents'], 'env steps/s')}; "
                f"best score {score(best['tf_agents'])}", files, results_dir,
                from_json_command("Pong-v5-impala", 60, "15 30 45 60", pattern))


def impala_pong_per_frame(results_dir):
    name = "per_frame_impala_sb3_a2c_seed0_tf_agents.json"
    files, records = _per_frame(results_dir, (name,))
    scores = (-19, -18)
    return _row("impala.pong_per_frame",
                "IMPALA Pong-v5 per frame (`impala_pong.gin`: RL Baselines3 Zoo's A2C settings) on "
                "tf-agents' synchronous loop, seed 0: frames to a training score of -19 / -18",
                f"`impala_pong.gin`: {_frames_to(records, 'tf_agents', scores)}",
                _published("sb3_a2c_pong", scores), files, results_dir,
                f"python benchmarks/per_frame.py --from_json benchmarks/results/{name} "
                "--reference sb3_a2c_pong --marks 1 2 4 8 10 12 --scores -19 -18")


def impala(results_dir):
    """IMPALA: Pong in an hour and per frame."""
    return [impala_pong_hour(results_dir), impala_pong_per_frame(results_dir)]


def learning(results_dir):
    """Does it learn sooner: every agent's wall-clock rows."""
    keys = ("dqn.cartpole_time_to_solve", "ppo.cartpole_time_to_solve", "ppo.pong_hour",
            "ppo.breakout_hour", "sac.halfcheetah_8min", "ppo.hopper_15min",
            "dqn.breakout_30min", "impala.pong_hour")
    rows = {row.key: row for table in (dqn, sac, ppo, impala) for row in table(results_dir)}
    return [rows[key] for key in keys]


TABLES = {"dqn": dqn, "sac": sac, "ppo": ppo, "impala": impala, "learning": learning}
