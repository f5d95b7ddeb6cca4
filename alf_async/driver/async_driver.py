"""AsyncOffPolicyDriver: environments, actors and the learner run at once.

    env threads (one env, batch B, each) --request--> actor queues
           ^                                              |  dequeue_many(actor_queue_cap)
           |--------- action-return queue (one each) <-- actor threads (batched policy.action)
           |
           +--unroll [B, T]--> log queue   --> LogThread (metrics, observers)
           +--unroll [B, T]--> learn queue --> run_async() / get_training_exps()
                                               (dequeue_all: learn_queue_cap unrolls)

With `num_actor_queues=0` there are no actor threads and no actor or
action-return queues: each env thread runs `policy.action` itself between
its steps (see EnvThread); the log and learn queues are the same.

Every thread runs under one `tf.train.Coordinator`. Stopping is: request
stop, close every queue (cancelling blocked enqueues and dequeues), join
with a grace period, close the environments. A thread's exception requests
stop (a closer thread then closes the queues, which wakes the learner) and
is raised again, with its original type and traceback, from the next
`run_async()` / `get_training_exps()` / `stop()` of the learner's thread —
once.

Threads: the constructor, `start()`, `get_training_exps()`, `run_async()`
and the metric getters are called by the learner's thread; `stop()` by any
thread (also while another blocks in `run_async()`, which then raises
`DriverStoppedError`). Only `get_training_exps()`/`run_async()` block (on
the learn queue); `stop()` waits at most `stop_grace_period_secs` for the
threads.
"""

import logging
import threading
import time

import tensorflow as tf

from alf_async import roles
from alf_async.tf215_py311_fixes import eager_tensor_fix, protocol_check_fix
from alf_async.driver import metrics as metrics_lib
from alf_async.driver.acting import own_action
from alf_async.driver.actor_thread import ActorThread
from alf_async.driver.env_setup import check_specs, close_envs, make_envs
from alf_async.driver.env_thread import EnvThread
from alf_async.driver.health import DriverHealth
from alf_async.driver.log_thread import LogThread
from alf_async.driver.queues import QUEUE_CLOSED_ERRORS, TFQueues, check_pacing, check_queue_config
from alf_async.driver.stepping import ROWS, stepping_of, warn_if_few_inter_op_threads

logger = logging.getLogger(__name__)

# Every EagerTensor leaks a few bytes on TF 2.15 + Python 3.11 (see
# eager_tensor_fix); the driver's threads and the learner make them for as
# long as a run lasts.
eager_tensor_fix.install()
# tf.is_tensor of a numpy array runs a typing.Protocol check on Python 3.11
# (see protocol_check_fix); tf-agents calls it on every Python environment
# step.
protocol_check_fix.install()


class DriverStoppedError(RuntimeError):
    """run_async()/get_training_exps() was called on, or woken by, a stopped driver."""


class AsyncOffPolicyDriver(roles.BatchSource):
    """Runs `num_envs` environments and batched actors in threads; feeds a learner."""

    def __init__(self, env_constructor, policy, num_envs=1, num_actor_queues=1, unroll_length=8,
                 learn_queue_cap=1, actor_queue_cap=1, observers=(), metrics=(),
                 exp_observers=(), stop_grace_period_secs=4.0, batches_ahead=None):
        """
        Args:
            env_constructor: zero-arg callable returning a tf-agents TFEnvironment of batch
                size B >= 1; called `num_envs` times, concurrently.
            policy: a tf-agents TFPolicy (e.g. `agent.collect_policy`); its
                policy state, if any, is carried per environment.
            num_envs: number of env threads (each owns one environment).
            num_actor_queues: number of actor threads (one queue each); env
                thread i uses actor queue i % num_actor_queues. 0: no actor
                thread; each env thread runs `policy.action` itself between
                its steps, with no queue round trip (see EnvThread).
            unroll_length: T, steps per unroll shipped to the learner.
            learn_queue_cap: unrolls per learner batch.
            actor_queue_cap: at most this many env threads' requests per
                batched forward pass (any value >= 1 works: an actor takes
                the requests that are waiting, up to the cap).
            observers: callables(Trajectory [B, T, ...]), fed every unroll by
                the LogThread.
            metrics: extra `alf_async.driver.metrics.AsyncStepMetric`s fed by the
                LogThread.
            exp_observers: callables(exp, env_ids) fed by `run_async()`.
            stop_grace_period_secs: how long `stop()` waits for the threads.
            batches_ahead: None: each env thread begins its next unroll as
                soon as it has shipped one (it then waits only for room in
                the learn queue). k >= 1: the env threads begin at most k
                learner batches (k * learn_queue_cap unrolls) that
                `get_training_exps()` has not taken, so an unroll acts with
                weights at most k batches' train steps older than those it
                is trained with (an env thread waits for a permit before
                each unroll). Needs at least as many unrolls as env threads
                and env threads that begin their batch's unrolls together
                (not rows stepped one by one).

        Raises:
            ValueError: a queue configuration that deadlocks, or environments
                whose specs differ from each other or from the policy's.
            TypeError: a metric that is not an AsyncStepMetric.
            Exception: whatever `env_constructor` raises, with its type (the
                environments already built are closed).
        """
        check_queue_config(num_envs, num_actor_queues, actor_queue_cap, learn_queue_cap,
                           unroll_length)
        check_pacing(batches_ahead, num_envs, learn_queue_cap)
        self._batches_ahead = batches_ahead
        for m in metrics:
            if not isinstance(m, metrics_lib.AsyncStepMetric):
                raise TypeError(
                    f"metrics must be alf_async.driver.metrics.AsyncStepMetric instances (updated "
                    f"with whole unrolls from any env thread, thread-safe); got "
                    f"{type(m).__name__}. tf-agents TFStepMetrics keep one accumulator per "
                    f"batch row and cannot follow rows from different env threads.")
        self._policy = policy
        self._unroll_length = unroll_length
        self._learn_queue_cap = learn_queue_cap
        self._exp_observers = list(exp_observers)
        self._grace = stop_grace_period_secs
        self._envs = make_envs(env_constructor, num_envs)
        try:
            # How each environment is stepped: decided here, once.
            self._steppings = [stepping_of(e) for e in self._envs]
            warn_if_few_inter_op_threads(self._steppings, num_actor_queues)
            self._env_batch_size = check_specs(self._envs, policy)
            self._build(num_envs, num_actor_queues, actor_queue_cap, observers, metrics)
        except BaseException:
            close_envs(self._envs)
            raise
        self._started = False
        self._stopped = False
        self._stop_lock = threading.Lock()

    def _build(self, num_envs, num_actor_queues, actor_queue_cap, observers, metrics):
        B = self._env_batch_size
        # Coordinator(clean_stop_exception_types=()): every exception counts;
        # the threads themselves ignore closed-queue errors once stop is requested.
        self._coord = tf.train.Coordinator(clean_stop_exception_types=())
        self._queues = TFQueues(
            num_envs=num_envs, env_batch_size=B, learn_queue_cap=self._learn_queue_cap,
            actor_queue_cap=actor_queue_cap, num_actor_queues=num_actor_queues,
            unroll_length=self._unroll_length,
            time_step_spec=self._policy.time_step_spec,
            policy_state_spec=self._policy.policy_state_spec,
            policy_step_spec=self._policy.policy_step_spec,
            trajectory_spec=self._policy.trajectory_spec, batches_ahead=self._batches_ahead)
        q = self._queues
        # Env threads stepping rows one by one ask for some rows per request.
        by_rows = [s.kind == ROWS for s in self._steppings]
        self._actor_threads = [
            ActorThread(f"actor{k}", self._coord, self._policy, q.actor_queues[k],
                        q.action_return_queues, range(k, num_envs, num_actor_queues), B,
                        q.actor_queue_cap,
                        partial_requests=any(by_rows[k::num_actor_queues]))
            for k in range(num_actor_queues)
        ]
        initial_state = tf.nest.map_structure(
            lambda t: t.numpy(), self._policy.get_initial_state(B))
        # The step token only where two graph-mode Python steps holding the
        # GIL could contend.
        graph_python = [s.takes_step_token for s in self._steppings]
        token = q.step_token if sum(graph_python) > 1 else None
        if num_actor_queues:
            actors = [dict(actor_queue=q.actor_queues[i % num_actor_queues],
                           return_queue=q.action_return_queues[i])
                      for i in range(num_envs)]
        else:
            # Env threads that act themselves; those with a Python loop share
            # one traced forward pass.
            own = own_action(self._policy, q) if not all(
                s.in_graph for s in self._steppings) else None
            actors = [dict(actor_queue=None, return_queue=None, policy=self._policy,
                           own_action_fn=own)] * num_envs
        self._env_threads = [
            EnvThread(f"env{i}", self._coord, env, i, q, initial_policy_state=initial_state,
                      unroll_length=self._unroll_length, stepping=self._steppings[i],
                      step_token=token if graph_python[i] else None, **actors[i])
            for i, env in enumerate(self._envs)
        ]
        self._metrics = [
            metrics_lib.NumberOfEpisodes(),
            metrics_lib.EnvironmentSteps(),
            metrics_lib.AverageReturn(),
            metrics_lib.AverageEpisodeLength(),
        ] + list(metrics)
        self._log_thread = LogThread("log", self._coord, q.log_queue, self._metrics,
                                     observers)
        self._closer = threading.Thread(target=self._close_queues_on_stop,
                                        name="queue_closer", daemon=True)
        self._threads = (self._env_threads + self._actor_threads +
                         [self._log_thread, self._closer])

    # ----------------------------------------------------------------- public

    @property
    def env_batch_size(self):
        return self._env_batch_size

    @property
    def num_envs(self):
        return len(self._envs)

    @property
    def environments(self):
        """The TFEnvironments the driver built (e.g. for
        `capabilities.restarts_of(env)`)."""
        return list(self._envs)

    @property
    def queues(self):
        """The driver's `TFQueues` (for occupancy summaries)."""
        return self._queues

    @property
    def threads(self):
        return list(self._threads)

    def start(self):
        """Starts every thread. Raises RuntimeError if started or stopped before."""
        # Under the stop lock: a stop() from another thread waits until every
        # thread is started (joining a thread not yet started raises).
        with self._stop_lock:
            if self._started or self._stopped:
                raise RuntimeError("AsyncOffPolicyDriver.start() can be called only once")
            self._started = True
            for t in self._threads:
                t.start()
        logger.info("alf_async driver started %d threads", len(self._threads))

    def get_training_exps(self):
        """Takes one learner batch; blocks until the learn queue is full.

        Returns:
            (exp, env_ids, steps): `exp` a batch-major Trajectory
                [learn_queue_cap * B, unroll_length, ...]; `env_ids` int32
                [learn_queue_cap * B], the global env id of each row; `steps` the
                number of env steps in it.

        Raises:
            Exception: the first exception of any driver thread, with its type.
            DriverStoppedError: the driver was stopped (or never started).
        """
        if not self._started:
            raise DriverStoppedError("call start() before get_training_exps()/run_async()")
        if self._coord.should_stop():
            self._raise_stopped()
        rows = self._learn_queue_cap * self._env_batch_size
        try:
            # Rows are the queue's elements: already [rows, T, ...], no reshape.
            exp, env_ids = self._queues.learn_queue.dequeue_all()
            if self._queues.permits is not None:
                # One permit back per unroll taken (batches_ahead).
                self._queues.permits.enqueue_many(tf.zeros([self._learn_queue_cap], tf.int32))
        except QUEUE_CLOSED_ERRORS:
            self._raise_stopped()
        return exp, env_ids, rows * self._unroll_length

    def run_async(self):
        """`get_training_exps()`, then every exp_observer(exp, env_ids).

        Returns:
            The number of env steps in the batch
                (learn_queue_cap * unroll_length * B).
        """
        exp, env_ids, steps = self.get_training_exps()
        for observer in self._exp_observers:
            observer(exp, env_ids)
        return steps

    def run(self, *args, **kwargs):
        raise RuntimeError(
            "AsyncOffPolicyDriver has no synchronous run(): call start() once, then "
            "run_async() in the training loop, and stop() at the end.")

    def get_metrics(self):
        """[NumberOfEpisodes, EnvironmentSteps, AverageReturn, AverageEpisodeLength, *metrics]."""
        return list(self._metrics)

    def get_step_metrics(self):
        """[NumberOfEpisodes, EnvironmentSteps]."""
        return self._metrics[:2]

    def health(self):
        """The driver's health as summary scalars (`health.DriverHealth`)."""
        return DriverHealth(self)

    def get_perf_stats(self):
        """Cumulative counters of the threads (read without locks: a snapshot).

        Returns:
            dict with env_steps, action_wait_secs and request_secs (summed
                over env threads; `EnvThread`'s), actor_batches, actor_rows,
                actor_inference_secs (summed over actors), learn_queue_size,
                actor_queue_sizes, log_queue_size.
        """
        q = self._queues
        return dict(
            env_steps=sum(t.steps for t in self._env_threads),
            action_wait_secs=sum(t.action_wait_secs for t in self._env_threads),
            request_secs=sum(t.request_secs for t in self._env_threads),
            actor_batches=sum(t.batches for t in self._actor_threads),
            actor_rows=sum(t.rows for t in self._actor_threads),
            actor_inference_secs=sum(t.inference_secs for t in self._actor_threads),
            learn_queue_size=_size(q.learn_queue),
            actor_queue_sizes=[_size(a) for a in q.actor_queues],
            log_queue_size=_size(q.log_queue),
        )

    def stop(self):
        """Stops every thread and closes the environments; returns in about
        `stop_grace_period_secs` at most. Idempotent; any thread may call it.

        Raises:
            Exception: the first exception of a driver thread, if no earlier
                call (run_async, get_training_exps, stop) raised it already.
            RuntimeError: naming threads still alive after the grace period
                (a thread stuck inside an environment's own code).
        """
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
            self._coord.request_stop()
            self._queues.close_all()
            # Environments that block on the outside (BlockingStep) promise a
            # close() that is safe from any thread and wakes a blocked step:
            # close them now rather than after a wait.
            blocking = [s.blocks for s in self._steppings]
            close_envs([e for e, b in zip(self._envs, blocking) if b])
            others = [e for e, b in zip(self._envs, blocking) if not b]
            try:
                if self._started:
                    # Closed queues end every thread within a step; a thread
                    # still alive after half the grace period is inside an
                    # environment's own step: closing its environment is the
                    # last way to interrupt it.
                    deadline = time.monotonic() + self._grace / 2
                    for t in self._threads:
                        t.join(max(0.0, deadline - time.monotonic()))
                    if any(t.is_alive() for t in self._env_threads):
                        close_envs(others)
                        others = []
                    self._coord.join(self._threads, stop_grace_period_secs=self._grace / 2)
            finally:
                close_envs(others)
                deadline = time.monotonic() + 2.0
                for t in self._env_threads:
                    t.drop_graph_loop()
                    t.join_row_workers(max(0.0, deadline - time.monotonic()))
                logger.info("alf_async driver stopped")

    # ---------------------------------------------------------------- private

    def _raise_stopped(self):
        # stop() raises the thread's error if nobody has yet; if it returns,
        # the stop was asked for.
        self.stop()
        raise DriverStoppedError(
            "the driver is stopped: no more experience (stop() was called, or a driver "
            "thread failed and its error was raised already)")

    def _close_queues_on_stop(self):
        self._coord.wait_for_stop()
        self._queues.close_all()


def _size(queue):
    try:
        return int(queue.size())
    except tf.errors.OpError:
        return 0
