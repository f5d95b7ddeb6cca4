"""A collector's link to the learner's Reverb server: reaching it, knowing
that it still answers, and the variable table it pulls the policy's
variables from.

- `wait_for_server`: retries an unreachable server with doubling backoff
  until a deadline (`UnreachableError`).
- `ServerWatch`: whether the server still answers, and when it has not
  for too long (a learner that stopped).
- `variable_table` (max_size 1: the latest policy variables and the train
  step, as tf-agents' distributed SAC keeps them), `policy_variables`
  (the nest it holds) and `VariablePullHook`, which pulls it every
  `interval_secs` on a helper thread while collection goes on.
"""

import threading
import time

import reverb
import tensorflow as tf
from tf_agents.experimental.distributed import reverb_variable_container

from alf_async.distributed.reverb_replayer import REPLAY_TABLE
from alf_async.learning.learner import Hook


VARIABLE_TABLE = "variables"
POLICY_KEY = reverb_variable_container.POLICY_KEY
TRAIN_STEP_KEY = reverb_variable_container.TRAIN_STEP_KEY


class UnreachableError(RuntimeError):
    """The server did not answer before the deadline."""


# What a Reverb client call raises when the server does not answer.
CONNECTION_ERRORS = (reverb.errors.DeadlineExceededError, RuntimeError, tf.errors.OpError)


def policy_variables(policy, train_step):
    """The nest the variable table holds: {policy: variables, train_step}."""
    return {POLICY_KEY: policy.variables(), TRAIN_STEP_KEY: train_step}


def variable_table(variables):
    """The table of the latest variables (max_size 1, readable once written)."""
    signature = tf.nest.map_structure(lambda v: tf.TensorSpec(v.shape, v.dtype), variables)
    return reverb.Table(VARIABLE_TABLE, sampler=reverb.selectors.Uniform(),
                        remover=reverb.selectors.Fifo(), max_size=1,
                        rate_limiter=reverb.rate_limiters.MinSize(1), signature=signature)


def wait_for_server(address, deadline_secs, print_fn, first_backoff_secs=0.5,
                    max_backoff_secs=8.0):
    """Returns once `address` answers `server_info` with the replay and
    variable tables; retries with doubling backoff, saying so, and raises
    `UnreachableError` after `deadline_secs`."""
    client = reverb.Client(address)
    start = time.monotonic()
    backoff = first_backoff_secs
    attempt = 1
    while True:
        try:
            info = client.server_info(timeout=1)  # seconds per attempt
            if REPLAY_TABLE in info and VARIABLE_TABLE in info:
                return client
            problem = f"no {REPLAY_TABLE!r} and {VARIABLE_TABLE!r} tables"
        except (reverb.errors.DeadlineExceededError, RuntimeError,
                tf.errors.OpError) as e:
            problem = type(e).__name__
        left = deadline_secs - (time.monotonic() - start)
        if left <= 0:
            raise UnreachableError(f"no Reverb server at {address} after "
                                   f"{deadline_secs:g} s ({attempt} attempts, last: {problem})")
        wait = min(backoff, max_backoff_secs, left)
        print_fn(f"[alf_async collector] {address} not reachable ({problem}), attempt "
                 f"{attempt}; retrying in {wait:.1f} s")
        time.sleep(wait)
        backoff *= 2
        attempt += 1


class ServerWatch(object):
    """Whether the learner's server still answers: `check()` returns True if
    it does, False if not (yet), and raises `UnreachableError` once it has
    not answered for `deadline_secs` (a learner that stopped: a collector
    started by hand then exits with one line). It says with `print_fn`
    when the server stops answering and when it answers again (`outages`
    counts them). Collection loop's thread; a check blocks at most 2 s."""

    def __init__(self, client, address, deadline_secs, print_fn=None):
        self._client = client
        self._address = address
        self._deadline = deadline_secs
        self._print = print_fn or (lambda line: None)
        self._lost_since = None
        self.outages = 0

    def check(self):
        try:
            self._client.server_info(timeout=2)
        except CONNECTION_ERRORS:
            now = time.monotonic()
            if self._lost_since is None:
                self._lost_since = now
                self.outages += 1
                self._print(f"[alf_async collector] {self._address} does not answer (outage "
                            f"{self.outages}); waiting up to {self._deadline:g} s")
            elif now - self._lost_since > self._deadline:
                raise UnreachableError(
                    f"lost the learner's server at {self._address}: no answer for "
                    f"{self._deadline:g} s") from None
            return False
        if self._lost_since is not None:
            self._print(f"[alf_async collector] {self._address} answers again after "
                        f"{time.monotonic() - self._lost_since:.1f} s (outage {self.outages})")
        self._lost_since = None
        return True


class VariablePullHook(Hook):
    """Pulls the policy's variables every `interval_secs`, then sends a
    stats report if there is a `reporter`.

    `pull()` (before acting) blocks until it is done. Later pulls overlap
    collection, as Acme's asynchronous `VariableClient` does: after an
    iteration at least `interval_secs` after the last pull began, a
    short-lived helper thread fetches the variables (a Reverb sample) and
    sends the report while collection goes on; the first iteration's end
    after the helper is done assigns what it fetched (local: no round
    trip) and raises its error, if any, with its type. On a link with a
    round trip of R, a blocking pull would stop collection for about 3 R
    (the liveness check, the sample, the report) each time.

    Threads: the collection loop's thread calls everything; fetches and
    reports run on the helper. A Reverb sample from a server that went
    away blocks for ever: while a fetch is in flight (and while `pull()`
    waits for one), `watch` is checked once a second, which raises
    `UnreachableError` after its deadline, leaving the daemon helper
    behind in a process that is about to exit. A pull blocks until the
    learner pushed once.
    """

    def __init__(self, container, variables, interval_secs, reporter=None, watch=None):
        self._container = container
        self._variables = variables
        self._interval = interval_secs
        self._reporter = reporter
        self._watch = watch
        self._last = time.monotonic()
        self._in_flight = None       # (helper thread, [outcome]) of a fetch under way
        self._checked = 0.0
        self.pulls = 0

    def pull(self):
        """Fetches and assigns the variables (and reports), blocking."""
        self._last = time.monotonic()
        self._assign(self._wait(self._start(self._fetch)))

    def after_iteration(self, learner, train_step_before, train_step):
        now = time.monotonic()
        if self._in_flight is not None:
            running = self._in_flight
            if running[1]:   # the helper put its outcome: _wait returns at once
                self._in_flight = None
                self._assign(self._wait(running))
            elif self._watch is not None and now - self._checked >= 1.0:
                self._checked = now
                self._watch.check()   # raises UnreachableError after its deadline
        elif now - self._last >= self._interval:
            self._last = self._checked = now
            self._in_flight = self._start(self._fetch)

    def end(self, learner, stopped_by):
        if self._in_flight is not None:   # the fetch under way ends (or the watch gives up)
            running, self._in_flight = self._in_flight, None
            self._assign(self._wait(running))
        if self._reporter is not None and self._watch is not None and self._watch.check():
            self._wait(self._start(self._reporter.report))

    def _fetch(self):
        """On the helper: the variables' latest values, then the report."""
        values = self._container.pull(VARIABLE_TABLE)
        if self._reporter is not None:
            self._reporter.report()
        return values

    @staticmethod
    def _start(fn):
        """Runs `fn` on a helper thread; returns (the thread, a list that
        gets `fn`'s (result, None) or (None, its error))."""
        outcome = []

        def target():
            try:
                outcome.append((fn(), None))
            except BaseException as e:  # pylint: disable=broad-except  (raised in _wait)
                outcome.append((None, e))

        helper = threading.Thread(target=target, name="variable_pull", daemon=True)
        helper.start()
        return helper, outcome

    def _wait(self, running):
        """Joins a `_start`ed helper, checking `watch` every second; returns
        its result or raises its error."""
        helper, outcome = running
        while not outcome:
            helper.join(1.0)
            if not outcome and self._watch is not None:
                self._watch.check()
        result, error = outcome[0]
        if error is not None:
            raise error
        return result

    def _assign(self, values):
        # ReverbVariableContainer.update's assignment, which it keeps private.
        tf.nest.assert_same_structure(self._variables, values, check_types=False)
        for variable, value in zip(tf.nest.flatten(self._variables), tf.nest.flatten(values)):
            variable.assign(value)
        self.pulls += 1
