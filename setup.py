"""alf_async: an asynchronous off-policy training driver for TF2 and tf-agents."""

import sys
import sysconfig

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """Builds alf_async.tf215_py311_fixes._eager_tensor_fix where it can; never fails the install.

    The extension frees what TF 2.15's EagerTensor leaks on CPython 3.11 (see
    alf_async/tf215_py311_fixes/eager_tensor_fix.py). Without a compiler it is skipped and
    alf_async warns at run time that the leak is still there.
    """

    def run(self):
        try:
            super().run()
        except Exception as e:  # pylint: disable=broad-except
            print(f"alf_async: not building the EagerTensor leak fix: {e}", file=sys.stderr)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:  # pylint: disable=broad-except
            print(f"alf_async: not building {ext.name}: {e}", file=sys.stderr)


# Only CPython 3.11 has the leak (and the internal header the fix reads).
EXTENSIONS = [
    Extension("alf_async.tf215_py311_fixes._eager_tensor_fix", ["alf_async/tf215_py311_fixes/_eager_tensor_fix.c"],
              include_dirs=[sysconfig.get_paths()["include"] + "/internal"],
              define_macros=[("Py_BUILD_CORE_MODULE", "1")]),
] if sys.version_info[:2] == (3, 11) and sys.implementation.name == "cpython" else []

# The pinned stack (docs/getting-started.md): tf-agents 0.19 is the newest release and
# supports TF 2.15 at most; gym 0.23 is what its suite_gym loads.
STACK = [
    "tensorflow-cpu==2.15.1",
    "tf-agents==0.19.0",
    "tensorflow-probability==0.23.0",
    "gin-config==0.5.0",
    "gym==0.23.0",
    "numpy<2",
    # SubprocessEnv pickles env constructors with it (already a tf-agents dependency).
    "cloudpickle>=1.3",
    # TensorFlow's grpcio, at the newest release that does not require
    # typing-extensions ~= 4.12 (tf-agents 0.19 pins 4.5.0): pip reaches it
    # anyway, after minutes of backtracking through 1.75-1.85.
    "grpcio==1.74.0",
]

GYMNASIUM = "gymnasium==1.3.0"
# Ray core only: ray[default] (dashboard) needs pydantic with typing-extensions
# >= 4.14, which tf-agents 0.19's typing-extensions==4.5.0 pin forbids. Ray
# core resolves beside the pinned stack without touching protobuf.
RAY = "ray==2.60.0"
# MuJoCo for gymnasium's v5 tasks (HalfCheetah-v5, Hopper-v5): gymnasium[mujoco]
# asks for mujoco>=2.1.5, imageio>=2.14.1. mujoco 3.17.0 is the newest 3.x
# (4.0.0 is a new major gymnasium 1.3.0 was not released against); both were
# installed on Python 3.11 beside the pinned stack with `pip check` clean.
MUJOCO = [GYMNASIUM, "mujoco==3.17.0", "imageio==2.38.1"]
# Reverb replay and collector processes (alf_async.distributed.reverb_replayer): 0.14.0 is
# the release built against TF 2.15; it adds only portpicker and psutil, and
# `pip check` stays clean beside the pinned stack. Linux only.
REVERB = "dm-reverb==0.14.0"
# Atari (suite_atari): ale-py ships the ROMs in its wheel. opencv resizes the
# frames in gymnasium's AtariPreprocessing; its 4.11+ and 5.x wheels require
# numpy 2, which TF 2.15 cannot import, so it stays below 4.11.
ATARI = [GYMNASIUM, "ale-py==0.12.1", "opencv-python-headless<4.11"]
# EnvPool (suite_envpool): C++ threads step Atari and MuJoCo games without the
# GIL. 1.2.5 installs beside the pinned stack with `pip check` clean (~700 MB
# with its game assets).
ENVPOOL = [GYMNASIUM, "envpool==1.2.5",
           # EnvPool's optree at the release pip backtracks to from 0.16-0.19
           # (they need a newer typing-extensions than tf-agents' 4.5.0).
           "optree==0.15.0"]
# The benchmarks' plots (benchmarks/wall_clock_learning.py).
BENCH = ["matplotlib==3.11.2"]
# The documentation site (mkdocs.yml, docs/): `mkdocs build --strict`, which
# .ci/run runs. mkdocstrings-python reads the docstrings by static analysis
# (griffe), so building needs none of the extras above. These exact versions
# were installed beside the pinned stack (typing-extensions stays 4.5.0) with
# `pip check` clean.
DOCS = ["mkdocs==1.6.1", "mkdocs-material==9.8.2", "mkdocstrings==1.0.8",
        "mkdocstrings-python==2.0.11", "griffelib==2.4.1",
        # Formats the API reference's signatures (mkdocstrings-python needs black or ruff).
        "ruff==0.17.6"]

setup(
    name="alf_async",
    version="0.1.0",
    description="Asynchronous off-policy training driver for TensorFlow 2 and tf-agents",
    packages=find_packages(include=["alf_async", "alf_async.*"]),
    python_requires=">=3.10,<3.12",
    install_requires=STACK,
    ext_modules=EXTENSIONS,
    cmdclass={"build_ext": OptionalBuildExt},
    extras_require={
        # gymnasium 1.3.0 is the newest release that installs beside
        # tf-agents 0.19's typing-extensions==4.5.0 pin (pip check stays clean).
        "gymnasium": [GYMNASIUM],
        "ray": [RAY],
        "reverb": [REVERB],
        "mujoco": MUJOCO,
        "atari": ATARI,
        "envpool": ENVPOOL,
        "bench": MUJOCO + BENCH,
        "docs": DOCS,
        # griffelib: tests/test_docstrings.py parses the docstrings as the docs site does.
        "test": ["pytest>=7", "pytest-timeout>=2.1", "hypothesis>=6.100", RAY, REVERB,
                 "griffelib==2.4.1"] + MUJOCO + ATARI + ENVPOOL,
    },
    entry_points={
        "console_scripts": ["alf-async-train=alf_async.bin.train:main",
                            "alf-async-collect=alf_async.bin.collect:main"],
    },
)
