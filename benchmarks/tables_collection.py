"""The results tables of "does it collect faster" and "where it does not pay",
read from benchmarks/results/, and `TABLES`, every table of helper A2's
modules (tables_choices.py: `Layout.choice = 'auto'` and the host kinds;
tables_reliability.py: "does it survive faults").

Every figure comes from a results file, parsed as its script wrote it: a
JSON record, or a .txt of the script's console output (the tables that
throughput.py, latency_bound.py, atari_throughput.py, driver_cost.py,
layout_choice.py, kernel_choice.py, learner_ops.py and step_breakdown.py
print). A table whose file is missing raises FileNotFoundError naming it.
Ratios are the scripts' own: the median of per-round (or per-pair) ratios.
"""

import re
import statistics

from result_rows import Row, count, load_json, meta_of, rate, ratio, read_text
from tables_choices import host_kinds, layout_auto
from tables_reliability import reliability

# ------------------------------------------------------------------ parsing


def _number(token):
    """A console table's cell as a float ('1,412', '1.52x', '72%', 'nan'), else None."""
    text = token.replace(",", "")
    scale = 0.01 if text.endswith("%") else 1.0
    try:
        return float(text.rstrip("x%")) * scale
    except ValueError:
        return None


def console_table(text, start, columns):
    """{row name: {column: value}} of the first console table at or after the
    line beginning with `start`: its header line begins with "collector", then
    one row per line until a blank one, a name followed by one number per
    `columns` (rows ending in words, such as a bound's note, are skipped)."""
    lines = text.splitlines()
    at = next((i for i, l in enumerate(lines) if l.startswith(start)), None)
    if at is None:
        raise ValueError(f"no line beginning {start!r}")
    header = next((i for i in range(at, len(lines)) if lines[i].startswith("collector")), None)
    if header is None:
        raise ValueError(f"no table header after {start!r}")
    table = {}
    for line in lines[header + 1:]:
        if not line.strip():
            break
        tokens = line.split()
        values = [_number(t) for t in tokens[-len(columns):]]
        if len(tokens) > len(columns) and None not in values:
            table[" ".join(tokens[:-len(columns)])] = dict(zip(columns, values))
    return table


LATENCY_COLUMNS = ("rate", "ratio", "of_bound", "of_ceiling", "cpu_us", "cs", "batch")
ATARI_COLUMNS = ("rate", "ratio", "of_env", "cpu_us", "cs", "batch")
_LATENCY_SETTINGS = re.compile(r"^(\d+) envs( in child processes)?, (\w+) latency of mean "
                               r"([\d.]+) ms", re.M)


def latency_bound(name, results_dir):
    """(table, "N CartPoles ... sleeping DIST(M ms)") of a latency_bound.py output."""
    text = read_text(name, results_dir)
    match = _LATENCY_SETTINGS.search(text)
    if match is None:
        raise ValueError(f"{name}: no latency_bound.py table")
    envs, processes, dist, mean_ms = match.groups()
    where = " in child processes" if processes else ""
    return (console_table(text, match.group(0), LATENCY_COLUMNS),
            f"{envs} CartPoles{where} whose every step first sleeps {dist}({float(mean_ms):g} ms)")


def _span(values, fmt):
    """'a-b' of formatted values (a unit they end in written once: '0.82-0.97x'),
    or one where they agree."""
    low, high = fmt(min(values)), fmt(max(values))
    if low == high:
        return low
    unit = re.search(r"[^\d.]*$", low).group(0)
    return f"{low[:len(low) - len(unit)] if high.endswith(unit) else low}-{high}"


def _us(value):
    return f"{value:.1f} us"


def _ms(value):
    return f"{value:.2f} ms"


def _row(results_dir, key, what, ours, theirs, files, short=""):
    """A Row of `files`, its host, date and command from their records
    (result_rows.meta_of)."""
    return Row(key=key, what=what, ours=ours, theirs=theirs, files=tuple(files), short=short,
               **meta_of(files, results_dir))


# ------------------------------------------------------------------ collection


def _throughput(results_dir):
    return load_json("throughput.json", results_dir)["table"]


def _cartpole64(results_dir):
    table = _throughput(results_dir)
    base = table["tf-agents DynamicStepDriver, BatchedGymEnv(64)"]
    acting = table["alf_async 1x64 acting itself BatchedGymEnv"]
    actor = table["alf_async 1x64 BatchedGymEnv"]
    stack = table["alf_async 2x32 BatchedPyEnvironment"]
    return _row(
        results_dir, "collection.cartpole64",
        "64 cheap in-process CartPoles, the DQN collect policy: one env thread of 64 acting "
        "itself (`Layout.actor_queues = 0`) against tf-agents' `DynamicStepDriver` over the "
        "same `BatchedGymEnv`, alternating rounds",
        f"{rate(acting['rate'])}, {ratio(acting['ratio'])}; with an actor thread "
        f"{ratio(actor['ratio'])}; through tf-agents' `suite_gym` stack, 2 x 32: "
        f"{ratio(stack['ratio'])}",
        f"`DynamicStepDriver`: {rate(base['rate'])}", ["throughput.json"])


def _atari(name, results_dir, layer="envpool"):
    return console_table(read_text(name, results_dir), f"[{layer}]", ATARI_COLUMNS)


def _atari_in_process(results_dir):
    table = _atari("atari_throughput.txt", results_dir, "inprocess")
    base = table["tf-agents DynamicStepDriver (lockstep)"]
    acting, actor = table["alf_async 2x8 acting itself"], table["alf_async 2x8"]
    alone = table["environment alone (no TF)"]
    return _row(
        results_dir, "collection.atari_in_process",
        "16 in-process Breakout games (gymnasium + ale-py), the Nature-CNN DQN collect policy: "
        "2 env threads x 8 acting themselves against tf-agents' `DynamicStepDriver`",
        f"{rate(acting['rate'])}, {ratio(acting['ratio'])} (with an actor thread "
        f"{ratio(actor['ratio'])}); the games alone, no TF: {rate(alone['rate'])}",
        f"`DynamicStepDriver`: {rate(base['rate'])}", ["atari_throughput.txt"],
        short="Collection from 16 in-process Atari games, the Nature-CNN policy")


def _envpool_lockstep(results_dir):
    table = _atari("atari_throughput_envpool_lockstep.txt", results_dir)
    base = table["tf-agents DynamicStepDriver (lockstep)"]
    acting, one = table["alf_async 2x8 acting itself"], table["alf_async 1x16 acting itself"]
    return _row(
        results_dir, "collection.envpool_lockstep",
        "16 Breakout games in EnvPool pools, the Nature-CNN DQN collect policy: 2 env threads "
        "x 8 acting themselves, each stepping its pool in lockstep "
        "(`suite_envpool.stepping = 'lockstep'`, `dqn_breakout_envpool.gin`)",
        f"{rate(acting['rate'])}, {ratio(acting['ratio'])} (1 x 16: {ratio(one['ratio'])})",
        f"tf-agents' lockstep driver over one pool of 16: {rate(base['rate'])}",
        ["atari_throughput_envpool_lockstep.txt"])


def _latency_row(results_dir, key, name, lead, base_name, base_label):
    table, settings = latency_bound(name, results_dir)
    layouts = [n for n in table if n.startswith("alf_async")]
    best = max(layouts, key=lambda n: table[n]["ratio"])
    label = lambda n: n[len("alf_async "):].replace(":0", " acting itself")
    others = "".join(f"; {label(n)} {ratio(table[n]['ratio'])}" for n in layouts if n != best)
    return _row(
        results_dir, key, f"{lead}: {settings}, the DQN collect policy, against {base_name}",
        f"{label(best)}: {rate(table[best]['rate'])}, {ratio(table[best]['ratio'])}"
        f"{others}; {table[best]['of_ceiling']:.0%} of the no-TF ceiling",
        f"{base_label}: {rate(table['lockstep']['rate'])}", [name],
        short=f"Collection from {settings}")


def _serving(results_dir):
    data = load_json("serving.json", results_dir)
    rows = data["rows"] if isinstance(data, dict) else data
    clients = " / ".join(f"{n:g}" for n, *_ in rows)
    return _row(
        results_dir, "collection.serving",
        f"Policy serving over HTTP on loopback: one `PolicyServerEnv` process, a client "
        f"process of {clients} threads playing episodes, get_action per step",
        f"{' / '.join(count(r[3]) for r in rows)} get_action/s; p99 "
        f"{' / '.join(_ms(r[2]) for r in rows)}; client errors "
        f"{' / '.join(f'{r[5]:g}' for r in rows)}", "", ["serving.json", "serving.txt"])


def step_breakdown_runs(name, results_dir):
    """(alf_async records, synchronous records, pair ratios of env steps/s)
    of a step_breakdown.py file of alternating runs ({"what", "runs"}), pairs
    taken in the runs' order."""
    runs = load_json(name, results_dir)["runs"]
    ours = [r["record"] for r in runs if r["record"]["side"] == "alf_async"]
    theirs = [r["record"] for r in runs if r["record"]["side"] == "tf_agents"]
    pairs = [a["env_steps_per_sec"] / b["env_steps_per_sec"] for a, b in zip(ours, theirs)]
    return ours, theirs, pairs


def _pong_layer(results_dir, key, name, what):
    ours, theirs, pairs = step_breakdown_runs(name, results_dir)
    med = lambda records, field: statistics.median(r[field] for r in records)
    return _row(
        results_dir, key, what,
        f"{count(med(ours, 'env_steps_per_sec'))} env steps/s, "
        f"{ratio(statistics.median(pairs))} (pairs {', '.join(ratio(p) for p in pairs)}), at "
        f"{ratio(med(ours, 'whole_ms') / med(theirs, 'whole_ms'))} its CPU per env step, on "
        f"{med(ours, 'cores'):.2f} cores",
        f"tf-agents' synchronous loop: {count(med(theirs, 'env_steps_per_sec'))} env steps/s, "
        f"{med(theirs, 'cores'):.2f} cores", [name])


PONG_LAYER = ("PPO Pong-v5 while training (`ppo_pong.gin` as shipped: one env thread of 8 "
              "EnvPool games stepped in lockstep, acting itself, paced one batch ahead): env "
              "steps/s against tf-agents' synchronous loop, alternating pairs of 180 s runs")


def collection(results_dir):
    """Does it collect faster: alf_async against tf-agents' collection."""
    return [
        _cartpole64(results_dir),
        _atari_in_process(results_dir),
        _envpool_lockstep(results_dir),
        _latency_row(results_dir, "collection.blocking_envs", "latency_bound_32_exp10ms.txt",
                     "Environments that wait", "tf-agents' lockstep collection",
                     "lockstep (multithreaded `BatchedPyEnvironment`)"),
        _latency_row(results_dir, "collection.child_processes",
                     "latency_bound_32_processes.txt", "Environments in child processes",
                     "tf-agents' `ParallelPyEnvironment`", "`ParallelPyEnvironment`"),
        _latency_row(results_dir, "collection.lognormal48",
                     "latency_bound_48_lognormal_row_workers.txt",
                     "Environments that wait briefly, stepped on row workers",
                     "tf-agents' lockstep collection",
                     "lockstep (multithreaded `BatchedPyEnvironment`)"),
        _serving(results_dir),
        _pong_layer(results_dir, "collection.ppo_pong_env_steps",
                    "step_breakdown_ppo_pong_paced.json", PONG_LAYER),
        _pong_layer(results_dir, "collection.ppo_pong_env_steps_epyc",
                    "step_breakdown_ppo_pong_epyc_shipped.json",
                    PONG_LAYER + ", again on another host"),
    ]


# ------------------------------------------------------------------ not paying

ROWS_PATHS = {"rows": "worker threads", "envpool": "EnvPool's asynchronous pool"}


def own_cpu_ratios(name, results_dir, paths):
    """{path: {side: own CPU / lockstep's}} of a driver_cost.py JSON: each
    alf_async side's `own_us` over its path's lockstep `own_us`, as the
    script prints it (none where lockstep's own is not above 0)."""
    table = load_json(name, results_dir)["table"]
    out = {}
    for path in paths:
        base = table[path]["lockstep"]["own_us"]
        if base <= 0:
            continue
        out[path] = {side: row["own_us"] / base for side, row in table[path].items()
                     if side.startswith("alf_async")}
    return out


def _rows_one_by_one(results_dir):
    table = load_json("driver_cost.json", results_dir)["table"]
    ratios = own_cpu_ratios("driver_cost.json", results_dir, ROWS_PATHS)
    every = [r for sides in ratios.values() for r in sides.values()]
    parts = ", ".join(
        f"{ROWS_PATHS[p]} {_span([table[p][s]['own_us'] for s in sides], lambda v: f'{v:.1f}')} us"
        for p, sides in ratios.items())
    return _row(
        results_dir, "not_paying.rows_one_by_one",
        "The driver's own CPU per env step where rows are stepped one by one (rows on worker "
        "threads, `blocking_step`; EnvPool's asynchronous pool, `stepping = 'rows'`): 16 rows "
        "of a tiny environment, a constant policy, every layout (1 x 16, 2 x 8; an actor "
        "thread or acting itself), less the environment layer's own CPU",
        f"{_span(every, lambda v: f'{v:.1f}')}x lockstep's; {parts}",
        "lockstep: " + ", ".join(f"{_us(table[p]['lockstep']['own_us'])}" for p in ratios),
        ["driver_cost.json"], short="The driver's own CPU per env step, rows stepped one by one")


def _own_cpu_batched(results_dir, key, name, where):
    table = load_json(name, results_dir)["table"]
    side = "alf_async 1x16, acting itself"
    paths = (("graph", "the graph loop"), ("envpool_lockstep", "EnvPool lockstep pools"))
    return _row(
        results_dir, key,
        f"The driver's own CPU per env step where rows step together{where}: 16 rows, one "
        "env thread acting itself, in the graph loop and on EnvPool pools stepped in lockstep",
        "; ".join(f"{label} {_us(table[p][side]['own_us'])} "
                  f"({ratio(table[p][side]['own_us'] / table[p]['lockstep']['own_us'])})"
                  for p, label in paths),
        "lockstep: " + "; ".join(f"{_us(table[p]['lockstep']['own_us'])}" for p, _ in paths),
        [name])


def _child_process_cpu(results_dir):
    name = "driver_cost_processes.json"
    tables = load_json(name, results_dir)["table"]
    table = tables["subprocess"]
    base = table["lockstep"]["cpu_us"]
    sides = [s for s in table if s.startswith("alf_async")]
    in_process = tables["graph"]["alf_async 1x16, 1 actor"]["cpu_us"]
    return _row(
        results_dir, "not_paying.child_processes_cpu",
        "The whole CPU per env step of 16 rows of a tiny environment in child processes "
        "(`SubprocessEnv` over shared memory), every layout: cheap steps pay for waking "
        "the processes",
        f"{_span([table[s]['cpu_us'] for s in sides], lambda v: f'{v:.0f}')} us, "
        f"{_span([table[s]['cpu_us'] / base for s in sides], ratio)} lockstep's",
        f"lockstep over the same children: {_us(base)}; the same environments in "
        f"process under the driver: {_us(in_process)}", [name])


def _envpool_rows(results_dir):
    table = _atari("atari_throughput_envpool_rows.txt", results_dir)
    base = table["tf-agents DynamicStepDriver (lockstep)"]
    sides = [n for n in table if n.startswith("alf_async")]
    best = max(sides, key=lambda n: table[n]["ratio"])
    return _row(
        results_dir, "not_paying.envpool_rows",
        "16 Breakout games in EnvPool's asynchronous pool (`suite_envpool.stepping = 'rows'`), "
        "the Nature-CNN DQN collect policy, on 2 cores: the driver's layouts against lockstep",
        f"{_span([table[n]['ratio'] for n in sides], ratio)} lockstep (best: "
        f"{best[len('alf_async '):]}, {rate(table[best]['rate'])})",
        f"tf-agents' lockstep driver over the same pool: {rate(base['rate'])}",
        ["atari_throughput_envpool_rows.txt"])


ROW_WORKER_COLUMNS = ("cpu_us", "runq_us", "voluntary_cs", "involuntary_cs")


def _row_workers(results_dir):
    name = "latency_bound_48_lognormal_row_workers.txt"
    _, settings = latency_bound(name, results_dir)
    table = console_table(read_text(name, results_dir), "row workers' time", ROW_WORKER_COLUMNS)
    cell = lambda r: (f"{_us(r['cpu_us'])} of CPU, {_us(r['runq_us'])} waiting for a core, "
                      f"{r['voluntary_cs']:.2f} voluntary and {r['involuntary_cs']:.2f} "
                      f"involuntary context switches")
    return _row(
        results_dir, "not_paying.row_workers",
        f"What an env step costs the thread that steps its row when one batched reply wakes "
        f"many at once: {settings}, one env thread of 48 rows with an actor, per env step",
        cell(table["alf_async 1x48"]),
        f"the ceiling's threads, woken one at a time, no TF: {cell(table['ceiling'])}", [name])


def _cartpole64_threads(results_dir):
    table = _throughput(results_dir)
    sides = [n for n in table if n.startswith("alf_async") and n.endswith(" BatchedGymEnv")
             and n != "alf_async 1x64 acting itself BatchedGymEnv"]
    return _row(
        results_dir, "not_paying.cartpole64_threads",
        "64 cheap in-process CartPoles with an actor thread, or split over more env threads: "
        "each Python step holds the GIL and each request costs a hand-off",
        "; ".join(f"{n.split()[1]}{' acting itself' if 'acting' in n else ''} "
                  f"{ratio(table[n]['ratio'])}" for n in sides),
        f"`DynamicStepDriver`: "
        f"{rate(table['tf-agents DynamicStepDriver, BatchedGymEnv(64)']['rate'])}",
        ["throughput.json"])


def _ppo_pong_avx2(results_dir):
    name = "step_breakdown_ppo_pong_paced_avx2.json"
    runs = load_json(name, results_dir)["runs"]
    by_run = {r["run"]: r["record"] for r in runs}
    paced, sync = by_run["paced"], [r["record"] for r in runs if r["run"].startswith("sync")]
    sync_rate = statistics.median(r["env_steps_per_sec"] for r in sync)
    return _row(
        results_dir, "not_paying.ppo_pong_avx2",
        "PPO Pong-v5 (`ppo_pong.gin` as shipped) on the AVX2 kind (emulated: float32 "
        "torsos), where the learner takes most of each env step: env steps/s while training",
        f"{count(paced['env_steps_per_sec'])} env steps/s, "
        f"{ratio(paced['env_steps_per_sec'] / sync_rate)}, at "
        f"{ratio(paced['whole_ms'] / statistics.median(r['whole_ms'] for r in sync))} its CPU "
        f"per env step (the earlier layout, two env threads of 4 with an actor: "
        f"{count(by_run['two_env_threads']['env_steps_per_sec'])} env steps/s)",
        f"tf-agents' synchronous loop: {' / '.join(count(r['env_steps_per_sec']) for r in sync)}"
        f" env steps/s", [name])


def not_paying(results_dir):
    """Where it does not pay: the driver's own cost and the layers it loses on."""
    return [
        _rows_one_by_one(results_dir),
        _child_process_cpu(results_dir),
        _row_workers(results_dir),
        _own_cpu_batched(results_dir, "not_paying.own_cpu_batched", "driver_cost.json", ""),
        _own_cpu_batched(results_dir, "not_paying.own_cpu_batched_epyc",
                         "driver_cost_graph_envpool_epyc.json", " (another host)"),
        _envpool_rows(results_dir),
        _cartpole64_threads(results_dir),
        _ppo_pong_avx2(results_dir),
    ]


TABLES = {"collection": collection, "not_paying": not_paying, "reliability": reliability,
          "layout_auto": layout_auto, "host_kinds": host_kinds}
