"""A quiet start: no third-party output before alf_async's own lines.

    from alf_async import quiet
    quiet.quiet(verbose=False)      # before TensorFlow, tf-agents or gym are imported
    import tensorflow as tf

Silenced unless `verbose`:

- TensorFlow's C++ start-up banner (oneDNN, CPU features):
  `TF_CPP_MIN_LOG_LEVEL=2`, unless the environment sets it already;
- gym's "unmaintained" notice (printed by `import gym` from the
  gym_notices package);
- gym's "The environment CartPole-v0 is out of date" UserWarning and other
  DeprecationWarnings;
- TensorFlow's Python-side deprecation warnings (tf-agents' "calling foldr_v2
  with back_prop=False") and absl's (tf-agents' policy saver, TF's
  SavedModel name sanitizing): the `tensorflow` and `absl` loggers show
  errors only;
- the Arcade Learning Environment's banner: suite_atari sets ale-py's
  logger to errors when it imports ale-py in a quiet process;
- Keras' "The initializer Orthogonal is unseeded and being called multiple
  times" UserWarning, known harmless where it comes from (`_apply`);
- MuJoCo's "compiler attribute 'settotalmass' is deprecated" warning,
  known harmless under the pinned mujoco: suite_gymnasium calls
  `quiet_mujoco()` before it makes a MuJoCo environment in a quiet process;
- Reverb's C++ INFO lines ("[reverb/cc/...] Started replay server on port
  ...", its checkpointer's, its shutdown's, a sampler's in the server's
  process): alf_async's Reverb calls run inside `reverb_info_dropped()`.

Child processes (SubprocessEnv's fork server and children, spawn) inherit it
through the environment: `quiet()` sets `ALF_ASYNC_QUIET=1`, and
`apply_inherited()` (called when the alf_async package is imported, before
any of its modules imports gym or TensorFlow) applies it there. alf_async's own
warnings (e.g. the driver's inter-op thread hint) are not silenced.
"""

import contextlib
import logging
import os
import re
import sys
import tempfile
import threading
import warnings

ENV_VAR = "ALF_ASYNC_QUIET"


def quiet(verbose=False):
    """Silences third-party start-up output in this process and its children.

    Call it before TensorFlow, tf-agents or gym are imported (the C++ banner
    and gym's notice are printed at import).

    Args:
        verbose: if True, change nothing (everything is shown) and do not
            pass quietness on to child processes.
    """
    if verbose:
        os.environ.pop(ENV_VAR, None)
        return
    os.environ[ENV_VAR] = "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    _apply()


def apply_inherited():
    """In a child process: be quiet if the parent called `quiet()`."""
    if os.environ.get(ENV_VAR) == "1":
        _apply()


def _apply():
    warnings.filterwarnings("ignore", message=r".*is out of date", category=UserWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    # tf-agents' PPOActorNetwork (ppo_agent's continuous actor, ppo_hopper.gin)
    # gives all its hidden layers one unseeded Orthogonal initializer. Its
    # layers' kernels differ in shape, so they differ (correlated draws),
    # and it is tf-agents' published PPO actor as ppo_hopper.gin's runs in
    # docs/results/learning.md trained it; ppo_agent's discrete actor uses a fresh initializer
    # per kernel (ppo.FreshOrthogonal).
    warnings.filterwarnings("ignore", category=UserWarning,
                            message="The initializer Orthogonal is unseeded and being called "
                                    "multiple times")
    try:
        # gym prints gym_notices' notice for its version at import time.
        from gym_notices import notices
        notices.notices.clear()
    except Exception:  # pylint: disable=broad-except  (no gym_notices: nothing to print)
        pass
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    try:
        from absl import logging as absl_logging  # a TensorFlow dependency; no TF import
        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:
        pass


# MuJoCo warnings known to be harmless: gymnasium's half_cheetah.xml
# (HalfCheetah-v5) sets the deprecated `settotalmass`, which mujoco 3.17.0
# (the pinned version) still applies: the model's total mass is 14, as the
# file asks.
HARMLESS_MUJOCO_WARNINGS = ("compiler attribute 'settotalmass' is deprecated",)


def quiet_mujoco():
    """Drops MuJoCo's known harmless warnings in this process; any other is
    printed and logged as MuJoCo does (or passed to a handler set before).

    MuJoCo prints its warnings from C ("WARNING: ..." on stdout, and in
    MUJOCO_LOG.TXT in the working directory) unless a handler is set.
    """
    import mujoco  # pylint: disable=import-outside-toplevel  (only where MuJoCo runs)
    previous = mujoco.get_mju_user_warning()
    if getattr(previous, "alf_async_quiet", False):
        return

    def handler(message):
        if message.startswith(HARMLESS_MUJOCO_WARNINGS):
            return
        if previous is not None:
            previous(message)
            return
        print(f"WARNING: {message}\n", flush=True)
        mujoco.mju_writeLog("WARNING", message)

    handler.alf_async_quiet = True
    mujoco.set_mju_user_warning(handler)


# Reverb's C++ server and client write these INFO lines to std::clog
# (stderr) whatever the log level: Reverb 0.14's logging
# (reverb/cc/platform/default/logging.h) has no level to set. alf_async
# prints its own line where one matters (the address collectors connect to,
# the checkpoint written at exit, the replay restored).
HARMLESS_REVERB_LINES = re.compile(
    rb"\[reverb/cc/[\w/.]+:\d+\] +(Started replay server on port \d+|Shutting down replay "
    rb"server|Initializing TFRecordCheckpointer in |Loading checkpoint from |Loading latest "
    rb"checkpoint from |Stored checkpoint to |Sampler and server are owned by the same "
    rb"process \(\d+\) so Table \S+ is accessed directly without gRPC\.).*\n?")
_stderr_lock = threading.RLock()
_captured = None  # the temporary file of the block in progress


@contextlib.contextmanager
def reverb_info_dropped():
    """In a quiet process, drops Reverb's INFO lines (`HARMLESS_REVERB_LINES`)
    that the calls inside write to stderr; any other line they or another
    thread write meanwhile reaches stderr when the block ends.

    It points file descriptor 2 at a temporary file for the block (Reverb
    writes from C++, below Python's `sys.stderr`), so keep the block to the
    Reverb call: a server's start, stop or checkpoint. Blocks in several
    threads take turns (a lock); a block inside one is the outer block's.
    Outside a quiet process it changes nothing.
    """
    global _captured
    if os.environ.get(ENV_VAR) != "1":
        yield
        return
    with _stderr_lock:
        if _captured is not None:  # inside another block of this thread
            yield
            return
        sys.stderr.flush()
        saved = os.dup(2)
        _captured = tempfile.TemporaryFile()
        os.dup2(_captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            _captured.seek(0)
            kept = [line for line in _captured.read().splitlines(keepends=True)
                    if not HARMLESS_REVERB_LINES.fullmatch(line)]
            _captured.close()
            _captured = None
            if kept:
                os.write(2, b"".join(kept))
