"""The roles of a run, named: what each part must do to take its place.

A part takes a role by subclassing its class here; code that needs the
role checks it with `isinstance` (or `issubclass` on a factory that is a
class), never by probing attributes. The roles, as acme's `core.py` names
its actors, learners and variable sources:

- `BatchSource`: what the `Learner` pulls batches of experience from. The
  `AsyncOffPolicyDriver` in this process, or a Reverb feed filled by
  collector processes (`alf_async.distributed.learner_role.ReplayFeed`).
- A replayer: what the learner samples its train batches from
  (`alf_async.learning.replayers.Replayer` is its base class). Three
  optional capabilities, each a class here:
  - `CheckpointedReplay`: its storage lives outside TF's checkpoint and is
    checkpointed with the agent (Reverb's own checkpointer);
  - `ScheduledReplay`: it can refuse a train schedule it would stall on
    (a rate limiter);
  - `ClosableReplay`: it owns resources (a server) that the run closes.
- `UnrollAgent`: an agent that trains on each batch of unrolls once
  (tf-agents' PPO agents, IMPALA) rather than on a replay buffer's
  windows; the run then wires a one-time replayer and refuses what such an
  agent cannot use.
- `RowStepper`: what steps the rows of a batched environment one by one,
  each as soon as its action comes, for the env thread that owns it
  (the driver's row workers; ExternalEnv's slots; child processes;
  EnvPool's asynchronous pools).

This module imports nothing of alf_async: every layer may use it.
"""

import abc
import functools


class BatchSource(abc.ABC):
    """What the `Learner` pulls batches of experience from.

    Threads: `start`, `run_async`, `get_metrics`, `get_step_metrics` and
    `health` are called on the learner's thread; `stop` from any thread, and
    more than once. `run_async` blocks until a batch is ready and raises
    `alf_async.driver.DriverStoppedError` once `stop` was called.
    """

    @abc.abstractmethod
    def start(self):
        """Starts collecting (threads, processes)."""

    @abc.abstractmethod
    def run_async(self):
        """Waits for the next batch and hands it to the experience observers.

        Returns:
            The env steps the batch brought (int).
        """

    @abc.abstractmethod
    def stop(self):
        """Stops collecting and raises again the first error of a worker."""

    @abc.abstractmethod
    def get_metrics(self):
        """The tf-agents metrics of the experience (AverageReturn, ...)."""

    @abc.abstractmethod
    def get_step_metrics(self):
        """The step metrics (NumberOfEpisodes, EnvironmentSteps)."""

    @abc.abstractmethod
    def health(self):
        """An object whose `scalars(train_step)` gives {tag: value} of the
        source's health (Perf/, Queues/, Env/), for summaries."""


class CheckpointedReplay(abc.ABC):
    """A replayer whose storage lives outside TF's checkpoint.

    Its constructor takes `checkpoint_dir`, where its storage's checkpoints
    go (`root_dir/replay`), and `checkpoint()` writes one; the run calls it
    whenever it checkpoints the agent, so both restore together.
    """

    @abc.abstractmethod
    def checkpoint(self):
        """Writes the storage's checkpoint; returns its path."""


class ScheduledReplay(abc.ABC):
    """A replayer that refuses a train schedule it would stall on."""

    @abc.abstractmethod
    def check_schedule(self, samples_per_iteration, inserts_per_iteration):
        """Raises ValueError, saying which setting to change, unless an
        iteration of `samples_per_iteration` samples against
        `inserts_per_iteration` inserted steps can run."""


class ClosableReplay(abc.ABC):
    """A replayer that owns resources (a server, a port) the run closes."""

    @abc.abstractmethod
    def close(self):
        """Frees its resources; safe to call more than once."""


class UnrollAgent(abc.ABC):
    """A TFAgent that trains on each batch of unrolls once, as it comes.

    Subclass it (`impala.ImpalaAgent` does) or register a class you cannot
    change (`UnrollAgent.register(PPOAgent)`: alf_async.learning.agents
    registers tf-agents' PPO agents). A marker: no methods.
    """


class RowStepper(abc.ABC):
    """Steps the rows of a batched environment one by one for its env thread.

    Every row is a continuous stream with tf-agents' semantics: after a LAST
    comes the FIRST of the row's next episode (its action ignored, reward 0,
    discount 1).

    Threads: every method is called by the env thread that owns the
    environment. `recv` blocks at most `timeout` seconds while nothing is in
    flight, and otherwise no longer than the rows in flight take to step,
    so the env thread sees a stop between calls.
    """

    @abc.abstractmethod
    def start(self):
        """Resets every row; each reports once its first time step came."""

    @abc.abstractmethod
    def send(self, rows, actions):
        """Steps each row of `rows` (0..batch_size-1, each once) with its
        action of `actions` (the action nest batched over `rows`); returns
        without waiting for them."""

    @abc.abstractmethod
    def recv(self, timeout):
        """The rows whose reset or step came since the last call.

        Returns:
            [(row, None or a `capabilities.RowFailed`), ...], possibly empty.
        """

    @abc.abstractmethod
    def close(self, wait=True):
        """Forgets the rows in flight; no more calls follow but `join`."""

    def join(self, timeout):
        """Waits for threads of its own, if it has any (none by default)."""


def factory_class(factory):
    """The class `factory` builds (unwrapping `functools.partial`), or None
    when it is not a class: a role of what a factory builds is then read
    from its class with `issubclass`."""
    while isinstance(factory, functools.partial):
        factory = factory.func
    return factory if isinstance(factory, type) else None
