"""The child process of a SubprocessEnv: builds the environment, then serves
the parent's requests (subprocess_protocol.py's frames) until it is told to
close or the parent goes away.

A step or a reset whose action (and whose time step) travel in the shared
slot (`STEP_IN_SLOT`, `RESET_IN_SLOT`, once ATTACH handed over the segment)
costs one 4-byte read, the environment's own call, the numpy writes of the
time step into the slot and one 4-byte write. The rest is pickled.

Threads: the main thread serves; one daemon thread watches the parent and
ends the process when it dies, even if the environment is stuck.
"""

import multiprocessing
import multiprocessing.connection
import multiprocessing.reduction
import os
import signal
import threading

import cloudpickle
from tf_agents.utils import nest_utils

from alf_async.environments.processes import env_index
from alf_async.environments.processes import shared_slots
from alf_async.environments.processes import subprocess_protocol as protocol
from alf_async.environments.suites.adapters import as_py_environment


def _send(fd, kind, seq, payload):
    try:
        protocol.send_pickled(fd, (kind, seq, payload))
    except Exception as e:  # e.g. an unpicklable observation: report, don't die
        protocol.send_pickled(fd, (protocol.ERROR, seq, protocol.pack_exception(e)))


def _watch_parent():
    """Exit the child when the parent process dies, even if the env is stuck."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch():
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="SubprocessEnvParentWatch", daemon=True).start()


def _build(env_constructors_bytes, gin_config, first_index):
    """The child's environments: one per constructor, each built while
    `current_env_index()` says its index."""
    env_constructors = cloudpickle.loads(env_constructors_bytes)  # imports their modules first
    if gin_config:
        import gin  # pylint: disable=import-outside-toplevel
        # Unknown configurables belong to the parent's other modules
        # (trainer, driver, ...) that this process never imports.
        gin.parse_config(gin_config, skip_unknown=True)
    envs = []
    try:
        for j, env_constructor in enumerate(env_constructors):
            with env_index.building_env(first_index + j):
                envs.append(as_py_environment(env_constructor()))
        specs = (envs[0].time_step_spec(), envs[0].action_spec())
        for j, env in enumerate(envs[1:], 1):
            if (env.time_step_spec(), env.action_spec()) != specs:
                raise ValueError(
                    f"the environments of one process must have the same specs: environment "
                    f"{first_index + j} has {env.time_step_spec()}, {env.action_spec()}, "
                    f"environment {first_index} has {specs[0]}, {specs[1]}")
    except BaseException:
        _close(envs)
        raise
    return envs, specs


def _close(envs):
    for env in envs:
        try:
            env.close()
        except Exception:
            pass


class _Server(object):
    """Serves the requests for the child's environments on its socket.

    With one environment, a request's payload and reply are its action and
    time step; with several (`envs_per_process`), a batch of them, each
    environment stepped in turn (row j of the batch is environment j, in
    slot `first slot + j`).
    """

    def __init__(self, conn, envs):
        self.conn = conn
        self.fd = conn.fileno()
        self.envs = envs
        self.views = None   # the shared slots, after ATTACH

    def serve(self):
        fd, envs = self.fd, self.envs
        while True:
            try:
                tag, seq, slot, message = protocol.read_frame(fd, self.conn)
            except (EOFError, OSError):
                return  # the parent is gone or closed the pipe
            if tag == protocol.PICKLED:
                command, seq, payload = message
                if command == protocol.CLOSE:
                    return
                self._pickled(command, seq, payload)
                continue
            # A step or reset in the shared slots (`slot` is the first
            # environment's): nothing pickled.
            views = self.views
            try:
                for j, env in enumerate(envs):
                    if tag == protocol.STEP_IN_SLOT:
                        time_step = env.step(views.action(slot + j))
                    elif tag == protocol.RESET_IN_SLOT:
                        time_step = env.reset()
                    else:
                        raise ValueError(f"unknown SubprocessEnv frame tag {tag!r}")
                    try:
                        views.write_time_step(slot + j, time_step)
                    except (ValueError, TypeError) as e:  # it broke its spec: one line
                        raise _Refused(str(e)) from None
            except _Refused as e:
                _send(fd, protocol.ERROR, protocol.short_seq(seq), protocol.pack_exception(
                    ValueError(str(e)), with_traceback=False))
            except Exception as e:
                _send(fd, protocol.ERROR, protocol.short_seq(seq), protocol.pack_exception(e))
            else:
                os.write(fd, protocol.FRAME.pack(protocol.RESULT_IN_SLOT, seq, slot))

    def _pickled(self, command, seq, payload):
        envs, batched = self.envs, len(self.envs) > 1
        try:
            if command == protocol.STEP:
                if batched:
                    result = _stack([env.step(a) for env, a in zip(
                        envs, nest_utils.unstack_nested_arrays(payload))])
                else:
                    result = envs[0].step(payload)
            elif command == protocol.RESET:
                result = _stack([env.reset() for env in envs]) if batched else envs[0].reset()
            elif command == protocol.CALL:
                name, args, kwargs = payload
                results = [getattr(env, name)(*args, **kwargs) for env in envs]
                result = results if batched else results[0]
            elif command == protocol.ATTACH:
                num_slots = payload
                segment_fd = multiprocessing.reduction.recv_handle(self.conn)
                self.views = shared_slots.map_in_child(segment_fd, envs[0].time_step_spec(),
                                                       envs[0].action_spec(), num_slots)
                result = None
            else:
                raise ValueError(f"unknown SubprocessEnv command {command!r}")
        except Exception as e:
            _send(self.fd, protocol.ERROR, seq, protocol.pack_exception(e))
        else:
            _send(self.fd, protocol.RESULT, seq, result)


class _Refused(Exception):
    """A time step that does not match its spec."""


def _stack(time_steps):
    return nest_utils.stack_nested_arrays(time_steps)


def child_main(conn, env_constructors_bytes, gin_config, index):
    """Entry point of a child process: build the envs, then serve requests."""
    # Ctrl-C goes to the whole process group; the parent decides what to do
    # (close us). Without this every child would "crash" on Ctrl-C and be
    # restarted while the program is shutting down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch_parent()
    env_index.set_current_env_index(index)
    fd = conn.fileno()
    envs = []
    try:
        try:
            envs, specs = _build(env_constructors_bytes, gin_config, index)
        except Exception as e:
            _send(fd, protocol.ERROR, protocol.READY_SEQ, protocol.pack_exception(e))
            return
        _send(fd, protocol.READY, protocol.READY_SEQ, specs)
        _Server(conn, envs).serve()
    finally:
        _close(envs)
        conn.close()

