"""The results table of "does it survive faults", read from benchmarks/results/:
the chaos and soak trials, the network faults and the partition trial,
collection and serving across a network (tables_collection.py registers it).

Every figure comes from a results file as its script wrote it: chaos.txt
(tests/stress/chaos.py's figures, through benchmarks/chaos.py), soak.txt
(benchmarks/soak.py's tables), network_faults.json, partition_trial.txt,
across_network*.json and serving's across-a-link JSON. A table whose file is
missing raises FileNotFoundError naming it.
"""

import re
import statistics

from result_rows import Row, count, load_json, meta_of, ratio, read_text


def _row(results_dir, key, what, ours, theirs, files):
    return Row(key=key, what=what, ours=ours, theirs=theirs, files=tuple(files),
               **meta_of(files, results_dir))


def _search(pattern, text, name):
    match = re.search(pattern, text, re.M)
    if match is None:
        raise ValueError(f"{name}: no line matching {pattern!r}")
    return match


# ------------------------------------------------------------------ trials

_KILLS = (r"^Crashing simulators: (\d+) kill -9 .*\n.*\n  env steps checked (\d+) in (\d+) "
          r"learner batches.*\n  steps lost or repeated: (\d+); envs with kills != restarts != "
          r"truncations: (\[.*?\]); children seen (\d+), left (\d+); "
          r"(?:shared-memory segments left (\d+); )?stop\(\) ([\d.]+) s")
_CHECKPOINTS = (r"^Checkpoints: (\d+) kill -9 .*\n  resumes (\d+) \(fresh starts (\d+)\).*\n"
                r"  kills that left .*: (\d+)\n  final run: (.*); problems (\d+);")


def chaos(results_dir):
    """The rows of chaos.txt: children kill -9'ed during training, and the
    training CLI kill -9'ed and resumed (when the run had that trial)."""
    text = read_text("chaos.txt", results_dir)
    kills, steps, batches, errors, mismatched, seen, left, segments, stop = _search(
        _KILLS, text, "chaos.txt").groups()
    # Runs before shared memory did not count segments.
    segments = "" if segments is None else f"; {segments} shared-memory segments left"
    rows = [_row(
        results_dir, "reliability.chaos_kills",
        "A DQN training run on `SubprocessEnv` children while a chaos thread `kill -9`s a "
        "random child every few seconds: every env step checked for loss or repetition, "
        "every child for survival after `stop()`, every shared-memory segment for release",
        f"{count(int(kills))} kills; {count(int(errors))} env steps lost or repeated of "
        f"{count(int(steps))} checked in {count(int(batches))} learner batches; envs whose "
        f"kills, restarts and truncations differ: {mismatched}; {left} of {seen} children "
        f"left{segments}; `stop()` {float(stop):.2f} s", "", ["chaos.txt"])]
    checkpoints = re.search(_CHECKPOINTS, text, re.M)
    if checkpoints:
        cycles, resumes, fresh, mid_save, final, problems = checkpoints.groups()
        rows.append(_row(
            results_dir, "reliability.checkpoint_kills",
            "The training CLI `kill -9`ed at random moments, each time resumed on the same "
            "root_dir",
            f"{resumes} of {cycles} resumed (fresh starts {fresh}, killed mid-save "
            f"{mid_save}); problems {problems}; the final run: {final}", "", ["chaos.txt"]))
    return rows


def markdown_table(text, first_header_cell):
    """The rows (dicts by header cell) of the first markdown table whose
    header's first cell is `first_header_cell`."""
    lines = text.splitlines()
    at = next((i for i, l in enumerate(lines)
               if l.startswith(f"| {first_header_cell} |")), None)
    if at is None:
        raise ValueError(f"no table headed {first_header_cell!r}")
    header = [c.strip() for c in lines[at].strip("|").split("|")]
    rows = []
    for line in lines[at + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, (c.strip() for c in line.strip("|").split("|")))))
    return rows


def soak(results_dir):
    """The soak's row: the first and last samples of the trainer and of the
    HTTP-fed learner beside it, the exit, the processes left, the growth flags."""
    text = read_text("soak.txt", results_dir)
    minutes = _search(r"^Soak: ([\d.]+) min of DQN CartPole on (\d+) SubprocessEnvs", text,
                      "soak.txt")
    trainer = markdown_table(text, "t (s)")
    first, last = trainer[1] if len(trainer) > 2 else trainer[0], trainer[-1]
    ends = lambda column, rows=(first, last): " -> ".join(r[column] for r in rows)
    ours = (f"trainer RSS {ends('trainer RSS MB')} MB, threads {ends('threads')}, fds "
            f"{ends('open fds')}, child processes {ends('child procs')} (from the first sample "
            f"after warm-up to the last, {count(int(last['env steps']))} env steps)")
    if "The HTTP-fed learner" in text:
        served = markdown_table(text[text.index("The HTTP-fed learner"):], "t (s)")
        a, b = served[1] if len(served) > 2 else served[0], served[-1]
        ours += (f"; policy server RSS {a['server RSS MB']} -> {b['server RSS MB']} MB, threads "
                 f"{a['threads']} -> {b['threads']}, {count(int(b['episodes']))} client episodes, "
                 f"{b['client errors']} client errors")
    exit_code = _search(r"^exit code (\S+); processes left (\d+)$", text, "soak.txt")
    flags = _search(r"^growth flags: (.*)$", text, "soak.txt").group(1)
    ours += (f"; exit code {exit_code.group(1)}, {exit_code.group(2)} processes left; growth "
             f"flags: {flags}")
    return [_row(
        results_dir, "reliability.soak",
        f"A {float(minutes.group(1)):g}-minute DQN training run on {minutes.group(2)} "
        f"`SubprocessEnv` children, beside it a DQN learner fed by HTTP clients, sampled for "
        f"leaks", ours, "", ["soak.txt"])]


# ------------------------------------------------------------------ network faults

FAULTS = {"partition": "collector0's link partitioned", "loss1": "1% loss on collector0's link",
          "loss5": "5% loss on collector0's link",
          "flap": "collector0's link flapping (3 s cut, 3 s up)",
          "learner_kill": "the learner SIGKILLed and resumed on its root_dir"}


def network_faults(results_dir):
    """One row per fault of network_faults.json."""
    rows = []
    for r in load_json("network_faults.json", results_dir)["rows"]:
        during = "-" if r["during"] is None else f"{r['during']:.0f}"
        lost = sum(gap[0] for gap in r["missing"].values())
        back = f"collector0 sending again after {r['back']['collector0']:.1f} s"
        if r.get("listening_after_kill") is not None:
            back = (f"the resumed learner listening {r['listening_after_kill']:.1f} s after the "
                    f"kill, {back}")
        gaps = (f"{count(lost)} steps in {len(r['missing'])} gaps (one per row, written after "
                f"the last checkpoint)" if r["missing"] else "0 steps lost")
        rows.append(_row(
            results_dir, f"reliability.network_{r['fault']}",
            f"The learner of `dqn_cartpole_distributed.gin` and 2 collectors on hosts of their "
            f"own, each through a relay: {FAULTS[r['fault']]}"
            + ("" if r["fault"] == "learner_kill" else f" for {r['fault_secs']:g} s")
            + "; after the run every item of the learner's replay checkpoint is audited",
            f"train steps/s {r['before']:.0f} / {during} / {r['after']:.0f} before / during / "
            f"after; {back}; "
            f"{count(r['items'])} items audited, {r['spliced']} spliced, {gaps}; exit "
            f"{r['exit']['learner']}, collectors {r['exit']['collectors']}",
            "", ["network_faults.json"]))
    return rows


def partition_trial(results_dir):
    """The last run of partition_trial.txt."""
    text = read_text("partition_trial.txt", results_dir)
    lines = [l for l in text.splitlines() if l.startswith("cut ")]
    if not lines:
        raise ValueError("partition_trial.txt: no 'cut' line")
    m = _search(r"^cut (\d+) s: train steps/s before ([\d.]+), during ([\d.]+), after "
                r"([\d.]+);.* collector0 sending again ([\d.]+) s after the heal; "
                r"(?:collectors )?alive (\[.*?\]); exit status learner (\d+), collectors "
                r"(\[.*?\])$", lines[-1], "partition_trial.txt")
    cut, before, during, after, back, alive, learner, collectors = m.groups()
    return [_row(
        results_dir, "reliability.partition_trial",
        f"A learner and 2 collectors on hosts of their own; collector0's link cut for {cut} s, "
        f"then healed",
        f"train steps/s {before} / {during} / {after} before / during / after; collector0 "
        f"sending again {back} s after the heal; collectors alive {alive}; exit {learner}, "
        f"collectors {collectors}", "", ["partition_trial.txt"])]


# ------------------------------------------------------------------ across a network


def link_ratios(rows, collectors, latency):
    """Per round, a link's train steps/s over that round's loopback row (as
    across_network.py prints them), for `collectors` collectors."""
    out = []
    for r in rows:
        if r["collectors"] == collectors and r["latency_ms"] == latency:
            base = next(b for b in rows if b["collectors"] == collectors and
                        b["latency_ms"] is None and b["round"] == r["round"])
            out.append(r["train_steps_per_sec"] / base["train_steps_per_sec"])
    return out


ACROSS = ("The learner of `dqn_cartpole_distributed.gin` and {k} collectors (16 rows, 8-step "
          "unrolls), each on a host of its own behind a relay adding {latency:g} ms each way"
          "{setting}: train steps/s against the same run over loopback")
UNCONFIRMED = (", with `collect.unconfirmed_unrolls = 4` and "
               "`replay_table.error_buffer = 4000.0`")


def _across(results_dir, key, name, setting):
    data = load_json(name, results_dir)
    rows, k, latency = data["rows"], data["args"]["collectors"][0], data["args"]["latency_ms"][0]
    ratios = link_ratios(rows, k, latency)
    loopback = [r["train_steps_per_sec"] for r in rows if r["latency_ms"] is None]
    return _row(
        results_dir, key, ACROSS.format(k=k, latency=latency, setting=setting),
        f"{ratio(statistics.median(ratios))} loopback's train steps/s (per round "
        f"{', '.join(ratio(x) for x in ratios)})",
        f"loopback: {' / '.join(f'{x:.0f}' for x in loopback)} train steps/s", [name])


def _grid(results_dir):
    name = "across_network_grid_unconfirmed4.json"
    data = load_json(name, results_dir)
    cells = [f"{k} collector{'s' if k > 1 else ''} " + ", ".join(
        f"{ratio(link_ratios(data['rows'], k, lat)[0])} at {lat:g} ms"
        for lat in data["args"]["latency_ms"]) for k in data["args"]["collectors"]]
    return _row(
        results_dir, "reliability.across_network_grid",
        "Collectors across a link as above (`collect.unconfirmed_unrolls = 4`), one round per "
        "cell: each collector count at each one-way latency against its loopback run",
        "; ".join(cells), "", [name])


def _bandwidth(results_dir):
    name = "across_network_20ms_2mbit_unconfirmed4.json"
    data = load_json(name, results_dir)
    loop, link = (next(r for r in data["rows"] if (r["latency_ms"] is None) == is_loop)
                  for is_loop in (True, False))
    return _row(
        results_dir, "reliability.across_network_bandwidth",
        f"2 collectors behind {link['latency_ms']:g} ms and a {data['args']['rate_kbps']:g} "
        f"kbit/s cap each way (`--rate_kbps`), `collect.unconfirmed_unrolls = 4`",
        f"{count(link['env_steps_per_sec'])} env steps/s delivered, "
        f"{ratio(link['train_steps_per_sec'] / loop['train_steps_per_sec'])} loopback's train "
        f"steps/s", f"loopback: {count(loop['env_steps_per_sec'])} env steps/s", [name])


def _variable_age(results_dir):
    name = "across_network_variable_age.json"
    rows = load_json(name, results_dir)["rows"]
    loop, link = (next(r for r in rows if (r["latency_ms"] is None) == is_loop)
                  for is_loop in (True, False))
    age = lambda r: (f"{r['variable_age']:.0f} train steps (max {r['variable_age_max']:.0f}) at "
                     f"{r['train_steps_per_sec']:.0f} train steps/s")
    return _row(
        results_dir, "reliability.variable_age",
        f"How old the collectors' policy is (`Collectors/variable_age`), 2 collectors at "
        f"{link['latency_ms']:g} ms one-way, pulls every second",
        age(link), f"loopback: {age(loop)}", [name])


def _serving_link(results_dir):
    name = "serving_across_network.json"
    rows = load_json(name, results_dir)["rows"]
    counts = sorted({r[1] for r in rows})
    cell = lambda lat: ", ".join(
        f"{r[1]:g} client{'s' if r[1] > 1 else ''} p99 {r[3]:.2f} ms, {count(r[4])} get_action/s"
        for r in rows if r[0] == lat)
    links = sorted({r[0] for r in rows if r[0] is not None})
    return _row(
        results_dir, "reliability.serving_across_network",
        f"Policy serving across a link: the server on one test host, a client process of "
        f"{' / '.join(f'{c:g}' for c in counts)} threads on another behind a relay, "
        f"get_action round trips (RTT = 2 x the one-way latency)",
        "; ".join(f"{lat:g} ms one-way: {cell(lat)}" for lat in links) + "; client errors "
        f"{sum(r[6] for r in rows):g}", f"loopback: {cell(None)}", [name])


def _serving_stalled(results_dir):
    name = "serving_stalled.json"
    data = load_json(name, results_dir)
    cell = lambda r: f"p99 {r[3]:.2f} ms, {count(r[4])} get_action/s, {r[6]:g} errors"
    by = {(r[0], bool(r[7])): r for r in data["rows"]}
    links = sorted({r[0] for r in data["rows"] if r[0] is not None})
    where = lambda lat: "loopback" if lat is None else f"{lat:g} ms one-way"
    return _row(
        results_dir, "reliability.serving_stalled",
        f"{data['args']['clients']} serving clients beside {data['args']['stalled']} stalled "
        f"ones on the same link (half holding a slot mid-episode, half sending a request a "
        f"byte per 100 ms)",
        "; ".join(f"{where(lat)}: {cell(by[(lat, True)])}" for lat in [None] + links),
        "without the stalled clients: " + "; ".join(
            f"{where(lat)}: {cell(by[(lat, False)])}" for lat in [None] + links), [name])


def reliability(results_dir):
    """Does it survive faults: the trials, the network faults, across a network."""
    return (chaos(results_dir) + soak(results_dir) + network_faults(results_dir)
            + partition_trial(results_dir) + [
                _across(results_dir, "reliability.across_network_shipped",
                        "across_network_20ms_shipped.json", " (the shipped collectors)"),
                _across(results_dir, "reliability.across_network_unconfirmed4",
                        "across_network_20ms_unconfirmed4.json", UNCONFIRMED),
                _grid(results_dir), _bandwidth(results_dir), _variable_age(results_dir),
                _serving_link(results_dir), _serving_stalled(results_dir)])
