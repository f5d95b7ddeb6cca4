"""The rows of the table `processes`: what a step of an environment in a child
process costs, over shared memory (the default transport) and over pickled
pipes (`transport='pipe'`), and what that buys environments that wait.
Read from benchmarks/results/ (driver_cost.py's JSON, latency_bound.py's and
time_to_solve.py's outputs); rendered in docs/guides/environments.md and
docs/guides/choose-layout.md.
"""

import re

from result_rows import Row, load_json, meta_of, rate, ratio, read_text
from tables_collection import console_table, latency_bound

COST = "driver_cost_processes.json"
LATENCY = "latency_bound_48_lognormal_processes.txt"
LATENCY_PIPE = "latency_bound_48_lognormal_processes_pipe.txt"
SOLVE = "time_to_solve_dqn_cartpole_subprocess.txt"
SOLVE_PIPE = "time_to_solve_dqn_cartpole_subprocess_pipe.txt"
RETURN_SAC = "time_to_return_sac_pendulum_subprocess.txt"


def _row(results_dir, key, what, ours, theirs, files):
    return Row(key=key, what=what, ours=ours, theirs=theirs, files=tuple(files),
               **meta_of(files, results_dir))


def _us(value):
    return f"{value:.0f} us"


def _split(side):
    """'T us (driver's process P, children C)' of a driver_cost side."""
    return (f"{_us(side['cpu_us'])} (driver's process {_us(side['parent_us'])}, "
            f"children {_us(side['children_us'])})")


def _cost(results_dir):
    """driver_cost_processes.json's table, and the envs_per_process of its batched path."""
    cost = load_json(COST, results_dir)
    return cost["table"], cost["args"].get("envs_per_process", 8)


def _layer(results_dir):
    table, k = _cost(results_dir)
    alone = lambda path: table[path]["environment alone"]
    return _row(
        results_dir, "processes.layer",
        f"CPU per env step of 16 rows of a tiny environment in child processes, stepped "
        f"in lockstep with no TF (the layer alone)",
        f"shared memory: {_split(alone('subprocess'))}; with `envs_per_process={k}`: "
        f"{_split(alone('subprocess_batched'))}",
        f"pickled pipes: {_split(alone('subprocess_pipe'))}; the children stepping alone, "
        f"no driver: {_us(table['subprocess']['bare processes']['cpu_us'])}",
        [COST])


def _under_driver(results_dir):
    table, k = _cost(results_dir)
    side = "alf_async 1x16, 1 actor"

    def cell(path):
        s = table[path][side]
        return (f"{_split(s)}, so one driver process feeds at most "
                f"{rate(1e6 / s['parent_us'])}")
    return _row(
        results_dir, "processes.driver",
        "The same 16 rows under the driver (one env thread of 16 rows, one actor): CPU per "
        "env step, and the driver's process's share, whose inverse bounds what one driver "
        "process can feed",
        f"shared memory: {cell('subprocess')}; with `envs_per_process={k}`: "
        f"{cell('subprocess_batched')}",
        f"pickled pipes: {cell('subprocess_pipe')}; in process (graph loop, no children): "
        f"{_us(table['graph'][side]['cpu_us'])}",
        [COST])


PROCESS_COLUMNS = ("rate", "vs_parallel", "vs_threads", "of_bare", "parent_us", "children_us")


def _waiting(results_dir, key, name, transport):
    _, settings = latency_bound(name, results_dir)
    text = read_text(name, results_dir)
    table = console_table(text, "bare processes:", PROCESS_COLUMNS)
    layouts = [n for n in table if n.startswith("alf_async")]
    best = max(layouts, key=lambda n: table[n]["rate"])
    label = best[len("alf_async "):].replace(":0", " acting itself")
    b, ceiling = table[best], table["ceiling"]
    return _row(
        results_dir, key,
        f"{settings}, over {transport}, the DQN collect policy: the best layout against "
        f"tf-agents' lockstep (`BatchedPyEnvironment(multithreading=True)` in process, and "
        f"`ParallelPyEnvironment`), and the children stepping alone with no driver",
        f"{label}: {rate(b['rate'])}, {ratio(b['vs_threads'])} the in-process lockstep, "
        f"{ratio(b['vs_parallel'])} `ParallelPyEnvironment`, {b['of_bare']:.0%} of the "
        f"children alone; the driver's process {_us(b['parent_us'])} a step, the children "
        f"{_us(b['children_us'])}",
        f"in-process lockstep {rate(table['lockstep threads']['rate'])}; "
        f"`ParallelPyEnvironment` {rate(table['lockstep']['rate'])}; a bare Python loop over "
        f"the same children {rate(ceiling['rate'])} ({ceiling['of_bare']:.0%}); the children "
        f"alone {rate(table['bare processes']['rate'])}, {_us(table['bare processes']['children_us'])} a step",
        [name])


def _median_secs(name, results_dir):
    for line in read_text(name, results_dir).splitlines():
        if line.startswith("async") and "median" in line:
            return float(line.split("median")[1].split("s")[0])
    raise ValueError(f"{name}: no async median")


def _solve(results_dir):
    shm, pipe = _median_secs(SOLVE, results_dir), _median_secs(SOLVE_PIPE, results_dir)
    return _row(
        results_dir, "processes.dqn_cartpole",
        "`dqn_cartpole_subprocess.gin`: median seconds to the first evaluation at 195, "
        "the same seeds",
        f"shared memory: {shm:.1f} s", f"pickled pipes: {pipe:.1f} s ({ratio(shm / pipe)})",
        [SOLVE, SOLVE_PIPE])


def _side_medians(name, results_dir):
    """{side: (median seconds or None, solved, runs)} of a time_to_return.py output."""
    sides = {}
    for line in read_text(name, results_dir).splitlines():
        match = re.match(r"^(.+?)\s*: median (\S+)(?: s)? over (\d+) solved of (\d+) runs$", line)
        if match:
            side, median, solved, runs = match.groups()
            sides[side] = (None if median == "-" else float(median), int(solved), int(runs))
    if not sides:
        raise ValueError(f"{name}: no medians")
    return sides


def _sac(results_dir):
    sides = _side_medians(RETURN_SAC, results_dir)
    cell = lambda side: (f"{sides[side][0]:.0f} s ({sides[side][1]} of {sides[side][2]} runs "
                         f"solved)" if sides[side][0] is not None else
                         f"not solved in {sides[side][2]} runs")
    return _row(
        results_dir, "processes.sac_pendulum",
        "`sac_pendulum_subprocess.gin`: median seconds of training to the greedy evaluation "
        "at its `Evaluation.stop_at_return`, the same seeds",
        f"shared memory: {cell('shared memory')}", f"pickled pipes: {cell('pipe')}",
        [RETURN_SAC])


def processes(results_dir):
    """Environments in child processes: the transport's cost and what it buys."""
    return [
        _layer(results_dir),
        _under_driver(results_dir),
        _waiting(results_dir, "processes.waiting", LATENCY, "shared memory"),
        _waiting(results_dir, "processes.waiting_pipe", LATENCY_PIPE, "pickled pipes"),
        _solve(results_dir),
        _sac(results_dir),
    ]


TABLES = {"processes": processes}
