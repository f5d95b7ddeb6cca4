"""The processes below a test's own, read from /proc: what the tests of
environments in child processes check for leftovers with.

`leftover_processes()` leaves out multiprocessing's own helpers (the fork
server and the resource tracker are the test process's direct children and
stay up for its life); environment processes are the fork server's
children and share its command line, so they are told apart by their
parent.
"""

import collections
import os

HELPERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


def process_table():
    """pid -> (ppid, state, command line) of every process."""
    table = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        table[int(name)] = (int(fields[1]), fields[0], cmdline)
    return table


def descendants(root=None):
    """pid -> (ppid, state, command line) of every process below `root`
    (default: this process)."""
    table = process_table()
    children = collections.defaultdict(list)
    for pid, (ppid, _, _) in table.items():
        children[ppid].append(pid)
    found, stack = {}, [os.getpid() if root is None else root]
    while stack:
        for pid in children[stack.pop()]:
            found[pid] = table[pid]
            stack.append(pid)
    return found


def leftover_processes():
    """pid -> (state, command line) of the processes below this one, but
    multiprocessing's own helpers."""
    me = os.getpid()
    return {pid: (state, cmd) for pid, (ppid, state, cmd) in descendants().items()
            if not (ppid == me and any(h in cmd for h in HELPERS))}


def gone(pid):
    """True once `pid` no longer exists (a zombie still does)."""
    return not os.path.exists(f"/proc/{pid}")
