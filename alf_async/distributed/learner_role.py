"""The learner role: `Collectors.count > 0` (collectors act, the learner only learns).

    alf-async-train --root_dir R --gin_file gin_configs/dqn_cartpole_distributed.gin

With `Collectors.count = K > 0`, `train()` builds, instead of an
AsyncOffPolicyDriver stepping environments in this process:

- a `LearnerServer`: one Reverb server in this process with three tables,
  the replay table (`reverb_replayer.replay_table` with the full two-sided
  `SampleToInsertRatio`: collectors insert, the learner samples, each side
  waits for the other), the variable table (`server_link.variable_table`:
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

This module wires them (`build`); `LearnerServer`, `VariablePushHook` and
`AddressAnnouncement` live in learner_server.py, `ReplayFeed` in
replay_feed.py and its health scalars in feed_health.py.

Threads: everything here runs on the learner's thread except
`ReplayFeed.stop()` (any thread; it stops the collectors, which blocks up
to the launcher's grace period) and the launcher's monitor thread (see
launcher.py).
"""

import os

import gin
import reverb
import tensorflow as tf

from alf_async import roles
from alf_async.distributed import launcher
# The run's gin files bind its collectors' settings too (collect.*): registered here.
from alf_async.distributed import collector  # noqa: F401  pylint: disable=unused-import
from alf_async.distributed.learner_server import (ADDRESS_FILE, AddressAnnouncement,
                                                  LearnerServer, VariablePushHook,
                                                  previous_port)
from alf_async.distributed.replay_feed import ReplayFeed
from alf_async.distributed.reverb_replayer import REPLAY_TABLE, ReverbReplayer, window_spec
from alf_async.distributed.server_link import policy_variables
from alf_async.learning import agents, policy_lag
# Re-exported: tests read it from this module.
from alf_async.distributed.learner_server import exposure_line  # noqa: F401

# The run's whole gin config (gin.config_str()), which the local collectors read.
CONFIG_FILE = "collector_config.gin"


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
