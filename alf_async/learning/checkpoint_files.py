"""Checkpoint writes that a stop never leaves half-done.

TensorFlow writes a checkpoint `ckpt-N` into a `ckpt-N_temp/` directory,
then moves its files to `ckpt-N.index` and `ckpt-N.data-*`, and only then
does the `CheckpointManager` name it in the directory's `checkpoint` state
file. A process that exits in the middle (a second SIGINT while the run
writes its checkpoint at exit) leaves the temporary directory, and perhaps
some of the final files, behind; the state file still names the previous
checkpoint, which stays the latest.

- `WRITES.writing(ckpt_dir)`: a block around one write (`CheckpointHook`
  uses it), so that another thread knows a write is in progress.
- `WRITES.finish_or_remove(grace_secs)`: called by the CLI's main thread
  when it aborts: starts no more writes, waits up to `grace_secs` for those
  in progress to finish, then removes what the unfinished ones left.
- `remove_partial(ckpt_dir)`: removes what an unfinished write left: every
  `ckpt-N_temp` directory and the files of every `ckpt-N` the state file
  does not name. The trainer calls it before it restores, which also clears what a
  killed process (SIGKILL, a lost machine) left.
"""

import contextlib
import os
import re
import shutil
import threading
import time

import tensorflow as tf

# The names `tf.train.CheckpointManager` gives (its default prefix "ckpt").
_CHECKPOINT_FILE = re.compile(r"(ckpt-\d+)\.(index|data-\d+-of-\d+)")
_TEMP_DIR = re.compile(r"ckpt-\d+_temp")


class WritesEnded(RuntimeError):
    """A checkpoint write was asked for after `finish_or_remove`."""


class CheckpointWrites:
    """The checkpoint writes in progress in this process.

    Threads: `writing` blocks are entered by the learner's thread;
    `finish_or_remove` is called by another (the CLI's main thread) and
    blocks up to its grace.
    """

    def __init__(self):
        self._changed = threading.Condition()
        self._writing = {}  # {checkpoint directory: writes in progress}
        self._ended = False

    @contextlib.contextmanager
    def writing(self, ckpt_dir):
        """Marks a write into `ckpt_dir` in progress for the block.

        Raises:
            WritesEnded: `finish_or_remove` was called: the process is
                exiting, and a write started now would be cut off.
        """
        with self._changed:
            if self._ended:
                raise WritesEnded(f"no checkpoint is written into {ckpt_dir}: the process "
                                  f"is exiting")
            self._writing[ckpt_dir] = self._writing.get(ckpt_dir, 0) + 1
        try:
            yield
        finally:
            with self._changed:
                self._writing[ckpt_dir] -= 1
                if not self._writing[ckpt_dir]:
                    del self._writing[ckpt_dir]
                self._changed.notify_all()

    def finish_or_remove(self, grace_secs):
        """Starts no more writes; waits up to `grace_secs` for those in
        progress to finish, and removes the partial files of any still in
        progress then.

        Returns:
            A pair of sorted lists: the directories whose write finished
                meanwhile, and those whose partial files were removed.
        """
        deadline = time.monotonic() + grace_secs
        with self._changed:
            self._ended = True
            waited = sorted(self._writing)
            while self._writing and self._changed.wait(max(0.0, deadline - time.monotonic())):
                pass
            unfinished = sorted(self._writing)
        for ckpt_dir in unfinished:
            remove_partial(ckpt_dir)
        return [d for d in waited if d not in unfinished], unfinished


# The process's: `CheckpointHook` writes through it, the CLI ends it.
WRITES = CheckpointWrites()


def remove_partial(ckpt_dir):
    """Removes what an unfinished write left in `ckpt_dir`: `ckpt-N_temp`
    directories and the files of the `ckpt-N` its state file does not name.

    Returns:
        The names removed, sorted.
    """
    if not os.path.isdir(ckpt_dir):
        return []
    state = tf.train.get_checkpoint_state(ckpt_dir)
    named = set()
    if state is not None:
        named = {os.path.basename(p) for p in state.all_model_checkpoint_paths}
        named.add(os.path.basename(state.model_checkpoint_path))
    removed = []
    for name in os.listdir(ckpt_dir):
        path = os.path.join(ckpt_dir, name)
        match = _CHECKPOINT_FILE.fullmatch(name)
        if _TEMP_DIR.fullmatch(name) and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif match and match.group(1) not in named:
            os.remove(path)
        else:
            continue
        removed.append(name)
    return sorted(removed)
