"""Getting started shows what the main job prints: docs/transcripts/dqn_cartpole.txt.

The transcript is a real run's output, rendered on docs/getting-started.md.
This test runs the command its header names (the README's and the page's
main job) as a user does, in a fresh directory, and checks that the run
prints the transcript's lines, numbers aside:

- the first line is the kernels line this host chooses (`alf_async.kernels`;
  the transcript shows its own host's);
- every other line, its numbers masked, is one of the transcript's three
  kinds, with the same fixed text: an evaluation line, a progress line,
  the line saying the run stopped;
- they come in the transcript's order: evaluations and progress lines in
  turn (how many depends on the seed and on the clock), the last
  evaluation then the last progress line, then the stop line; nothing on
  stderr.

The numbers that the gin file fixes are checked too, in the transcript and
in the run: 256 env steps an iteration (one env thread of 32 CartPoles,
8-step unrolls), 16 train steps an iteration from the 4th on (1,000 initial
collect steps), and a last evaluation that returns at least 195.
"""

import os
import re
import shlex
import subprocess
import sys

import pytest

from alf_async import kernels

pytestmark = pytest.mark.timeout(300)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRANSCRIPT = os.path.join(REPO, "docs", "transcripts", "dqn_cartpole.txt")
PAGE = os.path.join(REPO, "docs", "getting-started.md")
COMMAND = "alf-async-train --root_dir runs/dqn_cartpole --gin_file gin_configs/dqn_cartpole.gin"

NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?")
KERNELS = "[alf_async] kernels: "
EVAL = re.compile(r"\[alf_async\] eval at train step (\d+) \([\d.]+ s, (\d+) env steps\): "
                  r"greedy policy AverageReturn ([\d.]+) over 10 episodes")
PROGRESS = re.compile(r"\[alf_async\] iteration (\d+) \| env steps (\d+) .*\| train steps (\d+) ")
STOPPED = re.compile(r"\[alf_async\] stopped \(stop_at_eval_return\) at iteration (\d+), "
                     r"train step (\d+), env steps (\d+); ")
ENV_STEPS_PER_ITERATION = 32 * 8          # Layout.rows_per_env_thread x Schedule.unroll_length
TRAIN_STEPS_PER_ITERATION = 16            # Schedule.train_steps_per_iteration
ITERATIONS_BEFORE_TRAINING = 3            # 1000 initial collect steps: the 4th batch trains


def _transcript():
    """(the command of the transcript's header, its output lines)."""
    with open(TRANSCRIPT, encoding="utf-8") as f:
        lines = f.read().splitlines()
    header = [line for line in lines if line.startswith("# ")]
    assert lines[:len(header)] == header, "header lines come first"
    commands = [line[len("# command: "):] for line in header if line.startswith("# command: ")]
    assert len(commands) == 1, header
    return commands[0], lines[len(header):]


def _kinds(lines, templates):
    """The kinds ('E', 'P', 'S') of `lines` after the first, numbers masked,
    each run of one kind counted once."""
    kinds = ""
    for line in lines[1:]:
        masked = NUMBER.sub("#", line)
        assert masked in templates, f"a line of no kind the transcript shows: {line!r}"
        kind = templates[masked]
        if not kinds.endswith(kind):
            kinds += kind
    return kinds


def _templates(lines):
    """{masked line: its kind} of the transcript's lines."""
    templates = {}
    for line in lines[1:]:
        kind = "E" if EVAL.match(line) else "P" if PROGRESS.match(line) else \
            "S" if STOPPED.match(line) else None
        assert kind is not None, f"a transcript line of no known kind: {line!r}"
        templates.setdefault(NUMBER.sub("#", line), kind)
    assert sorted(templates.values()) == ["E", "P", "S"], templates
    return templates


def _check_numbers(lines):
    """The numbers the gin file fixes, in one run's lines."""
    for line in lines:
        progress, stopped = PROGRESS.match(line), STOPPED.match(line)
        if progress or stopped:
            iteration, env_steps, train_step = (
                map(int, progress.groups()) if progress else
                (int(stopped.group(1)), int(stopped.group(3)), int(stopped.group(2))))
            assert env_steps == ENV_STEPS_PER_ITERATION * iteration, line
            assert train_step == TRAIN_STEPS_PER_ITERATION * (
                iteration - ITERATIONS_BEFORE_TRAINING), line
    evaluations = [EVAL.match(line) for line in lines if EVAL.match(line)]
    stopped = STOPPED.match(lines[-1])
    assert float(evaluations[-1].group(3)) >= 195.0, evaluations[-1].group(0)
    assert evaluations[-1].group(1) == stopped.group(2), (evaluations[-1].group(0), lines[-1])
    assert all(float(e.group(3)) < 195.0 for e in evaluations[:-1])


def test_the_transcript_is_the_main_job_the_page_shows():
    command, lines = _transcript()
    assert command == COMMAND
    with open(PAGE, encoding="utf-8") as f:
        page = f.read()
    assert f"```\n{COMMAND}\n```" in page
    assert "<!-- rendered: transcript:dqn_cartpole -->" in page
    assert lines[0].startswith(KERNELS)
    assert re.fullmatch(r"[EP]*EPS", _kinds(lines, _templates(lines)))
    _check_numbers(lines)


def test_the_main_job_prints_what_the_transcript_shows(tmp_path):
    command, transcript = _transcript()
    templates = _templates(transcript)
    # The user's checkout: the command runs where gin_configs/ is.
    os.symlink(os.path.join(REPO, "gin_configs"), tmp_path / "gin_configs")
    argv = shlex.split(command)
    argv[0] = os.path.join(os.path.dirname(sys.executable), argv[0])  # this venv's script
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""
    gin_file = os.path.join(REPO, "gin_configs", "dqn_cartpole.gin")
    assert lines[0] == kernels.choose_for_gin([gin_file]).line()
    kinds = _kinds(lines, templates)
    assert re.fullmatch(r"[EP]*EPS", kinds), (kinds, lines)
    _check_numbers(lines)
    assert lines[-1].endswith("; checkpoint in runs/dqn_cartpole/train")
    assert os.path.isfile(tmp_path / "runs" / "dqn_cartpole" / "train" / "checkpoint")
