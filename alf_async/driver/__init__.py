"""The asynchronous driver: environments step in env threads, batched actor
threads run the policy, a log thread keeps the metrics, and the learner takes
whole batches of unrolls from the learn queue.

- `async_driver.py`: `AsyncOffPolicyDriver` (builds the queues and threads;
  `start()`, `run_async()`, `stop()`) and `DriverStoppedError`.
- `env_thread.py`, `actor_thread.py`, `log_thread.py`: one thread kind each.
- `stepping.py`: how an environment is stepped (`stepping_of`), decided
  once where the env threads are built; the env thread's three ways of
  stepping: `graph_loop.py`, `python_loop.py` (the batch in lockstep),
  `rows_loop.py` (rows one by one, their steppers and buffers in
  `env_rows.py`); `acting.py`: its actions, from an actor queue or the
  thread itself; `unrolls.py`: pacing, shipping and counting, once per
  unroll; `applied_steps.py`: the action an environment reports it applied.
- `queues.py`: `NestFIFOQueue` (with `dequeue_all`) and `TFQueues`;
  `env_setup.py`: the environments built, checked and closed.
- `layout.py`: `choose_layout`, the layout (env threads, rows, actors,
  processes) measured fastest for the user's environments and policy.
- `metrics.py`: step metrics safe to update from the log thread while the
  learner reads them; `health.py`: the driver's health as summaries.

Uses only `alf_async.environments` and `alf_async.tf215_py311_fixes`.
"""

from alf_async._lazy import lazy_exports

_EXPORTS = {
    "AsyncOffPolicyDriver": "async_driver",
    "DriverStoppedError": "async_driver",
    "Layout": "layout",
    "choose_layout": "layout",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
