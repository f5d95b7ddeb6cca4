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

The collection loop is a `Learner` with no agent: it takes the driver's
batches (for the writers) until stopped; `VariablePullHook` pulls.

Threads: `run()` on the caller's thread (it blocks in the driver's
`run_async()`; the writers send in the background and wait there when the
rate limiter refuses inserts, which is what holds collection to the
learner's pace); `stop_event.set()` from any thread (a signal handler)
ends it at the end of an iteration.
"""

import time

import gin
import reverb
import tensorflow as tf
from tf_agents.experimental.distributed import reverb_variable_container

from alf_async import agents  # noqa: F401  (registers dqn_agent, sac_agent with gin)
from alf_async.driver import AsyncOffPolicyDriver
from alf_async.environments import suites
from alf_async.learner import Hook, Learner
from alf_async.reverb_replayer import REPLAY_TABLE, RowWriters

VARIABLE_TABLE = "variables"
POLICY_KEY = reverb_variable_container.POLICY_KEY
TRAIN_STEP_KEY = reverb_variable_container.TRAIN_STEP_KEY


class UnreachableError(RuntimeError):
    """The server did not answer before the deadline."""


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


class VariablePullHook(Hook):
    """Pulls the policy's variables every `interval_secs` (learner's thread)."""

    def __init__(self, container, variables, interval_secs):
        self._container = container
        self._variables = variables
        self._interval = interval_secs
        self._last = time.monotonic()
        self.pulls = 0

    def pull(self):
        self._container.update(self._variables, VARIABLE_TABLE)
        self._last = time.monotonic()
        self.pulls += 1

    def after_iteration(self, learner, train_step_before, train_step):
        if time.monotonic() - self._last >= self._interval:
            self.pull()


class Collector(object):
    """One collection process's pieces; `run()` collects until stopped."""

    def __init__(self, learner, writers, pull_hook, train_step):
        self.learner = learner
        self.writers = writers
        self.pull_hook = pull_hook
        self.train_step = train_step

    def run(self, num_iterations=None):
        """Pulls the variables, collects until `stop_event` (or
        `num_iterations`), closes the writers; returns why it stopped."""
        self.pull_hook.pull()
        try:
            return self.learner.run(num_iterations=num_iterations)
        finally:
            self.writers.close()


@gin.configurable
def collect(replay_address, stop_event, env_name=gin.REQUIRED, agent_fn=gin.REQUIRED,
            suite="suite_gym", make_env_constructor=suites.make_env_constructor,
            sequence_length=gin.REQUIRED, num_envs=1, env_batch_size=1, num_actor_queues=1,
            actor_queue_cap=1, unroll_length=8, learn_queue_cap=1,
            variable_update_interval=1.0, connect_deadline_secs=60.0, seed=None,
            print_fn=print):
    """Builds a `Collector` writing to `replay_address` (gin: `collect.*`;
    the agent's own bindings are the learner's).

    Args:
        replay_address: 'host:port' of the learner's Reverb server.
        stop_event: a `threading.Event` that ends `run()`.
        env_name, agent_fn, suite, make_env_constructor, num_envs,
            env_batch_size, num_actor_queues, actor_queue_cap, unroll_length,
            learn_queue_cap, seed: as `trainer.train`'s.
        sequence_length: steps per replay item (the learner's
            `ReverbReplayer.sequence_length`).
        variable_update_interval: seconds between variable pulls.
        connect_deadline_secs: how long to retry an unreachable server.
        print_fn: callable(str) for the retry lines.

    Raises:
        UnreachableError: no server at `replay_address` by the deadline.
    """
    client = wait_for_server(replay_address, connect_deadline_secs, print_fn)
    del client
    if seed is not None:
        tf.random.set_seed(seed)
    spec_env = suites.load(suite, env_name, batch_size=1)
    try:
        train_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="train_step")
        agent = agent_fn(spec_env.time_step_spec(), spec_env.action_spec(), train_step)
        agent.initialize()
    finally:
        spec_env.close()
    writers = RowWriters(reverb.Client(replay_address), sequence_length)
    driver = AsyncOffPolicyDriver(
        make_env_constructor(suite, env_name, batch_size=env_batch_size, seed=seed),
        agent.collect_policy, num_envs=num_envs, num_actor_queues=num_actor_queues,
        unroll_length=unroll_length, learn_queue_cap=learn_queue_cap,
        actor_queue_cap=actor_queue_cap, exp_observers=[writers.write])
    container = reverb_variable_container.ReverbVariableContainer(
        replay_address, table_names=[VARIABLE_TABLE])
    hook = VariablePullHook(container, policy_variables(agent.collect_policy, train_step),
                            variable_update_interval)
    learner = Learner(None, driver, hooks=[hook], stop_event=stop_event)
    return Collector(learner, writers, hook, train_step)
