"""Stops TF 2.15's EagerTensor from leaking memory on CPython 3.11.

Every EagerTensor created from Python leaks a 40-48 byte block on this stack
(tensorflow/tensorflow#62551: TF's deallocator skips the instance-attribute
array CPython 3.11 allocates for it). A driver makes some per batch and per
unroll; a blocking environment's Python loop makes several per step; the
trainer makes some per train step, so a run's memory grows for as long
as it lasts (benchmarks/memory.py and benchmarks/soak.py measure it;
docs/results/reliability.md, "Memory"). The pinned stack (setup.py) cannot move to
a fixed TF, so
alf_async frees the block itself: `_eager_tensor_fix`, a small C extension
built at install time, wraps EagerTensor's deallocator.

`install()` runs when alf_async's driver is imported. It patches only the
stack it was written and tested for -- CPython 3.11 and TensorFlow 2.15 --
and only if the extension was built; otherwise it leaves TF alone (and warns
once on that stack, since the leak is then still there). Set
ALF_ASYNC_EAGER_TENSOR_FIX=0 to keep TF's own deallocator.
"""

import logging
import os
import sys

logger = logging.getLogger(__name__)

_installed = None


def applies():
    """True on the stack whose leak the extension fixes."""
    import tensorflow as tf
    return sys.version_info[:2] == (3, 11) and tf.__version__.startswith("2.15.")


def install():
    """Wraps EagerTensor's deallocator once; returns whether it is wrapped."""
    global _installed
    if _installed is not None:
        return _installed
    _installed = False
    if os.environ.get("ALF_ASYNC_EAGER_TENSOR_FIX", "1") == "0" or not applies():
        return False
    try:
        from alf_async.tf215_py311_fixes import _eager_tensor_fix
    except ImportError as e:
        logger.warning("alf_async: the EagerTensor leak fix is not built (%s): on TF 2.15 with "
                       "Python 3.11 every EagerTensor leaks ~48 bytes, so long runs grow. "
                       "Reinstall with a C compiler and the Python headers.", e)
        return False
    from tensorflow.python.framework import ops
    _installed = bool(_eager_tensor_fix.install(ops.EagerTensor))
    return _installed


def freed():
    """How many leaked blocks the fix has freed (0 if not installed)."""
    if not _installed:
        return 0
    from alf_async.tf215_py311_fixes import _eager_tensor_fix
    return _eager_tensor_fix.freed()
