"""docs/guides/your-environment.md works as written.

The page's titled code blocks are a user's files (`lights.py`, a gymnasium
environment, and `lights.gin`); its one `sh` block is the command. The test
writes the files into a fresh directory beside a link to gin_configs/ (a
user's checkout), runs the command as the page shows it, and checks:

- it trained on Lights and stopped solved: every evaluation's episodes are
  Lights' ten presses, the last returns 10 (every press right), and the
  stop line says `stop_at_eval_return`;
- the environment's steps reached the learner: every training episode the
  run summarised (`Metrics/AverageEpisodeLength` in `train`) is ten steps
  long, 256 env steps an iteration;
- it prints the lines of the page's transcript (docs/transcripts/lights.txt),
  numbers aside (alf_async.testing.transcripts), and nothing on stderr.
"""

import glob
import os
import re
import shlex
import subprocess
import sys

import pytest

from alf_async.testing import transcripts

pytestmark = pytest.mark.timeout(300)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(REPO, "docs", "guides", "your-environment.md")
TRANSCRIPT = os.path.join(REPO, "docs", "transcripts", "lights.txt")
BLOCK = re.compile(r"^```(\w+)(?: title=\"([^\"]+)\")?\n(.*?)^```$", re.M | re.S)
EPISODE_STEPS = 10          # Lights' presses per episode
ENV_STEPS_PER_ITERATION = 32 * 8


def _page():
    """({file name: text} of the page's titled blocks, the sh block's command)."""
    with open(PAGE, encoding="utf-8") as f:
        blocks = BLOCK.findall(f.read())
    files = {title: text for _, title, text in blocks if title}
    commands = [text.strip() for language, title, text in blocks if language == "sh"]
    assert len(commands) == 1, commands
    return files, commands[0]


def _summaries(directory, tag):
    """The values of scalar `tag` in the event files of `directory`, in step order."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    found = []
    for path in glob.glob(os.path.join(directory, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == tag:
                    found.append((event.step, float(tf.make_ndarray(value.tensor))))
    return [v for _, v in sorted(found)]


def test_the_page_shows_the_transcripts_command_and_two_files():
    files, command = _page()
    assert sorted(files) == ["lights.gin", "lights.py"]
    assert transcripts.read(TRANSCRIPT)[0] == command


def test_the_page_trains_on_its_environment(tmp_path):
    files, command = _page()
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    os.symlink(os.path.join(REPO, "gin_configs"), tmp_path / "gin_configs")
    words = shlex.split(command)
    env = dict(os.environ)
    while "=" in words[0]:                      # PYTHONPATH=. before the command
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    words[0] = os.path.join(os.path.dirname(sys.executable), words[0])  # this venv's script
    proc = subprocess.run(words, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    _, transcript = transcripts.read(TRANSCRIPT)
    shape = transcripts.kinds(lines, transcripts.templates(transcript))
    assert transcripts.SHAPE.fullmatch(shape), (shape, lines)

    evaluations = [transcripts.EVAL.match(line) for line in lines
                   if transcripts.EVAL.match(line)]
    assert [float(e.group(5)) for e in evaluations] == [float(EPISODE_STEPS)] * len(evaluations)
    assert float(evaluations[-1].group(3)) == 10.0
    stopped = transcripts.STOPPED.match(lines[-1])
    reason, iteration, train_step, env_steps = stopped.groups()
    assert reason == "stop_at_eval_return"
    assert train_step == evaluations[-1].group(1) and int(train_step) > 0
    assert int(env_steps) == ENV_STEPS_PER_ITERATION * int(iteration)

    lengths = _summaries(tmp_path / "runs" / "lights" / "train", "Metrics/AverageEpisodeLength")
    assert lengths and lengths == [float(EPISODE_STEPS)] * len(lengths)
