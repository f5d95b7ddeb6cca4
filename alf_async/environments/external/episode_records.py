"""The records an EpisodeTable keeps (episodes.py): episodes, the events
their clients queue, the replies clients wait for, a slot's current step;
and the ExternalEnv's exceptions.

Plain data guarded by the EpisodeTable's lock: every field is read and
written with it held (PendingAction's `expire()` takes it).
"""

import collections

import numpy as np
import tensorflow as tf
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories.time_step import StepType

from alf_async.environments.capabilities import EndOfData

ACT, END, CUT = "act", "end", "cut"   # the kinds of Event


class ExternalEnvStoppedError(RuntimeError):
    """The ExternalEnv was stopped (driver stopped, `stop()`, or `run()` failed)."""


class ExternalEnvFinished(EndOfData):
    """`run()` returned and every episode has ended: no more experience will come."""


class TooManyEpisodesError(RuntimeError):
    """`start_episode` would open more than `max_concurrent` episodes."""


class SlotClosed(Exception):
    """Internal: the driver closed the slot."""


def dummy_last_step(observation_spec):
    """An unbatched LAST time step of zeros (a closed slot's last step)."""
    return ts.TimeStep(
        step_type=np.asarray(StepType.LAST, np.int32), reward=np.zeros([], np.float32),
        discount=np.ones([], np.float32),
        observation=tf.nest.map_structure(lambda s: np.zeros(s.shape, s.dtype),
                                          observation_spec))


class Reply(object):
    """What a get_action / end_episode waits for.

    The slot side answers it (lock held) by setting `action`, then `done =
    True`; setting `done` also calls `on_done()` if set (how a
    get_action_async learns that its slot answered).
    """
    __slots__ = ("_done", "action", "on_done")

    def __init__(self, on_done=None):
        self._done = False
        self.action = None
        self.on_done = on_done

    @property
    def done(self):
        return self._done

    @done.setter
    def done(self, value):
        self._done = value
        if value and self.on_done is not None:
            self.on_done()


class PendingAction(object):
    """A get_action_async waiting for its action (see EpisodeTable.get_action_async).

    Threads: `expire()` may be called from any thread (the policy server's
    event loop arms a timer at `deadline` for it); everything else happens
    under the table's lock.
    """
    __slots__ = ("deadline", "episode", "reply", "on_done", "_table")

    def __init__(self, table, episode, deadline, on_done):
        self.deadline = deadline          # time.monotonic() seconds
        self.episode = episode
        self.reply = Reply(self._answered)
        self.on_done = on_done            # None once completed
        self._table = table

    def _answered(self):   # the slot set reply.done (table lock held)
        self._table._finish_async_locked(self, self.reply.action, None)

    def expire(self):
        """Called at `deadline`: does what a blocked get_action does then.

        Returns:
            None when the call is complete (now or before: closed episode,
                TimeoutError, ...); the seconds left when called early (call again).
        """
        return self._table._expire_async(self)


class Event(object):
    """One step a client queued for its episode's slot."""
    __slots__ = ("kind", "observation", "logged_action", "reward", "reply")

    def __init__(self, kind, observation, logged_action, reply):
        self.kind = kind
        self.observation = observation
        self.logged_action = logged_action
        self.reward = 0.0
        self.reply = reply


class Episode(object):
    """One episode's state; guarded by the ExternalEnv's lock."""

    def __init__(self, episode_id, training_enabled, cv, now):
        self.id = episode_id
        self.training_enabled = training_enabled
        self.cv = cv                      # Condition on the ExternalEnv's lock
        self.events = collections.deque()
        self.slot = None                  # the SlotEnv serving it, once bound
        self.in_ready = False             # waiting in the ready queue for a slot
        self.acted = False                # has queued an action
        self.ended = False                # end_episode() called
        self.closed_reason = None         # closed by a timeout or the idle reaper
        self.cur_reward = 0.0             # rewards since the last queued step
        self.last_info = None
        self.last_observation = None      # of the last step the slot took
        self.last_seen = now
        self.active_calls = 0
        self.async_waits = set()          # PendingActions (get_action_async) in flight


class Current(object):
    """The time step a slot last returned, and what the driver's next step means."""
    __slots__ = ("episode", "kind", "reply", "step_type", "observation", "logged_action",
                 "learn", "time_step")

    def __init__(self, episode, event, step_type, observation, reward, discount, learn):
        self.episode = episode
        self.kind = event.kind if event is not None else None
        self.reply = event.reply if event is not None else None
        self.logged_action = event.logged_action if event is not None else None
        self.step_type = step_type
        self.observation = observation
        self.learn = learn
        self.time_step = ts.TimeStep(   # unbatched: the slot adds a batch dimension
            step_type=np.asarray(step_type, np.int32),
            reward=np.asarray(reward, np.float32),
            discount=np.asarray(discount, np.float32),
            observation=observation)
