"""Shared-memory slots: where a child process and the driver's process exchange
time steps and actions without pickling them.

A `SharedSlots` is one memory segment holding `num_slots` rows, laid out by the
environment's specs: for every leaf of the time step spec (step type, reward,
discount, observation) and of the action spec, one array of shape
``(num_slots,) + spec.shape`` and the spec's dtype. Each environment has a
slot (its row). The parent writes a row's action in place and wakes the
child; the child steps, writes the time step in place and wakes the parent
(subprocess_protocol.py's frames); both sides see the arrays as numpy views.
Several SubprocessEnvs of one batch share one segment, so a lockstep batch
writes every action, and reads every time step, with one numpy copy per leaf.

The segment is a `memfd_create` file: anonymous, never in ``/dev/shm``, and
freed by the kernel when the last process holding it exits, however it
exits (a ``kill -9`` of the driver's process included). So no segment can be
left behind. The parent creates it once the first environment's specs are
known, and hands its file descriptor to each child over the child's socket
(SCM_RIGHTS) together with the child's slot; a restarted child gets the same.

Only numeric and boolean numpy dtypes have a fixed size; a spec of any other
dtype (strings, objects) is refused with one line when the segment is laid
out, and such environments use ``transport='pipe'``.

Threads: the parent's owner thread writes actions and reads time steps of its
rows only; creation is guarded by a lock (environments of one batch attach
from several initialising threads at once).
"""

import mmap
import os
import threading
import weakref

import numpy as np
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

__all__ = ["Layout", "SPEC_MISMATCH", "SharedSlots", "check_specs", "map_in_child"]

ALIGN = 64  # each array starts on its own cache line
SPEC_MISMATCH = "does not match its spec"


def _leaf_specs(time_step_spec, action_spec):
    return tf.nest.flatten(time_step_spec), tf.nest.flatten(action_spec)


def check_specs(time_step_spec, action_spec, where):
    """Raises TypeError (one line) if a spec has no fixed-size numeric dtype."""
    steps, actions = _leaf_specs(time_step_spec, action_spec)
    for kind, specs in (("time step", steps), ("action", actions)):
        for spec in specs:
            dtype = np.dtype(spec.dtype)
            if dtype.kind not in "biuf":
                raise TypeError(
                    f"{where}: the {kind} spec {spec} has dtype {dtype}, which shared "
                    "memory cannot hold (it takes bool, integer and float arrays); use "
                    "transport='pipe' for this environment")


class Layout(object):
    """Where each leaf of the specs lives in a segment of `num_slots` rows."""

    def __init__(self, time_step_spec, action_spec, num_slots):
        self.time_step_spec = time_step_spec
        self.action_spec = action_spec
        self.num_slots = int(num_slots)
        steps, actions = _leaf_specs(time_step_spec, action_spec)
        self.leaves = []   # (shape with the slot axis, dtype, offset), time step then action
        offset = 0
        for spec in steps + actions:
            shape = (self.num_slots,) + tuple(spec.shape)
            dtype = np.dtype(spec.dtype)
            self.leaves.append((shape, dtype, offset))
            size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            offset += -(-size // ALIGN) * ALIGN
        self.num_step_leaves = len(steps)
        self.size = max(offset, ALIGN)


class _Views(object):
    """A segment's arrays (numpy views over its mapping)."""

    def __init__(self, layout, buffer):
        arrays = [np.ndarray(shape, dtype, buffer=buffer, offset=offset)
                  for shape, dtype, offset in layout.leaves]
        self.step_leaves = arrays[:layout.num_step_leaves]
        self.action_leaves = arrays[layout.num_step_leaves:]
        self.time_step_spec = layout.time_step_spec
        self.action_spec = layout.action_spec
        self._flat_action = len(self.action_leaves) == 1 and not tf.nest.is_nested(
            layout.action_spec)
        self._flat_observation = (isinstance(layout.time_step_spec, ts.TimeStep) and
                                  len(self.step_leaves) == 4 and
                                  not tf.nest.is_nested(layout.time_step_spec.observation))

    # ---------------------------------------------------------- one row

    def write_action(self, slot, action):
        """Writes one row's action (a nest matching the action spec)."""
        if self._flat_action:
            self.action_leaves[0][slot] = action
            return
        for array, value in zip(self.action_leaves, tf.nest.flatten(action)):
            array[slot] = value

    def action(self, slot):
        """One row's action, copied (the environment may keep it)."""
        if self._flat_action:
            return np.array(self.action_leaves[0][slot])
        return tf.nest.pack_sequence_as(self.action_spec,
                                        [np.array(a[slot]) for a in self.action_leaves])

    def write_time_step(self, slot, time_step):
        """Writes one row's time step; ValueError (one line) if it does not
        match the spec's shapes, or cannot be cast to its dtypes."""
        if self._flat_observation and isinstance(time_step, ts.TimeStep):
            values = time_step   # its four arrays, without nest's flattening
        else:
            values = tf.nest.flatten(time_step)
            if len(values) != len(self.step_leaves):
                raise ValueError(f"the time step {SPEC_MISMATCH}: it has {len(values)} "
                                 f"arrays, the spec {len(self.step_leaves)}")
        for array, value in zip(self.step_leaves, values):
            dtype = getattr(value, "dtype", None)
            if dtype is None:   # a Python number or list: as numpy sees it
                value = np.asarray(value)
                dtype = value.dtype
            if np.shape(value) != array.shape[1:] or (
                    dtype != array.dtype and not np.can_cast(dtype, array.dtype, "same_kind")):
                value = np.asarray(value)
                raise ValueError(
                    f"the environment's time step {SPEC_MISMATCH}: got an array of shape "
                    f"{value.shape} and dtype {value.dtype} where the spec says shape "
                    f"{array.shape[1:]} and dtype {array.dtype}")
            array[slot] = value

    def time_step(self, slot):
        """One row's time step, copied out of the segment."""
        if self._flat_observation:   # the common case, without nest's packing
            step_type, reward, discount, observation = self.step_leaves
            return ts.TimeStep(np.array(step_type[slot]), np.array(reward[slot]),
                               np.array(discount[slot]), np.array(observation[slot]))
        return tf.nest.pack_sequence_as(self.time_step_spec,
                                        [np.array(a[slot]) for a in self.step_leaves])

    # ---------------------------------------------------------- all rows

    def write_actions(self, first, actions, count):
        """Writes the actions of rows `first` .. `first + count - 1` (a nest of
        arrays batched over them); ValueError if their batch is not `count`."""
        values = [actions] if self._flat_action else tf.nest.flatten(actions)
        for array, value in zip(self.action_leaves, values):
            value = np.asarray(value)
            if value.shape[:1] != (count,):
                raise ValueError(f"expected actions for {count} environments, got an array "
                                 f"of shape {value.shape}")
            array[first:first + count] = value

    def time_steps(self, first, count):
        """The time steps of rows `first` .. `first + count - 1`, batched, copied."""
        return tf.nest.pack_sequence_as(
            self.time_step_spec, [a[first:first + count].copy() for a in self.step_leaves])


class SharedSlots(object):
    """The parent's side of one segment: created at the first `attach`.

    Args:
        num_slots: rows in the segment (one per environment of the batch).
        name: how errors name the owner.
    """

    def __init__(self, num_slots, name="SharedSlots"):
        self.num_slots = int(num_slots)
        self._name = name
        self._lock = threading.Lock()
        self.layout = None
        self.views = None
        self._fd = None
        self._mmap = None
        self._users = 0

    def acquire(self):
        """Counts one more environment using the segment (see `release`)."""
        with self._lock:
            self._users += 1

    def release(self):
        """One environment is done with the segment: the last closes the
        parent's descriptor (the memory goes when no process maps it)."""
        with self._lock:
            self._users -= 1
            if self._users <= 0 and self._fd is not None:
                self._fd = None
                self._finalizer()

    @property
    def fd(self):
        """The segment's file descriptor (handed to each child)."""
        return self._fd

    def attach(self, time_step_spec, action_spec):
        """Lays out and creates the segment for these specs, the first time;
        later calls check that their specs are the same. Returns the views.

        Raises:
            TypeError: a spec's dtype has no fixed size (check_specs).
            ValueError: the specs differ from the first environment's.
        """
        with self._lock:
            if self.layout is None:
                check_specs(time_step_spec, action_spec, self._name)
                layout = Layout(time_step_spec, action_spec, self.num_slots)
                fd = os.memfd_create("alf_async_env_slots", os.MFD_CLOEXEC)
                try:
                    os.ftruncate(fd, layout.size)
                    self._mmap = mmap.mmap(fd, layout.size)
                except BaseException:
                    os.close(fd)
                    raise
                self._fd, self.layout = fd, layout
                self._finalizer = weakref.finalize(self, os.close, fd)
                self.views = _Views(layout, self._mmap)
            elif (time_step_spec, action_spec) != (self.layout.time_step_spec,
                                                  self.layout.action_spec):
                raise ValueError(f"{self._name}: an environment's specs differ from the "
                                 f"first's: {time_step_spec}, {action_spec} vs "
                                 f"{self.layout.time_step_spec}, {self.layout.action_spec}")
            return self.views



def map_in_child(fd, time_step_spec, action_spec, num_slots):
    """The child's views of the segment it was handed (the fd is closed after
    mapping: the mapping keeps the memory)."""
    layout = Layout(time_step_spec, action_spec, num_slots)
    try:
        buffer = mmap.mmap(fd, layout.size)
    finally:
        os.close(fd)
    return _Views(layout, buffer)
