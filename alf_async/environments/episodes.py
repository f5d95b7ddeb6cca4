"""EpisodeTable: the one owner of an ExternalEnv's episodes and the slots that serve them.

Every episode call (start_episode, get_action, log_action, log_returns,
end_episode, abandon_episode; their arguments are defined in episode_api.py)
lands here, whoever makes it: the ExternalEnv's own methods, the policy
server's requests, the offline feeders. Each driver slot (external_env.py's
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
"""

import collections
import logging
import threading
import time
import uuid

import numpy as np
import tensorflow as tf
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories.time_step import StepType

from alf_async.environments.capabilities import EndOfData
from alf_async.environments.episode_api import check_episode_id, check_nest, check_reward

logger = logging.getLogger(__name__)

_ACT, _END, _CUT = "act", "end", "cut"
_FINISHED_IDS_KEPT = 100_000


class ExternalEnvStoppedError(RuntimeError):
    """The ExternalEnv was stopped (driver stopped, `stop()`, or `run()` failed)."""


class ExternalEnvFinished(EndOfData):
    """`run()` returned and every episode has ended: no more experience will come."""


class TooManyEpisodesError(RuntimeError):
    """`start_episode` would open more than `max_concurrent` episodes."""


class _SlotClosed(Exception):
    """Internal: the driver closed the slot."""


def _dummy_last_step(observation_spec):
    return ts.TimeStep(
        step_type=np.asarray(StepType.LAST, np.int32), reward=np.zeros([], np.float32),
        discount=np.ones([], np.float32),
        observation=tf.nest.map_structure(lambda s: np.zeros(s.shape, s.dtype),
                                          observation_spec))


class _Reply(object):
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
        self.reply = _Reply(self._answered)
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


class _Event(object):
    """One step a client queued for its episode's slot."""
    __slots__ = ("kind", "observation", "logged_action", "reward", "reply")

    def __init__(self, kind, observation, logged_action, reply):
        self.kind = kind
        self.observation = observation
        self.logged_action = logged_action
        self.reward = 0.0
        self.reply = reply


class _Episode(object):
    """One episode's state; guarded by the ExternalEnv's lock."""

    def __init__(self, episode_id, training_enabled, cv, now):
        self.id = episode_id
        self.training_enabled = training_enabled
        self.cv = cv                      # Condition on the ExternalEnv's lock
        self.events = collections.deque()
        self.slot = None                  # the _SlotEnv serving it, once bound
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


class _Current(object):
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


class EpisodeTable(object):
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
            action_array_spec, observation_array_spec: array spec nests.
            max_concurrent, action_timeout, episode_idle_timeout,
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
            self._episodes[episode_id] = _Episode(episode_id, bool(training_enabled),
                                                  threading.Condition(self._lock),
                                                  time.monotonic())
        return episode_id

    def get_action(self, episode_id, observation, timeout=None, reward=None):
        """See ExternalEnv.get_action (`reward`: log_returns first, under the same lock)."""
        obs = check_nest(observation, self.observation_array_spec, "observation")
        r = None if reward is None else check_reward(reward)
        reply = _Reply()
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
            What get_action raises before it waits (nothing was queued).
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
        self._enqueue(ep, _Event(_ACT, obs, None, reply), deadline, "get_action")

    def log_action(self, episode_id, observation, action, timeout=None):
        """See ExternalEnv.log_action."""
        obs = check_nest(observation, self.observation_array_spec, "observation")
        act = check_nest(action, self.action_array_spec, "action")
        deadline = self._deadline(timeout)
        with self._lock:
            ep = self._get(episode_id)
            self._enqueue(ep, _Event(_ACT, obs, act, None), deadline, "log_action")

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
            reply = _Reply()
            self._enqueue(ep, _Event(_END, obs, None, reply), deadline, "end_episode")
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
            reply = _Reply()
            self._enqueue(ep, _Event(_CUT, None, None, reply), deadline, "abandon_episode")
            ep.ended = True
            self._wait(ep, lambda: reply.done, deadline, "abandon_episode")

    # ---------------------------------------------------- client-side waits

    def _deadline(self, timeout):
        return time.monotonic() + (self._action_timeout if timeout is None else float(timeout))

    def _raise_if_stopped(self):
        if self._stop_requested:
            raise ExternalEnvStoppedError(
                f"the ExternalEnv is stopped ({self._stop_reason})") from self._error

    def _get(self, episode_id):
        self._raise_if_stopped()
        ep = self._episodes.get(episode_id)
        if ep is not None and not ep.ended and ep.closed_reason is None:
            return ep
        reason = (self._finished.get(episode_id) if ep is None else
                  ep.closed_reason or "ended by end_episode()")
        if reason is not None:
            raise ValueError(f"episode {episode_id!r} has already finished ({reason})")
        raise ValueError(f"episode {episode_id!r} is unknown: call start_episode() first")

    def _wait(self, ep, predicate, deadline, what):
        """Waits on `ep.cv` (lock held) until predicate(); raises on stop/close/timeout."""
        ep.active_calls += 1
        try:
            while not predicate():
                ep.cv.wait(self._check_wait_locked(ep, deadline, what))
        finally:
            ep.active_calls -= 1
            ep.last_seen = time.monotonic()

    def _check_wait_locked(self, ep, deadline, what):
        """The rules of a wait for `ep` that is not answered yet (blocking or
        async): raises when the table is stopped, the episode closed, or the
        deadline passed (then it closes the episode); else returns the seconds left."""
        self._raise_if_stopped()
        if ep.closed_reason is not None:
            raise ValueError(f"{what}: episode {ep.id!r} was closed ({ep.closed_reason})")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            reason = f"{what} got no answer within its timeout"
            self._close_episode_locked(ep, reason)
            raise TimeoutError(
                f"{what} for episode {ep.id!r}: no answer within the timeout "
                f"(is the driver running and its learner consuming experience? "
                f"are there enough slots, num_envs, for the episodes in flight?); "
                f"the episode was closed")
        return remaining

    def _enqueue(self, ep, event, deadline, what):
        self._wait(ep, lambda: len(ep.events) < self._max_pending, deadline, what)
        event.reward = ep.cur_reward
        ep.cur_reward = 0.0
        ep.events.append(event)
        if event.kind == _ACT:
            ep.acted = True
        if ep.slot is None and not ep.in_ready:
            ep.in_ready = True
            self._ready.append(ep)
            self._slot_cv.notify()
        ep.cv.notify_all()
        self._poll_cv.notify_all()

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

    # ------------------------------------------- get_action_async completion
    # (client side only: the slot side completes a PendingAction by answering
    # its _Reply, as it answers a blocked get_action.)

    def _recheck_async_locked(self, ep):
        """Applies the wait rules to `ep`'s async get_actions (lock held)."""
        for pending in list(ep.async_waits):
            self._check_async_locked(pending)

    def _check_async_locked(self, pending):
        ep = pending.episode
        # Out of the set first: a TimeoutError closes the episode, whose
        # recheck must not fail this call with "was closed".
        ep.async_waits.discard(pending)
        try:
            remaining = self._check_wait_locked(ep, pending.deadline, "get_action")
        except Exception as e:  # pylint: disable=broad-except
            self._finish_async_locked(pending, None, e)
            return None
        ep.async_waits.add(pending)
        return remaining

    def _expire_async(self, pending):
        with self._lock:
            if pending.on_done is None:
                return None
            return self._check_async_locked(pending)

    def _finish_async_locked(self, pending, action, error):
        on_done, pending.on_done = pending.on_done, None
        if on_done is None:
            return
        pending.reply.on_done = None
        ep = pending.episode
        ep.async_waits.discard(pending)
        ep.active_calls -= 1
        ep.last_seen = time.monotonic()
        try:
            on_done(action, error)
        except Exception:  # pylint: disable=broad-except
            logger.exception("get_action_async's on_done failed")

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

    # ------------------------------------------------------------ slot side

    def _raise_in_slot(self, slot):
        if self._error is not None:
            raise self._error
        if slot.closed:
            raise _SlotClosed()
        if self._stop_requested:
            raise ExternalEnvStoppedError(f"the ExternalEnv is stopped ({self._stop_reason})")

    def slot_reset(self, slot):
        """`slot.reset()` (its env thread): binds the next
        episode with a step ready and returns its FIRST time step (unbatched);
        blocks until there is one."""
        self.start()   # the ExternalEnv's run() thread starts with the driver
        with self._lock:
            slot.used = True
            if slot.episode is not None:  # a second reset: drop the episode in flight
                ep = slot.episode
                self._close_episode_locked(ep, "its slot was reset")
                self._finish_bound_locked(slot, ep, ep.closed_reason or "its slot was reset")
            try:
                slot.current = self._bind_next_locked(slot)
            except _SlotClosed:
                raise ExternalEnvStoppedError("the slot was closed") from None
            return slot.current.time_step

    def slot_step(self, slot, action):
        """`slot.step(action)` (its env thread; `action`
        unbatched): answers the step's get_action, records what it applied
        (`slot.applied`: logged action or None, trainable), returns the next
        (unbatched) time step;
        blocks until the episode (or, after its LAST, the next one) has one."""
        try:
            return self._slot_step_or_raise(slot, action)
        except _SlotClosed:
            # The driver is stopping (it closes its queues, then its
            # environments): end the step quietly, once, with a dummy last
            # step that goes nowhere (raising would make TensorFlow log the
            # error of every slot).
            if slot.closed_step_returned:
                raise ExternalEnvStoppedError("the slot was closed") from None
            slot.closed_step_returned = True
            slot.applied = (None, False)
            return _dummy_last_step(self.observation_array_spec)

    def _slot_step_or_raise(self, slot, action):
        cur = slot.current
        if cur is None:
            slot.applied = (None, False)
            return self.slot_reset(slot)
        with self._lock:
            self._answer_locked(cur, action)
            return self._advance_locked(slot, wait=True).time_step

    def _answer_locked(self, cur, action):
        """The policy's action for the slot's current step `cur`: to the
        client waiting in its get_action."""
        if cur.step_type != StepType.LAST and cur.reply is not None and cur.kind == _ACT:
            cur.reply.action = action
            cur.reply.done = True
            cur.episode.cv.notify_all()

    def _advance_locked(self, slot, wait):
        """Moves the slot, whose current step was answered, to its next step
        (the next in its episode; after a LAST, the FIRST of the next ready
        episode) and sets what it applied. Returns the new `_Current`; with
        `wait=False`, None when there is no next step yet."""
        cur = slot.current
        if cur.step_type == StepType.LAST:
            nxt = self._bind_next_locked(slot, wait)
        else:
            nxt = self._next_in_episode_locked(slot, cur.episode, wait)
        if nxt is None:
            return None
        # The transition's next step is made up when the episode was closed.
        learn = cur.learn and nxt.learn if cur.step_type != StepType.LAST else cur.learn
        slot.applied = (cur.logged_action, bool(learn))
        slot.current = nxt
        return nxt

    # A polled slot (slot_stepper.py) is stepped in two halves by its env
    # thread, which never blocks in a slot: slot_act answers the client at
    # once; slot_poll hands back the slots whose next step has come.

    def slot_begin(self, slot):
        """A polled slot's reset (its env thread, once): it serves a driver
        from now on; `slot_poll` binds its first episode."""
        self.start()   # the ExternalEnv's run() thread starts with the driver
        with self._lock:
            slot.used = True

    def slot_act(self, slot, action):
        """A polled slot's step, first half: answers its current step's
        get_action with `action` (unbatched). Never blocks."""
        with self._lock:
            if slot.current is not None:
                self._answer_locked(slot.current, action)

    def slot_poll(self, slots, timeout):
        """A polled slot's step, second half, for several slots at once: the
        slots among `slots` (each reset or acted for since its last step)
        whose next time step has come, waiting up to `timeout` seconds for
        one. A slot with no step yet (after `slot_begin`) gets its first
        episode's FIRST step; each other one what `slot_step` would return,
        with `slot.applied` set.

        Returns:
            A list of (slot, unbatched time step, or the exception its
            `slot_step` would raise), possibly empty; closed slots (the
            driver is stopping) never appear.
        """
        with self._lock:
            while True:
                results = []
                for slot in slots:
                    try:
                        if slot.current is None:
                            nxt = self._bind_next_locked(slot, wait=False)
                            if nxt is not None:
                                slot.current = nxt
                        else:
                            nxt = self._advance_locked(slot, wait=False)
                    except _SlotClosed:
                        continue
                    except Exception as e:  # pylint: disable=broad-except
                        results.append((slot, e))
                        continue
                    if nxt is not None:
                        results.append((slot, nxt.time_step))
                if results or timeout <= 0:
                    return results
                self._poll_cv.wait(timeout)
                timeout = 0   # one more look, then return

    def slot_close(self, slot):
        """`slot.close()` (any thread; the driver's stop): closes it, and every
        used slot and the ExternalEnv with it, waking whatever waits."""
        with self._lock:
            if not slot.closed:
                slot.closed = True
            used = slot.used
            if used:
                # The driver closes environments only when it stops: all of them.
                for other in self._slots:
                    if other.used and not other.closed:
                        other.closed = True
            elif slot in self._slots:
                self._slots.remove(slot)
            self._notify_all_locked()
        if used:
            self.stop(reason="the driver closed its environments")

    def _bind_next_locked(self, slot, wait=True):
        """Waits for an episode with a step ready; binds it; returns its FIRST
        step. With `wait=False` (a polled slot) returns None instead of
        waiting, and the slot counts as waiting until it is bound."""
        self._waiting_slots.add(slot)
        if self._run_returned:
            self._slot_cv.notify_all()   # others may be waiting for this slot to be idle
            self._poll_cv.notify_all()
        bound = None
        try:
            bound = self._bind_next_waiting_locked(slot, wait)
            return bound
        finally:
            if wait or bound is not None:
                self._waiting_slots.discard(slot)

    def _bind_next_waiting_locked(self, slot, wait):
        while True:
            self._raise_in_slot(slot)
            if self._ready:
                ep = self._ready.popleft()
                ep.in_ready = False
                ep.slot = slot
                slot.episode = ep
                event = ep.events.popleft()
                ep.cv.notify_all()
                ep.last_observation = event.observation
                return _Current(ep, event, StepType.FIRST, event.observation, 0.0, 1.0,
                                ep.training_enabled)
            if self._run_returned and not self._episodes and self._all_slots_idle_locked():
                raise ExternalEnvFinished(
                    f"{type(self._owner).__name__}.run() returned and every episode has ended: "
                    f"no more experience")
            if not wait:
                return None
            self._slot_cv.wait()

    def _all_slots_idle_locked(self):
        """True when every slot a driver uses waits for an episode.

        Then no env thread is between a step and its next one, i.e. every
        complete unroll is in the driver's learn queue (or, for slots that
        are rows of one environment, recorded: the env thread ships those
        before raising); each env thread raises ExternalEnvFinished (a
        capabilities.EndOfData) only once the learner has taken every full
        batch of those.
        """
        return all(s in self._waiting_slots for s in self._slots if s.used and not s.closed)

    def _next_in_episode_locked(self, slot, ep, wait=True):
        """Waits for the bound episode's next step (or its close); returns it
        (with `wait=False`: None instead of waiting)."""
        while True:
            self._raise_in_slot(slot)
            if ep.events:
                event = ep.events.popleft()
                ep.cv.notify_all()
                if event.kind == _CUT:
                    self._finish_bound_locked(slot, ep, "abandoned by abandon_episode()")
                    event.reply.done = True
                    return _Current(ep, event, StepType.LAST, ep.last_observation,
                                    event.reward, 1.0, False)
                ep.last_observation = event.observation
                if event.kind == _END:
                    self._finish_bound_locked(slot, ep, "ended by end_episode()")
                    event.reply.done = True
                    return _Current(ep, event, StepType.LAST, event.observation, event.reward, 0.0,
                                    ep.training_enabled)
                return _Current(ep, event, StepType.MID, event.observation, event.reward, 1.0,
                                ep.training_enabled)
            if ep.closed_reason is not None:
                reward = ep.cur_reward
                self._finish_bound_locked(slot, ep, ep.closed_reason)
                return _Current(ep, None, StepType.LAST, ep.last_observation, reward, 1.0, False)
            timeout = None
            if self._idle_timeout is not None:
                idle = time.monotonic() - ep.last_seen
                if ep.active_calls == 0 and idle >= self._idle_timeout:
                    self._close_episode_locked(ep, self._idle_reason())
                    continue
                timeout = max(self._idle_timeout - idle, 0.01)
            if not wait:
                return None
            ep.cv.wait(timeout)

    def _finish_bound_locked(self, slot, ep, reason):
        ep.slot = None
        slot.episode = None
        self._forget_locked(ep, reason)
