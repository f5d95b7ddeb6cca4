"""The index of the environment being built, for constructors that run elsewhere.

A SubprocessEnv child and a Ray env actor build their environments by
calling a zero-arg env constructor; `current_env_index()` tells that
constructor (or the environment's own constructor) which environment it
builds, e.g. to give each its own seed, port or log file:

    def make_env():
        return MySimulator(seed=1000 + (current_env_index() or 0))

A SubprocessEnv child serves one environment for its whole life (a
restarted child gets the index of the one it replaces); a Ray actor builds
several, one after another, each inside `building_env(index)`.

Threads: the index is process-wide; it is set by the code that builds
environments (a child's main thread, a Ray actor's method) before it calls
the constructor.
"""

import contextlib
from typing import Optional

_CURRENT: Optional[int] = None


def current_env_index() -> Optional[int]:
    """The index of the environment being built (or served) in this process,
    None where no SubprocessEnv child or Ray env actor set one."""
    return _CURRENT


def set_current_env_index(index: Optional[int]) -> Optional[int]:
    """Sets what `current_env_index()` returns from now on; returns the old value."""
    global _CURRENT
    old, _CURRENT = _CURRENT, None if index is None else int(index)
    return old


@contextlib.contextmanager
def building_env(index: Optional[int]):
    """`current_env_index()` is `index` inside the block, the old value after it."""
    old = set_current_env_index(index)
    try:
        yield
    finally:
        set_current_env_index(old)
