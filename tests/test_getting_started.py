"""Getting started shows what the main job prints: docs/transcripts/dqn_cartpole.txt.

The transcript is a real run's output, rendered on docs/getting-started.md.
This test runs the command its header names (the page's main job) as a
user does, in a fresh directory, and checks that the run prints the
transcript's lines, numbers aside (alf_async.testing.transcripts):

- the first line is the kernels line this host chooses (`alf_async.kernels`;
  the transcript shows its own host's);
- every other line, its numbers masked, is one of the transcript's kinds,
  with the same fixed text: an evaluation line, a progress line, the line
  saying the run stopped;
- they come in the transcript's order: evaluations and progress lines in
  turn (how many depends on the seed and on the clock), the last
  evaluation then the last progress line, then the stop line; nothing on
  stderr.

The numbers that the gin file fixes are checked too, in the transcript and
in the run: 256 env steps an iteration (one env thread of 32 CartPoles,
8-step unrolls), 16 train steps an iteration from the 4th on (1,000 initial
collect steps), and a stop at the first evaluation that returns 195.
"""

import os
import shlex
import subprocess
import sys

import pytest

from alf_async import kernels
from alf_async.testing import transcripts

pytestmark = pytest.mark.timeout(300)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRANSCRIPT = os.path.join(REPO, "docs", "transcripts", "dqn_cartpole.txt")
PAGE = os.path.join(REPO, "docs", "getting-started.md")
COMMAND = "alf-async-train --root_dir runs/dqn_cartpole --gin_file gin_configs/dqn_cartpole.gin"
ENV_STEPS_PER_ITERATION = 32 * 8          # Layout.rows_per_env_thread x Schedule.unroll_length
TRAIN_STEPS_PER_ITERATION = 16            # Schedule.train_steps_per_iteration
ITERATIONS_BEFORE_TRAINING = 3            # 1000 initial collect steps: the 4th batch trains


def _check_numbers(lines):
    """The numbers the gin file fixes, in one run's lines."""
    counts = []
    for line in lines:
        progress, stopped = transcripts.PROGRESS.match(line), transcripts.STOPPED.match(line)
        if progress:
            counts.append((line, *map(int, progress.group(1, 2, 3))))
        elif stopped:
            assert stopped.group(1) == "stop_at_eval_return", line
            counts.append((line, *map(int, stopped.group(2, 4, 3))))
    for line, iteration, env_steps, train_step in counts:
        assert env_steps == ENV_STEPS_PER_ITERATION * iteration, line
        assert train_step == TRAIN_STEPS_PER_ITERATION * max(
            0, iteration - ITERATIONS_BEFORE_TRAINING), line
    evaluations = [transcripts.EVAL.match(line) for line in lines
                   if transcripts.EVAL.match(line)]
    returns = [float(e.group(3)) for e in evaluations]
    assert returns[-1] >= 195.0 and max(returns[:-1], default=0.0) < 195.0, returns
    assert evaluations[-1].group(1) == transcripts.STOPPED.match(lines[-1]).group(3)


def test_the_transcript_is_the_main_job_the_page_shows():
    command, lines = transcripts.read(TRANSCRIPT)
    assert command == COMMAND
    with open(PAGE, encoding="utf-8") as f:
        page = f.read()
    assert f"```\n{COMMAND}\n```" in page
    assert "<!-- rendered: transcript:dqn_cartpole -->" in page
    assert transcripts.SHAPE.fullmatch(transcripts.kinds(lines, transcripts.templates(lines)))
    _check_numbers(lines)


def test_the_main_job_prints_what_the_transcript_shows(tmp_path):
    command, transcript = transcripts.read(TRANSCRIPT)
    known = transcripts.templates(transcript)
    # A user's checkout: the command runs where gin_configs/ is.
    os.symlink(os.path.join(REPO, "gin_configs"), tmp_path / "gin_configs")
    argv = shlex.split(command)
    argv[0] = os.path.join(os.path.dirname(sys.executable), argv[0])  # this venv's script
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""
    gin_file = os.path.join(REPO, "gin_configs", "dqn_cartpole.gin")
    assert lines[0] == kernels.choose_for_gin([gin_file]).line()
    shape = transcripts.kinds(lines, known)
    assert transcripts.SHAPE.fullmatch(shape), (shape, lines)
    _check_numbers(lines)
    assert os.path.isfile(tmp_path / "runs" / "dqn_cartpole" / "train" / "checkpoint")
