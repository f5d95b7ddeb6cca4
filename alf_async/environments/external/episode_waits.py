"""ClientWaits: how an EpisodeTable's client calls wait (episodes.py).

A client's call that needs an answer waits on its episode's Condition, with
the table's lock held, until the answer comes or the wait's rules end it
(`_check_wait_locked`: the table stopped, the episode closed, or the
deadline passed, which closes the episode); a call that queues an event
waits while `max_pending_steps` events are queued (back-pressure,
`_enqueue`). `get_action_async` waits by the same rules without blocking:
its PendingAction completes (`_finish_async_locked`) on the slot's answer,
a close, `stop()`, or `expire()` at its deadline.

A base class of `EpisodeTable` only: it uses the table's state (the lock
and Conditions, `_episodes`, `_finished`, `_ready`, the stop state, the
timeouts) and its `_close_episode_locked`.
"""

import logging
import time

from alf_async.environments.external.episode_records import ACT, ExternalEnvStoppedError

# get_action_async's callbacks fail under the table's logger.
logger = logging.getLogger("alf_async.environments.external.episodes")


class ClientWaits(object):
    """The waits of an EpisodeTable's client calls (see the module docstring)."""

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
        if event.kind == ACT:
            ep.acted = True
        if ep.slot is None and not ep.in_ready:
            ep.in_ready = True
            self._ready.append(ep)
            self._slot_cv.notify()
        ep.cv.notify_all()
        self._poll_cv.notify_all()

    # ------------------------------------------- get_action_async completion
    # (client side only: the slot side completes a PendingAction by answering
    # its Reply, as it answers a blocked get_action.)

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
