"""ExternalEnv: an environment that runs its own loop and asks the policy for actions.

Control is inverted (as in RLlib's ExternalEnv): instead of the driver calling
`env.step(action)`, the environment's own loop -- an HTTP server, a log reader,
a game -- calls

    start_episode(episode_id=None, training_enabled=True) -> episode_id
    get_action(episode_id, observation) -> action          (on-policy: blocks)
    log_action(episode_id, observation, action)             (off-policy)
    log_returns(episode_id, reward, info=None)
    end_episode(episode_id, observation)
    abandon_episode(episode_id)      (an end without a last observation)

Subclass `ExternalEnv`, override `run()`, and give the driver
`ext.env_constructor()`:

    ext = MyExternalEnv(action_spec, observation_spec)
    learner_filter = ext.experience_filter(observers=[replayer])
    driver = AsyncOffPolicyDriver(ext.env_constructor(), policy, num_envs=K,
                                  exp_observers=[learner_filter])
    learner_filter.bind(driver)
    driver.start()          # starts ext's run() thread (first slot reset)

How episodes reach the driver
-----------------------------
Every call of the constructor makes one *slot*: a TFPyEnvironment of batch size 1
whose `reset()`/`step()` block until an episode has something for it. A slot
takes the oldest episode that has a step waiting and serves it until it ends;
K slots serve K episodes at once, each stepped as soon as its client is ready
(episodes beyond K wait for a free slot). Per slot, the driver sees an ordinary
stream of tf-agents time steps:

    client                          slot (env thread)                 driver
    get_action/log_action(o0)  -->  reset() returns FIRST(o0)    --> policy acts
    get_action(o1)             -->  step(a0): a0 to the client;
                                    returns MID(o1, reward since a0)
    end_episode(o2)            -->  step(a1): returns LAST(o2, reward, discount 0)
    (next episode)             -->  step(ignored) returns FIRST of the next one

With slots that wait for clients, use `actor_queue_cap=1` (an actor waiting
for several env threads would wait for several clients at once). One
ExternalEnv serves one driver: stopping the driver stops it.

An episode closed early (its get_action timed out, or its client went idle)
loses its queued steps and ends with a truncation (LAST, discount 1) that
repeats its last observation; `abandon_episode` ends the same way but keeps
the queued steps.

Logged actions and training_enabled=False: the ExperienceFilter
-----------------------------------------------------------------
The driver records in its trajectories the action *its policy* chose, and it
ships every unroll to the learn queue. Both must change for external
episodes, and no driver hook is needed for it: each slot keeps, per
transition it produced, a record (step type, observation, logged action or
None, learn flag); `ext.experience_filter(observers)` returns an exp_observer
that, on the learner's thread, takes each row's next T records (the driver
ships every env thread's unrolls in order, and a row's env id is its env
thread's index, which `bind(driver)` maps to the slot via
`driver.environments`), checks that they describe exactly the row's step
types and observations, and then

- writes each logged action over the policy's action (`log_action` steps);
- replaces every transition of a `training_enabled=False` episode by an
  inert boundary transition: step_type LAST, next_step_type FIRST, reward
  0, discount 1, zero observation, policy info and minimal action.
  tf-agents' losses mask transitions that start at a LAST step, so none of
  those steps trains the agent, and none of their observations, actions or
  rewards reach it (the step before such an episode is always the previous
  episode's LAST, itself a masked boundary);
- makes the last real transition of an episode closed early (timeout, idle
  client, `abandon_episode`), whose outcome is unknown, and its made-up end
  inert boundaries too, but keeps their observations: the transition before
  takes that observation as its next one and is trained on;

before handing the batch to its own observers (e.g. a replayer). The
LogThread still sees the driver's own trajectories: such episodes are
counted in the metrics like any other. Without a filter (no
`experience_filter()` call) nothing is recorded and the learner sees the
policy's actions and every episode; a warning says so the first time
`log_action` or `training_enabled=False` is used.

Threads
-------
- `run()` runs on this `threading.Thread`, started by the first slot
  `reset()` (i.e. by `driver.start()`) or by calling `start()` earlier
  (`start()` is idempotent). It and any thread it starts may call the five
  episode methods, concurrently for different episodes; each episode is
  stepped serially.
- The slots' `reset()`/`step()` are called by the driver's env threads,
  `close()` by the driver's `stop()`.
- The ExperienceFilter is called by the learner's thread (`run_async()`).

What blocks, and how it ends
----------------------------
- `get_action` blocks until the policy acted on its observation;
  `end_episode` until the slot took the episode's last observation;
  `log_action` only while `max_pending_steps` steps of that episode wait for
  the driver. Each waits at most `action_timeout` seconds (then the episode
  is closed and TimeoutError raised).
- A slot's `reset()`/`step()` block until a client provides the next step.
- `stop()` (any thread; also called when the driver closes a slot it used,
  i.e. by `driver.stop()`) wakes everything: blocked and later episode calls
  raise ExternalEnvStoppedError, blocked slots raise too (the driver, which
  is stopping, ignores it), and `on_stop()` lets `run()` return. The driver
  closes its environments only after waiting half its
  `stop_grace_period_secs` for env threads that are inside a step, and slots
  waiting for clients are: `driver.stop()` then takes about that long.
- An exception in `run()` makes every slot raise it: the driver stops and
  raises it, with its type, in the learner's thread.
- `run()` returning means no new episodes: once the open ones have ended, a
  slot that would wait for a new episode raises `ExternalEnvFinished`
  (so a learner reading finite logs ends with that exception). With an
  ExperienceFilter bound to the driver it first waits until the learner
  has taken every full batch that is left (a partial last unroll per slot is
  never shipped by the driver).
- An episode without any call for `episode_idle_timeout` seconds (a client
  that vanished) is closed: its slot serves other episodes again.
"""

import collections
import logging
import threading
import time
import uuid
import weakref

import numpy as np
import tensorflow as tf
from tf_agents.environments import py_environment, tf_py_environment
from tf_agents.specs import array_spec, tensor_spec
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories.time_step import StepType

from alf_async.environments.capabilities import BlockingStep

logger = logging.getLogger(__name__)

_ACT, _END, _CUT = "act", "end", "cut"
_FINISHED_IDS_KEPT = 100_000


class ExternalEnvStoppedError(RuntimeError):
    """The ExternalEnv was stopped (driver stopped, `stop()`, or `run()` failed)."""


class ExternalEnvFinished(Exception):
    """`run()` returned and every episode has ended: no more experience will come."""


class TooManyEpisodesError(RuntimeError):
    """`start_episode` would open more than `max_concurrent` episodes."""


# ------------------------------------------------------------------ specs


def spec_from_gym_space(space):
    """A tf-agents array spec (nest) for a gym space (see tf-agents' gym_wrapper)."""
    from tf_agents.environments import gym_wrapper
    return gym_wrapper.spec_from_gym_space(space)


def specs_from_gym(action_space, observation_space):
    """(action_spec, observation_spec) array specs for two gym spaces."""
    return spec_from_gym_space(action_space), spec_from_gym_space(observation_space)


def _as_array_spec(spec, what):
    if hasattr(spec, "sample") and hasattr(spec, "contains"):  # a gym space
        return spec_from_gym_space(spec)
    leaves = tf.nest.flatten(spec)
    if not leaves:
        raise ValueError(f"{what} is empty")
    if all(isinstance(s, tf.TensorSpec) for s in leaves):
        return tensor_spec.to_nest_array_spec(spec)
    for s in leaves:
        if not isinstance(s, array_spec.ArraySpec):
            raise TypeError(f"{what} must be a tf-agents ArraySpec nest or a gym space, "
                            f"got {type(s).__name__}")
    return spec


def _bounds_str(values):
    values = np.asarray(values)
    if values.size and np.all(values == values.flat[0]):
        return str(values.flat[0].item())
    return np.array2string(values, threshold=8)


def _check_array(value, spec, what):
    dtype = np.dtype(spec.dtype)
    shape = tuple(spec.shape)
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{what}: expected an array of shape {shape} and dtype {dtype.name}, "
                         f"got a value that is not a regular array ({e})") from None
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{what}: expected dtype {dtype.name}, got {arr.dtype} "
                         f"(value {value!r:.80})")
    if arr.shape != shape:
        raise ValueError(f"{what}: expected shape {shape}, got {arr.shape}")
    if not np.can_cast(arr.dtype, dtype, casting="same_kind"):
        raise ValueError(f"{what}: expected dtype {dtype.name}, got {arr.dtype.name} "
                         f"(which does not convert to {dtype.name} safely)")
    if dtype.kind in "iu" and arr.size:
        info = np.iinfo(dtype)
        if arr.min() < info.min or arr.max() > info.max:
            raise ValueError(f"{what}: values {arr.min()}..{arr.max()} do not fit {dtype.name}")
    out = arr.astype(dtype, copy=True)
    if isinstance(spec, array_spec.BoundedArraySpec):
        ok = (out >= spec.minimum) & (out <= spec.maximum)
        if not np.all(ok):
            bad = tuple(int(i) for i in np.argwhere(~ok)[0]) if out.ndim else ()
            raise ValueError(
                f"{what}: out of bounds: expected values in [{_bounds_str(spec.minimum)}, "
                f"{_bounds_str(spec.maximum)}], got {out[bad]!r} at index {bad}")
    return out


def check_nest(value, spec, what):
    """Converts `value` to numpy arrays that match the array spec nest `spec`.

    Structure, shape and dtype must match (a value of another dtype is
    accepted when numpy casts it safely within its kind, e.g. Python floats
    to float32, ints to float32; never floats to ints); bounded specs must
    hold every value (NaN never does).

    Args:
        value: the nest to check (lists and numpy arrays for the leaves).
        spec: the array spec nest.
        what: the field's name for error messages, e.g. "observation".

    Returns:
        The same nest of numpy arrays of the spec's dtypes.

    Raises:
        ValueError: naming the field (e.g. "observation['pos']") and what was
            expected.
    """
    if isinstance(spec, dict):
        if not isinstance(value, dict) or set(value) != set(spec):
            got = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise ValueError(f"{what}: expected a dict with keys {sorted(spec)}, got {got}")
        return type(spec)((k, check_nest(value[k], spec[k], f"{what}[{k!r}]")) for k in spec)
    if isinstance(spec, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(spec):
            got = (f"{len(value)} items" if isinstance(value, (list, tuple))
                   else type(value).__name__)
            raise ValueError(f"{what}: expected a sequence of {len(spec)} items, got {got}")
        items = [check_nest(v, s, f"{what}[{i}]") for i, (v, s) in enumerate(zip(value, spec))]
        return type(spec)(*items) if hasattr(spec, "_fields") else type(spec)(items)
    return _check_array(value, spec, what)


# --------------------------------------------------------------- internals

_ALL_SLOTS = weakref.WeakSet()


def open_slots():
    """Slots of any ExternalEnv in this process that are not closed yet."""
    return [slot for slot in list(_ALL_SLOTS) if not slot.closed]



class _SlotClosed(Exception):
    """Internal: the driver closed the slot."""


def _dummy_last_step(observation_spec):
    return ts.TimeStep(
        step_type=np.array([StepType.LAST], np.int32), reward=np.zeros([1], np.float32),
        discount=np.ones([1], np.float32),
        observation=tf.nest.map_structure(lambda s: np.zeros((1,) + tuple(s.shape), s.dtype),
                                          observation_spec))


class _Reply(object):
    """What a blocked get_action / end_episode waits for."""
    __slots__ = ("done", "action")

    def __init__(self):
        self.done = False
        self.action = None


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


class _Current(object):
    """The time step a slot last returned, and what the driver's next step means."""
    __slots__ = ("episode", "kind", "reply", "step_type", "observation", "logged_action",
                 "learn", "private", "time_step")

    def __init__(self, episode, event, step_type, observation, reward, discount, learn):
        self.episode = episode
        self.kind = event.kind if event is not None else None
        self.reply = event.reply if event is not None else None
        self.logged_action = event.logged_action if event is not None else None
        self.step_type = step_type
        self.observation = observation
        self.learn = learn
        self.private = not episode.training_enabled
        self.time_step = ts.TimeStep(
            step_type=np.array([step_type], np.int32),
            reward=np.array([reward], np.float32),
            discount=np.array([discount], np.float32),
            observation=tf.nest.map_structure(lambda o: o[None], observation))


class _Record(object):
    """What the ExperienceFilter needs to know about one transition of a slot.

    `learn`: the transition may be trained on. `private`: it belongs to a
    training_enabled=False episode (nothing of it may reach the learner).
    """
    __slots__ = ("step_type", "observation", "logged_action", "learn", "private")

    def __init__(self, step_type, observation, logged_action, learn, private):
        self.step_type = step_type
        self.observation = observation
        self.logged_action = logged_action
        self.learn = learn
        self.private = private


class _SlotEnv(py_environment.PyEnvironment, BlockingStep):
    """One concurrent-episode slot: a batched (B=1) PyEnvironment fed by clients.

    Threads: `reset()`/`step()` are called by one driver env thread and block
    until a client provides the next step (or the ExternalEnv stops: then
    they raise). `close()` may be called by any thread.
    """


    def __init__(self, ext, index):
        super().__init__(handle_auto_reset=False)
        self._ext = ext
        self.index = index
        self.used = False      # reset() was called: a driver runs it
        self.closed = False
        self.closed_step_returned = False
        self.stepped = False
        self.episode = None    # the bound _Episode
        self.current = None    # _Current
        self.records = collections.deque()

    @property
    def batched(self):
        return True

    @property
    def batch_size(self):
        return 1

    def observation_spec(self):
        return self._ext.observation_array_spec

    def action_spec(self):
        return self._ext.action_array_spec

    def _reset(self):
        return self._ext._slot_reset(self)

    def _step(self, action):
        return self._ext._slot_step(self, action)

    def close(self):
        self._ext._slot_close(self)


# ---------------------------------------------------------------- the env


class _Hub(object):
    """The state machine behind an ExternalEnv: its episodes, slots and stop state.

    Kept out of the ExternalEnv (a user-subclassed Thread) so that a
    subclass's attributes can never clash with it. Every method may be
    called from any thread; all state is guarded by one lock.
    """

    def __init__(self, owner, action_spec, observation_spec, max_concurrent, action_timeout,
                 episode_idle_timeout, max_pending_steps, max_unfiltered_records):
        self._owner = owner
        self.action_array_spec = _as_array_spec(action_spec, "action_spec")
        self.observation_array_spec = _as_array_spec(observation_spec, "observation_spec")
        if not isinstance(max_concurrent, int) or max_concurrent < 1:
            raise ValueError(f"max_concurrent must be an integer >= 1, got {max_concurrent!r}")
        if max_pending_steps < 1:
            raise ValueError(f"max_pending_steps must be >= 1, got {max_pending_steps!r}")
        self._max_concurrent = max_concurrent
        self._action_timeout = float(action_timeout)
        self._idle_timeout = None if episode_idle_timeout is None else float(episode_idle_timeout)
        self._max_pending = max_pending_steps
        self._max_records = max_unfiltered_records
        self._lock = threading.Lock()
        self._slot_cv = threading.Condition(self._lock)
        self._episodes = {}
        self._finished = collections.OrderedDict()   # id -> why it finished
        self._ready = collections.deque()            # episodes with a step and no slot
        self._slots = []
        self._recording = False
        self._filter = None
        self.run_started = False
        self._run_returned = False
        self._stop_requested = False
        self._stop_reason = None
        self._error = None
        self.stop_event = threading.Event()
        self._warned = set()

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

    def env_constructor(self):

        def make_slot():
            with self._lock:
                slot = _SlotEnv(self, len(self._slots))
                _ALL_SLOTS.add(slot)
                self._slots.append(slot)
            return tf_py_environment.TFPyEnvironment(slot)

        return make_slot

    def experience_filter(self, observers):
        with self._lock:
            if self._filter is not None:
                raise ValueError("this ExternalEnv already has an ExperienceFilter")
            if any(s.stepped for s in self._slots):
                raise ValueError("experience_filter() must be called before the driver "
                                 "starts: slots already produced unrecorded steps")
            self._filter = ExperienceFilter(self, observers)
            self._recording = True
            return self._filter

    # ------------------------------------------------------ episode methods

    def start_episode(self, episode_id=None, training_enabled=True):
        """See ExternalEnv.start_episode."""
        if episode_id is None:
            episode_id = uuid.uuid4().hex
        elif not isinstance(episode_id, str):
            raise TypeError(f"episode_id must be a str or None, got {type(episode_id).__name__}")
        if not training_enabled:
            self._warn_unfiltered("training_enabled=False")
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

    def get_action(self, episode_id, observation, timeout=None):
        """See ExternalEnv.get_action."""
        obs = check_nest(observation, self.observation_array_spec, "observation")
        reply = _Reply()
        deadline = self._deadline(timeout)
        with self._lock:
            ep = self._get(episode_id)
            self._enqueue(ep, _Event(_ACT, obs, None, reply), deadline, "get_action")
            self._wait(ep, lambda: reply.done, deadline, "get_action")
            return reply.action

    def log_action(self, episode_id, observation, action, timeout=None):
        """See ExternalEnv.log_action."""
        obs = check_nest(observation, self.observation_array_spec, "observation")
        act = check_nest(action, self.action_array_spec, "action")
        self._warn_unfiltered("log_action")
        deadline = self._deadline(timeout)
        with self._lock:
            ep = self._get(episode_id)
            self._enqueue(ep, _Event(_ACT, obs, act, None), deadline, "log_action")

    def log_returns(self, episode_id, reward, info=None):
        """See ExternalEnv.log_returns."""
        try:
            r = float(reward)
        except OverflowError:  # an int beyond float range (e.g. 10**400 from JSON)
            raise ValueError(f"reward: expected a finite number, got an integer of "
                             f"{len(str(reward))} digits") from None
        except (TypeError, ValueError):
            raise ValueError(f"reward: expected a number, got {reward!r:.80}") from None
        if not np.isfinite(r):
            raise ValueError(f"reward: expected a finite number, got {r}")
        with self._lock:
            ep = self._get(episode_id)
            if not ep.acted:
                raise ValueError(f"log_returns for episode {episode_id!r} before its first "
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
                ep.cv.wait(remaining)
        finally:
            ep.active_calls -= 1
            ep.last_seen = time.monotonic()

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

    def _warn_unfiltered(self, what):
        if not self._recording and what not in self._warned:
            self._warned.add(what)
            logger.warning(
                "%s used without an ExperienceFilter: the learner will see %s. Call "
                "ext.experience_filter() and pass it in the driver's exp_observers.", what,
                "the policy's actions instead of the logged ones" if what == "log_action"
                else "these episodes")

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

    def _close_episode_locked(self, ep, reason):
        """Closes an episode early (timeout, idle client); its queued steps are dropped.

        A bound episode's slot then ends it with a truncation (LAST, discount
        1) repeating its last observation, which the ExperienceFilter keeps
        from the learner together with the transition leading to it.
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
        for ep in self._episodes.values():
            ep.cv.notify_all()

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

    # ------------------------------------------------------------ slot side

    def _raise_in_slot(self, slot):
        if self._error is not None:
            raise self._error
        if slot.closed:
            raise _SlotClosed()
        if self._stop_requested:
            raise ExternalEnvStoppedError(f"the ExternalEnv is stopped ({self._stop_reason})")

    def _slot_reset(self, slot):
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

    def _slot_step(self, slot, action):
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
            return _dummy_last_step(self.observation_array_spec)

    def _slot_step_or_raise(self, slot, action):
        cur = slot.current
        if cur is None:
            return self._slot_reset(slot)
        with self._lock:
            slot.stepped = True
            if self._recording and len(slot.records) >= self._max_records:
                raise RuntimeError(
                    f"slot {slot.index} holds {len(slot.records)} transitions that its "
                    f"ExperienceFilter never took: pass the filter in the driver's "
                    f"exp_observers and use run_async() (or call filter.apply())")
            if cur.step_type == StepType.LAST:
                nxt = self._bind_next_locked(slot)
            else:
                if cur.reply is not None and cur.kind == _ACT:
                    cur.reply.action = tf.nest.map_structure(lambda a: a[0], action)
                    cur.reply.done = True
                    cur.episode.cv.notify_all()
                nxt = self._next_in_episode_locked(slot, cur.episode)
            if self._recording:
                # The transition's next step is made up when the episode was closed.
                learn = cur.learn and nxt.learn if cur.step_type != StepType.LAST else cur.learn
                slot.records.append(_Record(cur.step_type, cur.observation,
                                            cur.logged_action, learn, cur.private))
            slot.current = nxt
            return nxt.time_step

    def _slot_close(self, slot):
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

    def _bind_next_locked(self, slot):
        """Waits for an episode with a step ready; binds it; returns its FIRST step."""
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
            if self._run_returned and not self._episodes and self._delivered_locked():
                raise ExternalEnvFinished(
                    f"{type(self._owner).__name__}.run() returned and every episode has ended: "
                    f"no more experience")
            self._slot_cv.wait()

    def _delivered_locked(self):
        """True when the learner has taken every batch it still can.

        Raising ExternalEnvFinished stops the driver, which drops the unrolls
        in its queues; with an ExperienceFilter bound to the driver, slots
        wait until fewer complete unrolls than one learner batch are left
        unfiltered (those can never make a batch). Without one: at once.
        """
        f = self._filter
        if f is None or f.unroll_length is None:
            return True
        pending = sum(len(s.records) // f.unroll_length for s in self._slots)
        return pending < f.learn_queue_cap

    def records_taken(self):
        """Called by the ExperienceFilter after it took records (wakes finishing slots)."""
        if self._run_returned:
            with self._lock:
                self._slot_cv.notify_all()

    def _next_in_episode_locked(self, slot, ep):
        """Waits for the bound episode's next step (or its close); returns it."""
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
            wait = None
            if self._idle_timeout is not None:
                idle = time.monotonic() - ep.last_seen
                if ep.active_calls == 0 and idle >= self._idle_timeout:
                    self._close_episode_locked(ep, self._idle_reason())
                    continue
                wait = max(self._idle_timeout - idle, 0.01)
            ep.cv.wait(wait)

    def _finish_bound_locked(self, slot, ep, reason):
        ep.slot = None
        slot.episode = None
        self._forget_locked(ep, reason)


class ExternalEnv(threading.Thread):
    """Base class: override `run()`; see the module docstring.

    All of its state lives in a private object, so subclasses may use any
    attribute names of their own.
    """

    def __init__(self, action_spec, observation_spec, max_concurrent=100, action_timeout=60.0,
                 episode_idle_timeout=None, max_pending_steps=64,
                 max_unfiltered_records=100_000, name="external_env"):
        """
        Args:
            action_spec: tf-agents array spec nest of one action (or a gym space).
            observation_spec: array spec nest of one observation (or a gym space).
            max_concurrent: most episodes open at once (started and not yet
                fully handed to the driver); `start_episode` beyond it raises
                TooManyEpisodesError.
            action_timeout: seconds a get_action / end_episode / log_action
                call waits at most before raising TimeoutError (the episode
                is then closed).
            episode_idle_timeout: seconds without any call for an episode
                after which it is closed (its slot freed); None: never.
            max_pending_steps: steps one episode may queue (log_action) before
                log_action blocks.
            max_unfiltered_records: with an ExperienceFilter, transitions a
                slot may hold for it before the slot fails (a filter that is
                never called, e.g. get_training_exps() used instead of
                run_async(), would otherwise grow them forever).
            name: the thread's name.
        """
        super().__init__(name=name, daemon=True)
        self.__hub = _Hub(self, action_spec, observation_spec, max_concurrent, action_timeout,
                          episode_idle_timeout, max_pending_steps, max_unfiltered_records)
        self.action_array_spec = self.__hub.action_array_spec
        self.observation_array_spec = self.__hub.observation_array_spec

    # ------------------------------------------------------- user overrides

    def run(self):
        """Override: the environment's loop (see the module docstring)."""
        raise NotImplementedError("subclass ExternalEnv and override run()")

    def on_stop(self):
        """Override to make a `run()` blocked outside this class return.

        Called once, from the thread that calls `stop()`, after every
        blocked episode call was woken. The default does nothing (a `run()`
        that only calls the episode methods, or waits on `wait_stopped()`,
        ends by itself).
        """

    # ------------------------------------------------------ episode methods

    def start_episode(self, episode_id=None, training_enabled=True):
        """Opens an episode.

        Args:
            episode_id: a str unique for this env's life, or None for a fresh one.
            training_enabled: False: the episode is acted on and counted in
                the metrics, but the learner never trains on it (needs the
                ExperienceFilter).

        Returns:
            The episode id.

        Raises:
            ValueError: the id was started before (open or finished).
            TooManyEpisodesError: `max_concurrent` episodes are open.
            ExternalEnvStoppedError: the env was stopped.
        """
        return self.__hub.start_episode(episode_id, training_enabled)

    def get_action(self, episode_id, observation, timeout=None):
        """Records an observation and returns the policy's action for it.

        Blocks until the policy acted (at most `timeout`, default
        `action_timeout`, seconds).

        Returns:
            The action, a nest of numpy values like the action spec.

        Raises:
            ValueError: unknown or finished episode, or an observation that
                does not match the spec (then nothing is queued).
            TimeoutError: no action in time (the episode is then closed).
            ExternalEnvStoppedError: the env was stopped.
        """
        return self.__hub.get_action(episode_id, observation, timeout)

    def log_action(self, episode_id, observation, action, timeout=None):
        """Records an observation and the action the caller took (off-policy).

        Returns once the step is queued; blocks only while
        `max_pending_steps` steps of this episode wait for the driver.

        Raises:
            ValueError: unknown or finished episode, or an observation or
                action that does not match its spec (nothing is queued).
            TimeoutError, ExternalEnvStoppedError: as get_action.
        """
        self.__hub.log_action(episode_id, observation, action, timeout)

    def log_returns(self, episode_id, reward, info=None):
        """Adds `reward` to the return of the episode's last action.

        Rewards add up until the next action (or the end); none logged
        means 0.0. `info` is kept as the episode's last info (not sent to
        the learner).

        Raises:
            ValueError: unknown or finished episode, a reward that is not a
                finite number, or a reward before the episode's first action.
        """
        self.__hub.log_returns(episode_id, reward, info)

    def end_episode(self, episode_id, observation, timeout=None):
        """Records the episode's last observation (a termination) and closes it.

        Blocks until its slot took the last step. An episode ended before
        any action produces no experience.

        Raises:
            ValueError, TimeoutError, ExternalEnvStoppedError: as get_action.
        """
        self.__hub.end_episode(episode_id, observation, timeout)

    def abandon_episode(self, episode_id, timeout=None):
        """Closes an episode that has no last observation (e.g. a log cut short).

        Its queued steps still reach the driver; the episode then ends with a
        truncation (LAST, discount 1) repeating its last observation, and the
        ExperienceFilter keeps its last transition (whose outcome is unknown)
        from the learner. Blocks like end_episode.
        """
        self.__hub.abandon_episode(episode_id, timeout)

    # ---------------------------------------------------- driver integration

    def env_constructor(self):
        """The driver's env constructor: each call makes one slot, a batch-1 TFPyEnvironment."""
        return self.__hub.env_constructor()

    def time_step_spec(self):
        """The slots' time step spec, as TensorSpecs (for building agents)."""
        return tensor_spec.from_spec(ts.time_step_spec(self.observation_array_spec))

    def action_spec(self):
        """The action spec, as (bounded) TensorSpecs."""
        return tensor_spec.from_spec(self.action_array_spec)

    def experience_filter(self, observers=()):
        """The learner-side exp_observer for logged actions and training_enabled=False.

        Call it before the driver starts, pass the result in the driver's
        `exp_observers`, and `bind(driver)` it (see the module docstring).

        Args:
            observers: callables(exp, env_ids) that get the filtered batch
                (e.g. a replayer).

        Returns:
            The ExperienceFilter (one per ExternalEnv).
        """
        return self.__hub.experience_filter(observers)

    # -------------------------------------------------------------- control

    def start(self):
        """Starts the `run()` thread; does nothing if it was started (or stopped)."""
        self.__hub.start()

    def stop(self, reason="stop() was called"):
        """Stops: blocked and later calls raise ExternalEnvStoppedError. Idempotent.

        Any thread may call it; it does not join the `run()` thread (use
        `join()`).
        """
        self.__hub.stop(reason)

    def join(self, timeout=None):
        """Joins the `run()` thread; returns at once if it was never started."""
        if self.__hub.run_started:
            super().join(timeout)

    @property
    def run_started(self):
        return self.__hub.run_started

    @property
    def stopped(self):
        return self.__hub.stop_event.is_set()

    def wait_stopped(self, timeout=None):
        """Blocks until `stop()` (or a failure); returns True if stopped."""
        return self.__hub.stop_event.wait(timeout)

    @property
    def num_open_episodes(self):
        return self.__hub.num_open_episodes


class ExperienceFilter(object):
    """The learner-side exp_observer of an ExternalEnv (see the module docstring).

    Threads: called by the learner's thread (`run_async()` calls it with each
    batch); `bind()` by the thread that built the driver. Nothing blocks.
    """

    def __init__(self, ext, observers=()):
        self._ext = ext
        self._observers = list(observers)
        self._slots = None
        self.unroll_length = None     # known when bound to a driver
        self.learn_queue_cap = None
        self.transitions = 0          # transitions seen
        self.actions_replaced = 0     # logged actions written over the policy's
        self.transitions_masked = 0   # transitions replaced by inert boundaries

    def bind(self, driver_or_environments):
        """Maps env ids to slots: env id i is `driver.environments[i]` (batch size 1).

        Args:
            driver_or_environments: the AsyncOffPolicyDriver (anything with
                `.environments`) or its list of TFEnvironments.

        Returns:
            self.
        """
        envs = getattr(driver_or_environments, "environments", driver_or_environments)
        slots = []
        for i, env in enumerate(envs):
            pyenv = getattr(env, "pyenv", None)
            if not isinstance(pyenv, _SlotEnv) or pyenv._ext is not self._ext:
                raise ValueError(f"environment {i} is not a slot of this ExternalEnv: build "
                                 f"the driver with ext.env_constructor()")
            slots.append(pyenv)
        self._slots = slots
        queues = getattr(driver_or_environments, "queues", None)
        if queues is not None:
            self.unroll_length = queues.unroll_length
            self.learn_queue_cap = queues.learn_queue.capacity
        return self

    def __call__(self, exp, env_ids):
        exp = self.apply(exp, env_ids)
        for observer in self._observers:
            observer(exp, env_ids)

    def apply(self, exp, env_ids):
        """Returns `exp` [rows, T] with logged actions in and non-learning steps out.

        Raises:
            RuntimeError: not bound, or the batch does not match the slots'
                records (the filter missed a batch, or was created late).
        """
        if self._slots is None:
            raise RuntimeError("ExperienceFilter.bind(driver) was not called: the filter "
                               "cannot tell which slot each row comes from")
        env_ids = np.asarray(env_ids)
        step_type = np.asarray(exp.step_type)
        rows, T = step_type.shape
        obs_leaves = [np.asarray(o) for o in tf.nest.flatten(exp.observation)]
        replace, mask = [], []
        for r in range(rows):
            slot = self._slots[int(env_ids[r])]
            if len(slot.records) < T:
                raise RuntimeError(
                    f"slot {slot.index} has {len(slot.records)} recorded transitions for a "
                    f"row of {T}: the filter must see every batch from the driver's start")
            for t in range(T):
                rec = slot.records.popleft()
                if rec.step_type != step_type[r, t] or not all(
                        np.array_equal(o[r, t], x, equal_nan=o.dtype.kind == "f")
                        for o, x in zip(obs_leaves, tf.nest.flatten(rec.observation))):
                    raise RuntimeError(
                        f"row {r} (slot {slot.index}) step {t}: the driver's experience "
                        f"(step type {step_type[r, t]}) does not match the slot's record "
                        f"(step type {rec.step_type}); a batch was not filtered")
                if not rec.learn:
                    mask.append((r, t, rec.private))
                elif rec.logged_action is not None:
                    replace.append((r, t, rec.logged_action))
        self.transitions += rows * T
        self.actions_replaced += len(replace)
        self.transitions_masked += len(mask)
        self._ext.records_taken()
        if not replace and not mask:
            return exp
        new = tf.nest.map_structure(lambda t: np.array(t), exp)
        flat_actions = tf.nest.flatten(new.action)
        for r, t, action in replace:
            for leaf, value in zip(flat_actions, tf.nest.flatten(action)):
                leaf[r, t] = value
        if mask:
            self._mask(new, mask)
        return tf.nest.map_structure(tf.convert_to_tensor, new)

    def _mask(self, exp, cells):
        """Turns cells into inert boundaries; blanks the private ones.

        A non-private cell (the unknown-outcome end of a closed episode)
        keeps its observation: the transition before it, which is trained
        on, takes it as its next observation.
        """
        rows, steps, private = (np.array(x) for x in zip(*cells))
        exp.step_type[rows, steps] = StepType.LAST
        exp.next_step_type[rows, steps] = StepType.FIRST
        exp.reward[rows, steps] = 0
        exp.discount[rows, steps] = 1
        rows, steps = rows[private], steps[private]
        for leaf in tf.nest.flatten(exp.observation) + tf.nest.flatten(exp.policy_info):
            leaf[rows, steps] = 0
        for leaf, spec in zip(tf.nest.flatten(exp.action),
                              tf.nest.flatten(self._ext.action_array_spec)):
            leaf[rows, steps] = getattr(spec, "minimum", 0)
