"""The Learner on its own (public API only): exact counts and hook calls on
tiny deterministic environments, every way it stops, and a DQN learner that
provably trains."""

import threading
import time

import pytest
import tensorflow as tf
from tf_agents.agents.dqn import dqn_agent
from tf_agents.networks import q_network

from alf_async import AsyncOffPolicyDriver, DriverStoppedError
from alf_async.learning.learner import Hook, Learner, LearnerCounters
from alf_async.learning.hooks import ProgressHook
from alf_async.learning.replayers import UniformReplayer
from alf_async.testing.envs import CountingEnvConstructor
from alf_async.testing.policies import CountingPolicy

pytestmark = pytest.mark.timeout(60)


def specs():
    env = CountingEnvConstructor()()
    return env.time_step_spec(), env.action_spec()


class Recorder(Hook):
    """Records every hook call; optionally requests a stop at an iteration."""

    def __init__(self, stop_at_iteration=None):
        self.calls = []
        self._stop_at = stop_at_iteration

    def begin(self, learner):
        self.calls.append(("begin", learner.iterations))

    def training_started(self, learner):
        self.calls.append(("training_started", learner.iterations))

    def after_iteration(self, learner, train_step_before, train_step):
        self.calls.append(("after_iteration", learner.iterations, train_step_before,
                           train_step))
        if learner.iterations == self._stop_at:
            learner.request_stop("recorder")

    def end(self, learner, stopped_by):
        self.calls.append(("end", stopped_by))

    def close(self, learner):
        self.calls.append(("close",))


def collecting(hooks=(), **driver_kwargs):
    """A Learner without an agent over 2 env threads of 2 CountingEnvs."""
    driver = AsyncOffPolicyDriver(CountingEnvConstructor(batch_size=2),
                                  CountingPolicy(*specs()), num_envs=2, unroll_length=3,
                                  **driver_kwargs)
    return Learner(None, driver, hooks=hooks)


def test_without_an_agent_it_takes_exact_batches_and_calls_every_hook_in_order():
    recorder = Recorder()
    learner = collecting(hooks=[recorder])
    assert learner.run(num_iterations=4) == "num_iterations"
    assert (learner.iterations, learner.env_steps, learner.train_step) == (4, 4 * 2 * 3, 0)
    assert learner.loss is None and not learner.training
    assert recorder.calls == ([("begin", 0)] +
                              [("after_iteration", i, 0, 0) for i in range(1, 5)] +
                              [("end", "num_iterations"), ("close",)])
    assert not [t for t in learner.driver.threads if t.is_alive()]


def test_limits_are_totals_of_the_counters_it_is_given():
    counters = LearnerCounters()
    counters.iterations.assign(10)
    counters.env_steps.assign(60)
    driver = AsyncOffPolicyDriver(CountingEnvConstructor(), CountingPolicy(*specs()),
                                  unroll_length=2)
    learner = Learner(None, driver, counters=counters)
    assert learner.run(num_env_steps=70) == "num_env_steps"
    assert (learner.iterations, learner.env_steps) == (15, 70)


def test_a_hook_stops_it_with_its_reason():
    recorder = Recorder(stop_at_iteration=2)
    learner = collecting(hooks=[recorder])
    assert learner.run(num_iterations=100) == "recorder"
    assert learner.iterations == 2
    assert recorder.calls[-2:] == [("end", "recorder"), ("close",)]


def test_stop_from_another_thread_wakes_a_learner_waiting_for_experience():
    # learn_queue_cap 1000: the learner blocks in run_async() until stopped.
    recorder = Recorder()
    learner = collecting(hooks=[recorder], learn_queue_cap=1000)
    result = []
    thread = threading.Thread(target=lambda: result.append(learner.run()), name="learner")
    thread.start()
    time.sleep(0.5)
    assert thread.is_alive() and learner.iterations == 0
    start = time.monotonic()
    learner.stop()
    thread.join(10)
    assert not thread.is_alive() and time.monotonic() - start < 5
    assert result == ["stop_event"]
    assert recorder.calls == [("begin", 0), ("end", "stop_event"), ("close",)]


def test_a_stop_event_set_before_run_stops_it_at_once():
    stop = threading.Event()
    stop.set()
    driver = AsyncOffPolicyDriver(CountingEnvConstructor(), CountingPolicy(*specs()))
    learner = Learner(None, driver, stop_event=stop)
    assert learner.run(num_iterations=10) == "stop_event"
    assert learner.iterations == 0


class _FailingHook(Hook):
    def after_iteration(self, learner, train_step_before, train_step):
        if learner.iterations == 3:
            raise LookupError("hook failed")


def test_a_hook_error_stops_the_driver_and_is_raised_without_end_hooks():
    recorder = Recorder()
    learner = collecting(hooks=[_FailingHook(), recorder])
    with pytest.raises(LookupError, match="hook failed"):
        learner.run(num_iterations=10)
    # No end hooks after an error; every hook is closed.
    assert recorder.calls[-2:] == [("after_iteration", 2, 0, 0), ("close",)]
    assert not [t for t in learner.driver.threads if t.is_alive()]
    with pytest.raises(DriverStoppedError):
        learner.driver.run_async()


def _dqn(time_step_spec, action_spec):
    net = q_network.QNetwork(
        time_step_spec.observation, action_spec, fc_layer_params=(8,),
        preprocessing_layers=tf.keras.layers.Lambda(lambda x: tf.cast(x, tf.float32) * 1e-3))
    agent = dqn_agent.DqnAgent(time_step_spec, action_spec, q_network=net,
                               optimizer=tf.keras.optimizers.Adam(1e-3),
                               train_step_counter=tf.Variable(0, dtype=tf.int64))
    agent.initialize()
    return agent


def test_with_an_agent_it_trains_after_initial_collection_in_whole_iterations():
    agent = _dqn(*specs())
    replayer = UniformReplayer(agent.collect_data_spec, num_rows=2, capacity_per_row=100)
    driver = AsyncOffPolicyDriver(CountingEnvConstructor(), agent.collect_policy, num_envs=2,
                                  unroll_length=4, exp_observers=[replayer])
    recorder, lines = Recorder(), []
    learner = Learner(agent, driver, replayer, train_steps_per_iteration=3,
                      sample_batch_size=8, initial_collect_steps=12,
                      hooks=[recorder, ProgressHook(lines.append, interval_secs=3600)])
    assert learner.run(num_train_steps=9) == "num_train_steps"
    # 4 env steps per iteration: training starts at the 3rd (12 steps in),
    # 3 train steps each, until 9.
    assert (learner.iterations, learner.env_steps, learner.train_step) == (5, 20, 9)
    assert ("training_started", 3) in recorder.calls
    assert [c[2:] for c in recorder.calls if c[0] == "after_iteration"] == [
        (0, 0), (0, 0), (0, 3), (3, 6), (6, 9)]
    assert learner.training and tf.math.is_finite(learner.loss.loss)
    assert len(lines) == 1 and lines[0].startswith("[alf_async] iteration 5 | env steps 20")


def test_progress_lines_say_each_iteration_once():
    """A line every iteration (interval 0) and none more at the end: the end
    line would repeat the last iteration's."""
    agent = _dqn(*specs())
    replayer = UniformReplayer(agent.collect_data_spec, num_rows=2, capacity_per_row=100)
    driver = AsyncOffPolicyDriver(CountingEnvConstructor(), agent.collect_policy, num_envs=2,
                                  unroll_length=4, exp_observers=[replayer])
    lines = []
    learner = Learner(agent, driver, replayer, train_steps_per_iteration=3,
                      sample_batch_size=8, initial_collect_steps=12,
                      hooks=[ProgressHook(lines.append, interval_secs=0.0)])
    assert learner.run(num_train_steps=9) == "num_train_steps"
    assert [line.split(" | ")[0] for line in lines] == [
        f"[alf_async] iteration {i}" for i in range(1, 6)]


def test_an_agent_needs_a_replayer():
    agent = _dqn(*specs())
    with pytest.raises(ValueError, match="replayer"):
        Learner(agent, driver=None)
