"""impala_agent's settings from OpenAI baselines' a2c, each checked exactly:
the torso's orthogonal initializers' gains and the learning rate's linear
annealing (per gradient step, under RMSprop as under Adam)."""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from alf_async.environments import suites
from alf_async.learning import agents
from test_ppo_reference import _kernels  # noqa: E402  (tests/ is on sys.path)
from test_unroll_agents import _collect, _linked  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _cartpole():
    return suites.load("suite_gym", "CartPole-v0", batch_size=4, seed=0)


def test_orthogonal_init_gives_the_torso_gain_sqrt2_one_initializer_per_kernel():
    action_spec = _cartpole().action_spec()
    pixels = tensor_spec.BoundedTensorSpec([12, 12, 2], tf.uint8, 0, 255)
    agent = agents.impala_agent(ts.time_step_spec(pixels), action_spec, tf.Variable(0, tf.int64),
                                conv_layer_params=((4, 4, 2),), fc_layer_params=(8, 8),
                                orthogonal_init=True)
    net = agent.network
    [conv] = _kernels(net, "conv2d")
    conv = conv.reshape(-1, 4)                                 # [4 * 4 * 2, 4]
    np.testing.assert_allclose(conv.T @ conv, 2.0 * np.eye(4), atol=1e-5)
    first, second = _kernels(net, "EncodingNetwork/dense")     # [100, 8], [8, 8]
    np.testing.assert_allclose(first.T @ first, 2.0 * np.eye(8), atol=1e-5)
    np.testing.assert_allclose(second.T @ second, 2.0 * np.eye(8), atol=1e-5)
    assert not np.allclose(first[:8], second)                  # one initializer per kernel
    [logits] = _kernels(net, "policy_logits")                  # [8, 2]
    np.testing.assert_allclose(logits.T @ logits, 1e-4 * np.eye(2), atol=1e-9)
    [value] = _kernels(net, "value")                           # [8, 1]
    np.testing.assert_allclose(value.T @ value, [[1.0]], atol=1e-5)
    biases = [v.numpy() for v in net.trainable_weights if "bias" in v.name]
    assert len(biases) == 5 and all(not b.any() for b in biases)


def test_without_orthogonal_init_the_torso_keeps_tf_agents_he_initializer():
    env = _cartpole()
    tf.random.set_seed(0)
    agent = agents.impala_agent(env.time_step_spec(), env.action_spec(),
                                tf.Variable(0, tf.int64), fc_layer_params=(8, 8))
    [_, second] = _kernels(agent.network, "EncodingNetwork/dense")
    # He truncated normal: entries within 2 standard deviations of
    # sqrt(2 / fan in) / 0.8796 (the truncation's correction), and not orthogonal.
    assert np.abs(second).max() <= 2 * (2.0 / 8) ** 0.5 / 0.87962566
    assert not np.allclose(second.T @ second, 2.0 * np.eye(8), atol=1e-2)


@pytest.mark.parametrize("optimizer_fn", [None, tf.keras.optimizers.RMSprop],
                         ids=["adam", "rmsprop"])
def test_the_learning_rate_falls_linearly_to_zero_over_the_decay_steps(optimizer_fn):
    """Train step k (from 0) applies 7e-4 x (1 - k / 10), then 0."""
    env = _cartpole()
    agent = agents.impala_agent(env.time_step_spec(), env.action_spec(),
                                tf.Variable(0, tf.int64), fc_layer_params=(8,),
                                learning_rate=7e-4, optimizer_fn=optimizer_fn,
                                learning_rate_decay_steps=10)
    train = tf.function(agent.train)
    exp = _linked(_collect(env, agent.collect_policy, 3))
    applied = []
    for _ in range(12):
        train(exp)
        applied.append(float(agent._optimizer.learning_rate))  # the last step's rate
    expected = [7e-4 * (1 - k / 10) for k in range(10)] + [0.0, 0.0]
    np.testing.assert_allclose(applied, expected, rtol=1e-5, atol=1e-12)
    assert int(agent._optimizer.iterations) == 12 and int(agent.train_step_counter) == 12


def test_learning_rate_decay_steps_must_be_a_positive_int():
    env = _cartpole()
    with pytest.raises(ValueError, match="^impala_agent.learning_rate_decay_steps must be an "
                                         "int >= 1, got 0"):
        agents.impala_agent(env.time_step_spec(), env.action_spec(), tf.Variable(0, tf.int64),
                            learning_rate_decay_steps=0)
