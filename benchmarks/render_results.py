"""Writes every results table of README.md and docs/ from benchmarks/results/,
and checks that no measured figure stands outside one.

    python benchmarks/render_results.py            # rewrite every rendered block
    python benchmarks/render_results.py --check    # exit 1, one line per problem
    python benchmarks/render_results.py --show ppo # print one block
    python benchmarks/render_results.py --catalog  # add missing files to catalog.json

A page places a block by writing its two markers with nothing between them:

    <!-- rendered: NAME -->
    <!-- /rendered: NAME -->

NAME is a table (`TABLES` of tables_learning.py, tables_processes.py and
tables_collection.py, which takes in tables_choices.py's and tables_reliability.py's, and
`headline`: the README's short rows, picked by key from the others, each
its `short` question and both sides' figures up to their first ';'), a
picture list (`pictures:...` of pictures_learning.py) or `transcript:NAME`
(docs/transcripts/NAME.txt in a code block). What is between the markers is written here, never by hand.

`--check` flags a block that differs from what the files give, a row whose
file is missing, an unknown block name, an image outside a picture block and
a measured figure (figures.py's rules) outside the blocks, fenced code and
code spans.
"""

import argparse
import functools
import json
import os
import pathlib
import re
import subprocess
import sys

import figures
import pictures_learning
import result_rows
import tables_collection
import tables_learning
import tables_processes

REPO = pathlib.Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
TRANSCRIPTS = DOCS / "transcripts"
IMAGES = DOCS / "images"
TABLES = {**tables_learning.TABLES, **tables_collection.TABLES, **tables_processes.TABLES}
PICTURES = pictures_learning.PICTURES
NO_FILE_YET = tables_learning.NO_FILE_YET
HEADLINE_KEYS = ("dqn.cartpole_time_to_solve", "ppo.cartpole_time_to_solve", "ppo.pong_hour",
                 "ppo.breakout_hour", "collection.blocking_envs", "collection.atari_in_process",
                 "collection.child_processes", "not_paying.rows_one_by_one")
# A table's columns; each row's command follows the table, under the row's number
# (commands are long: as a column they squeezed every other one on the site).
COLUMNS = ("", "what", "alf_async", "the other side", "host, date, file")
OPEN = re.compile(r"^<!-- rendered: (\S+) -->\s*$")
CLOSE = re.compile(r"^<!-- /rendered: (\S+) -->\s*$")


class RenderError(Exception):
    """A block that cannot be rendered: one line saying why."""


def pages(repo=REPO):
    """README.md and every docs/**/*.md, in order."""
    return [repo / "README.md"] + sorted((repo / "docs").rglob("*.md"))


def known_names():
    """Every block name a page may use, transcripts aside."""
    return sorted({"headline", *TABLES, *PICTURES})


def _link(page, target):
    """`target` (a path in the repository) as a link from `page`: on the docs
    site a results file is at docs/results/files/<file> (docs_hooks/results_files.py)."""
    target = pathlib.Path(target)
    inside_docs = DOCS in page.resolve().parents
    if inside_docs and target.parent == result_rows.RESULTS_DIR:
        target = DOCS / "results" / "files" / target.name
    return os.path.relpath(target, page.resolve().parent).replace(os.sep, "/")


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def _code(text):
    return f"`{text}`" if text else ""


def _files_cell(page, files, results_dir):
    """The files' links; several files as their shared prefix and suffix around
    the linked parts that differ (`wall_clock_Pong_{seed0, seed1}_60min.json`)."""
    links = [(name, _link(page, result_rows.RESULTS_DIR / name)) for name in files]
    prefix = os.path.commonprefix(files) if len(files) > 1 else ""
    suffix = os.path.commonprefix([name[len(prefix):][::-1] for name in files])[::-1] \
        if len(files) > 1 else ""
    middles = [name[len(prefix):len(name) - len(suffix)] for name in files]
    if len(files) < 2 or not all(middles):
        return ", ".join(f"[{name}]({link})" for name, link in links)
    return (f"{prefix}{{" + ", ".join(f"[{middle}]({link})"
                                      for middle, (_, link) in zip(middles, links))
            + f"}}{suffix}")


@functools.lru_cache(maxsize=None)
def table_rows(name, results_dir):
    """The rows of table `name` from `results_dir` (read once a run).

    Raises:
        RenderError: a file a row reads is missing, or a row names one that is.
    """
    try:
        rows = TABLES[name](results_dir)
    except FileNotFoundError as error:
        raise RenderError(f"table {name}: results file missing: "
                          f"{pathlib.Path(error.filename).name}") from None
    except (KeyError, ValueError) as error:   # a file without what the table reads
        raise RenderError(f"table {name}: {error}") from None
    for row in rows:
        missing = [f for f in row.files if not (pathlib.Path(results_dir) / f).exists()]
        if missing or not row.files:
            raise RenderError(f"row {row.key}: results file missing: "
                              f"{', '.join(missing) or '(none named)'}")
        unknown = [field for field in ("host", "date", "command") if not getattr(row, field)]
        if unknown:
            raise RenderError(f"row {row.key}: no {' or '.join(unknown)} for "
                              f"{', '.join(row.files)} (the file's own record or catalog.json)")
    return rows


def _table(name, page, results_dir):
    rows = table_rows(name, results_dir)
    if not rows:
        if name not in NO_FILE_YET:
            raise RenderError(f"table {name}: no rows, and no command in NO_FILE_YET "
                              f"that would make its results file")
        return [f"No result of this version has a results file yet; "
                f"`{NO_FILE_YET[name]}` would make one."]
    lines = ["| " + " | ".join(COLUMNS) + " |", "|---:" + "|---" * (len(COLUMNS) - 1) + "|"]
    for number, row in enumerate(rows, 1):
        cells = [number, row.what, row.ours, row.theirs,
                 f"{row.host}, {row.date}: {_files_cell(page, row.files, results_dir)}"]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    lines += ["", "The commands, by row:", ""]
    lines += [f"{number}. {_code(row.command)}" for number, row in enumerate(rows, 1)]
    return lines


def _home_of(key, repo=REPO):
    """The page that shows the row `key`: a docs/results/ page holding a
    table with that row if one does, else any page holding its table."""
    table = key.split(".")[0]
    holders = [p for p in pages(repo) if f"<!-- rendered: {table} -->" in p.read_text()]
    if table in ("dqn", "ppo", "impala", "sac"):
        holders = [p for p in pages(repo)
                   if "<!-- rendered: learning -->" in p.read_text()] + holders
    if not holders:
        raise RenderError(f"headline row {key}: no page shows table {table}")
    return holders[0]


def _first_clause(text):
    """A figure cell's headline form: up to its first ';'."""
    return text.split(";", 1)[0].strip()


def _headline(page, results_dir):
    rows = {}
    for name in sorted({key.split(".")[0] for key in HEADLINE_KEYS}):
        rows.update({row.key: row for row in table_rows(name, results_dir)})
    lines = ["| what | alf_async | the other side | |", "|---|---|---|---|"]
    for key in HEADLINE_KEYS:
        if key not in rows:
            raise RenderError(f"headline row {key}: no table gives it")
        row = rows[key]
        cells = [row.short or row.what, _first_clause(row.ours), _first_clause(row.theirs),
                 f"[results]({_link(page, _home_of(key))})"]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def _pictures(name, page, results_dir):
    lines = []
    for picture in PICTURES[name](results_dir):
        if not (IMAGES / picture.image).exists():
            raise RenderError(f"{name}: image missing: docs/images/{picture.image}")
        missing = [f for f in picture.files if not (pathlib.Path(results_dir) / f).exists()]
        if missing:
            raise RenderError(f"{name}: {picture.image}: results file missing: "
                              f"{', '.join(missing)}")
        sources = _files_cell(page, picture.files, results_dir)
        lines += [f"![{picture.alt}]({_link(page, IMAGES / picture.image)})", "",
                  f"*{picture.alt}.* From {sources}; {picture.host}, {picture.date}; "
                  f"drawn by `{picture.command}`.", ""]
    return lines[:-1]


def _transcript(name):
    path = TRANSCRIPTS / f"{name}.txt"
    if not path.exists():
        raise RenderError(f"transcript:{name}: no file docs/transcripts/{name}.txt")
    return ["```text", *path.read_text().rstrip("\n").splitlines(), "```"]


def render(name, page, results_dir=result_rows.RESULTS_DIR):
    """The lines of block `name` on `page`, markers included.

    Raises:
        RenderError: an unknown name, or a block its files cannot give.
    """
    if name.startswith("transcript:"):
        body = _transcript(name.split(":", 1)[1])
    elif name == "headline":
        body = _headline(page, results_dir)
    elif name in PICTURES:
        body = _pictures(name, page, results_dir)
    elif name in TABLES:
        body = _table(name, page, results_dir)
    else:
        raise RenderError(f"unknown rendered block {name!r} (known: {', '.join(known_names())}, "
                          f"transcript:NAME)")
    return [f"<!-- rendered: {name} -->", "", *body, "", f"<!-- /rendered: {name} -->"]


def blocks(lines):
    """[(name, first line index, last line index)] of the rendered blocks
    in `lines`.

    Raises:
        RenderError: a marker without its pair, with the line number.
    """
    found, start = [], None
    for index, line in enumerate(lines):
        opened, closed = OPEN.match(line), CLOSE.match(line)
        if opened:
            if start is not None:
                raise RenderError(f"line {index + 1}: block {opened.group(1)} opens inside "
                                  f"block {start[0]}")
            start = (opened.group(1), index)
        elif closed:
            if start is None or closed.group(1) != start[0]:
                raise RenderError(f"line {index + 1}: block {closed.group(1)} closes "
                                  "without its opening marker")
            found.append((start[0], start[1], index))
            start = None
    if start is not None:
        raise RenderError(f"line {start[1] + 1}: block {start[0]} has no closing marker")
    return found


def rewrite(page, results_dir=result_rows.RESULTS_DIR):
    """`page`'s text with every block rendered afresh, and its problems
    [(line number, message)] (blocks left as they were)."""
    lines = page.read_text().splitlines()
    try:
        spans = blocks(lines)
    except RenderError as error:
        return "\n".join(lines) + "\n", [(0, str(error))]
    problems, out, done = [], [], 0
    for name, first, last in spans:
        out += lines[done:first]
        try:
            out += render(name, page, results_dir)
        except RenderError as error:
            problems.append((first + 1, str(error)))
            out += lines[first:last + 1]
        done = last + 1
    out += lines[done:]
    return "\n".join(out) + "\n", problems


def check(page, results_dir=result_rows.RESULTS_DIR):
    """One line per problem of `page`: blocks, figures and images."""
    shown = os.path.relpath(page, REPO) if REPO in page.resolve().parents else str(page)
    text = page.read_text()
    fresh, problems = rewrite(page, results_dir)
    lines = [f"{shown}:{line}: {message}" for line, message in problems]
    if fresh != text and not problems:
        old = text.splitlines()
        changed = next((i for i, (a, b) in enumerate(zip(old, fresh.splitlines())) if a != b),
                       min(len(old), len(fresh.splitlines())))
        lines.append(f"{shown}:{changed + 1}: a rendered block differs from what the files give "
                     "(run python benchmarks/render_results.py)")
    for number, figure, line in figures.outside_blocks(text):
        lines.append(f"{shown}:{number}: figure {figure}: {line.strip()}")
    for number, image in figures.images_outside_blocks(text):
        lines.append(f"{shown}:{number}: image outside a rendered picture block: {image}")
    return lines


def catalog(results_dir=result_rows.RESULTS_DIR):
    """Adds to catalog.json every committed results file it lacks, with the
    date and commit of the git commit that last changed it (its command and
    host are filled by hand, from HISTORY.md, where the file lacks them);
    returns the names added."""
    path = pathlib.Path(results_dir) / result_rows.CATALOG
    data = json.loads(path.read_text()) if path.exists() else {"files": {}}
    added = []
    for file in sorted(pathlib.Path(results_dir).iterdir()):
        if (file.name in data["files"] or file.name == result_rows.CATALOG
                or file.suffix not in (".json", ".txt", ".patch")):
            continue
        logged = subprocess.run(["git", "log", "-1", "--format=%as %h", "--", str(file)],
                                cwd=REPO, capture_output=True, text=True, check=True).stdout
        if not logged.strip():      # not committed yet: its commit will date it
            continue
        date, commit = logged.split()
        data["files"][file.name] = dict(date=date, commit=commit, command="", host="")
        added.append(file.name)
    data["files"] = dict(sorted(data["files"].items()))
    path.write_text(json.dumps(data, indent=1) + "\n")
    return added


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", nargs="*", metavar="PAGE",
                        help="report problems of these pages (default: README.md and docs/); "
                             "exit 1 if any")
    parser.add_argument("--show", metavar="NAME", help="print block NAME as README.md shows it")
    parser.add_argument("--catalog", action="store_true",
                        help="add the results files catalog.json lacks, dated from git")
    parser.add_argument("--results_dir", default=str(result_rows.RESULTS_DIR),
                        help="where the results files are (default: benchmarks/results)")
    args = parser.parse_args(argv)
    results_dir = pathlib.Path(args.results_dir)
    if args.catalog:
        print("\n".join(catalog(results_dir)) or "catalog.json lacks no file")
        return 0
    if args.show:
        try:
            print("\n".join(render(args.show, REPO / "README.md", results_dir)))
        except RenderError as error:
            print(error)
            return 1
        return 0
    if args.check is not None:
        targets = [pathlib.Path(p).resolve() for p in args.check] or pages()
        problems = [line for page in targets for line in check(page, results_dir)]
        print("\n".join(problems) or "no problems")
        return 1 if problems else 0
    failed = False
    for page in pages():
        text, problems = rewrite(page, results_dir)
        for line, message in problems:
            print(f"{os.path.relpath(page, REPO)}:{line}: {message}")
            failed = True
        if text != page.read_text():
            page.write_text(text)
            print(f"rewrote {os.path.relpath(page, REPO)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
