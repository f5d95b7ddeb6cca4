"""Evaluation beside training (`Evaluation.in_background`): the policy snapshot of
every agent builder, the evaluation thread's schedule, errors and stops on
the real Learner, the Evaluator's cancel, and train() end to end."""

import os
import threading
import time

import gin
import numpy as np
import pytest
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from alf_async import AsyncOffPolicyDriver, trainer
from alf_async import settings
from alf_async.learning import agents
from alf_async.learning.background_evaluation import BackgroundEvaluationHook, PolicySnapshot
from alf_async.learning.evaluation import Evaluator, eval_policy
from alf_async.learning.hooks import Hook
from alf_async.learning.learner import Learner
from alf_async.learning.replayers import UniformReplayer
from alf_async.testing.envs import CountingEnv, CountingEnvConstructor
from tf_agents.environments import tf_py_environment

from test_trainer import SMOKE_GIN, read_scalars

pytestmark = pytest.mark.timeout(120)

DISCRETE = (tensor_spec.BoundedTensorSpec([4], tf.float32, -1.0, 1.0),
            tensor_spec.BoundedTensorSpec([], tf.int64, 0, 2))
CONTINUOUS = (tensor_spec.BoundedTensorSpec([3], tf.float32, -1.0, 1.0),
              tensor_spec.BoundedTensorSpec([2], tf.float32, -1.0, 1.0))


def evaluation_threads():
    return [t for t in threading.enumerate() if t.name.startswith("alf_async_evaluation")]


@pytest.fixture(autouse=True)
def _clear_gin():
    gin.clear_config()
    yield
    gin.clear_config()


@pytest.mark.parametrize("builder, specs", [
    (agents.dqn_agent, DISCRETE), (agents.ppo_agent, DISCRETE), (agents.ppo_agent, CONTINUOUS),
    (agents.impala_agent, DISCRETE), (agents.sac_agent, CONTINUOUS)],
    ids=["dqn", "ppo_discrete", "ppo_continuous", "impala", "sac"])
def test_a_snapshot_makes_the_evaluated_policy_act_as_the_agents(builder, specs):
    observation_spec, action_spec = specs
    time_step_spec = ts.time_step_spec(observation_spec)

    def build():
        return builder(time_step_spec, action_spec, tf.Variable(0, dtype=tf.int64))

    agent, shadow = build(), build()
    # Every float variable of the agent moves (normalizers too, if the
    # policy left one out of its variables, the actions would differ).
    rng = np.random.default_rng(0)
    for v in agent.variables:
        if v.dtype.is_floating:
            v.assign_add(np.abs(rng.normal(size=v.shape)).astype(v.dtype.as_numpy_dtype) + 0.1)
    observations = tf.constant(rng.uniform(-1, 1, size=(64,) + tuple(observation_spec.shape)),
                               tf.float32)
    step = ts.restart(observations, batch_size=64)

    def actions(policy):
        return eval_policy(policy, greedy=True).action(step).action.numpy()

    snapshot = PolicySnapshot(agent.policy, shadow.policy)
    assert any(not np.array_equal(a.numpy(), b.numpy())
               for a, b in zip(agent.policy.variables(), shadow.policy.variables()))
    snapshot()
    for a, b in zip(agent.policy.variables(), shadow.policy.variables()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(actions(shadow.policy), actions(agent.policy))


def test_a_snapshot_of_another_agents_policy_is_refused():
    dqn = agents.dqn_agent(ts.time_step_spec(DISCRETE[0]), DISCRETE[1], tf.Variable(0, tf.int64))
    other = agents.dqn_agent(ts.time_step_spec(DISCRETE[0]), DISCRETE[1],
                             tf.Variable(0, tf.int64), fc_layer_params=(8, 8))
    with pytest.raises(ValueError, match=r"^the evaluated policy's variable \S+ \([\d, ]+\) "
                       r"float32 does not match the agent's \S+ \([\d, ]+\) float32: build "
                       r"both with the same agent function$"):
        PolicySnapshot(dqn.policy, other.policy)
    small = agents.dqn_agent(ts.time_step_spec(DISCRETE[0]), DISCRETE[1],
                             tf.Variable(0, tf.int64), fc_layer_params=(8, 8, 8))
    with pytest.raises(ValueError, match=r"^the evaluated policy has 8 variables and the "
                       r"agent's 6: build both"):
        PolicySnapshot(dqn.policy, small.policy)


def test_a_cancelled_evaluator_ends_its_running_call_and_plays_no_more():
    # Episodes of a million steps: only the cancel ends the call.
    env = tf_py_environment.TFPyEnvironment(CountingEnv(episode_length=10**6))
    spec = env.action_spec()

    class Zero(object):   # an action-spec-shaped policy of zeros, tf-agents' interface
        def get_initial_state(self, batch_size):
            return ()

        def action(self, time_step, state=()):
            from tf_agents.trajectories import policy_step
            return policy_step.PolicyStep(tf.zeros([1] + spec.shape.as_list(), spec.dtype), ())

    evaluator = Evaluator(env, Zero(), max_steps=10**9)
    result = []
    thread = threading.Thread(target=lambda: result.append(evaluator()))
    thread.start()
    time.sleep(0.5)
    assert thread.is_alive() and not evaluator.cancelled
    cancelled_at = time.monotonic()
    evaluator.cancel()
    thread.join(5)
    assert not thread.is_alive() and time.monotonic() - cancelled_at < 1.0
    assert result[0][1] > 10                     # steps played before the cancel
    assert evaluator.cancelled and evaluator() == (0.0, 0.0)   # no step more


class GatedEvaluator(object):
    """The evaluator interface (trace, num_episodes, cancel, a call), its calls
    scripted: each waits for `gate` (or a cancel), then returns the sum of
    the evaluated policy's variables as its 'return'."""

    num_episodes = 1

    def __init__(self, policy, error=None):
        self.policy = policy
        self.gate = threading.Event()
        self.calls = 0
        self.cancelled = False
        self._error = error

    def trace(self):
        pass

    def cancel(self):
        self.cancelled = True

    def __call__(self):
        self.calls += 1
        while not self.gate.wait(0.01) and not self.cancelled:
            pass
        if self._error is not None:
            raise self._error
        return weights(self.policy), 1.0


def weights(policy):
    return float(sum(tf.reduce_sum(v).numpy() for v in policy.variables()))


class StepRecorder(Hook):
    """The trained policy's weights at every train step; opens `gate` once
    the train step reaches `open_at` (after the evaluation hook's turn)."""

    def __init__(self, policy, gate=None, open_at=None, stop=None):
        self.policy, self.gate, self.open_at, self.stop = policy, gate, open_at, stop
        self.weights = {}

    def after_iteration(self, learner, train_step_before, train_step):
        self.weights[train_step] = weights(self.policy)
        if self.gate is not None and train_step >= self.open_at:
            self.gate.set()
        if self.stop is not None and train_step >= self.stop:
            learner.stop()


def _dqn():
    env = CountingEnvConstructor()()
    return agents.dqn_agent(env.time_step_spec(), env.action_spec(),
                            tf.Variable(0, dtype=tf.int64), fc_layer_params=(8,))


def _learner(agent, hooks):
    replayer = UniformReplayer(agent.collect_data_spec, num_rows=2, capacity_per_row=100)
    driver = AsyncOffPolicyDriver(CountingEnvConstructor(), agent.collect_policy, num_envs=2,
                                  unroll_length=1, exp_observers=[replayer])
    return Learner(agent, driver, replayer, train_steps_per_iteration=1, sample_batch_size=4,
                   initial_collect_steps=4, hooks=hooks)


def _hook(lines, interval=2, writer=None, error=None, **kwargs):
    """(the agent, a BackgroundEvaluationHook over a GatedEvaluator of a second agent)."""
    agent, shadow = _dqn(), _dqn()
    evaluator = GatedEvaluator(shadow.policy, error=error)
    hook = BackgroundEvaluationHook(
        evaluator, PolicySnapshot(agent.policy, shadow.policy),
        writer or tf.summary.create_noop_writer(), interval, print_fn=lines.append, **kwargs)
    return agent, evaluator, hook


def test_the_learner_trains_on_while_an_evaluation_of_its_snapshot_plays(tmp_path):
    lines = []
    agent, evaluator, hook = _hook(lines,
                                   writer=tf.summary.create_file_writer(str(tmp_path / "eval")))
    recorder = StepRecorder(agent.policy, evaluator.gate, open_at=8)
    learner = _learner(agent, [hook, recorder])
    assert learner.run(num_train_steps=12) == "num_train_steps"
    assert not evaluation_threads()
    steps = [e[1] for e in hook.evaluations]
    # The first evaluation (train step 2) played until step 8: those due at
    # 4, 6 and 8 were not made. Step 12's is waited for at the end.
    assert steps[0] == 2 and steps[-1] == 12 and set(steps) <= {2, 10, 12}
    assert hook.not_made >= 3 and len(steps) + hook.not_made == 6
    assert evaluator.calls == len(steps)
    # Each evaluated the weights of its own train step, not those it ended at.
    for _, step, _, average_return, _ in hook.evaluations:
        assert average_return == recorder.weights[step]
    assert recorder.weights[2] != recorder.weights[8]
    assert lines[-1] == (f"[alf_async] {hook.not_made} evaluations were due while one ran, "
                         f"and were not made (Evaluation.in_background)")
    assert [line.split(" (")[0] for line in lines[:-1]] == [
        f"[alf_async] eval at train step {s}" for s in steps]
    written = read_scalars(str(tmp_path / "eval"))["Metrics/AverageReturn"]
    assert written == [(s, pytest.approx(r, rel=1e-6)) for _, s, _, r, _ in hook.evaluations]


@pytest.mark.parametrize("interval", [3, 1])
def test_reaching_the_return_stops_the_learner_with_the_snapshots_step(interval):
    # At interval 1 an evaluation is due at the iteration that records the
    # solving one: none starts, since the learner stops there.
    agent, evaluator, hook = _hook([], interval=interval, stop_at_return=-1e9)
    evaluator.gate.set()
    learner = _learner(agent, [hook])
    assert learner.run(num_train_steps=100) == "stop_at_eval_return"
    assert [e[1] for e in hook.evaluations] == [interval] and evaluator.calls == 1
    assert learner.train_step > interval and hook.solved_secs == hook.evaluations[0][0]
    assert not evaluation_threads()


def test_an_evaluation_error_is_raised_by_the_learner_with_its_type():
    agent, evaluator, hook = _hook([], error=LookupError("evaluation failed"))
    evaluator.gate.set()
    learner = _learner(agent, [hook])
    with pytest.raises(LookupError, match="^evaluation failed$"):
        learner.run(num_train_steps=100)
    assert not evaluation_threads()
    assert not [t for t in learner.driver.threads if t.is_alive()]


def test_a_stop_cancels_the_running_evaluation_and_records_nothing():
    agent, evaluator, hook = _hook([])   # its gate never opens: only the cancel ends it
    learner = _learner(agent, [hook, StepRecorder(agent.policy, stop=6)])
    start = time.monotonic()
    assert learner.run(num_train_steps=1000) == "stop_event"
    assert time.monotonic() - start < 30
    assert evaluator.calls == 1 and evaluator.cancelled
    assert hook.evaluations == [] and not evaluation_threads()


def test_train_evaluates_in_the_background_and_stops_when_solved(tmp_path):
    gin.parse_config_files_and_bindings([SMOKE_GIN], [])
    lines = []
    result = trainer.train(str(tmp_path),
                           evaluation=settings.Evaluation(in_background=True, stop_at_return=0.0),
                           print_fn=lines.append)
    assert result.stopped_by == "stop_at_eval_return" and result.global_step >= 20
    assert [e[1] for e in result.evaluations] == [20]
    assert [line for line in lines if "eval at" in line][0].startswith(
        "[alf_async] eval at train step 20 (")
    evaluation = read_scalars(str(tmp_path / "eval"))
    assert [step for step, _ in evaluation["Metrics/AverageReturn"]] == [20]
    assert not evaluation_threads()
    with pytest.raises(trainer.ConfigError):
        trainer.train(str(tmp_path / "other"), evaluation=settings.Evaluation(in_background="yes"),
                      print_fn=lines.append)
