"""A collector: an AsyncOffPolicyDriver with local inference that writes its
unrolls to a learner's Reverb server and pulls the policy's variables from it.

    collector = build_collector('localhost:8000', stop_event)   # gin-configured
    collector.run()

The learner's server holds two tables: the replay table
(`reverb_replayer.replay_table`, both sides rate limited) and a variable
table (`variable_table`: max_size 1, the latest policy variables and the
train step, as tf-agents' distributed SAC keeps them). The collector builds
the same agent as the learner (from the same gin file) for its
`collect_policy`, pulls the variables before acting and then every
`variable_update_interval` seconds with tf-agents' `ReverbVariableContainer`,
and writes every env row as its own stream with `RowWriters` (streams are
per writer, so collectors never join each other's steps either).

A learner of an agent that trains on unrolls (PPO, IMPALA) holds a queue
of unrolls instead of the replay table (`reverb_replayer.unroll_table`,
under the same name). The collector sees that in the table's info (each
item sampled once, FIFO) and its signature (items of T + 1 steps); it
then acts with `policy_lag.TrainStepStampedPolicy(agent.collect_policy,
train_step)`, train_step being the one it pulls with the variables, and
writes an item of each row's last T + 1 steps every T steps (consecutive
items share one step). `collect.unroll_length` (how its driver cuts
unrolls) is independent of T.

The collection loop is a `Learner` with no agent: it takes the driver's
batches (for the writers) until stopped; `VariablePullHook` pulls (on a
helper thread, while collection goes on) and then reports the collector's
episode metrics to the learner (`StatsReporter`:
one item in the server's `collector_stats` queue table, which the learner
drains into its own NumberOfEpisodes / EnvironmentSteps / AverageReturn /
AverageEpisodeLength); with `summary_dir` the collector also writes its
own summaries there (`CollectorSummaryHook`).

Threads: `run()` on the caller's thread (it blocks in the driver's
`run_async()`, and after each batch until the server confirmed all but
the last unroll of each row's items: the rate limiter holds inserts while
the learner is behind, which is what holds collection to the learner's
pace); `stop_event.set()` from any thread (a signal handler) ends it at
the end of an iteration (a wait for the server wakes every 0.2 s for it).
"""

import time

import gin
import reverb
import tensorflow as tf
from tf_agents.experimental.distributed import reverb_variable_container

from alf_async import settings
from alf_async.learning import agents  # also registers the agents with gin
from alf_async.driver import AsyncOffPolicyDriver
from alf_async.environments import suites
from alf_async.learning.learner import Hook, Learner
from alf_async.learning.scalar_summaries import ScalarSummaries, metric_points
from alf_async.learning.policy_lag import TrainStepStampedPolicy
from alf_async.distributed.reverb_replayer import REPLAY_TABLE, RowWriters, is_unroll_queue
from alf_async.distributed.collector_stats import STATS_TABLE, StatsReporter
from alf_async.distributed.server_link import (CONNECTION_ERRORS, VARIABLE_TABLE, ServerWatch,
                                               VariablePullHook, policy_variables,
                                               wait_for_server)
# Re-exported: tests and bin/collect.py read these names from this module.
from alf_async.distributed.collector_stats import STATS_SIGNATURE, stats_table  # noqa: F401
from alf_async.distributed.server_link import (POLICY_KEY, TRAIN_STEP_KEY,  # noqa: F401
                                               UnreachableError, variable_table)


def table_sequence_length(client):
    """The replay table's window length (its signature's leading dimension)."""
    signature = client.server_info(timeout=5)[REPLAY_TABLE].signature
    return int(tf.nest.flatten(signature)[0].shape[0])


def _check_unconfirmed_unrolls(value):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"collect.unconfirmed_unrolls must be an int >= 1, got {value!r}")


class PacedWrite(object):
    """The driver's exp_observer: writes the unroll rows, then waits (on the
    collection loop's thread, waking every 0.2 s for `stop_event`) until
    each row has at most `unconfirmed_unrolls` unrolls' items
    (`unroll_length` / the writers' period, rounded up, each) unconfirmed
    by the server, so that a rate limiter holding inserts back (a full
    queue) holds collection back too; while it waits, `watch` raises
    `UnreachableError` once the server has been gone for its deadline.
    With 1 the collector waits a round trip after every unroll; more keep
    that many unrolls in flight, for a link with a long round trip."""

    def __init__(self, writers, unroll_length, stop_event, watch, unconfirmed_unrolls=1):
        _check_unconfirmed_unrolls(unconfirmed_unrolls)
        self._writers = writers
        self._pending = unconfirmed_unrolls * -(-unroll_length // writers.period)
        self._stop_event = stop_event
        self._watch = watch

    def __call__(self, exp, env_ids):
        self._writers.write(exp, env_ids)
        self._writers.wait(self._pending, self._stop_event, on_timeout=self._watch.check)


class CollectorSummaryHook(Hook):
    """The collector's own summaries (the driver's metrics under tf-agents'
    tags, against the learner's train step it last pulled) every
    `interval_secs` and at the end (the collection loop's thread)."""

    def __init__(self, writer, train_step, interval_secs=10.0):
        self._summaries = ScalarSummaries(writer)
        self._train_step = train_step
        self._interval = interval_secs
        self._last = time.monotonic()

    def after_iteration(self, learner, train_step_before, train_step):
        if time.monotonic() - self._last >= self._interval:
            self._write(learner)

    def end(self, learner, stopped_by):
        self._write(learner)
        self._summaries.flush()

    def _write(self, learner):
        driver = learner.driver
        self._summaries.write(metric_points(driver.get_metrics(), driver.get_step_metrics(),
                                            int(self._train_step.numpy())))
        self._last = time.monotonic()


class Collector(object):
    """One collection process's pieces; `run()` collects until stopped."""

    def __init__(self, learner, writers, pull_hook, train_step, client=None,
                 stop_event=None, watch=None):
        self.learner = learner
        self.writers = writers
        self.pull_hook = pull_hook
        self.train_step = train_step
        self._client = client
        self._stop_event = stop_event
        self._watch = watch

    def run(self, num_iterations=None):
        """Waits (interruptibly) until the learner pushed variables once,
        pulls them, collects until `stop_event` (or `num_iterations`),
        closes the writers; returns why it stopped."""
        try:
            if not self._wait_for_variables():
                return "stop_event"
            self.pull_hook.pull()
            return self.learner.run(num_iterations=num_iterations)
        finally:
            self.writers.close()

    def _wait_for_variables(self, poll_secs=0.1):
        """A pull blocks inside Reverb until the variable table has an item
        (a learner still starting up): wait for it here, where a stop can
        end the wait. False if stopped first."""
        if self._client is None or self._stop_event is None:
            return True
        while not self._variables_pushed():
            if self._stop_event.wait(poll_secs):
                return False
        return True

    def _variables_pushed(self):
        try:
            return self._client.server_info(timeout=2)[VARIABLE_TABLE].current_size >= 1
        except CONNECTION_ERRORS:
            if self._watch is not None:
                self._watch.check()  # raises UnreachableError after its deadline
            return False


@gin.configurable
def collect(replay_address, stop_event, task=None, layout=None, unroll_length=8,
            rows_per_batch=None, sequence_length=None, unconfirmed_unrolls=1,
            variable_update_interval=1.0, connect_deadline_secs=60.0, seed=None,
            collector_id=0, summary_dir=None, summary_interval_secs=10.0, print_fn=print):
    """Builds a `Collector` writing to `replay_address` (gin: `collect.*`;
    the agent's own bindings are the learner's).

    The collector runs the learner's `Task` and a `Layout` of its own, each
    built from gin in the scope `collect`: `collect/Layout.env_threads = 2`
    binds this collector's env threads, and a field it leaves unbound is
    the learner's (`Task.env_name`, `Task.agent_fn`, ...).

    Args:
        replay_address: 'host:port' of the learner's Reverb server.
        stop_event: a `threading.Event` that ends `run()`.
        task: a `settings.Task` (None: `collect/Task` from gin); its
            replayer_fn is not used.
        layout: a `settings.Layout` of this collector's env threads and rows
            (None: `collect/Layout` from gin).
        unroll_length: steps per unroll of its driver.
        rows_per_batch: rows in each batch its driver hands the writers; a
            multiple of the layout's rows_per_env_thread (None: one env
            thread's rows).
        sequence_length: steps per replay item (the learner's
            `ReverbReplayer.sequence_length`); None: the replay table's
            (its signature's leading dimension). A queue of unrolls'
            items (T + 1 steps) are written every T steps.
        unconfirmed_unrolls: unrolls per row written and not yet confirmed
            by the server before the collector waits (1: a round trip per
            unroll; more for a link with a long round trip, which then
            needs the room in `replay_table.error_buffer`).
        variable_update_interval: seconds between variable pulls (and
            stats reports, if the server has a `collector_stats` table).
        connect_deadline_secs: how long to retry an unreachable server (at
            start, and once collecting: then `run()` raises UnreachableError).
        seed: seeds TF's global generator and the environments (None: unseeded).
        collector_id: this collector's number (its reports carry it; the
            learner's launcher sets it).
        summary_dir: where the collector writes its own summaries (None: none).
        summary_interval_secs: seconds between those summaries.
        print_fn: callable(str) for the retry lines.

    Raises:
        UnreachableError: no server at `replay_address` by the deadline.
        ValueError: the table does not fit the agent (a queue of unrolls
            for an agent that trains on a replay table, or the reverse), or
            `rows_per_batch` is not a whole number of env threads' rows.
    """
    _check_unconfirmed_unrolls(unconfirmed_unrolls)  # before any connection
    with gin.config_scope("collect"):
        task = task or settings.Task()
        layout = layout or settings.Layout()
    learn_queue_cap = layout.unrolls_per_batch(rows_per_batch or layout.rows_per_env_thread,
                                               scope="collect/")
    client = wait_for_server(replay_address, connect_deadline_secs, print_fn)
    if sequence_length is None:
        sequence_length = table_sequence_length(client)
    info = client.server_info(timeout=5)
    has_stats = STATS_TABLE in info
    queue = is_unroll_queue(info[REPLAY_TABLE])
    if seed is not None:
        tf.random.set_seed(seed)
    spec_env = suites.load(task.suite, task.env_name, batch_size=1)
    try:
        train_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="train_step")
        agent = task.agent_fn(spec_env.time_step_spec(), spec_env.action_spec(), train_step)
        agent.initialize()
    finally:
        spec_env.close()
    policy = agent.collect_policy
    if queue != agents.trains_on_unrolls(agent):
        raise ValueError(
            f"the learner's table at {replay_address} is "
            f"{'a queue of unrolls' if queue else 'a replay table'} but this collector's "
            f"{type(agent).__name__} trains on {'a replay table' if queue else 'unrolls'}: "
            f"run the collector with the learner's gin file")
    if queue:
        # Stamped with the train step its variables were pulled at (the policy lag).
        policy = TrainStepStampedPolicy(policy, train_step)
    writers = RowWriters(reverb.Client(replay_address), sequence_length,
                         period=sequence_length - 1 if queue else 1)
    watch = ServerWatch(client, replay_address, connect_deadline_secs, print_fn)
    driver = AsyncOffPolicyDriver(
        task.make_env_constructor(task.suite, task.env_name,
                                  batch_size=layout.rows_per_env_thread, seed=seed),
        policy, num_envs=layout.env_threads, num_actor_queues=layout.actor_queues,
        unroll_length=unroll_length, actor_queue_cap=layout.actor_queue_cap,
        learn_queue_cap=learn_queue_cap,
        exp_observers=[PacedWrite(writers, unroll_length, stop_event, watch,
                                   unconfirmed_unrolls)])
    container = reverb_variable_container.ReverbVariableContainer(
        replay_address, table_names=[VARIABLE_TABLE])
    reporter = (StatsReporter(client, collector_id, driver.get_metrics(), train_step)
                if has_stats else None)
    hook = VariablePullHook(container, policy_variables(agent.collect_policy, train_step),
                            variable_update_interval, reporter, watch)
    hooks = [hook]
    if summary_dir:
        hooks.append(CollectorSummaryHook(tf.summary.create_file_writer(summary_dir),
                                          train_step, summary_interval_secs))
    learner = Learner(None, driver, hooks=hooks, stop_event=stop_event)
    return Collector(learner, writers, hook, train_step, client, stop_event, watch)
