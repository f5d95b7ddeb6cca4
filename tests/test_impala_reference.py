"""impala_agent's settings from OpenAI baselines' a2c, each checked exactly:
the torso's orthogonal initializers' gains, the learning rate's linear
annealing (per gradient step, under RMSprop as under Adam), the value
loss's weight against a hand-computed batch, and TensorFlow 1's RMSprop
(`TF1RMSprop`), step by step."""

import gin
import numpy as np
import pytest
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from alf_async.environments import suites
from alf_async.learning import agents
from alf_async.learning.optimizers import TF1RMSprop
from test_ppo_reference import (  # noqa: E402  (tests/ is on sys.path)
    _kernels, assert_rate_falls_to_zero_over_10_steps)
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
    assert_rate_falls_to_zero_over_10_steps(agent, env, 7e-4)
    assert int(agent.train_step_counter) == 12


def test_learning_rate_decay_steps_must_be_a_positive_int():
    env = _cartpole()
    with pytest.raises(ValueError, match="^impala_agent.learning_rate_decay_steps must be an "
                                         "int >= 1, got 0"):
        agents.impala_agent(env.time_step_spec(), env.action_spec(), tf.Variable(0, tf.int64),
                            learning_rate_decay_steps=0)


def test_the_value_loss_is_the_coefficient_times_half_the_mean_squared_error():
    """On-policy (every ratio 1), V-trace's targets are the unroll's n-step
    returns: vs_t = sum_k gamma^k r_(t+k) + gamma^(T-t) V(x_T). The loss's
    value term is value_pred_loss_coef x mean(0.5 (vs_t - V(x_t))^2), so
    a2c's vf_coef 0.5 x mean((R - V)^2) is a coefficient of 1.0 here."""
    env = _cartpole()
    agent = agents.impala_agent(env.time_step_spec(), env.action_spec(),
                                tf.Variable(0, tf.int64), fc_layer_params=(8,))
    # [4, 5]: the first unroll's step 0 is a boundary (the linked
    # placeholder), then 3 transitions per row, no episode ends.
    exp = _linked(_collect(env, agent.collect_policy, 4))
    np.testing.assert_array_equal(exp.is_boundary().numpy(), [[1, 0, 0, 0, 0]] * 4)
    losses = {}
    for coef in (0.0, 1.0):
        agent._value_coef = coef                                     # pylint: disable=protected-access
        losses[coef] = agent._loss(exp, None)                        # pylint: disable=protected-access
    np.testing.assert_allclose(losses[1.0][1].mean_rho.numpy(), 1.0, rtol=1e-6)
    (_, values), _ = agent.network(exp.observation)
    values, rewards = values.numpy(), exp.reward.numpy()
    discounts = 0.99 * exp.discount.numpy()
    targets = np.zeros_like(values[:, 1:-1])              # transitions 1-3 of each row
    for b in range(values.shape[0]):
        ret = values[b, -1]
        for t in (3, 2, 1):
            ret = rewards[b, t] + discounts[b, t] * ret
            targets[b, t - 1] = ret
    expected = np.mean(0.5 * (targets - values[:, 1:-1]) ** 2)
    np.testing.assert_allclose(losses[1.0][1].value_estimation_loss.numpy(), expected, rtol=1e-5)
    np.testing.assert_allclose(losses[1.0][0].numpy() - losses[0.0][0].numpy(), expected,
                               rtol=1e-4)


def test_tf1_rmsprop_starts_the_mean_square_at_one():
    """TF1's RMSPropOptimizer, step by step: ms = rho ms + (1 - rho) g^2
    from ms = 1, then w -= lr g / sqrt(ms + epsilon)."""
    weights = tf.Variable([1.0, -2.0, 0.5])
    optimizer = TF1RMSprop(0.1, rho=0.9, epsilon=1e-5)
    grads = [np.array([0.5, 0.1, 0.0], np.float32), np.array([-0.3, 0.2, 4.0], np.float32)]
    w, ms = np.array([1.0, -2.0, 0.5]), np.ones(3)
    for g in grads:
        optimizer.apply_gradients([(tf.constant(g), weights)])
        ms = 0.9 * ms + 0.1 * g.astype(np.float64) ** 2
        w = w - 0.1 * g / np.sqrt(ms + 1e-5)
        np.testing.assert_allclose(weights.numpy(), w, rtol=1e-6)
    # Keras' RMSprop from ms = 0 moves the first step ~ lr / sqrt(1 - rho) = 3.2 x lr.
    keras = tf.Variable([1.0])
    tf.keras.optimizers.RMSprop(0.1, rho=0.9, epsilon=1e-5).apply_gradients(
        [(tf.constant([0.5]), keras)])
    np.testing.assert_allclose(1.0 - keras.numpy(), 0.1 / np.sqrt(0.1 + 1e-5 / 0.25), rtol=1e-5)


def test_impala_agent_takes_tf1_rmsprop_from_gin_and_restores_its_mean_square(tmp_path):
    gin.clear_config()
    try:
        gin.parse_config(["impala_agent.optimizer_fn = @TF1RMSprop", "TF1RMSprop.rho = 0.99",
                          "TF1RMSprop.epsilon = 1e-5"])
        env = _cartpole()
        agent = agents.impala_agent(env.time_step_spec(), env.action_spec(),
                                    tf.Variable(0, tf.int64), fc_layer_params=(8,))
    finally:
        gin.clear_config()
    optimizer = agent._optimizer                                   # pylint: disable=protected-access
    assert type(optimizer).__name__ == "TF1RMSprop"
    assert optimizer.rho == 0.99 and optimizer.epsilon == 1e-5
    velocities = [v.numpy() for v in optimizer.variables if "velocity" in v.name]
    assert len(velocities) == 6 and all((v == 1.0).all() for v in velocities)   # built: all 1
    agent.train(_linked(_collect(env, agent.collect_policy, 3)))
    trained = [v.numpy() for v in optimizer.variables if "velocity" in v.name]
    assert all((v < 1.0).any() for v in trained)                  # one step moved each
    checkpoint = tf.train.Checkpoint(agent=agent)
    path = checkpoint.save(str(tmp_path / "ckpt"))
    other = agents.impala_agent(env.time_step_spec(), env.action_spec(),
                                tf.Variable(0, tf.int64), fc_layer_params=(8,),
                                optimizer_fn=TF1RMSprop)
    tf.train.Checkpoint(agent=other).restore(path).assert_existing_objects_matched()
    restored = [v.numpy() for v in other._optimizer.variables if "velocity" in v.name]  # pylint: disable=protected-access
    for a, b in zip(trained, restored):
        np.testing.assert_array_equal(a, b)
