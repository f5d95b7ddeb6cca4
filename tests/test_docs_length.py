"""The performance page and the benchmarks' README stay results, not a log.

- docs/performance.md has at most 450 lines: per section the result, one
  table or picture with its host, the command and a short why;
- benchmarks/README.md has at most 250 lines (it was rewritten at 246):
  what each script measures and how to run it;
- docs/performance.md names no commit ids and no dates; they belong in
  benchmarks/results/HISTORY.md, beside the JSON they explain.

It reads two files and runs in milliseconds.
"""

import os
import re

import pytest

pytestmark = pytest.mark.timeout(60)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PERFORMANCE = os.path.join(REPO, "docs", "performance.md")
BENCHMARKS_README = os.path.join(REPO, "benchmarks", "README.md")
HISTORY = os.path.join(REPO, "benchmarks", "results", "HISTORY.md")

MAX_PERFORMANCE_LINES = 450
MAX_BENCHMARKS_README_LINES = 250

HEX_TOKEN = re.compile(r"\b[0-9a-f]{7,40}\b")
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


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


def test_commit_like_finds_ids_and_spares_numbers():
    assert _commit_like("at 05858ed and 9c68580, 1234567 steps, deadbeef") == \
        ["05858ed", "9c68580"]


def test_performance_page_is_short():
    lines = _read(PERFORMANCE).splitlines()
    assert len(lines) <= MAX_PERFORMANCE_LINES, (
        f"docs/performance.md has {len(lines)} lines (at most "
        f"{MAX_PERFORMANCE_LINES}); move history to benchmarks/results/HISTORY.md")


def test_benchmarks_readme_is_short():
    lines = _read(BENCHMARKS_README).splitlines()
    assert len(lines) <= MAX_BENCHMARKS_README_LINES, (
        f"benchmarks/README.md has {len(lines)} lines (at most "
        f"{MAX_BENCHMARKS_README_LINES}): what each script measures and how to run it")


def test_performance_page_names_no_commits_or_dates():
    text = _read(PERFORMANCE)
    commits, dates = _commit_like(text), DATE.findall(text)
    assert not commits and not dates, (
        f"docs/performance.md names commits {commits} and dates {dates}; "
        "they belong in benchmarks/results/HISTORY.md")


def test_history_sits_beside_the_json():
    assert os.path.exists(HISTORY)
    assert "benchmarks/results/HISTORY.md" in _read(PERFORMANCE)
