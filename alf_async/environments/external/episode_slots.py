"""SlotSide: the half of an EpisodeTable that the driver's slots call.

A slot (external_slots.py's slot environment) asks the table for its next
time step and tells it what the policy did: `slot_reset`/`slot_step`
block until a client provides the step (a slot stepped on its own driver
thread); a polled slot is stepped in two halves by its env thread, which
never blocks in a slot (`slot_begin`, `slot_act`, `slot_poll`; see
slot_stepper.py). The state is the EpisodeTable's (episodes.py), guarded
by its lock; this class only holds its methods.

Threads: each slot's methods are called by the one driver thread stepping
it; `slot_close` by any thread (the driver's stop).
"""

import time

from tf_agents.trajectories.time_step import StepType

from alf_async.environments.external.episode_records import (ACT, CUT, END, Current,
                                                             ExternalEnvFinished,
                                                             ExternalEnvStoppedError, SlotClosed,
                                                             dummy_last_step)


class SlotSide(object):
    """The slot methods of EpisodeTable (a base class of it; see the module docstring)."""

    def _raise_in_slot(self, slot):
        if self._error is not None:
            raise self._error
        if slot.closed:
            raise SlotClosed()
        if self._stop_requested:
            raise ExternalEnvStoppedError(f"the ExternalEnv is stopped ({self._stop_reason})")

    def slot_reset(self, slot):
        """`slot.reset()` (its env thread): binds the next episode with a step
        ready and returns its FIRST time step (unbatched); blocks until there
        is one."""
        self.start()   # the ExternalEnv's run() thread starts with the driver
        with self._lock:
            slot.used = True
            if slot.episode is not None:  # a second reset: drop the episode in flight
                ep = slot.episode
                self._close_episode_locked(ep, "its slot was reset")
                self._finish_bound_locked(slot, ep, ep.closed_reason or "its slot was reset")
            try:
                slot.current = self._bind_next_locked(slot)
            except SlotClosed:
                raise ExternalEnvStoppedError("the slot was closed") from None
            return slot.current.time_step

    def slot_step(self, slot, action):
        """`slot.step(action)` (its env thread; `action` unbatched): answers
        the step's get_action, records what it applied (`slot.applied`:
        logged action or None, trainable), returns the next (unbatched) time
        step; blocks until the episode (or, after its LAST, the next one) has
        one."""
        try:
            return self._slot_step_or_raise(slot, action)
        except SlotClosed:
            # The driver is stopping (it closes its queues, then its
            # environments): end the step quietly, once, with a dummy last
            # step that goes nowhere (raising would make TensorFlow log the
            # error of every slot).
            if slot.closed_step_returned:
                raise ExternalEnvStoppedError("the slot was closed") from None
            slot.closed_step_returned = True
            slot.applied = (None, False)
            return dummy_last_step(self.observation_array_spec)

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
        if cur.step_type != StepType.LAST and cur.reply is not None and cur.kind == ACT:
            cur.reply.action = action
            cur.reply.done = True
            cur.episode.cv.notify_all()

    def _advance_locked(self, slot, wait):
        """Moves the slot, whose current step was answered, to its next step
        (the next in its episode; after a LAST, the FIRST of the next ready
        episode) and sets what it applied. Returns the new `Current`; with
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
                    except SlotClosed:
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
                return Current(ep, event, StepType.FIRST, event.observation, 0.0, 1.0,
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
                if event.kind == CUT:
                    self._finish_bound_locked(slot, ep, "abandoned by abandon_episode()")
                    event.reply.done = True
                    return Current(ep, event, StepType.LAST, ep.last_observation,
                                    event.reward, 1.0, False)
                ep.last_observation = event.observation
                if event.kind == END:
                    self._finish_bound_locked(slot, ep, "ended by end_episode()")
                    event.reply.done = True
                    return Current(ep, event, StepType.LAST, event.observation, event.reward, 0.0,
                                    ep.training_enabled)
                return Current(ep, event, StepType.MID, event.observation, event.reward, 1.0,
                                ep.training_enabled)
            if ep.closed_reason is not None:
                reward = ep.cur_reward
                self._finish_bound_locked(slot, ep, ep.closed_reason)
                return Current(ep, None, StepType.LAST, ep.last_observation, reward, 1.0, False)
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
