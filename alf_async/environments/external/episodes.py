"""EpisodeTable: the one owner of an ExternalEnv's episodes and the slots that serve them.

Every episode call (start_episode, get_action, log_action, log_returns,
end_episode, abandon_episode; their arguments are defined in episode_api.py)
lands here, whoever makes it: the ExternalEnv's own methods, the policy
server's requests, the offline feeders. Each driver slot (external_slots.py's
slot environment) asks it for its next time step and tells it what the
policy did.

How an episode moves: the client's calls queue *events* (a step with an
observation and maybe a logged action, an end, an abandon) on the episode;
a slot waiting for work binds the oldest episode with an event ready
(`_ready`) and then takes that episode's events one per driver step until
its last, answering a blocked get_action with the policy's action. Per
transition the slot reports (see `capabilities.AppliedStep`) the logged
action, if any, and whether it may be trained on: not when its episode has
`training_enabled=False`, nor the last transition of an episode closed
early (its outcome is unknown) and the made-up end after it.

Threads: any thread may call any method (clients concurrently for
different episodes; each episode is stepped serially); one lock guards all
state, with one Condition per episode (its client waits) and one for the
slots (they wait for ready episodes). What blocks: get_action until the
policy acted, end_episode / abandon_episode until the slot took the last
step, log_action while `max_pending_steps` events wait, each at most its
timeout; a slot's reset/step until an episode has a step for it. `stop()`
wakes them all. `get_action_async` never blocks: the same rules complete
its PendingAction (the slot's answer, a close, `stop()`, or `expire()` at
its deadline), through a callback run under the lock.

Layout: this module is the table and its client side's calls; how a
client's call waits (deadlines, back-pressure, an async get_action's
completion) is its base class ClientWaits (episode_waits.py); the slot side
is its base class SlotSide (episode_slots.py); the records it keeps
(episodes, events, replies, a slot's current step) and the exceptions are
in episode_records.py.
"""

import collections
import logging
import threading
import time
import uuid

from alf_async.environments.external.episode_api import check_episode_id, check_nest, check_reward
from alf_async.environments.external.episode_records import (
    ACT, CUT, END, Episode, Event, ExternalEnvFinished, ExternalEnvStoppedError, PendingAction,
    Reply, TooManyEpisodesError)
from alf_async.environments.external.episode_slots import SlotSide
from alf_async.environments.external.episode_waits import ClientWaits

# The exceptions live in episode_records.py and are imported from here.
__all__ = ["EpisodeTable", "ExternalEnvFinished", "ExternalEnvStoppedError",
           "TooManyEpisodesError"]

logger = logging.getLogger(__name__)

_FINISHED_IDS_KEPT = 100_000


class EpisodeTable(ClientWaits, SlotSide):
    """The episodes of an ExternalEnv, the slots that serve them, and its stop state.

    The one owner of the episode API's state (see the module docstring).
    Kept out of the ExternalEnv (a user-subclassed Thread) so that a
    subclass's attributes can never clash with it. Every method may be
    called from any thread; all state is guarded by one lock.
    """

    def __init__(self, owner, action_array_spec, observation_array_spec, max_concurrent,
                 action_timeout, episode_idle_timeout, max_pending_steps):
        """
        Args:
            owner: the ExternalEnv (a Thread whose `run` is the user's loop
                and whose `on_stop()` is called on stop).
            action_array_spec: the action array spec nest.
            observation_array_spec: the observation array spec nest.
            max_concurrent: see ExternalEnv.
            action_timeout: see ExternalEnv.
            episode_idle_timeout: see ExternalEnv.
            max_pending_steps: see ExternalEnv.
        """
        self._owner = owner
        self.action_array_spec = action_array_spec
        self.observation_array_spec = observation_array_spec
        if not isinstance(max_concurrent, int) or max_concurrent < 1:
            raise ValueError(f"max_concurrent must be an integer >= 1, got {max_concurrent!r}")
        if max_pending_steps < 1:
            raise ValueError(f"max_pending_steps must be >= 1, got {max_pending_steps!r}")
        self._max_concurrent = max_concurrent
        self._action_timeout = float(action_timeout)
        self._idle_timeout = None if episode_idle_timeout is None else float(episode_idle_timeout)
        self._max_pending = max_pending_steps
        self._lock = threading.Lock()
        self._slot_cv = threading.Condition(self._lock)
        # Polled slots (slot_poll): their env thread waits here, woken by
        # whatever wakes a slot thread (a ready episode, an episode's event
        # or close, run() returning, stop).
        self._poll_cv = threading.Condition(self._lock)
        self._episodes = {}
        self._finished = collections.OrderedDict()   # id -> why it finished
        self._ready = collections.deque()            # episodes with a step and no slot
        self._slots = []
        self._waiting_slots = set()                  # slots waiting for an episode
        self.run_started = False
        self._run_returned = False
        self._stop_requested = False
        self._stop_reason = None
        self._error = None
        self.stop_event = threading.Event()

    # -------------------------------------------------------------- control

    def start(self):
        with self._lock:
            if self.run_started or self._stop_requested:
                return
            self.run_started = True
        owner = self._owner
        user_run = owner.run
        owner.run = lambda: self._run_guarded(user_run)
        threading.Thread.start(owner)

    def stop(self, reason):
        with self._lock:
            if self._stop_requested:
                return
            self._stop_requested = True
            self._stop_reason = reason
            self._notify_all_locked()
        self.stop_event.set()
        try:
            self._owner.on_stop()
        except Exception:  # pylint: disable=broad-except
            logger.exception("%s.on_stop() failed", type(self._owner).__name__)

    @property
    def num_open_episodes(self):
        with self._lock:
            return len(self._episodes)

    @property
    def num_pending_steps(self):
        """Steps clients queued that no slot has taken yet, over all episodes."""
        with self._lock:
            return sum(len(ep.events) for ep in self._episodes.values())

    def add_slot(self, make_slot):
        """Registers the slot `make_slot(index)` builds (a driver's env constructor)."""
        with self._lock:
            slot = make_slot(len(self._slots))
            self._slots.append(slot)
        return slot

    # ------------------------------------------------------ episode methods

    def start_episode(self, episode_id=None, training_enabled=True):
        """See ExternalEnv.start_episode."""
        if check_episode_id(episode_id, allow_none=True) is None:
            episode_id = uuid.uuid4().hex
        with self._lock:
            self._raise_if_stopped()
            if episode_id in self._episodes:
                raise ValueError(f"episode {episode_id!r} is already started")
            if episode_id in self._finished:
                raise ValueError(f"episode {episode_id!r} has already finished "
                                 f"({self._finished[episode_id]}); ids cannot be reused")
            self._close_idle_unbound_locked()
            if len(self._episodes) >= self._max_concurrent:
                raise TooManyEpisodesError(
                    f"cannot start episode {episode_id!r}: {len(self._episodes)} episodes are "
                    f"open and max_concurrent is {self._max_concurrent}; end one first")
            self._episodes[episode_id] = Episode(episode_id, bool(training_enabled),
                                                  threading.Condition(self._lock),
                                                  time.monotonic())
        return episode_id

    def get_action(self, episode_id, observation, timeout=None, reward=None):
        """See ExternalEnv.get_action (`reward`: log_returns first, under the same lock)."""
        obs = check_nest(observation, self.observation_array_spec, "observation")
        r = None if reward is None else check_reward(reward)
        reply = Reply()
        deadline = self._deadline(timeout)
        with self._lock:
            ep = self._get(episode_id)
            self._queue_action_locked(ep, obs, r, reply, deadline)
            self._wait(ep, lambda: reply.done, deadline, "get_action")
            return reply.action

    def get_action_async(self, episode_id, observation, on_done, timeout=None, reward=None):
        """get_action without a thread waiting: queues the step and returns.

        `on_done(action, error)` is called exactly once, under this table's
        lock, from whichever thread completes the call (a slot's, the one
        calling `stop()`, the one calling `PendingAction.expire()`...): with
        the action when the slot answers, or with the exception get_action
        would raise (episode closed, table stopped, deadline passed: then the
        episode is closed too). It must not block nor call this table.

        Returns:
            A PendingAction (call its `expire()` at its `deadline`), or None
                when queueing the step would wait for back-pressure
                (`max_pending_steps`): then nothing was changed; call the blocking
                get_action (on a thread of its own).

        Raises:
            ValueError: what get_action raises before it waits: an unknown or
                finished episode, an observation or reward it refuses
                (nothing was queued).
            ExternalEnvStoppedError: the table was stopped (nothing was queued).
        """
        obs = check_nest(observation, self.observation_array_spec, "observation")
        r = None if reward is None else check_reward(reward)
        deadline = self._deadline(timeout)
        with self._lock:
            ep = self._get(episode_id)
            if len(ep.events) >= self._max_pending:
                return None
            pending = PendingAction(self, ep, deadline, on_done)
            self._queue_action_locked(ep, obs, r, pending.reply, deadline)   # does not wait
            ep.active_calls += 1   # as a blocked get_action's _wait does
            ep.async_waits.add(pending)
            return pending

    def _queue_action_locked(self, ep, obs, r, reply, deadline):
        if r is not None:
            self._add_reward_locked(ep, r, None)
        self._enqueue(ep, Event(ACT, obs, None, reply), deadline, "get_action")

    def log_action(self, episode_id, observation, action, timeout=None):
        """See ExternalEnv.log_action."""
        obs = check_nest(observation, self.observation_array_spec, "observation")
        act = check_nest(action, self.action_array_spec, "action")
        deadline = self._deadline(timeout)
        with self._lock:
            ep = self._get(episode_id)
            self._enqueue(ep, Event(ACT, obs, act, None), deadline, "log_action")

    def log_returns(self, episode_id, reward, info=None):
        """See ExternalEnv.log_returns."""
        r = check_reward(reward)
        with self._lock:
            self._add_reward_locked(self._get(episode_id), r, info)

    def _add_reward_locked(self, ep, r, info):
        if not ep.acted:
            raise ValueError(f"log_returns for episode {ep.id!r} before its first "
                             f"action: a reward belongs to the action before it")
        ep.cur_reward += r
        if info:
            ep.last_info = info
        ep.last_seen = time.monotonic()

    def end_episode(self, episode_id, observation, timeout=None):
        """See ExternalEnv.end_episode."""
        obs = check_nest(observation, self.observation_array_spec, "observation")
        deadline = self._deadline(timeout)
        with self._lock:
            ep = self._get(episode_id)
            if not ep.acted:
                self._forget_locked(ep, "ended before any action: no experience")
                return
            reply = Reply()
            self._enqueue(ep, Event(END, obs, None, reply), deadline, "end_episode")
            ep.ended = True
            self._wait(ep, lambda: reply.done, deadline, "end_episode")

    def abandon_episode(self, episode_id, timeout=None):
        """See ExternalEnv.abandon_episode."""
        deadline = self._deadline(timeout)
        with self._lock:
            ep = self._get(episode_id)
            if not ep.acted:
                self._forget_locked(ep, "abandoned before any action: no experience")
                return
            reply = Reply()
            self._enqueue(ep, Event(CUT, None, None, reply), deadline, "abandon_episode")
            ep.ended = True
            self._wait(ep, lambda: reply.done, deadline, "abandon_episode")

    # ------------------------------------------------- episode bookkeeping

    def _forget_locked(self, ep, reason):
        """Removes a finished episode and remembers why (lock held)."""
        if self._episodes.get(ep.id) is ep:
            del self._episodes[ep.id]
        self._finished[ep.id] = reason
        while len(self._finished) > _FINISHED_IDS_KEPT:
            self._finished.popitem(last=False)
        ep.cv.notify_all()
        if self._run_returned:
            self._slot_cv.notify_all()
            self._poll_cv.notify_all()

    def _close_episode_locked(self, ep, reason):
        """Closes an episode early (timeout, idle client); its queued steps are dropped.

        A bound episode's slot then ends it with a truncation (LAST, discount
        1) repeating its last observation, which it reports untrainable
        together with the transition leading to it.
        """
        if ep.closed_reason is not None or self._episodes.get(ep.id) is not ep:
            return
        ep.closed_reason = reason
        ep.events.clear()
        if ep.slot is None:
            if ep.in_ready:
                self._ready.remove(ep)
                ep.in_ready = False
            self._forget_locked(ep, reason)
        ep.cv.notify_all()
        self._poll_cv.notify_all()
        self._recheck_async_locked(ep)   # get_action_async: as the woken waits do

    def _close_idle_unbound_locked(self):
        if self._idle_timeout is None:
            return
        now = time.monotonic()
        for ep in list(self._episodes.values()):
            if (ep.slot is None and ep.active_calls == 0 and
                    now - ep.last_seen >= self._idle_timeout):
                self._close_episode_locked(ep, self._idle_reason())

    def _idle_reason(self):
        return f"no call for {self._idle_timeout:g} s (episode_idle_timeout)"

    def _notify_all_locked(self):
        self._slot_cv.notify_all()
        self._poll_cv.notify_all()
        for ep in list(self._episodes.values()):
            ep.cv.notify_all()
            self._recheck_async_locked(ep)   # get_action_async: as the woken waits do

    # ---------------------------------------------------------- run thread

    def _run_guarded(self, user_run):
        try:
            user_run()
        except BaseException as e:  # pylint: disable=broad-except
            with self._lock:
                if self._stop_requested:
                    logger.debug("%s.run() ended on stop: %r", type(self._owner).__name__, e)
                    return
                self._error = e
            logger.error("%s.run() failed: %r; stopping", type(self._owner).__name__, e)
            self.stop(reason=f"run() raised {type(e).__name__}: {e}")
        else:
            with self._lock:
                self._run_returned = True
                self._slot_cv.notify_all()
                self._poll_cv.notify_all()
