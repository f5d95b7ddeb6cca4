"""The docs pages answer their question in one screen, and keep no lab notebook.

- each page of docs/ has at most its section's lines (`MAX_LINES`: 250 for
  a guide, an agent's page, a results page or a top-level page; design.md,
  which maps every module, 300); benchmarks/README.md at most 250 (README.md's
  cap is tests/test_docs.py's);
- no prose line of README.md or docs/ is longer than `MAX_LINE_CHARS`
  (fenced code and rendered blocks aside): a paragraph is several lines,
  a table row a few cells;
- README.md and docs/ name no commit ids and no dates outside rendered
  blocks and code: a rendered row carries its file's date; the history
  belongs in benchmarks/results/HISTORY.md, which stays beside the results.

It reads the Markdown and runs in milliseconds.
"""

import os
import re

import pytest

pytestmark = pytest.mark.timeout(60)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, "docs")
BENCHMARKS_README = os.path.join(REPO, "benchmarks", "README.md")
HISTORY = os.path.join(REPO, "benchmarks", "results", "HISTORY.md")

MAX_LINES = {"design.md": 300, "": 250}   # by page, else "" for every other page
MAX_BENCHMARKS_README_LINES = 250
MAX_LINE_CHARS = 400

HEX_TOKEN = re.compile(r"\b[0-9a-f]{7,40}\b")
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
FENCE = re.compile(r"^\s*(```|~~~)")
OPEN = re.compile(r"^<!-- rendered: \S+ -->\s*$")
CLOSE = re.compile(r"^<!-- /rendered: \S+ -->\s*$")
CODE_SPAN = re.compile(r"(`+).+?\1")


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _pages():
    found = [os.path.join(REPO, "README.md")]
    for root, _, files in os.walk(DOCS):
        found += [os.path.join(root, f) for f in sorted(files) if f.endswith(".md")]
    return sorted(found)


def _prose(text):
    """[(line number, line)] of `text` outside fenced code and rendered
    blocks, code spans blanked."""
    out, fenced, rendered = [], False, False
    for number, line in enumerate(text.splitlines(), 1):
        if rendered:
            rendered = not CLOSE.match(line)
        elif FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            if OPEN.match(line):
                rendered = True
            else:
                out.append((number, CODE_SPAN.sub("``", line)))
    return out


def _commit_like(text):
    """The 7-to-40-character lowercase hex tokens of `text` that hold both a
    digit and a letter, as abbreviated commit ids do.

    Args:
        text: the text to search.

    Returns:
        The tokens found, in order.
    """
    return [t for t in HEX_TOKEN.findall(text)
            if re.search(r"[0-9]", t) and re.search(r"[a-f]", t)]


def _name(page):
    return os.path.relpath(page, REPO)


def test_commit_like_finds_ids_and_spares_numbers():
    assert _commit_like("at 05858ed and 9c68580, 1234567 steps, deadbeef") == \
        ["05858ed", "9c68580"]


def test_prose_leaves_out_code_and_rendered_blocks():
    text = ("a `2026-01-01` span\n```\n05858ed\n```\n<!-- rendered: x -->\n2026-01-01\n"
            "<!-- /rendered: x -->\nafter")
    assert _prose(text) == [(1, "a `` span"), (8, "after")]


@pytest.mark.parametrize("page", [p for p in _pages() if p.startswith(DOCS)], ids=_name)
def test_docs_page_fits_one_screen(page):
    cap = MAX_LINES.get(os.path.relpath(page, DOCS), MAX_LINES[""])
    lines = _read(page).splitlines()
    assert len(lines) <= cap, (f"{_name(page)} has {len(lines)} lines (at most {cap}): split "
                               "it by question, or move history to benchmarks/results/HISTORY.md")


def test_benchmarks_readme_is_short():
    lines = _read(BENCHMARKS_README).splitlines()
    assert len(lines) <= MAX_BENCHMARKS_README_LINES, (
        f"benchmarks/README.md has {len(lines)} lines (at most "
        f"{MAX_BENCHMARKS_README_LINES}): what each script measures and how to run it")


@pytest.mark.parametrize("page", _pages(), ids=_name)
def test_no_prose_line_is_a_paragraph(page):
    long = [f"line {n}: {len(line)} characters" for n, line in _prose(_read(page))
            if len(line) > MAX_LINE_CHARS]
    assert not long, f"{_name(page)} has lines over {MAX_LINE_CHARS} characters: {long}"


@pytest.mark.parametrize("page", _pages(), ids=_name)
def test_page_names_no_commits_or_dates(page):
    prose = "\n".join(line for _, line in _prose(_read(page)))
    commits, dates = _commit_like(prose), DATE.findall(prose)
    assert not commits and not dates, (
        f"{_name(page)} names commits {commits} and dates {dates} outside rendered blocks; "
        "they belong in benchmarks/results/HISTORY.md")


def test_history_sits_beside_the_results():
    assert os.path.exists(HISTORY)
