"""A training job that serves its policy: the trainer's `make_serving_env_constructor`.

    Task.make_env_constructor = @make_serving_env_constructor
    make_serving_env_constructor.host = '127.0.0.1'
    make_serving_env_constructor.port = 8900         # 0: any free port
    make_serving_env_constructor.token = 's3cret'    # None: no token

With it, `train()`'s environments are the slots of one `PolicyServerEnv`
(alf_async.serving): every env thread (`Layout.env_threads`) serves
`Layout.rows_per_env_thread` client episodes at a time, one per slot (the rows of
its environment, stepped whichever have a client step ready), so there are
`Layout.rows` slots; the learner trains on whatever the
clients play. `Task.suite` /
`Task.env_name` name the local environment whose specs the server checks
(and which the trainer evaluates on, if `Evaluation.episodes` > 0).

The server binds when the constructor is made (so that a port in use or a
bad host is a config error before any thread starts) and serves once the
driver starts; `ServingAnnouncement` (a learner hook the trainer adds) then
prints its address on one line,

    [alf_async] serving on http://127.0.0.1:8900

and writes it to `root_dir/server_address`, removed again when training
stops cleanly. The driver's stop stops the server (ExternalEnv: stopping
the driver stops it); the trainer then calls `close()`, which joins its
threads (and closes the socket if the driver never started).

Threads: `make_serving_env_constructor` runs on the trainer's thread; the
returned constructor is called by the driver (each call adds a slot); the
server's own threads are described in alf_async/serving/server.py.
"""

import os

import gin
from tf_agents.specs import tensor_spec

from alf_async.environments import suites
from alf_async.learning.learner import Hook

ADDRESS_FILE = "server_address"


class ServingEnvConstructor(object):
    """The driver's env constructor over one PolicyServerEnv (see the module docstring).

    Attributes:
        server: the PolicyServerEnv (bound, not yet serving).
        address: its address, "http://host:port" (the port actually bound).
    """

    def __init__(self, server, slots_per_env=1):
        self.server = server
        self.address = server.address
        self._make_slots = server.env_constructor(slots_per_env=slots_per_env)

    def __call__(self):
        """One env thread's slots: a TFPyEnvironment of batch `slots_per_env`
        (called by the driver, once per env thread)."""
        return self._make_slots()

    def close(self):
        """Stops serving and joins the server's threads; idempotent."""
        self.server.close()


@gin.configurable
def make_serving_env_constructor(suite, env_name, batch_size=1, seed=None, host="127.0.0.1",
                                 port=0, token=None, max_concurrent=64,
                                 episode_idle_timeout=60.0, action_timeout=60.0):
    """Binds a PolicyServerEnv with `env_name`'s specs; returns its `ServingEnvConstructor`.

    Args:
        suite: the suite of the local environment whose action and
            observation specs the served episodes must match (built once,
            then closed).
        env_name: that environment's name in `suite`.
        batch_size: slots per env thread (`Layout.rows_per_env_thread`; each slot
            serves one episode at a time).
        seed: unused (the clients' environments are theirs).
        host: the interface to bind (loopback by default; see server.py on
            tokens and TLS before binding another).
        port: the TCP port; 0 picks a free one (printed and written to
            root_dir/server_address).
        token: if set, clients need it (`PolicyClient(token=...)`). Note that
            gin's operative config saved in root_dir records it.
        max_concurrent: most open client episodes (more get 429); episodes
            beyond the slots (`Layout.env_threads * Layout.rows_per_env_thread`) wait
            for a free slot.
        episode_idle_timeout: seconds after which a silent client's episode
            is closed (its slot freed).
        action_timeout: seconds a client's request may wait for the policy.

    Raises:
        ValueError: batch_size is not an integer >= 1, an unknown suite or
            environment, or
            the server cannot listen on host:port (in use, a bad host) --
            one line each.
    """
    del seed
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"make_serving_env_constructor: Layout.rows_per_env_thread (slots per env "
                         f"thread) must be an integer >= 1, got {batch_size!r}")
    spec_env = suites.load(suite, env_name, batch_size=1)
    try:
        action_spec = tensor_spec.to_nest_array_spec(spec_env.action_spec())
        observation_spec = tensor_spec.to_nest_array_spec(spec_env.observation_spec())
    finally:
        spec_env.close()
    from alf_async.serving.server import PolicyServerEnv  # pylint: disable=import-outside-toplevel
    try:
        server = PolicyServerEnv(action_spec, observation_spec, host=host, port=port,
                                 token=token, max_concurrent=max_concurrent,
                                 episode_idle_timeout=episode_idle_timeout,
                                 action_timeout=action_timeout)
    except (OSError, OverflowError) as e:   # in use, no such interface, port > 65535
        reason = getattr(e, "strerror", None) or str(e)
        raise ValueError(f"make_serving_env_constructor: cannot serve on {host}:{port}: "
                         f"{reason}") from None
    return ServingEnvConstructor(server, slots_per_env=batch_size)


class ServingAnnouncement(Hook):
    """Says where the server is once it serves (printed, and in root_dir/server_address);
    removes the file when training stops cleanly.

    Threads: every method runs on the learner's thread (see learner.Hook).
    """

    def __init__(self, env_constructor, root_dir, print_fn):
        self._env_constructor = env_constructor
        self._path = os.path.join(root_dir, ADDRESS_FILE)
        self._print = print_fn

    def begin(self, learner):
        os.makedirs(os.path.dirname(self._path), exist_ok=True)
        temporary = self._path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as f:
            f.write(self._env_constructor.address + "\n")
        os.replace(temporary, self._path)   # readers never see half an address
        self._print(f"[alf_async] serving on {self._env_constructor.address} "
                    f"(written to {self._path})")

    def end(self, learner, stopped_by):
        try:
            os.remove(self._path)
        except FileNotFoundError:
            pass
