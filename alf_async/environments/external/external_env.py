"""ExternalEnv: an environment that runs its own loop and asks the policy for actions.

Control is inverted (as in RLlib's ExternalEnv): instead of the driver calling
`env.step(action)`, the environment's own loop -- an HTTP server, a log reader,
a game -- calls

    start_episode(episode_id=None, training_enabled=True) -> episode_id
    get_action(episode_id, observation, reward=None) -> action   (on-policy: blocks)
    log_action(episode_id, observation, action)             (off-policy)
    log_returns(episode_id, reward, info=None)
    end_episode(episode_id, observation)
    abandon_episode(episode_id)      (an end without a last observation)

Subclass `ExternalEnv`, override `run()`, and give the driver
`ext.env_constructor(slots_per_env=K)`; nothing else to wire:

    from alf_async.environments import ExternalEnv

    ext = MyExternalEnv(action_spec, observation_spec)
    driver = AsyncOffPolicyDriver(ext.env_constructor(slots_per_env=K), policy,
                                  num_envs=1, exp_observers=[replayer])
    driver.start()          # starts ext's run() thread (first slot reset)

The pieces: episode_api.py defines the episode methods and checks their
values (TF-free, shared with the policy server and its clients);
episodes.py's `EpisodeTable` owns every episode and slot; this module is the
user-facing class and the slot environment the driver steps.

How episodes reach the driver
-----------------------------
Every call of the constructor makes `slots_per_env` *slots*, the rows of one
TFPyEnvironment (with `slots_per_env=1`, a TFPyEnvironment of batch size 1);
a slot's `reset()`/`step()` block until an episode has something for it. A
slot takes the oldest episode that has a step waiting and serves it until it
ends; K slots serve K episodes at once, each stepped as soon as its client is
ready (episodes beyond K wait for a free slot). The env thread of a batch of
slots steps them itself, in two halves that never block (slot_stepper.py:
answer a slot's client, later collect whichever slots' clients have called),
and asks the actor, in one request, for the actions of whichever slots are
ready: one env thread serves all K, with no thread per slot. Per slot, the
driver sees an ordinary stream of tf-agents time steps:

    client                          slot (env thread)            driver
    get_action/log_action(o0)  -->  reset() returns FIRST(o0)    --> policy acts
    get_action(o1)             -->  step(a0): a0 to the client;
                                    returns MID(o1, reward since a0)
    end_episode(o2)            -->  step(a1): returns LAST(o2, reward, discount 0)
    (next episode)             -->  step(ignored) returns FIRST of the next one

With one slot per env thread (`slots_per_env=1`), give the actors a large
`actor_queue_cap` (e.g. `num_envs // num_actor_queues`): actors batch
dynamically, i.e. take whichever env threads' requests are waiting and never
wait for a slot whose client is slow, so a large cap only lets one forward
pass serve many clients (cap 1 means one forward pass per client step:
~600 get_action/s for 16 clients in benchmarks/serving.py). With many slots
per env thread one request already carries every ready slot. One
ExternalEnv serves one driver: stopping the driver stops it.

Logged actions and training_enabled=False
-----------------------------------------
Slots are `capabilities.AppliedStep` environments: right after each step
the env thread asks the slot what it applied, and the slot answers with the
logged action of a `log_action` step (None, i.e. the policy's, for a
`get_action` step) and whether the transition may be trained on. So the
driver's own trajectories hold the logged actions, and the transitions of
`training_enabled=False` episodes reach the learn queue only as inert
boundaries (step_type LAST, blanked: no tf-agents loss trains on them, and
none of their observations, actions or rewards reach the learner), while
the log queue, i.e. the metrics, counts them like any other episode.
`get_training_exps()` and `run_async()` are right with no extra wiring.

An episode closed early (its get_action timed out, or its client went idle)
loses its queued steps and ends with a truncation (LAST, discount 1) that
repeats its last observation; `abandon_episode` ends the same way but keeps
the queued steps. Either way its last real transition (outcome unknown) and
the made-up end are untrainable; the observation the transition before them
needs as its next one is kept.

Threads
-------
- `run()` runs on this `threading.Thread`, started by the first slot
  `reset()` (i.e. by `driver.start()`) or by calling `start()` earlier
  (`start()` is idempotent). It and any thread it starts may call the
  episode methods, concurrently for different episodes; each episode is
  stepped serially.
- The slots' `reset()`/`step()`/`applied_step()` are called by the driver's
  env threads (slots_per_env > 1: the env thread's SlotStepper steps them,
  see slot_stepper.py), `close()` by the driver's `stop()`.

What blocks, and how it ends
----------------------------
- `get_action` blocks until the policy acted on its observation;
  `end_episode` until the slot took the episode's last observation;
  `log_action` only while `max_pending_steps` steps of that episode wait for
  the driver. Each waits at most `action_timeout` seconds (then the episode
  is closed and TimeoutError raised).
- `get_action_async` (for an event loop, e.g. the policy server's: no
  thread parks per request) queues the step and returns; its callback
  later gets the action or the exception get_action would have raised.
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
- `run()` returning means no new episodes: once the open ones have ended and
  every slot waits for a new one, the slots raise `ExternalEnvFinished` (a
  `capabilities.EndOfData`): the env threads raise it once the learner has
  taken every full batch left (a partial last unroll per slot is never
  shipped), so a learner reading finite logs learns from all of them and
  then ends with that exception.
- An episode without any call for `episode_idle_timeout` seconds (a client
  that vanished) is closed: its slot serves other episodes again.

Memory under load: back-pressure, never dropping
------------------------------------------------
When clients produce experience faster than the learner takes it, nothing
grows and nothing already accepted is dropped: the learn queue is a bounded
TF queue, so the env threads block on it, so the slots stop taking steps,
so clients wait -- `get_action` for its action, `log_action` once its
episode has `max_pending_steps` steps queued, `start_episode` is refused
(TooManyEpisodesError; 429 from a policy server) beyond `max_concurrent`
open episodes. What the process holds is therefore bounded by
`max_concurrent * max_pending_steps` queued steps (`num_pending_steps`),
one unroll per slot and the driver's bounded queues. (RLlib's sampler queue
grew without bound instead: ray-project/ray#30139.) Dropping was rejected:
it would silently bias the data toward whatever arrives when the learner
is idle, and a served client cannot tell that its steps were lost. The
client sees the pressure as latency; a wait beyond `action_timeout` closes
the episode (TimeoutError, 504; its still-queued steps are dropped, as for
a vanished client), so set `action_timeout` above the learner's longest
pause.
"""

import threading

import tensorflow as tf
from tf_agents.specs import array_spec, tensor_spec
from tf_agents.trajectories import time_step as ts

from alf_async.environments.external.episode_api import check_nest
from alf_async.environments.external.episodes import (EpisodeTable, ExternalEnvFinished,
                                                      ExternalEnvStoppedError, TooManyEpisodesError)
from alf_async.environments.external.external_slots import open_slots, slots_constructor

# The names users import from here; the exceptions, check_nest and
# open_slots live in episodes.py, episode_api.py and external_slots.py.
__all__ = ["ExternalEnv", "ExternalEnvFinished", "ExternalEnvStoppedError",
           "TooManyEpisodesError", "check_nest", "open_slots", "spec_from_gym_space",
           "specs_from_gym", "as_array_spec"]

# ------------------------------------------------------------------ specs


def spec_from_gym_space(space):
    """A tf-agents array spec (nest) for a gym space (see tf-agents' gym_wrapper)."""
    from tf_agents.environments import gym_wrapper  # pylint: disable=import-outside-toplevel
    return gym_wrapper.spec_from_gym_space(space)


def specs_from_gym(action_space, observation_space):
    """(action_spec, observation_spec) array specs for two gym spaces."""
    return spec_from_gym_space(action_space), spec_from_gym_space(observation_space)


def as_array_spec(spec, what):
    """`spec` (an ArraySpec or TensorSpec nest, or a gym space) as an ArraySpec nest."""
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


# ---------------------------------------------------------------- the env


class ExternalEnv(threading.Thread):
    """Base class: override `run()`; see the module docstring.

    All of its state lives in a private object, so subclasses may use any
    attribute names of their own.
    """

    def __init__(self, action_spec, observation_spec, max_concurrent=100, action_timeout=60.0,
                 episode_idle_timeout=None, max_pending_steps=64, name="external_env"):
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
            name: the thread's name.
        """
        super().__init__(name=name, daemon=True)
        self.__table = EpisodeTable(self, as_array_spec(action_spec, "action_spec"),
                                    as_array_spec(observation_spec, "observation_spec"),
                                    max_concurrent, action_timeout, episode_idle_timeout,
                                    max_pending_steps)
        self.action_array_spec = self.__table.action_array_spec
        self.observation_array_spec = self.__table.observation_array_spec

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
                the metrics, but the learner never trains on it (its
                transitions reach the learn queue only as inert boundaries,
                see capabilities.AppliedStep).

        Returns:
            The episode id.

        Raises:
            ValueError: the id was started before (open or finished).
            TooManyEpisodesError: `max_concurrent` episodes are open.
            ExternalEnvStoppedError: the env was stopped.
        """
        return self.__table.start_episode(episode_id, training_enabled)

    def get_action(self, episode_id, observation, timeout=None, reward=None):
        """Records an observation and returns the policy's action for it.

        Blocks until the policy acted (at most `timeout`, default
        `action_timeout`, seconds).

        `reward`, if given, is first added to the return of the episode's
        previous action, exactly as `log_returns(episode_id, reward)` would
        (checked the same way; a refused call changes nothing): the usual
        step -- reward of the last action, next observation -- is then one
        call, one HTTP round trip for a PolicyClient.

        Returns:
            The action, a nest of numpy values like the action spec.

        Raises:
            ValueError: unknown or finished episode, an observation that
                does not match the spec, or a reward that log_returns would
                refuse (then nothing is queued or added).
            TimeoutError: no action in time (the episode is then closed).
            ExternalEnvStoppedError: the env was stopped.
        """
        return self.__table.get_action(episode_id, observation, timeout, reward)

    def get_action_async(self, episode_id, observation, on_done, timeout=None, reward=None):
        """get_action for an event loop: queues the step without waiting for its action.

        `on_done(action, error)` is called exactly once, from whichever
        thread completes the call and under the ExternalEnv's lock (so it
        must only hand the result over, e.g. `loop.call_soon_threadsafe`):
        with the action, or with the exception get_action would raise
        (ValueError when the episode was closed, ExternalEnvStoppedError,
        TimeoutError once the returned PendingAction's `expire()` is called
        at or after its `deadline`: the episode is then closed).

        Returns:
            A PendingAction, or None when the step would have to wait for
                back-pressure (`max_pending_steps`): nothing was queued or
                added; call get_action on a thread that may block.

        Raises:
            Exception: what get_action raises before it waits (nothing is
                queued).
        """
        return self.__table.get_action_async(episode_id, observation, on_done, timeout, reward)

    def log_action(self, episode_id, observation, action, timeout=None):
        """Records an observation and the action the caller took (off-policy).

        Returns once the step is queued; blocks only while
        `max_pending_steps` steps of this episode wait for the driver.

        Raises:
            ValueError: unknown or finished episode, or an observation or
                action that does not match its spec (nothing is queued).
            TimeoutError: as get_action.
            ExternalEnvStoppedError: as get_action.
        """
        self.__table.log_action(episode_id, observation, action, timeout)

    def log_returns(self, episode_id, reward, info=None):
        """Adds `reward` to the return of the episode's last action.

        Rewards add up until the next action (or the end); none logged
        means 0.0. `info` is kept as the episode's last info (not sent to
        the learner).

        Raises:
            ValueError: unknown or finished episode, a reward that is not a
                finite number, or a reward before the episode's first action.
        """
        self.__table.log_returns(episode_id, reward, info)

    def end_episode(self, episode_id, observation, timeout=None):
        """Records the episode's last observation (a termination) and closes it.

        Blocks until its slot took the last step. An episode ended before
        any action produces no experience.

        Raises:
            ValueError: as get_action.
            TimeoutError: as get_action.
            ExternalEnvStoppedError: as get_action.
        """
        self.__table.end_episode(episode_id, observation, timeout)

    def abandon_episode(self, episode_id, timeout=None):
        """Closes an episode that has no last observation (e.g. a log cut short).

        Its queued steps still reach the driver; the episode then ends with a
        truncation (LAST, discount 1) repeating its last observation, and its
        last transition (whose outcome is unknown) is kept from the learner.
        Blocks like end_episode.
        """
        self.__table.abandon_episode(episode_id, timeout)

    # ---------------------------------------------------- driver integration

    def env_constructor(self, slots_per_env=1):
        """The driver's env constructor: each call makes `slots_per_env` slots.

        Args:
            slots_per_env: slots per constructed environment. 1: a batch-1
                TFPyEnvironment, one slot per env thread. K > 1: a
                TFPyEnvironment of batch K whose rows are K slots, which the
                env thread steps one by one, whichever have a client step
                ready (slot_stepper.py), so one env thread serves K episodes at
                once (and a request to the actor carries every slot ready).

        Raises:
            ValueError: slots_per_env is not an integer >= 1.
        """
        if isinstance(slots_per_env, bool) or not isinstance(slots_per_env, int) or \
                slots_per_env < 1:
            raise ValueError(f"slots_per_env must be an integer >= 1, got {slots_per_env!r}")
        return slots_constructor(self.__table, slots_per_env)

    def time_step_spec(self):
        """The slots' time step spec, as TensorSpecs (for building agents)."""
        return tensor_spec.from_spec(ts.time_step_spec(self.observation_array_spec))

    def action_spec(self):
        """The action spec, as (bounded) TensorSpecs."""
        return tensor_spec.from_spec(self.action_array_spec)

    # -------------------------------------------------------------- control

    def start(self):
        """Starts the `run()` thread; does nothing if it was started (or stopped)."""
        self.__table.start()

    def stop(self, reason="stop() was called"):
        """Stops: blocked and later calls raise ExternalEnvStoppedError. Idempotent.

        Any thread may call it; it does not join the `run()` thread (use
        `join()`).
        """
        self.__table.stop(reason)

    def join(self, timeout=None):
        """Joins the `run()` thread; returns at once if it was never started."""
        if self.__table.run_started:
            super().join(timeout)

    @property
    def run_started(self):
        return self.__table.run_started

    @property
    def stopped(self):
        return self.__table.stop_event.is_set()

    def wait_stopped(self, timeout=None):
        """Blocks until `stop()` (or a failure); returns True if stopped."""
        return self.__table.stop_event.wait(timeout)

    @property
    def num_open_episodes(self):
        return self.__table.num_open_episodes

    @property
    def num_pending_steps(self):
        """Steps the clients queued that no slot has taken yet (all episodes);
        at most `max_concurrent * max_pending_steps` (see "Memory under load")."""
        return self.__table.num_pending_steps
