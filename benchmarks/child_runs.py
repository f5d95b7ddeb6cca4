"""What the benchmarks that run each measurement in a process of its own
share: the child's result (its last JSON line), and the seconds each
evaluation takes in it."""

import json
import subprocess
import time


def json_result(cmd, timeout, what, env=None):
    """Runs `cmd` and returns the last line of its stdout that is a JSON
    object (the child prints its result last).

    Raises:
        RuntimeError: naming `what` (e.g. 'async run for seed 3'), with the
            child's exit code and the end of its stderr, if no such line came.
        subprocess.TimeoutExpired: the child ran past `timeout` seconds.
    """
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def time_evaluations():
    """From now on in this process, times every `Evaluator` call (an
    evaluation's whole graph call); returns the list its seconds are
    appended to."""
    from alf_async.learning import evaluation
    secs = []
    evaluate = evaluation.Evaluator.__call__

    def timed(self):
        start = time.monotonic()
        try:
            return evaluate(self)
        finally:
            secs.append(time.monotonic() - start)
    evaluation.Evaluator.__call__ = timed
    return secs
