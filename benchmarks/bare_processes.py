"""The ceiling of environments in child processes: each child steps its
environment alone, with no driver and nothing from the parent per step.

Each child builds its environment, resets it and says it is ready; when
every child is, they all loop `env.step(fixed action)` for the same number
of seconds (the action spec's minimum; an episode's end resets as the
environment's own `step` does), report their counts and wait to be told to
exit, so that their CPU is still in /proc when `Usage` reads it. Plain
`multiprocessing` (forkserver, else spawn): the constructors must pickle
(module-level functions, classes or `functools.partial`s of them).
"""

import multiprocessing
import queue
import time
import traceback

import numpy as np

from usage import Usage  # benchmarks/ is this script's directory


def _fixed_action(spec):
    return np.full(spec.shape, spec.minimum, spec.dtype)


def _step_alone(index, constructor, seconds, go, done, out):
    """A child's work (see the module docstring)."""
    try:
        env = constructor()
        action = _fixed_action(env.action_spec())
        env.reset()
        out.put((index, "ready", None))
        go.wait()
        steps, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            env.step(action)
            steps += 1
        out.put((index, "steps", steps))
    except Exception:   # pylint: disable=broad-except
        out.put((index, "error", traceback.format_exc()))
        return
    done.wait(600)
    env.close()


def _context(start_method):
    if start_method == "forkserver" and "forkserver" not in multiprocessing.get_all_start_methods():
        start_method = "spawn"
    return multiprocessing.get_context(start_method)


def _collect(out, children, kind, deadline):
    """{child index: value} of one `kind` message from every child; raises
    if a child fails, dies or is late."""
    got = {}
    while len(got) < len(children):
        try:
            index, what, value = out.get(timeout=1.0)
        except queue.Empty:
            dead = [c.exitcode for c in children if c.exitcode is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"bare processes: {len(got)} of {len(children)} children "
                                   f"{kind}; exit codes of the dead: {dead}") from None
            continue
        if what == "error":
            raise RuntimeError(f"bare process {index} failed:\n{value}")
        if what == kind:
            got[index] = value
    return got


def measure(constructors, seconds, start_method="forkserver", start_timeout=600.0):
    """One child process per constructor, each stepping its environment alone
    for `seconds` (see the module docstring).

    Args:
        constructors: picklable callables, each making one PyEnvironment
            with a single bounded action spec.
        seconds: how long each child steps.
        start_method: "forkserver" (else spawn where there is none) or "spawn".
        start_timeout: seconds the children have to build their environments.

    Returns:
        `Usage.per_step` over the stepping, the children included, with
        `rate` = the children's total steps / `seconds`.
    """
    ctx = _context(start_method)
    go, done, out = ctx.Event(), ctx.Event(), ctx.Queue()
    children = [ctx.Process(target=_step_alone, args=(i, c, seconds, go, done, out),
                            name=f"bare_process{i}", daemon=True)
                for i, c in enumerate(constructors)]
    try:
        for child in children:
            child.start()
        _collect(out, children, "ready", time.monotonic() + start_timeout)
        usage = Usage()
        go.set()
        counts = _collect(out, children, "steps", time.monotonic() + seconds + 60)
        steps = sum(counts.values())
        result = usage.per_step(steps)
        result["rate"] = steps / seconds
    finally:
        done.set()
        for child in children:
            child.join(10)
            if child.is_alive():
                child.kill()
                child.join()
        out.close()
    return result
