"""The learner's Reverb server and what it tells the collectors.

- `LearnerServer`: one Reverb server with the replay table (or the queue
  of unrolls), the variable table and the `collector_stats` queue,
  checkpointed under root_dir/replay, on `LearnerServer.port` or the run's
  previous port (`previous_port`) or a free one.
- `VariablePushHook`: pushes the policy's variables and the train step to
  the variable table.
- `AddressAnnouncement`: says who can reach the port (`exposure_line`)
  and where collectors connect, and writes that to root_dir/replay_address.
"""

import os
import socket
import time

import gin
import portpicker
import reverb
import tensorflow as tf
from tf_agents.experimental.distributed import reverb_variable_container

from alf_async.distributed.collector_stats import stats_table
from alf_async.distributed.reverb_replayer import replay_table, unroll_table
from alf_async.distributed.server_link import VARIABLE_TABLE, variable_table
from alf_async.learning.learner import Hook
from alf_async import quiet

ADDRESS_FILE = "replay_address"


@gin.configurable
class LearnerServer(object):
    """The learner's Reverb server (see module docstring). Built and stopped
    by the trainer's thread; Reverb serves on its own threads.

    Args:
        data_spec: one step's nest of TensorSpecs (agent.collect_data_spec).
        sequence_length: steps per replay item.
        variables: the nest `server_link.policy_variables` pushes.
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
            f"policy's variables or drain the tables); {reach} (docs/guides/many-machines.md, "
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
