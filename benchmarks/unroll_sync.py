"""tf-agents' synchronous loop for an unroll agent (PPO, IMPALA): the
baseline time_to_solve.py and wall_clock_learning.py set alf_async against.

    loop = SyncUnrollLoop(agent, env, steps_per_iteration)
    while ...:
        loss = loop.iteration()     # collect, then train once on what was collected

The shape of tf-agents' PPO examples (ppo_train_eval.py): a
`DynamicStepDriver` acting with `agent.collect_policy` collects the
iteration's env steps over the batched environment (every row in
lockstep) into a `TFUniformReplayBuffer` of one row per environment, the
agent trains on `gather_all()`, and the buffer is cleared. One difference,
so that both sides train on exactly the same transitions: the gathered
[rows, n] batch goes through the same `OneTimeReplayer` as alf_async's
learner, which precedes each row by the step its previous batch ended with
(tf-agents' examples drop that transition: the last step of each gathered
row only bootstraps). `DynamicStepDriver` counts the steps that are not
episode boundaries, so n varies a little from iteration to iteration; the
replayer takes any n.

Threads: everything on the caller's thread (collection, then training).
"""

import time

import gin

# TensorFlow, tf-agents and alf_async are imported where they are used:
# the benchmarks' parent processes import this module and run no TensorFlow.


def _builder_name():
    return str(gin.query_parameter("Task.agent_fn")).lstrip("@").split(".")[-1]


def is_unroll_task():
    """True when the parsed gin config's Task.agent_fn is an unroll agent
    builder (ppo_agent, impala_agent)."""
    return _builder_name() in ("ppo_agent", "impala_agent")


def gin_agent_fn():
    """The agent builder `Task.agent_fn` names in the parsed gin config."""
    from alf_async.learning import agents
    return getattr(agents, _builder_name())


def steps_per_batch():
    """Env steps in one of alf_async's learner batches (and so in one
    iteration of the synchronous loop): Schedule.rows_per_batch x
    unroll_length. Both sides train on batches of all environments only
    when the batch holds every row; other configs are refused."""
    q = gin.query_parameter
    rows = q("Layout.env_threads") * q("Layout.rows_per_env_thread")
    if q("Schedule.rows_per_batch") != rows:
        raise ValueError(
            f"the synchronous loop trains on all {rows} environments at once; alf_async's "
            f"batches hold Schedule.rows_per_batch rows: set Schedule.rows_per_batch = {rows} "
            f"so both sides train on batches of the same shape")
    return q("Schedule.rows_per_batch") * q("Schedule.unroll_length")


class SyncUnrollLoop(object):
    """Collect `steps_per_iteration` env steps, train the agent once on them.

    Args:
        agent: the unroll agent (its collect_policy acts; `train` trains).
        env: the batched TFEnvironment (rows in lockstep).
        steps_per_iteration: env steps (boundaries not counted) per iteration.
        exp_observers: callables(exp, env_ids) given each iteration's
            collected [rows, n] batch, as the driver's `exp_observers` are
            given each dequeued batch (e.g. `metrics.EpisodeLog`).
    """

    def __init__(self, agent, env, steps_per_iteration, exp_observers=()):
        import numpy as np
        import tensorflow as tf  # pylint: disable=unused-import
        from tf_agents.drivers import dynamic_step_driver
        from tf_agents.replay_buffers import tf_uniform_replay_buffer
        from tf_agents.utils import common

        from alf_async.learning.replayers import OneTimeReplayer
        rows = env.batch_size
        per_row = -(-steps_per_iteration // rows)
        # Room for the boundary steps DynamicStepDriver does not count.
        self._capacity = 2 * per_row + 8
        self._buffer = tf_uniform_replay_buffer.TFUniformReplayBuffer(
            agent.collect_data_spec, batch_size=rows, max_length=self._capacity)
        self._collect = common.function(dynamic_step_driver.DynamicStepDriver(
            env, agent.collect_policy, observers=[self._buffer.add_batch],
            num_steps=steps_per_iteration).run)
        self._replayer = OneTimeReplayer()
        self._train = common.function(lambda: agent.train(self._replayer.sample()))
        self._rows = np.arange(rows, dtype=np.int32)
        self._time_step = None
        self._policy_state = None
        self._exp_observers = list(exp_observers)
        self.env_steps = 0

    def iteration(self):
        """One collection and one train call; returns the LossInfo."""
        self._time_step, self._policy_state = self._collect(self._time_step, self._policy_state)
        exp = self._buffer.gather_all()
        n = int(exp.step_type.shape[1])
        if n >= self._capacity:
            raise RuntimeError(f"an iteration filled the {self._capacity}-step buffer: steps "
                               f"may have been overwritten")
        self._buffer.clear()
        self.env_steps += n * len(self._rows)   # as alf_async counts: boundaries too
        for observer in self._exp_observers:
            observer(exp, self._rows)
        self._replayer(exp, self._rows)
        return self._train()

    def train_again(self):
        """One more train call on the latest batch (the raw train rate)."""
        return self._train()


def learning_run(seed, seconds, raw_secs, env, eval_policy, raw_rate, cpu_secs, peak_rss_mb,
                 num_env_steps=None, exp_observers=()):
    """wall_clock_learning.py's (and per_frame.py's) synchronous side for an
    unroll agent: the gin file's agent and evaluation, `SyncUnrollLoop` on
    `env` for `seconds` (or until `num_env_steps`), then the raw rate of its
    train call (none if `raw_secs` is 0); returns the record
    (wall_clock_learning.run_tf_agents's fields; `policy_lag` is 0: each
    batch is trained on right after it was collected, before any other
    train step; `loop_start` is the loop's time.monotonic() start).

    Args:
        seed: seeds TensorFlow and the evaluation environments.
        seconds: the loop's wall-clock budget.
        raw_secs: seconds of the raw train-rate measurement.
        env: the batched environment of all rows.
        eval_policy, raw_rate, cpu_secs, peak_rss_mb: wall_clock_learning's
            helpers (the evaluated policy of an agent; the rate measurement;
            the process's CPU seconds; its peak RSS).
        num_env_steps: stop once this many env steps were collected (None:
            the clock alone stops the run).
        exp_observers: `SyncUnrollLoop`'s.
    """
    import tensorflow as tf

    from alf_async.environments import suites
    from alf_async.learning import evaluation
    q = gin.query_parameter

    def query(name, default):
        try:
            return q(name)
        except ValueError:
            return default

    tf.random.set_seed(seed)
    eval_env = suites.load(q("Task.suite"), q("Task.env_name"),
                           batch_size=q("Evaluation.episodes"), seed=seed + 1000003,
                           **(query("Evaluation.env_kwargs", None) or {}))
    global_step = tf.Variable(0, dtype=tf.int64, trainable=False)
    agent = gin_agent_fn()(env.time_step_spec(), env.action_spec(), global_step)
    agent.initialize()
    loop = SyncUnrollLoop(agent, env, steps_per_batch(), exp_observers)
    evaluator = evaluation.Evaluator(eval_env, eval_policy(agent))
    eval_interval = q("Evaluation.interval")
    evaluations, eval_secs = [], 0.0
    start, cpu_start = time.monotonic(), cpu_secs()
    while time.monotonic() - start < seconds and (num_env_steps is None
                                                  or loop.env_steps < num_env_steps):
        before = int(global_step)
        loop.iteration()
        after = int(global_step)
        if after // eval_interval > before // eval_interval:
            t = time.monotonic()
            average_return, _ = evaluator()
            eval_secs += time.monotonic() - t
            evaluations.append((t - start, loop.env_steps, after, average_return))
    loop_secs = time.monotonic() - start
    cores = (cpu_secs() - cpu_start) / loop_secs
    train_steps = int(global_step)
    peak = peak_rss_mb()
    per_call = train_steps - before if train_steps > before else 1

    def train_calls(k):
        for _ in range(k):
            loop.train_again()

    raw = raw_rate(train_calls, per_call, raw_secs) if raw_secs > 0 else None
    env.close()
    eval_env.close()
    return dict(evaluations=evaluations, env_steps=loop.env_steps, train_steps=train_steps,
                loop_secs=loop_secs, eval_secs=eval_secs, raw_rate=raw, peak_rss_mb=peak,
                cores=cores, policy_lag=0.0, loop_start=start)


def logged_one_time_replayer(log):
    """The unroll agents' OneTimeReplayer (their gin files' `Task.replayer_fn`)
    that also feeds `log(exp, env_ids)` each batch of unrolls the learner takes."""
    from alf_async.learning import replayers

    class LoggedReplayer(replayers.OneTimeReplayer):

        def __call__(self, exp, env_ids):
            log(exp, env_ids)
            super().__call__(exp, env_ids)

    return LoggedReplayer


class TrainingEpisodes(object):
    """An experience observer keeping each finished training episode (the
    behaviour policy's, whole games for Atari) as (monotonic seconds at the
    batch it ended in, env steps, score): `metrics.EpisodeLog` with a clock.
    Called by one thread (the learner's); read after the run."""

    def __init__(self):
        from alf_async.driver.metrics import EpisodeLog
        self._log = EpisodeLog()
        self.episodes = []

    def __call__(self, exp, env_ids):
        seen = len(self._log.episodes)
        self._log(exp, env_ids)
        now = time.monotonic()
        self.episodes.extend((now, steps, ret) for steps, ret, _ in self._log.episodes[seen:])

    def since(self, start):
        """[(seconds since `start`, env steps, score)]."""
        return [(t - start, steps, ret) for t, steps, ret in self.episodes]
