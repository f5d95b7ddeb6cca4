"""Step metrics that the LogThread updates while the learner reads them.

tf-agents' TFStepMetrics keep one accumulator per batch row and are updated
one time step at a time by a single driver; here unrolls of different env
threads arrive in any order, and `TFPyMetric` refuses concurrent use. So
these metrics take a whole unroll with the global env id of each row, keep
one accumulator per environment, and guard every update and read with a
lock. Their definitions are tf-agents' own (tests compare them with
`tf_agents.metrics.tf_metrics` on the same trajectories):

- NumberOfEpisodes: transitions whose next step is LAST.
- EnvironmentSteps: transitions that are not boundaries (step_type LAST).
- AverageReturn / AverageEpisodeLength: mean over the last `buffer_size`
  finished episodes.

The state is numpy, not tf.Variables: updating variables would cost the
LogThread several eager TF ops per unroll, a share of the driver's
throughput (benchmarks/throughput.py measures it). It is still checkpointed: each
metric tracks a `tf.train.experimental.PythonState` that a
`tf.train.Checkpoint` (or tf-agents' `Checkpointer`) serializes on save and
restores on load. Episodes in flight are not saved (they do not survive a
restart anyway); counters and finished-episode buffers are.

`EpisodeLog` is no step metric and is not checkpointed: an experience
observer that keeps every finished episode's return and length with the
env steps it ended by (the training curve published agents plot).

Threads: `__call__` is called by the LogThread; `result()`, `reset()`,
`tf_summaries()` and checkpointing by any thread. Nothing blocks except on
the lock.
"""

import collections
import json
import threading

import numpy as np
import tensorflow as tf
from tf_agents.metrics import tf_metric
from tf_agents.trajectories.time_step import StepType



def by_name(metrics):
    """{metric.name: metric} of `metrics`, e.g. `by_name(driver.get_metrics())
    ["AverageReturn"]` (read metrics by name, not by position)."""
    return {m.name: m for m in metrics}


class _SavedState(tf.train.experimental.PythonState):
    """Checkpoints a metric's `_get_state()` / `_set_state()` as JSON."""

    def __init__(self, metric):
        self._metric = metric

    def serialize(self):
        with self._metric._lock:
            return json.dumps(self._metric._get_state())

    def deserialize(self, string_value):
        value = string_value.numpy() if hasattr(string_value, "numpy") else string_value
        with self._metric._lock:
            self._metric._set_state(json.loads(value))


class AsyncStepMetric(tf_metric.TFStepMetric):
    """Base class: a TFStepMetric updated with whole unrolls from any env.

    Subclasses implement, on numpy and under `self._lock`: `_update(trajectory,
    env_ids)`, `_result()`, `_reset()`, and `_get_state()`/`_set_state()`
    (JSON-able) for checkpoints.
    """

    def __init__(self, name, prefix="Metrics"):
        super().__init__(name=name, prefix=prefix)
        self._lock = threading.Lock()
        self.saved_state = _SavedState(self)

    def __call__(self, trajectory, env_ids):
        """Counts one unroll.

        Args:
            trajectory: a `Trajectory` of numpy arrays, batch-major [B, T, ...].
            env_ids: int array [B], the global environment id of each row.
        """
        with self._lock:
            self._update(trajectory, np.asarray(env_ids))
        return trajectory

    def result(self):
        with self._lock:
            return tf.constant(self._result())

    def reset(self):
        with self._lock:
            self._reset()


class CounterMetric(AsyncStepMetric):
    """A checkpointed count; subclasses say what an unroll adds (`_count_unroll`)."""

    def __init__(self, name):
        super().__init__(name)
        self._count = 0

    def _update(self, trajectory, env_ids):
        self._count += self._count_unroll(trajectory)

    def _result(self):
        return np.int64(self._count)

    def _reset(self):
        self._count = 0

    def _get_state(self):
        return {"count": self._count}

    def _set_state(self, state):
        self._count = int(state["count"])


class NumberOfEpisodes(CounterMetric):
    """Finished episodes: transitions whose next step is LAST."""

    def __init__(self, name="NumberOfEpisodes"):
        super().__init__(name)

    def _count_unroll(self, trajectory):
        return int(np.count_nonzero(trajectory.next_step_type == StepType.LAST))


class EnvironmentSteps(CounterMetric):
    """Environment steps: transitions that are not episode boundaries."""

    def __init__(self, name="EnvironmentSteps"):
        super().__init__(name)

    def _count_unroll(self, trajectory):
        return int(np.count_nonzero(trajectory.step_type != StepType.LAST))


class _EpisodeAverageMetric(AsyncStepMetric):
    """Mean of a per-episode value over the last `buffer_size` episodes.

    Keeps one accumulator per environment (grown to the largest env id
    seen) for the episodes in flight.
    """

    def __init__(self, name, buffer_size=10):
        super().__init__(name)
        self._buffer_size = buffer_size
        self._reset()

    def _update(self, trajectory, env_ids):
        needed = int(env_ids.max()) + 1
        if needed > self._acc.shape[0]:
            self._acc = np.concatenate([self._acc, np.zeros(needed - self._acc.shape[0])])
        rows = self._acc[env_ids]
        step_type = trajectory.step_type
        next_step_type = trajectory.next_step_type
        increments = self._increments(trajectory)
        for t in range(step_type.shape[1]):
            rows = np.where(step_type[:, t] == StepType.FIRST, 0.0, rows) + increments[:, t]
            done = next_step_type[:, t] == StepType.LAST
            if done.any():
                self._finished.extend(rows[done].tolist())
                rows = self._after_last(rows, done)
        self._acc[env_ids] = rows

    def _after_last(self, rows, done):
        return rows

    def _result(self):
        return np.float32(np.mean(self._finished)) if self._finished else np.float32(0.0)

    def _reset(self):
        self._acc = np.zeros([0], np.float64)
        # A deque, not a list: tf.Module tracks list attributes, and the
        # tracking wrapper's append/del would cost the LogThread time per
        # unroll that it holds the GIL from the env threads.
        self._finished = collections.deque(maxlen=self._buffer_size)

    def _get_state(self):
        return {"finished": list(self._finished)}

    def _set_state(self, state):
        self._finished = collections.deque((float(v) for v in state["finished"]),
                                           maxlen=self._buffer_size)


class AverageReturn(_EpisodeAverageMetric):
    """Mean undiscounted return of the last `buffer_size` episodes (tf-agents' AverageReturn)."""

    def __init__(self, name="AverageReturn", buffer_size=10):
        super().__init__(name, buffer_size)

    def _increments(self, trajectory):
        reward = np.asarray(trajectory.reward, np.float64)
        if reward.ndim > 2:
            reward = reward.reshape(reward.shape[:2] + (-1,)).sum(-1)
        return reward


class AverageEpisodeLength(_EpisodeAverageMetric):
    """Mean length of the last `buffer_size` episodes (tf-agents' AverageEpisodeLength)."""

    def __init__(self, name="AverageEpisodeLength", buffer_size=10):
        super().__init__(name, buffer_size)

    def _increments(self, trajectory):
        return (trajectory.step_type != StepType.LAST).astype(np.float64)

    def _after_last(self, rows, done):
        # tf-agents zeroes the length when an episode ends (its boundary step
        # then adds nothing).
        return np.where(done, 0.0, rows)


class EpisodeLog(object):
    """Every finished episode's undiscounted return and length, with the env
    steps seen when it ended: the training curve published agents plot
    (the behaviour policy's episodes, rewards as the environment gave
    them, against frames), where `AverageReturn` keeps only a window's mean.

    An experience observer: `AsyncOffPolicyDriver(exp_observers=[log])`
    feeds it every dequeued unroll, and a synchronous loop can feed it each
    collected batch the same way. Rows are told apart by env id, each row's
    unrolls arriving in order; an episode's return sums the rewards of its
    transitions (a boundary step LAST -> FIRST adds nothing), as
    `AverageReturn` does.

    `episodes` is [(env_steps, return, length)] in the order they ended,
    where env_steps counts every transition fed so far (all rows,
    boundaries included, as the learner counts env steps) up to and
    including the batch the episode ended in; `env_steps` is that count now.

    Threads: `__call__` by the one thread that feeds it (the learner's, as
    an exp observer); `episodes` and `env_steps` by any thread (the lock).
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._returns = {}   # env id -> (return, length) of the episode in flight
        self._episodes = []
        self._env_steps = 0

    def __call__(self, exp, env_ids):
        """Counts one batch of unrolls.

        Args:
            exp: a `Trajectory` [B, T, ...] (tensors or numpy).
            env_ids: int [B], the env id of each row.
        """
        step_type = np.asarray(exp.step_type)
        next_step_type = np.asarray(exp.next_step_type)
        reward = np.asarray(exp.reward, np.float64)
        if reward.ndim > 2:
            reward = reward.reshape(reward.shape[:2] + (-1,)).sum(-1)
        with self._lock:
            self._env_steps += step_type.size
            for row, env_id in enumerate(np.asarray(env_ids).tolist()):
                ret, length = self._returns.get(env_id, (0.0, 0))
                for t in range(step_type.shape[1]):
                    if step_type[row, t] == StepType.FIRST:
                        ret, length = 0.0, 0
                    if step_type[row, t] != StepType.LAST:
                        ret, length = ret + float(reward[row, t]), length + 1
                    if next_step_type[row, t] == StepType.LAST:
                        self._episodes.append((self._env_steps, ret, length))
                        ret, length = 0.0, 0
                self._returns[env_id] = (ret, length)

    @property
    def episodes(self):
        """[(env_steps, return, length)] of the finished episodes."""
        with self._lock:
            return list(self._episodes)

    @property
    def env_steps(self):
        """Transitions fed so far (all rows, boundaries included)."""
        with self._lock:
            return self._env_steps
