"""The training loop end to end (in process): learner reached, summaries,
checkpoints and resume, errors, other agents and replayers."""

import functools
import glob
import os
import threading

import gin
import gym
import numpy as np
import pytest
import tensorflow as tf

from alf_async import AsyncOffPolicyDriver, trainer
from alf_async import settings

from alf_async.learning import agents, replayers
from alf_async.environments.suites import gym_batch
from alf_async.environments import suites
from alf_async.learning.evaluation import Evaluator
from alf_async.learning.learner import Learner
from alf_async.learning.warm_up import WarmUp
from alf_async.environments.capabilities import Restartable
from tf_agents.environments import tf_py_environment

SMOKE_GIN = os.path.join(os.path.dirname(__file__), os.pardir, "gin_configs", "smoke.gin")

TRAIN_TAGS = {
    "Metrics/AverageReturn", "Metrics/AverageEpisodeLength", "Metrics/NumberOfEpisodes",
    "Metrics/EnvironmentSteps", "Metrics_vs_EnvironmentSteps/AverageReturn",
    "Metrics_vs_EnvironmentSteps/AverageEpisodeLength",
    "Metrics_vs_NumberOfEpisodes/AverageReturn", "Losses/td_loss", "Losses/total_loss",
    "Perf/env_steps_per_sec", "Perf/train_steps_per_sec", "Perf/action_wait_fraction",
    "Perf/actor_inference_ms_per_batch", "Perf/actor_batch_size",
    "Queues/learn_queue_occupancy", "Queues/actor_queue_occupancy", "Queues/log_queue_size",
}


@pytest.fixture
def smoke_gin():
    gin.clear_config()
    gin.parse_config_files_and_bindings([SMOKE_GIN], [])
    yield
    gin.clear_config()


@pytest.fixture(autouse=True)
def _clear_gin():
    yield
    gin.clear_config()


def read_scalars(directory):
    """{tag: [(step, value)]} from every event file in `directory`."""
    scalars = {}
    for path in sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                number = float(tf.make_ndarray(value.tensor)) if value.HasField(
                    "tensor") else value.simple_value
                scalars.setdefault(value.tag, []).append((event.step, number))
    return scalars


def test_smoke_run_reaches_the_learner_and_writes_everything(tmp_path, smoke_gin):
    lines = []
    result = trainer.train(str(tmp_path), print_fn=lines.append)
    assert result.stopped_by == "num_iterations"
    assert result.iterations == 40
    assert result.env_steps == 40 * 8
    assert result.global_step > 0
    train = read_scalars(str(tmp_path / "train"))
    assert TRAIN_TAGS <= set(train), TRAIN_TAGS - set(train)
    losses = [v for _, v in train["Losses/td_loss"]]
    assert losses and all(np.isfinite(losses))
    assert not any(tag.startswith("Learner/") for tag in train)   # one loss family: Losses/
    assert max(v for _, v in train["Metrics/EnvironmentSteps"]) > 0
    assert "Env/restarts" not in train  # gym envs have no restarts
    evaluation = read_scalars(str(tmp_path / "eval"))
    assert {"Metrics/AverageReturn", "Metrics/AverageEpisodeLength"} <= set(evaluation)
    assert len(result.evaluations) == result.global_step // 20
    assert glob.glob(str(tmp_path / "operative_config-*.gin"))
    config = open(glob.glob(str(tmp_path / "operative_config-*.gin"))[0]).read()
    assert "Layout.env_threads = 2" in config
    assert tf.train.latest_checkpoint(str(tmp_path / "train")).endswith(
        f"ckpt-{result.global_step}")
    assert any("iteration" in line and "env steps" in line and "loss" in line for line in lines)


def test_rates_have_one_point_per_train_step_and_none_over_an_empty_interval(tmp_path,
                                                                              smoke_gin):
    # Stopped by the first evaluation (train step 20, a multiple of the summary
    # interval of 10): the run's final write falls on the train step of the
    # regular one just before it, an interval with no steps.
    result = trainer.train(str(tmp_path), evaluation=settings.Evaluation(stop_at_return=0.0),
                           print_fn=lambda line: None)
    assert result.stopped_by == "stop_at_eval_return" and result.global_step == 20
    train = read_scalars(str(tmp_path / "train"))
    for tag in ("Perf/env_steps_per_sec", "Perf/train_steps_per_sec",
                "Perf/action_wait_fraction"):
        steps = [step for step, _ in train[tag]]
        assert steps == [20], (tag, steps)   # the write at 10 has no interval before it
    assert all(value > 0 for _, value in train["Perf/train_steps_per_sec"])
    assert all(value > 0 for _, value in train["Perf/env_steps_per_sec"])


def test_checkpoint_resume_continues_counters(tmp_path, smoke_gin):
    first = trainer.train(str(tmp_path), schedule=settings.Schedule(num_iterations=12),
                          print_fn=lambda line: None)
    assert first.global_step > 0
    lines = []
    second = trainer.train(str(tmp_path), schedule=settings.Schedule(num_iterations=20),
                           print_fn=lines.append)
    assert any("resumed" in line for line in lines)
    assert second.iterations == 20
    assert second.env_steps == 20 * 8
    # 8 more iterations, all past initial collection: 2 train steps each.
    assert second.global_step == first.global_step + 8 * 2
    steps = [s for s, _ in read_scalars(str(tmp_path / "train"))["Metrics/EnvironmentSteps"]]
    env_steps = [v for _, v in read_scalars(str(tmp_path / "train"))["Metrics/EnvironmentSteps"]]
    assert steps == sorted(steps) and env_steps == sorted(env_steps)
    assert env_steps[-1] > env_steps[0]
    # A finished run resumed again stops at once, without training.
    third = trainer.train(str(tmp_path), schedule=settings.Schedule(num_iterations=20),
                          print_fn=lambda line: None)
    assert (third.global_step, third.iterations) == (second.global_step, 20)


def test_stop_event_stops_cleanly_with_a_checkpoint(tmp_path, smoke_gin):
    stop = threading.Event()
    stop.set()
    result = trainer.train(str(tmp_path), schedule=settings.Schedule(num_iterations=10**6),
                           print_fn=lambda line: None, stop_event=stop)
    assert result.stopped_by == "stop_event"
    assert tf.train.latest_checkpoint(str(tmp_path / "train")) is not None


class _FailingCartPole(gym.Wrapper):
    def __init__(self, env, fail_at):
        super().__init__(env)
        self._steps, self._fail_at = 0, fail_at

    def step(self, action):
        self._steps += 1
        if self._steps >= self._fail_at:
            raise KeyError("injected env failure")
        return self.env.step(action)


def test_a_crash_in_an_env_thread_raises_the_original_error_after_stopping(tmp_path,
                                                                          smoke_gin):
    suites.register_suite("failing_gym", lambda name, batch_size, seed: (
        tf_py_environment.TFPyEnvironment(gym_batch.BatchedGymEnv(
            [_FailingCartPole(gym.make(name), 50) for _ in range(batch_size)], seed=seed))))
    before = set(threading.enumerate())
    with pytest.raises(KeyError, match="injected env failure"):
        trainer.train(str(tmp_path), task=settings.Task(suite="failing_gym"),
                      schedule=settings.Schedule(num_iterations=10**6),
                      evaluation=settings.Evaluation(episodes=0), print_fn=lambda line: None)
    leftover = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert not leftover, leftover


def test_bad_values_fail_before_anything_starts(tmp_path, smoke_gin):
    with pytest.raises(trainer.ConfigError, match="Schedule.num_iterations"):
        trainer.train(str(tmp_path), schedule=settings.Schedule(num_iterations=-1))
    with pytest.raises(trainer.ConfigError, match="num_iterations or Schedule.num_env_steps"):
        trainer.train(str(tmp_path), schedule=settings.Schedule(num_iterations=None))
    with pytest.raises(trainer.ConfigError, match="unknown environment suite 'nope'"):
        trainer.train(str(tmp_path), task=settings.Task(suite="nope"))
    with pytest.raises(trainer.ConfigError, match="NoSuchEnv-v0"):
        trainer.train(str(tmp_path), task=settings.Task(env_name="NoSuchEnv-v0"))
    assert not os.path.exists(tmp_path / "train" / "checkpoint")


class _RestartedGymEnvs(gym_batch.BatchedGymEnv, Restartable):
    """CartPoles that claim 3 restarts."""
    restarts = 3


def test_environment_restarts_are_summarised(tmp_path, smoke_gin):
    suites.register_suite("restarted_gym", lambda name, batch_size, seed: (
        tf_py_environment.TFPyEnvironment(_RestartedGymEnvs(
            [gym.make(name) for _ in range(batch_size)], seed=seed))))
    trainer.train(str(tmp_path), task=settings.Task(suite="restarted_gym"),
                  schedule=settings.Schedule(num_iterations=12), print_fn=lambda line: None)
    restarts = read_scalars(str(tmp_path / "train"))["Env/restarts"]
    assert restarts[-1][1] == 3 * 2  # two env threads


class _BatchRowsRecorded(replayers.OneTimeReplayer):
    """A OneTimeReplayer that keeps the batch_rows each construction was given."""
    given = []

    def __init__(self, *args, batch_rows=None, **kwargs):
        _BatchRowsRecorded.given.append(batch_rows)
        super().__init__(*args, batch_rows=batch_rows, **kwargs)


def test_one_time_replayer_reaches_the_learner(tmp_path, smoke_gin):
    """Given the learner's batch rows (Schedule.rows_per_batch 2 of the 4
    rows), so the train iteration is traced before the first batch."""
    _BatchRowsRecorded.given = []
    result = trainer.train(str(tmp_path), task=settings.Task(replayer_fn=_BatchRowsRecorded),
                           schedule=settings.Schedule(num_iterations=10,
                                                      train_steps_per_iteration=1),
                           print_fn=lambda line: None)
    assert result.global_step == 10 - 32 // 8 + 1
    assert _BatchRowsRecorded.given == [2]


def test_sac_plugs_in(tmp_path):
    agent_fn = functools.partial(agents.sac_agent, actor_fc_layer_params=(16,),
                                 critic_joint_fc_layer_params=(16,))
    result = trainer.train(str(tmp_path),
                           task=settings.Task(env_name="Pendulum-v1", agent_fn=agent_fn),
                           schedule=settings.Schedule(num_iterations=6, unroll_length=4,
                                                      initial_collect_steps=8,
                                                      sample_batch_size=8),
                           evaluation=settings.Evaluation(episodes=1, interval=4),
                           print_fn=lambda line: None)
    assert result.global_step == 5
    train = read_scalars(str(tmp_path / "train"))
    losses = [v for _, v in train["Losses/critic_loss"]]
    assert losses and np.isfinite(losses).all()
    assert {"Losses/actor_loss", "Losses/alpha_loss"} <= set(train)


def _built_learner(train_steps_per_iteration=3, wrap_agent=None):
    """A Learner over the smoke config's pieces, built from the public API and
    not run (the driver is never started; the caller stops it)."""
    spec_env = suites.load("suite_gym", "CartPole-v0")
    agent = agents.dqn_agent(spec_env.time_step_spec(), spec_env.action_spec(),
                             tf.Variable(0, dtype=tf.int64))
    spec_env.close()
    agent.initialize()
    if wrap_agent is not None:
        agent = wrap_agent(agent)
    replayer = replayers.UniformReplayer(agent.collect_data_spec, num_rows=4)
    driver = AsyncOffPolicyDriver(
        suites.make_env_constructor("suite_gym", "CartPole-v0", batch_size=2, seed=1),
        agent.collect_policy, num_envs=2, actor_queue_cap=2, unroll_length=4,
        exp_observers=[replayer])
    return Learner(agent, driver, replayer, train_steps_per_iteration=train_steps_per_iteration,
                   sample_batch_size=4)


def test_the_dry_call_trains_nothing_and_the_iteration_traces_agent_train_once(
        tmp_path, smoke_gin):
    learner = _built_learner()
    try:
        traces = []
        train = learner.agent.train

        def counting_train(experience):
            traces.append(1)
            return train(experience)

        learner.agent.train = counting_train
        # Some experience, so that the real iteration can sample.
        exp = tf.nest.map_structure(
            lambda s: tf.zeros([4, 8] + s.shape.as_list(), s.dtype),
            learner.agent.collect_data_spec)
        learner.replayer(exp._replace(step_type=tf.ones_like(exp.step_type),
                                      next_step_type=tf.ones_like(exp.next_step_type),
                                      discount=tf.ones_like(exp.discount)), tf.range(4))
        variables = learner.agent.variables + learner.replayer.variables
        before = [v.numpy() for v in variables]

        loss_info = learner.train(0)

        assert all(np.array_equal(b, v.numpy()) for b, v in zip(before, variables))
        assert learner.train_step == 0
        assert float(loss_info.loss) == 0.0
        assert [t.numpy().tolist() for t in tf.nest.flatten(loss_info.extra)] == [[0.0] * 4] * 2
        loss_info = learner.train(3)
        assert learner.train_step == 3
        assert np.isfinite(float(loss_info.loss))
        changed = sum(not np.array_equal(b, v.numpy()) for b, v in zip(before, variables))
        assert changed > 0
        assert len(traces) == 1
    finally:
        learner.driver.stop()


def test_a_failing_warm_up_raises_its_error_after_stopping(tmp_path, smoke_gin, monkeypatch):
    def failing_trace(self):
        raise KeyError("injected warm-up failure")

    # The evaluation's trace is a warm-up job (submitted once training starts).
    monkeypatch.setattr(Evaluator, "trace", failing_trace)
    before = set(threading.enumerate())
    with pytest.raises(KeyError, match="injected warm-up failure"):
        trainer.train(str(tmp_path), print_fn=lambda line: None)
    leftover = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert not leftover, leftover


def _raise(error):
    raise error


def test_warm_up_jobs_run_in_order_and_raise_their_own_errors(caplog):
    warm_up = WarmUp()
    ran = []
    warm_up.submit("first", ran.append, 1)
    warm_up.submit("second", _raise, LookupError("second failed"))
    warm_up.wait("first")
    assert ran == [1]
    warm_up.wait("never submitted")  # nothing to wait for
    with pytest.raises(LookupError, match="second failed"):
        warm_up.wait("second")
    warm_up.submit("third", _raise, ValueError("third failed"))
    with pytest.raises(ValueError, match="third failed"):
        warm_up.close()
    warm_up.submit("fourth", _raise, ValueError("fourth failed"))
    warm_up.close(reraise=False)
    assert "fourth" in caplog.text and "fourth failed" in caplog.text
    assert not [t for t in threading.enumerate() if t.name.startswith("alf_async_warm_up")]


class _ExtraNoneAgent(object):
    """An agent stand-in whose LossInfo holds a None and a Python value."""

    def __init__(self, agent):
        self._agent = agent

    def __getattr__(self, name):
        return getattr(self._agent, name)

    def train(self, experience):
        loss_info = self._agent.train(experience)
        return loss_info._replace(extra={"none": None, "constant": 3, "td": loss_info.extra})


def test_the_iteration_returns_a_loss_info_with_none_and_python_values(tmp_path, smoke_gin):
    learner = _built_learner(wrap_agent=_ExtraNoneAgent)
    try:
        exp = tf.nest.map_structure(
            lambda s: tf.ones([4, 8] + s.shape.as_list(), s.dtype),
            learner.agent.collect_data_spec)
        learner.replayer(exp, tf.range(4))
        assert learner.train(0).extra["none"] is None
        loss_info = learner.train(2)
        assert loss_info.extra["none"] is None and loss_info.extra["constant"] == 3
        assert np.isfinite(float(loss_info.loss)) and learner.train_step == 2
    finally:
        learner.driver.stop()


def test_a_driver_stopped_from_outside_raises_and_ends_every_thread(tmp_path, smoke_gin,
                                                                  monkeypatch):
    """stop() from another thread (not the stop_event): run_async's
    DriverStoppedError reaches the caller; the helper thread ends too (the
    autouse fixture checks it)."""
    from alf_async import driver as driver_lib
    run_async = driver_lib.AsyncOffPolicyDriver.run_async
    calls = []

    def stopping_run_async(self):
        calls.append(1)
        if len(calls) == 8:  # past initial collection: the helper has had jobs
            self.stop()
        return run_async(self)

    monkeypatch.setattr(driver_lib.AsyncOffPolicyDriver, "run_async", stopping_run_async)
    with pytest.raises(driver_lib.DriverStoppedError, match="the driver is stopped"):
        trainer.train(str(tmp_path), print_fn=lambda line: None)
