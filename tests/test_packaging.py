"""The installed set stays consistent: the pins of setup.py (TF stack,
gymnasium, Ray, MuJoCo and bench extras) resolve together and `pip check` finds nothing."""

import subprocess
import sys

import pytest


@pytest.mark.timeout(120)
def test_pip_check_is_clean():
    out = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True,
                         text=True, timeout=110)
    assert out.returncode == 0, out.stdout + out.stderr
