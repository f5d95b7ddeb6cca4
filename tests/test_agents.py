"""The agent builders: their train step traces once and trains every variable."""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.environments import suite_gym
from tf_agents.specs import tensor_spec
from tf_agents.utils import common

from alf_async.learning import agents


def _specs(env_name):
    env = suite_gym.load(env_name)
    try:
        return (tensor_spec.from_spec(env.time_step_spec()),
                tensor_spec.from_spec(env.action_spec()))
    finally:
        env.close()


def _traces_and_train(agent, variables, steps=3):
    """(traces of a tf.function around agent.train, how many of `variables` changed)."""
    spec = agent.collect_data_spec
    experience = tensor_spec.sample_spec_nest(
        spec, outer_dims=(8, agent.train_sequence_length or 2), seed=1)
    # Every step of the windows is a mid-episode step (tf-agents' n-step
    # transitions need them), with a discount of 1; observations and rewards
    # are standard normal (the specs' bounds are +-3.4e38 for CartPole).
    shape = tf.shape(experience.reward)
    experience = experience._replace(
        step_type=tf.ones_like(experience.step_type),
        next_step_type=tf.ones_like(experience.next_step_type),
        discount=tf.ones_like(experience.discount),
        reward=tf.random.stateless_normal(shape, seed=(1, 2)),
        observation=tf.random.stateless_normal(tf.shape(experience.observation), seed=(3, 4)))
    traces = []

    def train(exp):
        traces.append(1)
        return agent.train(exp)

    train_fn = common.function(train)
    before = [v.numpy() for v in variables]
    losses = [float(train_fn(experience).loss) for _ in range(steps)]
    changed = sum(not np.array_equal(b, v.numpy()) for b, v in zip(before, variables))
    assert all(np.isfinite(losses))
    return len(traces), changed


@pytest.mark.timeout(120)
def test_dqn_train_step_traces_once():
    time_step_spec, action_spec = _specs("CartPole-v0")
    step = tf.Variable(0, dtype=tf.int64)
    agent = agents.dqn_agent(time_step_spec, action_spec, step, fc_layer_params=(8,),
                             agent_kwargs=dict(n_step_update=2))
    agent.initialize()
    q_variables = agent._q_network.trainable_variables
    traces, changed = _traces_and_train(agent, q_variables)
    # Without the optimizer built in advance: 2 (a function that creates
    # variables is traced again).
    assert traces == 1
    assert changed == len(q_variables) == 4  # 2 layers: kernels and biases
    assert int(step) == 3


@pytest.mark.timeout(120)
def test_dqn_without_prebuild_traces_twice():
    """What the builder saves (tf-agents' examples build the optimizer lazily)."""
    time_step_spec, action_spec = _specs("CartPole-v0")
    agent = agents.dqn_agent(time_step_spec, action_spec, tf.Variable(0, dtype=tf.int64),
                             fc_layer_params=(8,), agent_kwargs=dict(n_step_update=2),
                             prebuild_optimizer=False)
    agent.initialize()
    traces, changed = _traces_and_train(agent, agent._q_network.trainable_variables)
    assert (traces, changed) == (2, 4)


@pytest.mark.timeout(120)
def test_sac_train_step_traces_once():
    time_step_spec, action_spec = _specs("Pendulum-v1")
    step = tf.Variable(0, dtype=tf.int64)
    agent = agents.sac_agent(time_step_spec, action_spec, step, actor_fc_layer_params=(8,),
                             critic_joint_fc_layer_params=(8,))
    agent.initialize()
    variables = (agent._actor_network.trainable_variables +
                 agent._critic_network_1.trainable_variables +
                 agent._critic_network_2.trainable_variables + [agent._log_alpha])
    traces, changed = _traces_and_train(agent, variables)
    assert traces == 1
    # Each optimizer moved every variable it was built for.
    assert changed == len(variables) == 4 + 4 + 4 + 1
    assert int(step) == 3


@pytest.mark.timeout(120)
def test_sac_does_not_train_on_episode_boundaries():
    """A window from an episode's LAST step to the next FIRST is no transition:
    weight 0 in SAC's losses, as DqnAgent masks it. A batch of boundaries
    only has zero losses and leaves every variable as it was; the same batch
    as mid-episode windows trains them."""
    import gin  # pylint: disable=import-outside-toplevel
    time_step_spec, action_spec = _specs("Pendulum-v1")
    with gin.unlock_config():
        gin.bind_parameter("SacAgent.gamma", 0.5)   # SacAgent.* bindings still apply
    try:
        agent = agents.sac_agent(time_step_spec, action_spec, tf.Variable(0, dtype=tf.int64),
                                 actor_fc_layer_params=(8,), critic_joint_fc_layer_params=(8,))
    finally:
        gin.clear_config()
    assert isinstance(agent, agents.BoundaryMaskedSacAgent) and agent._gamma == 0.5
    agent.initialize()
    variables = (agent._actor_network.trainable_variables +
                 agent._critic_network_1.trainable_variables +
                 agent._critic_network_2.trainable_variables + [agent._log_alpha])
    experience = tensor_spec.sample_spec_nest(agent.collect_data_spec, outer_dims=(8, 2), seed=1)
    experience = experience._replace(
        reward=tf.random.stateless_normal([8, 2], seed=(1, 2)),
        discount=tf.ones([8, 2]),
        observation=tf.random.stateless_normal([8, 2, 3], seed=(3, 4)))
    boundaries = experience._replace(step_type=tf.constant([[2, 0]] * 8),
                                     next_step_type=tf.constant([[0, 1]] * 8))
    before = [v.numpy() for v in variables]
    loss = agent.train(boundaries)
    assert float(loss.loss) == 0.0
    assert all(float(x) == 0.0 for x in tf.nest.flatten(loss.extra))
    assert all(np.array_equal(b, v.numpy()) for b, v in zip(before, variables))
    mid = experience._replace(step_type=tf.ones([8, 2], tf.int32),
                              next_step_type=tf.ones([8, 2], tf.int32))
    assert float(agent.train(mid).loss) != 0.0
    assert all(not np.array_equal(b, v.numpy()) for b, v in zip(before, variables))


def _pixel_specs(num_actions=4, shape=(12, 12, 2)):
    observation = tensor_spec.BoundedTensorSpec(shape, tf.uint8, 0, 255)
    action = tensor_spec.BoundedTensorSpec([], tf.int64, 0, num_actions - 1)
    from tf_agents.trajectories import time_step as ts  # pylint: disable=import-outside-toplevel
    return ts.time_step_spec(observation), action


def _pixel_experience(agent, reward):
    """8 two-step windows of mid-episode steps with `reward` on every step."""
    experience = tensor_spec.sample_spec_nest(agent.collect_data_spec, outer_dims=(8, 2), seed=5)
    return experience._replace(
        step_type=tf.ones_like(experience.step_type),
        next_step_type=tf.ones_like(experience.next_step_type),
        discount=tf.ones_like(experience.discount),
        reward=tf.fill(tf.shape(experience.reward), reward))


@pytest.mark.timeout(120)
def test_dqn_conv_network_takes_uint8_pixels_scaled_to_unit_range():
    time_step_spec, action_spec = _pixel_specs()
    agent = agents.dqn_agent(time_step_spec, action_spec, tf.Variable(0, dtype=tf.int64),
                             conv_layer_params=((4, 3, 2), (8, 3, 1)), fc_layer_params=(16,))
    q_net = agent._q_network
    layers = q_net.layers[0].layers   # the EncodingNetwork: rescaling, convs, flatten, dense
    assert isinstance(layers[0], tf.keras.layers.Rescaling) and layers[0].scale == 1 / 255
    assert [(l.filters, l.kernel_size, l.strides) for l in layers
            if isinstance(l, tf.keras.layers.Conv2D)] == [(4, (3, 3), (2, 2)), (8, (3, 3), (1, 1))]
    white = tf.fill([1, 12, 12, 2], tf.constant(255, tf.uint8))
    q_values, _ = q_net(white)
    assert q_values.shape == (1, 4) and q_values.dtype == tf.float32
    # The network's first layer sees the byte 255 as 1.0.
    np.testing.assert_allclose(layers[0](white).numpy(), np.ones([1, 12, 12, 2]))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bad, message", [
    (dict(conv_layer_params=((32, 8),)), "dqn_agent.conv_layer_params must be"),
    (dict(reward_clip=(1.0, -1.0)), "dqn_agent.reward_clip must be (low, high) with low < high"),
])
def test_dqn_refuses_bad_conv_layers_and_reward_clips(bad, message):
    time_step_spec, action_spec = _pixel_specs()
    with pytest.raises(ValueError) as error:
        agents.dqn_agent(time_step_spec, action_spec, tf.Variable(0, dtype=tf.int64), **bad)
    assert str(error.value).startswith(message)


@pytest.mark.timeout(120)
def test_reward_clip_trains_on_clipped_rewards_only():
    """An agent with reward_clip (-1, 1) trained on rewards of 7 takes exactly
    the step an unclipped twin takes on rewards of 1; the experience it was
    given is left as it was."""
    time_step_spec, action_spec = _pixel_specs()

    def build(**kwargs):
        tf.keras.utils.set_random_seed(3)
        agent = agents.dqn_agent(time_step_spec, action_spec, tf.Variable(0, dtype=tf.int64),
                                 conv_layer_params=((4, 3, 2),), fc_layer_params=(8,),
                                 **kwargs)
        agent.initialize()
        return agent

    clipped, plain = build(reward_clip=(-1.0, 1.0)), build()
    assert type(clipped).__name__ == "RewardClippedDqnAgent"
    for net in ("_q_network", "_target_q_network"):
        for a, b in zip(getattr(clipped, net).variables, getattr(plain, net).variables):
            b.assign(a)
    sevens = _pixel_experience(clipped, 7.0)
    ones = sevens._replace(reward=tf.ones_like(sevens.reward))
    loss_clipped = float(clipped.train(sevens).loss)
    loss_plain = float(plain.train(ones).loss)
    assert loss_clipped == pytest.approx(loss_plain, rel=1e-6)
    for a, b in zip(clipped._q_network.variables, plain._q_network.variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)
    assert float(tf.reduce_min(sevens.reward)) == 7.0
    twin = build()
    for net in ("_q_network", "_target_q_network"):
        for a, b in zip(getattr(plain, net).variables, getattr(twin, net).variables):
            b.assign(a)
    loss_unclipped_sevens = float(twin.train(sevens).loss)
    assert loss_unclipped_sevens > 2 * loss_plain
