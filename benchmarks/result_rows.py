"""A rendered results row and where its host, date and command come from.

A table (benchmarks/tables_*.py) is a function `(results_dir) -> list[Row]`;
benchmarks/render_results.py writes its rows between the markers of README.md
and docs/. Every figure in a row is read from a file of benchmarks/results/,
so a row changes when its file does. A row's host, date and command come from
its file's own record (`file_meta`), else from benchmarks/results/catalog.json
(made once from git and the notes by `render_results.py --catalog`: CI needs
no git history).

The formatting helpers here are the one way a figure is written: `count`
(thousands separators), `ratio` (`1.52x`), `secs`, `score` (signed), `rate`.
"""

import dataclasses
import json
import pathlib
import re
import shlex

from alf_async.kernels import host_kind

RESULTS_DIR = pathlib.Path(__file__).resolve().parent / "results"
CATALOG = "catalog.json"
# The scripts whose JSON keeps its argparse args (`"args"`), by file-name prefix.
ARGS_SCRIPTS = (("across_network", "across_network.py"), ("driver_cost", "driver_cost.py"),
                ("network_faults", "network_faults.py"), ("serving", "serving.py"),
                ("throughput", "throughput.py"))
_HEADER = re.compile(r"^# (command|date|commit|host|host_record): ?(.*)$")


@dataclasses.dataclass(frozen=True)
class Row:
    """One rendered row: a question, both sides' figures and where they come from.

    Attributes:
        key: stable id, "table.slug", e.g. "ppo.pong_hour".
        what: the question in words (settings allowed, no measured figures).
        ours: alf_async's figure(s), formatted, e.g. "1.52x" or "2,306 steps/s".
        theirs: the other side's figure(s) ("" when none), naming the other side.
        files: the results files backing the row, relative to benchmarks/results/.
        command: the command that made (or re-renders) the files.
        host: "CPU model (kind)", read from the file, else from catalog.json.
        date: YYYY-MM-DD, read from the file, else from catalog.json.
        short: the README headline's <=25-word form of `what`, if a headline row.
    """
    key: str
    what: str
    ours: str
    theirs: str
    files: tuple
    command: str
    host: str
    date: str
    short: str = ""


def host_cell(record):
    """'CPU model (kind)' of a host record (alf_async.testing.bench.host.record):
    the kernels' host kind ('avx2', 'avx512', 'avx512_bf16', 'amx', with the
    emulated one where a run emulated it), else the kind its CPU flags give,
    else 'flags not recorded'."""
    kernels = record.get("kernels") or {}
    if kernels.get("host_kind"):
        kind = kernels["host_kind"]
        if kernels.get("emulated_kind"):
            kind = f"{kernels['emulated_kind']} emulated on {kernels.get('cpu_kind') or kind}"
    elif "cpu_flags" in record:
        kind = host_kind(record["cpu_flags"])
    else:
        kind = "flags not recorded"
    return f"{record.get('cpu', 'unknown')} ({kind})"


def load_catalog(results_dir=RESULTS_DIR):
    """catalog.json's entries by file name: {name: {date, commit, command, host}}
    (`results_dir`'s own catalog if it has one, else the repository's)."""
    path = pathlib.Path(results_dir) / CATALOG
    if not path.exists():
        path = RESULTS_DIR / CATALOG
    if not path.exists():
        return {}
    return json.loads(path.read_text())["files"]


def _runs(data):
    """The records a results JSON holds: itself where it records a host, a
    command or its args, else each run of its list, of its "runs" or of its
    {run name: run} mapping (a run's own "record" where it nests one)."""
    if isinstance(data, dict) and {"host", "command", "args"} & set(data):
        return [data]
    if isinstance(data, dict):
        data = data["runs"] if isinstance(data.get("runs"), list) else list(data.values())
    if not isinstance(data, list):
        return []
    return [item["record"] if isinstance(item.get("record"), dict) else item
            for item in data if isinstance(item, dict)]


def script_command(script, args, name):
    """The command line of benchmarks/`script` from its argparse `args`
    (dest names as `--dest`; a true flag alone, false and None left out;
    its `--json` as the results file `name`)."""
    words = ["python", f"benchmarks/{script}"]
    for dest, value in args.items():
        if value is None or value is False:
            continue
        if dest == "json":
            value = f"benchmarks/results/{name}"
        words.append(f"--{dest}")
        if value is True:
            continue
        values = value if isinstance(value, list) else [value]
        words.extend(shlex.quote(_plain(v)) for v in values)
    return " ".join(words)


def _plain(value):
    return f"{value:g}" if isinstance(value, float) else str(value)


def clean_command(command, name=""):
    """A recorded command line as a user types it from the checkout: the
    script as `python benchmarks/x.py` wherever the recording ran it from,
    gin files under gin_configs/, a child run's `--one SIDE` as `--sides
    SIDE` (`--one SIDE --seed N` as `--sides SIDE --seeds N`, per_frame.py's
    parent's flags), no scratch `--root_dir`, and `--json` as the
    results file `name` (when given)."""
    command = command.strip()
    match = re.match(r"^(?:python3? )?(?:\S*/)?(benchmarks/)?(\w+\.py)\b", command)
    if match is None:
        return command
    rest = command[match.end():]
    rest = re.sub(r"(?<=\s)\S*/gin_configs/", "gin_configs/", rest)
    rest = re.sub(r"--one (\S+) --seed (\d+)", r"--sides \1 --seeds \2", rest)
    rest = re.sub(r"--one (\S+)", r"--sides \1", rest)
    rest = re.sub(r" --root_dir \S+", "", rest)
    rest = re.sub(r" --gin_bindings\s*$", "", rest)
    if name:
        rest = re.sub(r"--json \S+", f"--json benchmarks/results/{name}", rest)
    return f"python benchmarks/{match.group(2)}{rest}"


def merge_commands(commands):
    """One command for runs that differ only in their `--sides` and
    `--seeds` (written SIDE and N), else the distinct commands joined by ' ; '."""
    commands = list(dict.fromkeys(c for c in commands if c))
    if len(commands) < 2:
        return commands[0] if commands else ""
    general = [re.sub(r"--seeds (\d+ ?)+", "--seeds N ", re.sub(r"--sides \S+", "--sides SIDE", c))
               .replace("  ", " ").strip() for c in commands]
    return " ; ".join(dict.fromkeys(general))


def file_meta(name, results_dir=RESULTS_DIR):
    """Host, date, command and commit of the results file `name` (relative to
    `results_dir`): its own record first (a JSON's "host", "args", "command",
    "date", "commit" keys; a .txt's `# command:`, `# date:`, `# commit:`,
    `# host_record:` header lines), then catalog.json for what it lacks.

    Returns:
        dict with keys host ("CPU model (kind)"), date, command, commit;
        "" for what neither the file nor the catalog gives.
    """
    path = pathlib.Path(results_dir) / name
    own = {}
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        runs = _runs(data)
        hosts = sorted({host_cell(r["host"]) for r in runs if isinstance(r.get("host"), dict)})
        commands = [clean_command(r["command"], name) for r in runs
                    if isinstance(r.get("command"), str)]
        if hosts:
            own["host"] = " / ".join(hosts)
        if commands:
            own["command"] = merge_commands(commands)
        if isinstance(data, dict):
            for key in ("date", "commit"):
                if isinstance(data.get(key), str):
                    own[key] = data[key]
            script = next((s for prefix, s in ARGS_SCRIPTS if name.startswith(prefix)), None)
            if not commands and isinstance(data.get("args"), dict) and script:
                own["command"] = script_command(script, data["args"], name)
    elif path.suffix == ".txt":
        for line in path.read_text().splitlines()[:8]:
            match = _HEADER.match(line)
            if match is None:
                continue
            key, value = match.groups()
            if key == "host_record":
                own["host"] = host_cell(json.loads(value))
            elif key == "host":
                own.setdefault("host", value.split(" | ")[-1].split(",")[0])
            else:
                own[key] = value.strip()
    cataloged = load_catalog(results_dir).get(name, {})
    return {key: own.get(key) or cataloged.get(key, "")
            for key in ("host", "date", "command", "commit")}


def meta_of(files, results_dir=RESULTS_DIR):
    """One host, date and command for a row backed by several `files`: the
    hosts joined where they differ, the latest date, the commands merged
    (`merge_commands`).

    Returns:
        dict with keys host, date, command (Row's fields of those names).
    """
    metas = [file_meta(f, results_dir) for f in files]
    hosts = sorted({m["host"] for m in metas if m["host"]})
    dates = [m["date"] for m in metas if m["date"]]
    return dict(host=" / ".join(hosts), date=max(dates) if dates else "",
                command=merge_commands(m["command"] for m in metas))


def load_json(name, results_dir=RESULTS_DIR):
    """The parsed JSON results file `name`."""
    return json.loads((pathlib.Path(results_dir) / name).read_text())


def read_text(name, results_dir=RESULTS_DIR):
    """The text of results file `name`."""
    return (pathlib.Path(results_dir) / name).read_text()


def count(value):
    """An integer with thousands separators: 4985 -> '4,985'."""
    return f"{round(value):,}"


def ratio(value, digits=2):
    """A ratio: 1.524 -> '1.52x'."""
    return f"{value:.{digits}f}x"


def secs(value, digits=1):
    """Seconds: 1.75 -> '1.8 s' (minutes past 120 s: '14.5 min')."""
    if value >= 120:
        return f"{value / 60:.{digits}f} min"
    return f"{value:.{digits}f} s"


def score(value, digits=1):
    """A signed score: 19.94 -> '+19.9', -21 -> '-21.0'."""
    return f"{value:+.{digits}f}"


def rate(value, unit="steps/s"):
    """A rate with thousands separators: 2306.4 -> '2,306 steps/s'."""
    return f"{count(value)} {unit}"


def frames(value):
    """Env steps in millions: 1693696 -> '1.69M'."""
    return f"{value / 1e6:.2f}M"
