"""The policy a PolicyServerEnv exports for local inference: a tf-agents
SavedModel as a tarball, and its current weights as a checkpoint tarball
with an ETag, refreshed at most every `refresh_secs`.
"""

import hashlib
import io
import os
import shutil
import tarfile
import tempfile
import threading
import time
import weakref


class PolicyExport(object):
    """A policy as a SavedModel tarball, plus its current weights on demand.

    Threads: built on the server's constructing thread (PolicySaver traces
    the policy there); `model()`/`weights()` are called by worker
    threads (serialised by a lock); `close()` by any thread.
    """

    def __init__(self, policy, refresh_secs):
        from tf_agents.policies import policy_saver  # pylint: disable=import-outside-toplevel
        self._refresh = float(refresh_secs)
        self._dir = tempfile.mkdtemp(prefix="alf_async_policy_")
        # Removed by close(), or at garbage collection / exit if never closed.
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._dir, ignore_errors=True)
        self._lock = threading.Lock()
        try:
            self._saver = policy_saver.PolicySaver(policy, batch_size=None)
            model_dir = os.path.join(self._dir, "model")
            self._saver.save(model_dir)
            self._model = _tar_gz(model_dir)
        except BaseException:
            self.close()
            raise
        self._weights = None
        self._weights_time = float("-inf")

    def model(self):
        return self._model

    def weights(self):
        """(etag, tar.gz bytes) of a variables checkpoint at most refresh_secs old."""
        with self._lock:
            if time.monotonic() - self._weights_time >= self._refresh:
                ckpt_dir = tempfile.mkdtemp(dir=self._dir)
                try:
                    self._saver.save_checkpoint(ckpt_dir)
                    self._weights = (_digest(ckpt_dir), _tar_gz(ckpt_dir))
                finally:
                    shutil.rmtree(ckpt_dir, ignore_errors=True)
                self._weights_time = time.monotonic()
            return self._weights

    def close(self):
        self._cleanup()


def _tar_gz(directory):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(directory, arcname=".")
    return buf.getvalue()


def _digest(directory):
    """An ETag from the files' names and contents (tar bytes carry mtimes)."""
    h = hashlib.sha256()
    for root, _, files in sorted(os.walk(directory)):
        for name in sorted(files):
            path = os.path.join(root, name)
            h.update(os.path.relpath(path, directory).encode() + b"\0")
            with open(path, "rb") as f:
                h.update(f.read())
    return '"' + h.hexdigest()[:32] + '"'
