"""The learner role: `Collectors.count > 0` (collectors act, the learner only learns).

    alf-async-train --root_dir R --gin_file gin_configs/dqn_cartpole_distributed.gin

With `Collectors.count = K > 0`, `train()` builds, instead of an
AsyncOffPolicyDriver stepping environments in this process:

- a `LearnerServer`: one Reverb server in this process with three tables,
  the replay table (`reverb_replayer.replay_table` with the full two-sided
  `SampleToInsertRatio`: collectors insert, the learner samples, each side
  waits for the other), the variable table (`collector.variable_table`:
  the latest policy variables and train step) and the `collector_stats`
  queue (the collectors' metric reports). It is checkpointed under
  `root_dir/replay` with the agent's checkpoints and restored from there on
  resume (items, rate limiter counts, variables). Reverb binds its port on
  every interface (`[::]:PORT`) and authenticates no one; `AddressAnnouncement`
  says so in one line at start (`exposure_line`). Collectors on other
  machines reach it at `HOST:PORT` where HOST is this machine's name
  (`socket.gethostname()`, or `LearnerServer.advertised_host` where that
  name does not resolve from the collectors' machines); the port is
  `LearnerServer.port`, or a free one (portpicker). With local collectors
  only (`Collectors.launcher = 'local'`, no `advertised_host`) the
  address announced is `localhost:PORT`. `AddressAnnouncement` prints it on
  one line, `[alf_async] collectors connect to HOST:PORT`, and writes it
  (one line) to `root_dir/replay_address`;
- a `ReverbReplayer` on that server (the learner samples windows of the
  agent's train_sequence_length);
- a `ReplayFeed`, which takes the driver's place in the `Learner`: it
  starts and stops the K collectors (`launcher.launch_collectors`),
  and its `run_async()` waits (polling the server, interruptible by
  `stop()`) until the rate limiter will let one iteration's samples
  through, so that the train step never blocks inside TensorFlow; it
  returns the env steps the collectors reported meanwhile and keeps the
  learner's NumberOfEpisodes / EnvironmentSteps / AverageReturn /
  AverageEpisodeLength from their reports (progress lines and summaries
  show the collectors' exploring policy, as in one process);
- a `VariablePushHook`: pushes the policy's variables and the train step to
  the variable table when the learner begins (after a resume: the restored
  ones), every `VariablePushHook.interval_secs` (default 0.5 s, half the
  collectors' default `collect.variable_update_interval`, so that a pull
  sees variables at most ~1.5 s old) and at the end.

Training starts once the table holds `replay_table.min_size` items (the
rate limiter's minimum; `Schedule.initial_collect_steps` counts the env steps
the collectors reported). Evaluation, checkpoints, summaries,
`stop_at_eval_return` and the progress lines are the single-process run's.

Agents that train on each batch of unrolls once (`agents.trains_on_unrolls`:
PPO, IMPALA) get a queue of unrolls instead of the replay table
(`reverb_replayer.unroll_table`, under the replay table's name, so the
health summaries and the collectors find it there): its items are
`Schedule.unroll_length` + 1 steps of one env row, stamped with the train
step the collector's variables were pulled at
(`policy_lag.TrainStepStampedPolicy`), consecutive items of a row sharing
one step. The replayer is `PolicyLag(ReverbReplayer(...))`, each sample
`Schedule.rows_per_batch` items (the rows of one
process's batch), and `ReplayFeed.run_async` waits until the queue holds
them plus the items the dataset may fetch ahead. The queue is not
checkpointed (a resumed learner trains on what its new collectors bring).

Threads: everything here runs on the learner's thread except
`ReplayFeed.stop()` (any thread; it stops the collectors, which blocks up
to the launcher's grace period) and the launcher's monitor thread (see
launcher.py).
"""

import os
import socket
import threading
import time
import types

import gin
import numpy as np
import portpicker
import reverb
import tensorflow as tf
from tf_agents.experimental.distributed import reverb_variable_container

from alf_async import roles
from alf_async.distributed import launcher
from alf_async.driver import metrics as metrics_lib
from alf_async.distributed.collector import (STATS_TABLE, VARIABLE_TABLE, policy_variables, stats_table,
                                 variable_table)
from alf_async.driver import DriverStoppedError
from alf_async.driver.health import RateInterval
from alf_async.learning import agents, policy_lag
from alf_async.learning.learner import Hook
from alf_async.tf215_py311_fixes import quiet
from alf_async.distributed.reverb_replayer import (REPLAY_TABLE, ReverbReplayer,
                                                   is_unroll_queue, replay_table,
                                                   unroll_table, window_spec)

ADDRESS_FILE = "replay_address"
# The run's whole gin config (gin.config_str()), which the local collectors read.
CONFIG_FILE = "collector_config.gin"


@gin.configurable
class LearnerServer(object):
    """The learner's Reverb server (see module docstring). Built and stopped
    by the trainer's thread; Reverb serves on its own threads.

    Args:
        data_spec: one step's nest of TensorSpecs (agent.collect_data_spec).
        sequence_length: steps per replay item.
        variables: the nest `collector.policy_variables` pushes.
        checkpoint_dir: Reverb's checkpoints (restored at start if any).
        port: the port (None: `previous_port` if it is free, else a free one).
        advertised_host: the host name collectors use (None: socket.gethostname()).
        unrolls: a queue of unrolls (`unroll_table`) instead of the replay table.
        previous_port: the port of the run's last learner (`previous_port()`
            of its root_dir), tried first when `port` is None, so that
            collectors started by hand come back to a resumed learner.

    Attributes:
        address: 'HOST:PORT' for collectors anywhere.
        local_address: 'localhost:PORT' for this machine's collectors.
        advertised: whether `advertised_host` was given (remote collectors
            chosen explicitly).
        moved_from: `previous_port` if it was taken (the server then
            listens on another), else None.
    """

    def __init__(self, data_spec, sequence_length, variables, checkpoint_dir, port=None,
                 advertised_host=None, unrolls=False, previous_port=None):
        table = (unroll_table(data_spec, sequence_length) if unrolls else
                 replay_table(data_spec, sequence_length, learner_in_process=False))
        tables = [table, variable_table(variables), stats_table()]
        self.moved_from = None
        if port is None and previous_port:
            # Checked with a plain bind first: gRPC binds with SO_REUSEPORT,
            # so it would share the port with a learner still holding it.
            if portpicker.is_port_free(previous_port):
                port = previous_port
            else:
                self.moved_from = previous_port
        port = port or portpicker.pick_unused_port()
        try:
            with quiet.reverb_info_dropped():
                self.server = reverb.Server(
                    tables, port=port, checkpointer=reverb.checkpointers.DefaultCheckpointer(
                        checkpoint_dir))
        except ValueError as e:  # gRPC could not bind (Reverb says only that)
            raise ValueError(f"the learner's Reverb server cannot listen on port {port} "
                             f"(LearnerServer.port; in use?): {e}") from e
        self.port = self.server.port
        self.advertised = advertised_host is not None
        self.address = f"{advertised_host or socket.gethostname()}:{self.port}"
        self.local_address = f"localhost:{self.port}"

    def stop(self):
        if self.server is not None:
            with quiet.reverb_info_dropped():
                self.server.stop()
            self.server = None


class ReportedCount(metrics_lib.CounterMetric):
    """A count summed from the collectors' reports (checkpointed like the driver's)."""

    def add(self, n):
        with self._lock:
            self._count += int(n)


class ReportedAverage(metrics_lib.AsyncStepMetric):
    """The mean of each collector's latest reported average (over its last
    10 episodes); collectors that never finished an episode are left out."""

    def __init__(self, name):
        super().__init__(name)
        # In a namespace: a dict attribute of a tf.Module would be wrapped for tracking.
        self._state = types.SimpleNamespace(latest={})

    def set(self, collector_id, value):
        with self._lock:
            self._state.latest[str(int(collector_id))] = float(value)

    def _result(self):
        values = list(self._state.latest.values())
        return np.float32(np.mean(values)) if values else np.float32(0.0)

    def _reset(self):
        self._state.latest = {}

    def _get_state(self):
        return {"latest": dict(self._state.latest)}

    def _set_state(self, state):
        self._state.latest = {k: float(v) for k, v in state["latest"].items()}


class ReplayFeed(roles.BatchSource):
    """The driver's stand-in for a learner fed by collectors (module docstring).

    Args:
        client: a `reverb.Client` of the learner's server.
        samples_per_iteration: train_steps_per_iteration x sample_batch_size
            (from a queue of unrolls: the items of one batch).
        samples_in_flight: what the replayer's dataset may request ahead
            (from a queue: items it may already have taken out; the feed
            waits for them in the queue too, so the train step never does).
        collectors: the launcher (`launcher.LocalCollectors` or
            `RayCollectors`), not started.
        poll_secs: seconds between polls of the server while waiting.
        train_step: the learner's train step variable; with it, each report's
            `policy_step` gives that collector's variable age (train steps
            behind the learner when the report is read, `variable_ages`).

    Threads: `start`, `run_async`, `get_metrics`, `get_step_metrics`,
    `health` on the learner's thread; `stop()` from any thread (idempotent;
    a `run_async` waiting meanwhile raises `DriverStoppedError`).
    `run_async` blocks until the table can serve an iteration's samples,
    raising the launcher's error if collectors died beyond their budget.
    """

    def __init__(self, client, samples_per_iteration, samples_in_flight, collectors,
                 poll_secs=0.005, train_step=None):
        self._client = client
        self._needed = samples_per_iteration + samples_in_flight
        self._collectors = collectors
        self._poll = poll_secs
        self._stop = threading.Event()
        self._stop_lock = threading.Lock()
        self._stopped = False
        self._started = False
        self._pending_steps = 0
        self._last_samples = None
        self._episodes = ReportedCount("NumberOfEpisodes")
        self._env_steps = ReportedCount("EnvironmentSteps")
        self._return = ReportedAverage("AverageReturn")
        self._length = ReportedAverage("AverageEpisodeLength")
        self._train_step = train_step
        self._ages = {}  # {collector: train steps behind, at its latest report}

    @property
    def collectors(self):
        return self._collectors

    def check_schedule(self):
        """Raises ValueError unless the rate limiter's window (its error
        buffer on both sides) holds one iteration's samples plus those in
        flight: else the learner would wait for inserts the limiter refuses."""
        table = self._client.server_info(timeout=10)[REPLAY_TABLE]
        if is_unroll_queue(table):
            if table.max_size < self._needed:
                raise ValueError(
                    f"unroll_table.max_size {table.max_size} is too small for one batch: the "
                    f"learner waits for {self._needed} items (Schedule.rows_per_batch "
                    f"+ ReverbReplayer.max_in_flight_samples_per_worker); "
                    f"set unroll_table.max_size >= {self._needed}")
            return
        info = table.rate_limiter_info
        window = info.max_diff - info.min_diff
        if window < self._needed + info.samples_per_insert:
            raise ValueError(
                f"replay_table's error_buffer {window / 2:g} is too small for one iteration: "
                f"the learner needs {self._needed} samples (train_steps_per_iteration x "
                f"sample_batch_size + ReverbReplayer.max_in_flight_samples_per_worker) within "
                f"twice the error buffer; set replay_table.error_buffer >= "
                f"{(self._needed + info.samples_per_insert) / 2:g} or lower "
                f"Schedule.train_steps_per_iteration")

    def start(self):
        if self._stop.is_set():
            raise RuntimeError("the feed was stopped before it started")
        self._started = True
        self._collectors.start()

    def run_async(self):
        """Waits until one iteration's samples can be served; returns the
        env steps the collectors reported since the last call."""
        if self._last_samples is not None:
            # The learner did not sample last iteration (initial_collect_steps):
            # do not spin on the server.
            if self._samples() == self._last_samples:
                self._stop.wait(0.05)
        while True:
            if self._stop.is_set():
                raise DriverStoppedError("the learner's replay feed was stopped")
            self._collectors.check()
            info = self._client.server_info(timeout=10)
            self._drain(int(info[STATS_TABLE].current_size))
            if self._ready(info[REPLAY_TABLE]):
                steps, self._pending_steps = self._pending_steps, 0
                self._last_samples = info[REPLAY_TABLE].rate_limiter_info.sample_stats.completed
                return steps
            self._stop.wait(self._poll)

    def _samples(self):
        info = self._client.server_info(timeout=10)[REPLAY_TABLE]
        return info.rate_limiter_info.sample_stats.completed

    def _ready(self, table):
        limiter = table.rate_limiter_info
        if table.current_size < limiter.min_size_to_sample:
            return False
        diff = (limiter.insert_stats.completed * limiter.samples_per_insert -
                limiter.sample_stats.completed)
        return diff - self._needed >= limiter.min_diff

    def _drain(self, n):
        if n <= 0:
            return
        with quiet.reverb_info_dropped():  # a sampler's creation in the server's process
            samples = list(self._client.sample(STATS_TABLE, num_samples=n, emit_timesteps=False,
                                               unpack_as_table_signature=True))
        for sample in samples:
            report = {k: np.asarray(v).reshape(-1)[0] for k, v in sample.data.items()}
            self._episodes.add(report["episodes"])
            self._env_steps.add(report["env_steps"])
            self._pending_steps += int(report["env_steps"])
            if self._train_step is not None and "policy_step" in report:
                self._ages[int(report["collector"])] = (int(self._train_step.numpy()) -
                                                        int(report["policy_step"]))
            if report["episodes"] > 0 or report["average_return"] != 0:
                self._return.set(report["collector"], report["average_return"])
                self._length.set(report["collector"], report["average_length"])

    def variable_ages(self):
        """{collector id: how many train steps its variables were behind the
        learner's at its latest report} (empty without `train_step`)."""
        return dict(self._ages)

    def get_metrics(self):
        return [self._episodes, self._env_steps, self._return, self._length]

    def get_step_metrics(self):
        return [self._episodes, self._env_steps]

    def health(self):
        return FeedHealth(self._client, self._collectors, self.variable_ages)

    def stop(self):
        """Stops waiting and stops the collectors (blocks up to the launcher's
        grace period). Idempotent; any thread."""
        self._stop.set()
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
            if self._started:
                self._collectors.stop()


class FeedHealth(object):
    """`SummaryHook`'s health scalars for a `ReplayFeed`: Replay/size,
    Replay/inserts_per_sec, Replay/samples_per_sec, Replay/samples_per_insert
    (observed over the interval since the previous call at an earlier train
    step, `RateInterval`; a call at the same train step has none),
    Collectors/restarts, and with reports of the variables' train step,
    Collectors/variable_age (their mean over collectors, `variable_ages`)
    and Collectors/variable_age_max. `scalars` runs on the learner's thread
    and blocks for one `server_info` call at most."""

    def __init__(self, client, collectors, variable_ages=dict):
        self._client = client
        self._collectors = collectors
        self._variable_ages = variable_ages
        self._interval = RateInterval()

    def scalars(self, train_step):
        """Returns `{tag: value}` at `train_step`."""
        table = self._client.server_info(timeout=10)[REPLAY_TABLE]
        limiter = table.rate_limiter_info
        counts = (limiter.insert_stats.completed, limiter.sample_stats.completed)
        interval = self._interval.since(time.monotonic(), train_step, counts)
        scalars = {"Replay/size": table.current_size}
        if interval is not None:
            dt, _, old = interval
            inserts, samples = counts[0] - old[0], counts[1] - old[1]
            scalars["Replay/inserts_per_sec"] = inserts / dt
            scalars["Replay/samples_per_sec"] = samples / dt
            if inserts > 0:
                scalars["Replay/samples_per_insert"] = samples / inserts
        scalars["Collectors/restarts"] = self._collectors.restarts
        ages = list(self._variable_ages().values())
        if ages:
            scalars["Collectors/variable_age"] = float(np.mean(ages))
            scalars["Collectors/variable_age_max"] = max(ages)
        return scalars


@gin.configurable
class VariablePushHook(Hook):
    """Pushes the policy's variables and the train step to the variable
    table at `begin`, every `interval_secs` and at `end` (learner's thread;
    a push is one Reverb insert, which does not wait: the table keeps the
    latest item only)."""

    def __init__(self, address, variables, interval_secs=0.5):
        self._container = reverb_variable_container.ReverbVariableContainer(
            address, table_names=[VARIABLE_TABLE])
        self._variables = variables
        self._interval = interval_secs
        self._last = None
        self.pushes = 0

    def push(self):
        self._container.push(self._variables, VARIABLE_TABLE)
        self._last = time.monotonic()
        self.pushes += 1

    def begin(self, learner):
        self.push()

    def after_iteration(self, learner, train_step_before, train_step):
        if train_step > train_step_before and time.monotonic() - self._last >= self._interval:
            self.push()

    def end(self, learner, stopped_by):
        self.push()


def exposure_line(port, remote):
    """The line a learner prints at start about who can reach its Reverb
    port: Reverb binds every interface (`[::]:PORT`, not a choice its
    server offers) and authenticates no one. `remote`: collectors on other
    machines were chosen (`LearnerServer.advertised_host`, or a launcher
    other than 'local')."""
    reach = ("collectors on other machines use it: run them on a private network or "
             "through a tunnel" if remote else
             "the collectors are this machine's, yet Reverb cannot be kept off the other "
             "interfaces: firewall the port")
    return (f"[alf_async] the learner's Reverb port {port} is open on every interface with "
            f"no authentication (anyone who reaches it can insert experience, read the "
            f"policy's variables or drain the tables); {reach} (docs/distributed.md, "
            f"'Across a network')")


def previous_port(root_dir):
    """The port in root_dir/replay_address (the run's last learner), or None."""
    try:
        with open(os.path.join(root_dir, ADDRESS_FILE)) as f:
            return int(f.read().strip().rsplit(":", 1)[1])
    except (OSError, IndexError, ValueError):
        return None


class AddressAnnouncement(Hook):
    """Prints who can reach the learner's port (`exposure_line`) and the
    address collectors use, and writes that address to
    root_dir/replay_address, when the learner begins (learner's thread).

    Args:
        server: the `LearnerServer`.
        remote: collectors on other machines were chosen: the address is
            `server.address` (HOST:PORT), else `server.local_address`
            (localhost:PORT), which says no more than it should to whoever
            reads the output or root_dir.
        root_dir: the run's directory.
        print_fn: callable(str).
    """

    def __init__(self, server, remote, root_dir, print_fn):
        self._address = server.address if remote else server.local_address
        self._exposure = exposure_line(server.port, remote)
        self._path = os.path.join(root_dir, ADDRESS_FILE)
        self._print = print_fn

    def begin(self, learner):
        tf.io.gfile.makedirs(os.path.dirname(self._path))
        with open(self._path + ".tmp", "w") as f:
            f.write(self._address + "\n")
        os.replace(self._path + ".tmp", self._path)
        self._print(self._exposure)
        self._print(f"[alf_async] collectors connect to {self._address} (written to "
                    f"{self._path}): alf-async-collect --replay_address {self._address} "
                    f"--gin_file ...")


class Built(object):
    """What `build()` returns: the replayer the learner samples, the feed
    (the driver's place), the server, the hooks the trainer adds, and the
    `ReverbReplayer` that reads the server (`replayer` itself, or the one a
    `PolicyLag` wraps)."""


    def __init__(self, replayer, feed, server, hooks, reverb_replayer=None):
        self.replayer = replayer
        self.feed = feed
        self.server = server
        self.hooks = hooks
        self.reverb_replayer = replayer if reverb_replayer is None else reverb_replayer

    def close(self):
        """Stops the feed (collectors), the replayer and the server."""
        try:
            self.feed.stop()
        finally:
            self.reverb_replayer.close()
            self.server.stop()


def _check_restored_signature(restored, expected, checkpoint_dir):
    """A Reverb checkpoint brings back its tables' signatures over the ones
    the server was built with: refuse one that does not fit this config."""
    shapes = sorted((s.shape.as_list(), s.dtype.name) for s in tf.nest.flatten(restored))
    wanted = sorted((s.shape.as_list(), s.dtype.name) for s in tf.nest.flatten(expected))
    if shapes != wanted:
        steps = tf.nest.flatten(restored)[0].shape.as_list()[:1]
        raise ValueError(
            f"the replay table restored from {checkpoint_dir} does not fit this config "
            f"(windows of {steps[0] if steps else '?'} steps, this config's "
            f"{tf.nest.flatten(expected)[0].shape.as_list()[0]}; the environment, the "
            f"agent, DqnAgent.n_step_update or Schedule.unroll_length changed?): use a new "
            f"--root_dir to start fresh")


def build(root_dir, agent, replayer_fn, num_rows, num_collectors, launcher_name,
          samples_per_iteration, seed, print_fn, unroll_length=None, batch_rows=None):
    """Builds the learner role's pieces (collectors not started).

    Writes root_dir/collector_config.gin (the run's whole gin config) for
    the local collectors. Raises ValueError (a config error) if
    `replayer_fn` is not a Reverb replayer or the schedule does not fit the
    rate limiter (or the queue).

    For an agent that trains on unrolls (module docstring): the queue's
    items are `unroll_length` + 1 steps, and each sample `batch_rows` of
    them (Schedule.rows_per_batch); the replayer is
    then a `PolicyLag` over the `ReverbReplayer`.
    """
    replayer_class = roles.factory_class(replayer_fn)
    if not (replayer_class and issubclass(replayer_class, ReverbReplayer)):
        raise ValueError("Collectors.count > 0 needs Task.replayer_fn = @ReverbReplayer "
                         "(collectors write to the learner's Reverb server)")
    train_step = agent.train_step_counter
    variables = policy_variables(agent.collect_policy, train_step)
    unrolls = agents.trains_on_unrolls(agent)
    replayer_args = {}
    if unrolls:
        # Each step stamped with the train step its collector pulled (the policy lag).
        data_spec = policy_lag.TrainStepStampedPolicy(agent.collect_policy,
                                                      train_step).trajectory_spec
        length = unroll_length + 1
        replayer_args["sample_batch_size"] = batch_rows  # whatever Schedule.sample_batch_size says
        samples_per_iteration = batch_rows
    else:
        data_spec = agent.collect_data_spec
        length = agent.train_sequence_length or 2
    server = LearnerServer(data_spec, length, variables, os.path.join(root_dir, "replay"),
                           unrolls=unrolls, previous_port=previous_port(root_dir))
    if server.moved_from:
        print_fn(f"[alf_async] port {server.moved_from} of this run's last learner "
                 f"({os.path.join(root_dir, ADDRESS_FILE)}) is taken: listening on "
                 f"{server.port}; collectors started by hand need the new address")
    replayer = None
    try:
        table = reverb.Client(server.local_address).server_info(timeout=10)[REPLAY_TABLE]
        _check_restored_signature(table.signature, window_spec(data_spec, length),
                                  os.path.join(root_dir, "replay"))
        limiter = table.rate_limiter_info
        if limiter.insert_stats.completed:
            print_fn(f"[alf_async] replay restored from {os.path.join(root_dir, 'replay')}: "
                     f"{table.current_size} items ({limiter.insert_stats.completed} inserted, "
                     f"{limiter.sample_stats.completed} sampled in all)")
        replayer = replayer_fn(data_spec=data_spec, num_rows=num_rows, sequence_length=length,
                               server_address=server.local_address, **replayer_args)
        tf.io.gfile.makedirs(root_dir)
        config_path = os.path.join(root_dir, CONFIG_FILE)
        with open(config_path, "w") as f:
            f.write(gin.config_str())
        collectors = launcher.launch_collectors(
            launcher_name, num_collectors, server.local_address, config_path, root_dir,
            print_fn=print_fn, seed=seed)
        in_flight = replayer.max_in_flight_samples
        feed = ReplayFeed(replayer.client, samples_per_iteration, in_flight, collectors,
                          train_step=train_step)
        feed.check_schedule()
    except BaseException:
        if replayer is not None:
            replayer.close()
        server.stop()
        raise
    remote = server.advertised or launcher_name != "local"
    hooks = [VariablePushHook(server.local_address, variables),
             AddressAnnouncement(server, remote, root_dir, print_fn)]
    if unrolls:
        return Built(policy_lag.PolicyLag(replayer, train_step), feed, server, hooks,
                     reverb_replayer=replayer)
    return Built(replayer, feed, server, hooks)
