"""How an env thread steps its environment, decided once per environment.

`stepping_of(tf_env)` reads the environment's capabilities
(alf_async/environments/capabilities.py) and returns a `Stepping`; the
driver calls it once per environment, where it builds the env threads,
and hands the decision to the env thread, the actor threads, its stop and
its inter-op warning; `choose_layout`'s profile reads it too. Nothing
else looks at what the environment is.

The three ways (`Stepping.kind`):

- `GRAPH`: one long-running graph call (graph_loop.py). A TF-native
  environment, or a TFPyEnvironment built with `isolation=True` (whose
  Python environment must run on its own thread), is stepped with
  `tf_env.step`; any other Python environment through a `numpy_function`,
  taking the step token unless its step releases the GIL
  (`capabilities.GilFreeStep`). The queue traffic and the unroll never
  touch Python.
- `PYTHON`: the batch in lockstep from a Python loop with raw queue ops
  (python_loop.py): environments whose step blocks on the outside
  (`capabilities.BlockingStep`) and whose rows are not separate
  environments, and `capabilities.AppliedStep` environments (their
  `applied_step()` is read after each step). Inside the graph a blocked
  `numpy_function` holds one of TF's inter-op threads (as many as cores by
  default), so a few blocked steps would starve the actors; a blocking
  step's per-step overhead does not matter next to its wait.
- `ROWS`: each row stepped on its own, asking for its action as soon as it
  is ready (rows_loop.py): a `capabilities.RowStepping` batch (EnvPool's
  asynchronous pool), or a batch whose rows are separate unbatched
  BlockingStep environments (tf-agents' BatchedPyEnvironment, our
  BatchedSubprocessEnv, ExternalEnv's batched slots). No row waits for a
  slower one.

Threads: `stepping_of` runs on the driver's constructing thread (and
`choose_layout`'s); a `Stepping` is immutable.
"""

import logging
import os

import tensorflow as tf
from tf_agents.environments import batched_py_environment, py_environment

from alf_async.environments import BatchedSubprocessEnv, capabilities

logger = logging.getLogger(__name__)

GRAPH = "graph"
PYTHON = "python"
ROWS = "rows"


class Stepping(object):
    """What `stepping_of` decided for one environment (read-only fields).

    Attributes:
        kind: GRAPH, PYTHON or ROWS (see the module docstring).
        py_env: the Python environment an env thread may step from its own
            thread (from a numpy_function or a Python loop), or None: a
            TF-native environment, or one isolated on a thread of its own.
        rows: with ROWS, what steps the rows: the RowStepping batch, or the
            rows' unbatched environments (a list); else None.
        blocks: the step blocks on the outside (BlockingStep): stepped off
            TF's inter-op pool, and closed at once by the driver's stop.
        takes_step_token: a GRAPH Python step that holds the GIL, which
            takes turns with the others (the step token).
        reports_applied: the environment is an AppliedStep (or a batch of
            them): its applied actions and trainable flags are recorded.
    """

    __slots__ = ("kind", "py_env", "rows", "blocks", "takes_step_token", "reports_applied")

    def __init__(self, kind, py_env, rows, blocks, takes_step_token, reports_applied):
        for name, value in zip(self.__slots__, (kind, py_env, rows, blocks, takes_step_token,
                                                reports_applied)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise AttributeError("a Stepping is decided once and not changed")

    @property
    def in_graph(self):
        """The env thread runs its graph loop."""
        return self.kind == GRAPH

    @property
    def rows_one_by_one(self):
        """The rows step on their own, whichever are ready (ROWS), or the
        step waits on the outside: what `choose_layout`'s cost model calls
        rows stepped one by one (their waits overlap)."""
        return self.kind == ROWS or self.blocks

    def __repr__(self):
        return (f"Stepping({self.kind}, blocks={self.blocks}, "
                f"step_token={self.takes_step_token}, applied={self.reports_applied})")


def stepping_of(tf_env):
    """How an env thread steps `tf_env` (a TFEnvironment): a `Stepping`."""
    py_env = capabilities.python_env(tf_env)
    if py_env is None or _isolated(tf_env):
        # Stepped with tf_env.step in the graph (an isolated AppliedStep
        # environment is refused by its env thread: its applied steps cannot
        # be read from there).
        return Stepping(GRAPH, None, None, blocks=False, takes_step_token=False,
                        reports_applied=capabilities.reports_applied_step(py_env))
    if isinstance(py_env, batched_py_environment.BatchedPyEnvironment):
        blocks = all(capabilities.steps_block(e) for e in py_env.envs)
    else:
        blocks = capabilities.steps_block(py_env)
    applied = capabilities.reports_applied_step(py_env)
    rows = _rows(py_env)
    if rows is not None:
        kind = ROWS
    elif blocks or applied:
        kind = PYTHON
    else:
        kind = GRAPH
    token = kind == GRAPH and not capabilities.steps_release_gil(py_env)
    return Stepping(kind, py_env, rows, blocks, token, applied)


def _isolated(tf_env):
    """A TFPyEnvironment built with `isolation=True`: its Python environment
    runs on a thread of its own and is stepped through `tf_env.step`.
    tf-agents offers no public way to ask: its `TFPyEnvironment.__init__`
    keeps the isolation pool in `_pool`, None without isolation
    (tf_agents/environments/tf_py_environment.py)."""
    return tf_env._pool is not None   # pylint: disable=protected-access


def _rows(py_env):
    """What steps `py_env`'s rows one by one (see `Stepping.rows`), or None."""
    if isinstance(py_env, capabilities.RowStepping):
        return py_env
    # The batches of separate environments: tf-agents' (ExternalEnv's
    # batched slots are one) and ours of child processes.
    if not isinstance(py_env, (batched_py_environment.BatchedPyEnvironment,
                               BatchedSubprocessEnv)):
        return None
    envs = py_env.envs
    if envs and all(isinstance(e, py_environment.PyEnvironment) and not e.batched and
                    capabilities.steps_block(e) for e in envs):
        return list(envs)
    return None


_warned_inter_op = False


def warn_if_few_inter_op_threads(steppings, num_actor_queues):
    """Warns once per process when TF's inter-op pool cannot hold the
    environment steps that may run in it at the same time and the actors.

    `steppings`: each environment's `Stepping`. A graph-mode env thread
    steps a Python environment inside a numpy_function, which holds one of
    TF's inter-op threads while it runs. Those env threads take turns (the
    step token: one Python step at a time), so together they hold one
    thread; other graph-mode environments (a TFPyEnvironment with
    isolation=True, a TF-native one) may hold one each. Python steps that
    release the GIL take no token and may hold one each too, but count as
    one here: they end by themselves within a step of the pool.
    BlockingStep environments step off the pool. More threads than these
    steps and the actor threads are not asked for (docs/results/collection.md and
    benchmarks/results/HISTORY.md have the runs), so the hint shows only
    where the pool is smaller, e.g. `Runtime.inter_op_threads = 1`. The pool
    is sized by `tf.config.threading.set_inter_op_parallelism_threads(n)`,
    which only works before TF starts running ops (alf-async-train and
    `train()` set it from the gin binding `Runtime.inter_op_threads`).
    """
    global _warned_inter_op
    in_graph = [s for s in steppings if not s.blocks]
    python_steps = sum(s.py_env is not None for s in in_graph)
    steps_at_once = min(python_steps, 1) + len(in_graph) - python_steps
    threads = tf.config.threading.get_inter_op_parallelism_threads() or os.cpu_count()
    wanted = steps_at_once + num_actor_queues
    if threads < wanted and not _warned_inter_op:
        _warned_inter_op = True
        logger.warning(
            "TF has %d inter-op threads for %d graph-mode environment steps at a time (of %d "
            "env threads) and %d actor threads: an environment step and the actors' forward "
            "passes cannot all run at once. Run alf-async-train with --gin_param "
            "'Runtime.inter_op_threads = %d' (in Python: "
            "tf.config.threading.set_inter_op_parallelism_threads(%d) before TF runs any op). "
            "A slow in-process simulator steps off the pool, several at once, with "
            "blocking_step = True on its PyEnvironment.",
            threads, steps_at_once, len(in_graph), num_actor_queues, wanted, wanted)
