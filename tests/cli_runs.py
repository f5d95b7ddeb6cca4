"""Running alf-async-train as users do, in a subprocess, for the tests of the
gin files shipped in gin_configs/."""

import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
GIN_CONFIGS = os.path.join(REPO, "gin_configs")


def run_train_cli(root_dir, gin_file, bindings, timeout, env=None):
    """Runs `python -m alf_async.bin.train` on `gin_file` (in gin_configs/)
    with each of `bindings` as a --gin_param, from the repository's root, in
    `env` (None: this process's environment).

    Returns:
        The finished `subprocess.CompletedProcess`, stdout and stderr as text.
    """
    args = [sys.executable, "-m", "alf_async.bin.train", "--root_dir", str(root_dir),
            "--gin_file", os.path.join(GIN_CONFIGS, gin_file)]
    for binding in bindings:
        args += ["--gin_param", binding]
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env=env)


PROGRESS_LINE = "[alf_async] iteration "


# Every start says which kernels TensorFlow runs, once the run is built
# (alf_async.kernels); test_quiet_start.py asserts the line exactly.
KERNELS_LINE = "[alf_async] kernels: "


def without_kernels_line(lines):
    """A start's output lines without its kernels line, which comes once,
    before the first progress line (AssertionError if it does not)."""
    found = [i for i, line in enumerate(lines) if line.startswith(KERNELS_LINE)]
    progress = [i for i, line in enumerate(lines) if line.startswith(PROGRESS_LINE)]
    assert len(found) == 1 and (not progress or found[0] < progress[0]), lines[:10]
    return lines[:found[0]] + lines[found[0] + 1:]


def lines_before_progress(lines):
    """The output lines before the first progress line (`[alf_async]
    iteration ...`), without the start's kernels line: a quiet start has
    none but those alf_async prints there by design. AssertionError if
    there is no progress line or the kernels line is not the first.
    """
    lines = without_kernels_line(lines)
    for i, line in enumerate(lines):
        if line.startswith(PROGRESS_LINE):
            return lines[:i]
    raise AssertionError(f"no progress line in {lines[-40:]}")


def third_party_lines(proc):
    """The lines of a finished run (a `CompletedProcess`, text) that are not
    alf_async's own: all of stderr, and stdout's without the `[alf_async] `
    prefix. A quiet run has none, at its start and after."""
    return proc.stderr.splitlines() + [line for line in proc.stdout.splitlines()
                                       if not line.startswith("[alf_async] ")]
