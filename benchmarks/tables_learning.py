"""The learning tables (dqn, sac, ppo, impala, learning) and the pictures
beside them, read from benchmarks/results/ (render_results.py writes them).

Each table is a function `(results_dir) -> [Row]` in `TABLES`; each picture
list a function `(results_dir) -> [Picture]` in `PICTURES`. The figures come
from the readers the benchmarks report with: time_to_solve.py's summary
lines, alf_async.testing.bench.wall_clock_report (wall_clock_learning.py's
`--from_json`) and alf_async.testing.bench.curves (per_frame.py's).
"""

import dataclasses
import re
import statistics

from result_rows import Row, meta_of, ratio, read_text, secs

# Tables without a results file of this version yet: the command that would make one.
NO_FILE_YET = {
    "sac": "python benchmarks/wall_clock_learning.py --task Hopper-v5 --seeds 0 1 2 "
           "--minutes 15 --eval_every_steps 10000",
}
_MEDIAN = re.compile(r"^(\S+)\s+: median ([\d.]+) s over (\d+) runs, (\d+) not solved", re.M)
_RATIO = re.compile(r"^ratio of medians \S+ / \S+: ([\d.]+)$", re.M)


@dataclasses.dataclass(frozen=True)
class Picture:
    """A picture of docs/images/ and the results files it is drawn from.

    Attributes:
        image: its file name in docs/images/.
        alt: what it shows, in words (no measured figures).
        files: the results files it is drawn from, relative to benchmarks/results/.
        command: the command that draws it from them.
        host: "CPU model (kind)" of the runs.
        date: YYYY-MM-DD of the latest of them.
    """
    image: str
    alt: str
    files: tuple
    command: str
    host: str
    date: str


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
        raise ValueError(f"no complete time_to_solve summary{' under ' + heading if heading else ''}")
    return medians, float(found.group(1))


def _solve_row(key, what, short, name, results_dir, heading=None):
    medians, ratio_of_medians = solve_times(read_text(name, results_dir), heading)
    ours, theirs = medians["async"], next(v for k, v in medians.items() if k != "async")
    meta = meta_of((name,), results_dir)
    return Row(key=key, what=what, short=short,
               ours=f"{secs(ours[0])} median over {ours[1]} runs ({ratio(ratio_of_medians)} "
                    f"the other side's time), {ours[2]} unsolved",
               theirs=f"tf-agents' synchronous loop: {secs(theirs[0])}, {theirs[2]} unsolved",
               files=(name,), **meta)


def dqn(results_dir):
    """DQN: CartPole's time to solve."""
    return [_solve_row(
        "dqn.cartpole_time_to_solve",
        "DQN CartPole-v0 (`dqn_cartpole.gin`), seconds of training to the first evaluation "
        "at 195, seeds 1-8", "DQN solves CartPole-v0 sooner (seconds of training, seeds 1-8)",
        "time_to_solve_dqn_cartpole.txt", results_dir)]


def sac(results_dir):
    """SAC: no results file of this version yet (`NO_FILE_YET`)."""
    return []


TABLES = {"dqn": dqn, "sac": sac}
PICTURES = {}
