"""Every figure of README.md and docs/ is rendered from the results file behind it.

benchmarks/render_results.py writes the blocks between `<!-- rendered: NAME -->`
markers from benchmarks/results/ and, with `--check`, prints one line per
problem. Checked here through that command (tests import no benchmark
script, tests/test_repo_imports.py):

- every block on the pages equals what the files give, every rendered
  row's files exist, and no page names an unknown block;
- no measured figure, and no results picture, stands outside the blocks;
- the figure finder flags exactly the figures of a set of lines and none
  of a set of settings, versions, ports and counts;
- a rendered row changes when its file does (a copy of the results,
  altered);
- an unknown block name is refused in one line.
"""

import functools
import os
import re
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(180)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "benchmarks", "render_results.py")
RESULTS = os.path.join(REPO, "benchmarks", "results")
PROBLEM = re.compile(r"^(?P<page>[^:]+):(?P<line>\d+): (?P<what>.*)$")


def _run(*args):
    """(exit code, output lines) of render_results.py with `args`."""
    done = subprocess.run([sys.executable, SCRIPT, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=150)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, done.stdout.splitlines()


@functools.lru_cache(maxsize=None)
def _repo_problems():
    """The problems `--check` prints for README.md and docs/, parsed."""
    code, lines = _run("--check")
    problems = [PROBLEM.match(line) for line in lines if line != "no problems"]
    assert all(problems), [line for line, p in zip(lines, problems) if p is None]
    assert code == (1 if problems else 0)
    return [(p["page"], int(p["line"]), p["what"]) for p in problems]


def _of_kind(test):
    return [f"{page}:{line}: {what}" for page, line, what in _repo_problems() if test(what)]


def test_every_block_equals_what_its_files_give():
    stale = _of_kind(lambda what: what.startswith("a rendered block differs"))
    assert not stale, "run python benchmarks/render_results.py:\n" + "\n".join(stale)


def test_every_block_renders_from_its_files():
    """A row whose file is missing, or lacks what the table reads, a picture
    or transcript without its file: every problem of rendering itself."""
    failed = _of_kind(lambda what: not what.startswith(
        ("a rendered block differs", "unknown rendered block", "line ", "figure ",
         "image outside")))
    assert not failed, "\n".join(failed)


def test_every_block_name_is_known_and_closed():
    unknown = _of_kind(lambda what: what.startswith(("unknown rendered block", "line ")))
    assert not unknown, "\n".join(unknown)


def test_no_figure_outside_rendered_blocks():
    loose = _of_kind(lambda what: what.startswith("figure "))
    assert not loose, (f"{len(loose)} measured figures outside rendered blocks (render them "
                       "from their results file, or drop them):\n" + "\n".join(loose[:60]))


def test_no_results_picture_outside_rendered_blocks():
    loose = _of_kind(lambda what: what.startswith("image outside"))
    assert not loose, "\n".join(loose)


# Lines of prose and the figures the checker must find in each, exactly.
FIGURES = {
    "collects 1.52x as fast": ["1.52x"],
    "a ratio of 2x, and 0.57× with two actors": ["2x", "0.57×"],
    "82% of the two-core ceiling and 1.5 % more": ["82%", "1.5 %"],
    "2,306 steps/s from 32 environments": ["2,306 steps/s"],
    "340 env steps/s on one host": ["340 env steps/s"],
    "about 500 requests per second": ["500 requests per second"],
    "SAC HalfCheetah 4,985 against 4,242": ["4,985", "4,242"],
    "a median of +19.9 against -21 and −20.5": ["+19.9", "-21", "−20.5"],
    "solves in 0.54 of the time": ["0.54"],
    "p99 7.9 ms at 16 clients": ["7.9 ms"],
    "within 3.2M frames": ["3.2M"],
    "Python 3.11 runs 0.95 of it": ["0.95"],
}
# Lines with no measured figure: settings, versions, ports, counts, code, links.
NOT_FIGURES = (
    "32 CartPoles for 60 minutes, seeds 0-2 and 1-8, 16 rows",
    "a 4x16 layout, 2 x 8 games, 84x84x4 pixels",
    "Python 3.11, TensorFlow 2.15.1, gymnasium 1.3.0, tf-agents 0.19",
    "the server listens on port 8000 at 127.0.0.1",
    "set `learning_rate = 2.5e-4` and `1.52x` in code",
    "see [the table](results/x_1.5x.md#a-1.5x-anchor) and <https://x.org/1.5x>",
    "an evaluation returns >= -200 on Pendulum-v1 and CartPole-v0",
    "on 2026-12-07 at e39ec39, `kill -9` and kill -9 of a child",
    "HTTP/1.1 requests; numpy < 2; a gym (0.23) class",
    "## Pong {#pong-1.5}",
    "<!-- 1.52x in a comment -->",
)


def _figures_found(tmp_path, lines):
    page = tmp_path / "page.md"
    page.write_text("\n".join(lines) + "\n")
    code, out = _run("--check", str(page))
    found = {}
    for line in out:
        match = re.match(r"^.*?:(\d+): figure (.*?): ", line)
        if match:
            found.setdefault(int(match.group(1)), []).append(match.group(2))
    return code, found


def test_finder_flags_exactly_the_figures(tmp_path):
    code, found = _figures_found(tmp_path, list(FIGURES))
    assert code == 1
    assert {line: found.get(k + 1, []) for k, line in enumerate(FIGURES)} == FIGURES


def test_finder_spares_settings_versions_ports_and_code(tmp_path):
    lines = ["```", "speed 1.52x, +19.9 in a fence", "```", *NOT_FIGURES,
             "<!--", "a comment of 4,985 lines", "-->"]
    assert _figures_found(tmp_path, lines) == (0, {})


def test_finder_skips_rendered_blocks(tmp_path):
    lines = ["<!-- rendered: transcript:nosuch -->", "1.52x",
             "<!-- /rendered: transcript:nosuch -->", "after it 0.54"]
    code, found = _figures_found(tmp_path, lines)
    assert found == {4: ["0.54"]}


def test_a_rendered_row_changes_with_its_file(tmp_path):
    copy = tmp_path / "results"
    shutil.copytree(RESULTS, copy)
    name = "time_to_solve_dqn_cartpole.txt"
    text = (copy / name).read_text()
    altered, count = re.subn(r"^(async\s+: median )[\d.]+ s", r"\g<1>77.7 s", text, flags=re.M)
    assert count == 1
    (copy / name).write_text(altered)
    _, before = _run("--show", "dqn")
    _, after = _run("--show", "dqn", "--results_dir", str(copy))
    row = next(line for line in after if name in line)
    assert "77.7 s" in row
    assert row not in before
    assert [line for line in after if name not in line] == \
        [line for line in before if name not in line]


def test_a_missing_results_file_is_named(tmp_path):
    copy = tmp_path / "results"
    shutil.copytree(RESULTS, copy)
    (copy / "time_to_solve_dqn_cartpole.txt").unlink()
    code, out = _run("--show", "dqn", "--results_dir", str(copy))
    assert (code, out) == (1, ["table dqn: results file missing: time_to_solve_dqn_cartpole.txt"])


def test_an_unknown_block_is_refused_in_one_line(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n<!-- rendered: nosuch -->\n<!-- /rendered: nosuch -->\n")
    code, out = _run("--check", str(page))
    assert code == 1
    assert len(out) == 1
    assert re.fullmatch(rf"{re.escape(str(page))}:3: unknown rendered block 'nosuch' "
                        r"\(known: [a-z_:, ]+, transcript:NAME\)", out[0]), out


def test_a_row_without_its_host_date_and_command_is_refused(tmp_path):
    """A figure is rendered only with where, when and how it was measured:
    the file's own header, else catalog.json (which dates every committed file
    from git, so here only the host and the command are missing)."""
    copy = tmp_path / "results"
    shutil.copytree(RESULTS, copy)
    name = "time_to_solve_dqn_cartpole.txt"
    text = (copy / name).read_text()
    (copy / name).write_text("".join(line for line in text.splitlines(keepends=True)
                                     if not line.startswith("# ")))
    code, out = _run("--show", "dqn", "--results_dir", str(copy))
    assert (code, out) == (1, [f"row dqn.cartpole_time_to_solve: no host or command "
                               f"for {name} (the file's own record or catalog.json)"])
