"""A run's output against its transcript in docs/transcripts/, numbers aside.

A transcript is a real run's stdout under `# command:`, `# date:` and
`# host:` header lines; the docs render it. A run of the same command
prints the same kinds of lines with other numbers, and as many evaluation
and progress lines as its seed and the clock make: so the lines are
compared as kinds (their text with every number masked), in order, each
run of one kind counted once.
"""

import re

# A number, and the progress line's loss before the first train step ('-').
NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?|(?<=\| loss )-")
KERNELS = "[alf_async] kernels: "
EVAL = re.compile(r"\[alf_async\] eval at train step (\d+) \([\d.]+ s, (\d+) env steps\): "
                  r"greedy policy AverageReturn ([\d.]+) over (\d+) episodes, "
                  r"AverageEpisodeLength ([\d.]+)$")
PROGRESS = re.compile(r"\[alf_async\] iteration (\d+) \| env steps (\d+) \(\d+/s\) \| "
                      r"train steps (\d+) \(\d+/s\) \| collect policy AverageReturn ([\d.]+) "
                      r"\| loss \S+$")
STOPPED = re.compile(r"\[alf_async\] stopped \((\w+)\) at iteration (\d+), train step (\d+), "
                     r"env steps (\d+); checkpoint in \S+$")
# Evaluations and progress lines in turn, then the last evaluation, the
# last progress line and the stop line.
SHAPE = re.compile(r"[EP]*EPS")


def read(path):
    """(the command of the transcript's header, its output lines)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    header = [line for line in lines if line.startswith("# ")]
    assert lines[:len(header)] == header, f"{path}: header lines come first"
    commands = [line[len("# command: "):] for line in header if line.startswith("# command: ")]
    assert len(commands) == 1, header
    return commands[0], lines[len(header):]


def templates(lines):
    """{masked line: its kind} of a transcript's lines after the kernels
    line: 'E' an evaluation, 'P' a progress line, 'S' the stop line."""
    assert lines[0].startswith(KERNELS), lines[0]
    found = {}
    for line in lines[1:]:
        kind = "E" if EVAL.match(line) else "P" if PROGRESS.match(line) else \
            "S" if STOPPED.match(line) else None
        assert kind is not None, f"a transcript line of no known kind: {line!r}"
        found.setdefault(NUMBER.sub("#", line), kind)
    assert sorted(set(found.values())) == ["E", "P", "S"], found
    return found


def kinds(lines, known):
    """The kinds of `lines` after the kernels line, each run of one kind
    once ('EPEPS'). AssertionError for a line whose masked text is none of
    `known` (`templates`)."""
    out = ""
    for line in lines[1:]:
        masked = NUMBER.sub("#", line)
        assert masked in known, f"a line of no kind the transcript shows: {line!r}"
        if not out.endswith(known[masked]):
            out += known[masked]
    return out
