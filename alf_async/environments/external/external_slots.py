"""The slots of an ExternalEnv: what the driver steps.

A slot is a PyEnvironment fed by clients: each serves one concurrent episode
at a time, its `reset()`/`step()` waiting (through the EpisodeTable,
episodes.py) until a client provides the next step. `ExternalEnv.env_constructor`
makes them (`slots_constructor`); a batch of unbatched slots is stepped row by
row by a `rows.slot_stepper.SlotStepper`. external_env.py is the episode API
the environment's own loop calls.
"""

import weakref

import numpy as np
import tensorflow as tf
from tf_agents.environments import (batched_py_environment, py_environment,
                                    tf_py_environment)

from alf_async.environments.capabilities import AppliedStep, BlockingStep, OffersRowStepper

_ALL_SLOTS = weakref.WeakSet()


def open_slots():
    """Slots of any ExternalEnv in this process that are not closed yet."""
    return [slot for slot in list(_ALL_SLOTS) if not slot.closed]


class SlotEnv(py_environment.PyEnvironment, BlockingStep, AppliedStep, OffersRowStepper):
    """One concurrent-episode slot: a PyEnvironment fed by clients.

    `batched=True`: a batch-1 environment of its own (`slots_per_env=1`);
    `batched=False`: one row of a BatchedPyEnvironment of slots. The
    EpisodeTable deals in unbatched steps; a batched slot adds and strips
    the batch dimension.

    Threads: `reset()`/`step()` and then `applied_step()` are called by one
    driver thread (the env thread); the first two block until a client
    provides the next step (or the ExternalEnv stops: then they raise). A
    batch of slots is stepped through the EpisodeTable's polled-slot methods
    instead (`row_stepper`). `close()` may be called by any thread. The
    EpisodeTable sets the state below under its lock.
    """

    def __init__(self, table, index, batched=True):
        super().__init__(handle_auto_reset=False)
        self._table = table
        self._batched = batched
        self.index = index
        self.used = False      # reset() was called: a driver runs it
        self.closed = False
        self.closed_step_returned = False
        self.episode = None    # the bound episode
        self.current = None    # the time step last returned, and what it means
        self.applied = (None, False)   # of the last step, unbatched

    @property
    def batched(self):
        return self._batched

    @property
    def batch_size(self):
        return 1 if self._batched else None

    def observation_spec(self):
        return self._table.observation_array_spec

    def action_spec(self):
        return self._table.action_array_spec

    def _reset(self):
        return self._out(self._table.slot_reset(self))

    def _step(self, action):
        if self._batched:
            action = tf.nest.map_structure(lambda a: a[0], action)
        return self._out(self._table.slot_step(self, action))

    def _out(self, time_step):
        if not self._batched:
            return time_step
        return tf.nest.map_structure(lambda a: a[None], time_step)

    def applied_step(self):
        """(logged action or None, trainable) of the last step; with a batch
        dimension ([1, ...], [1]) when the slot is batched."""
        action, trainable = self.applied
        if not self._batched:
            return action, trainable
        return (None if action is None else tf.nest.map_structure(lambda a: a[None], action),
                np.array([trainable]))

    def close(self):
        self._table.slot_close(self)

    def row_stepper(self, rows, on_step):
        """How an env thread steps `rows` (this slot among them) one by one
        (`OffersRowStepper`): a SlotStepper (slot_stepper.py, no worker
        threads) when they are unbatched slots of this slot's ExternalEnv,
        else None (the driver's row workers then)."""
        if not all(isinstance(r, SlotEnv) and r._table is self._table and not r._batched
                   for r in rows):
            return None
        from alf_async.environments.rows.slot_stepper import SlotStepper  # pylint: disable=import-outside-toplevel
        return SlotStepper(self._table, rows, on_step)


def slots_constructor(table, slots_per_env):
    """`ExternalEnv.env_constructor(slots_per_env)`: each call makes
    `slots_per_env` new slots of `table` as one TFPyEnvironment (batch 1, or
    a BatchedPyEnvironment of K unbatched slots)."""

    def make_slot(batched):
        slot = table.add_slot(lambda index: SlotEnv(table, index, batched=batched))
        _ALL_SLOTS.add(slot)
        return slot

    def make_slots():
        if slots_per_env == 1:
            return tf_py_environment.TFPyEnvironment(make_slot(True))
        return tf_py_environment.TFPyEnvironment(batched_py_environment.BatchedPyEnvironment(
            [make_slot(False) for _ in range(slots_per_env)], multithreading=False))

    return make_slots
