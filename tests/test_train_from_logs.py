"""examples/train_from_logs.py refuses a --log-dir that does not exist: one
line, exit status 2, nothing left behind."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.timeout(120)
def test_a_missing_log_dir_is_a_one_line_error_and_leaves_no_temporary_directory(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    missing = str(tmp_path / "no" / "such" / "dir")
    env = dict(os.environ, TMPDIR=str(scratch),
               PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "examples")] + [
                   p for p in [os.environ.get("PYTHONPATH")] if p]))
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "train_from_logs.py"),
         "--log-dir", missing], capture_output=True, text=True, env=env, timeout=110)
    assert result.returncode == 2
    assert result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert errors == [f"train_from_logs.py: error: --log-dir {missing!r} is not an existing "
                      f"directory"]
    assert not any(line.startswith("Traceback") for line in result.stderr.splitlines())
    assert os.listdir(scratch) == []
