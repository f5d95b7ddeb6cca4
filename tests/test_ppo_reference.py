"""ppo_agent's settings from the published PPO (OpenAI baselines' ppo2,
CleanRL's ppo_atari), each checked exactly: advantages normalized per
minibatch, the learning rate's linear annealing, the value loss's weight,
the orthogonal initializers' gains; and `metrics.EpisodeLog`, which
records the training episodes their curves plot."""

import gin
import numpy as np
import pytest
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

from alf_async import kernels
from alf_async.driver.metrics import EpisodeLog
from alf_async.environments import suites
from alf_async.learning import agents
from alf_async.learning.ppo import MinibatchPPOClipAgent
from test_metrics import make_traj  # noqa: E402  (tests/ is on sys.path)
from test_unroll_agents import _collect, _linked  # noqa: E402

pytestmark = pytest.mark.timeout(120)
FIRST, MID, LAST = 0, 1, 2


def _cartpole():
    return suites.load("suite_gym", "CartPole-v0", batch_size=4, seed=0)


class _AdvantageRecorder(MinibatchPPOClipAgent):
    """Records the advantages and weights each gradient step's loss is given."""

    def get_loss(self, time_steps, actions, act_log_probs, returns, normalized_advantages,
                 *args, **kwargs):
        weights = args[1] if len(args) > 1 else kwargs["weights"]
        self.seen.append((normalized_advantages.numpy().ravel(), weights.numpy().ravel()))
        return super().get_loss(time_steps, actions, act_log_probs, returns,
                                normalized_advantages, *args, **kwargs)


def _recorder_agent(env, normalization):
    actor_net = agents.actor_distribution_network.ActorDistributionNetwork(
        env.observation_spec(), env.action_spec(), fc_layer_params=(8,))
    value_net = agents.value_network.ValueNetwork(env.observation_spec(), fc_layer_params=(8,))
    agent = _AdvantageRecorder(
        env.time_step_spec(), env.action_spec(), optimizer=tf.keras.optimizers.Adam(1e-3),
        actor_net=actor_net, value_net=value_net, num_epochs=2, num_minibatches=3,
        advantage_normalization=normalization, train_step_counter=tf.Variable(0, tf.int64))
    agent.seen = []
    return agent


@pytest.mark.parametrize("normalization", ["minibatch", "batch"])
def test_advantages_are_normalized_per_minibatch_or_per_batch(normalization):
    env = _cartpole()
    agent = _recorder_agent(env, normalization)
    exp = _linked(_collect(env, agent.collect_policy, 12))   # 4 rows x 12 transitions
    agent.train(exp)                                          # eagerly: get_loss sees numpy
    assert len(agent.seen) == 2 * 3
    means, stds = [], []
    for advantages, weights in agent.seen:
        assert advantages.shape == (16,)                      # 48 // 3
        valid = advantages[weights > 0]
        means.append(valid.mean())
        stds.append(valid.std())
    if normalization == "minibatch":
        np.testing.assert_allclose(means, 0.0, atol=1e-5)
        np.testing.assert_allclose(stds, 1.0, rtol=1e-4)
    else:
        # Normalized once over the batch: one minibatch's mean and std are its sample's.
        assert max(abs(m) for m in means) > 1e-3
        assert max(abs(s - 1.0) for s in stds) > 1e-3
        epoch = np.concatenate([a[w > 0] for a, w in agent.seen[:3]])
        np.testing.assert_allclose([epoch.mean(), epoch.std()], [0.0, 1.0], atol=1e-4)


def test_advantage_normalization_refuses_an_unknown_place():
    env = _cartpole()
    with pytest.raises(ValueError, match=r"ppo_agent.advantage_normalization must be one of "
                                         r"\('batch', 'minibatch', 'none'\), got 'epoch'"):
        agents.ppo_agent(env.time_step_spec(), env.action_spec(), tf.Variable(0, tf.int64),
                         advantage_normalization="epoch")


def test_the_learning_rate_falls_linearly_to_zero_over_the_decay_steps():
    """Gradient step k (from 0) applies 2.5e-4 x (1 - k / 10), then 0."""
    env = _cartpole()
    agent = agents.ppo_agent(env.time_step_spec(), env.action_spec(), tf.Variable(0, tf.int64),
                             actor_fc_layer_params=(8,), value_fc_layer_params=(8,),
                             num_epochs=1, num_minibatches=1, learning_rate=2.5e-4,
                             learning_rate_decay_steps=10)
    assert_rate_falls_to_zero_over_10_steps(agent, env, 2.5e-4)


def assert_rate_falls_to_zero_over_10_steps(agent, env, rate):
    """Trains `agent` (one gradient step per train call) 12 times on one
    batch of `env`; the rate each call applied is rate x (1 - k / 10), then 0."""
    train = tf.function(agent.train)
    exp = _linked(_collect(env, agent.collect_policy, 3))
    applied = []
    for _ in range(12):
        train(exp)
        applied.append(float(agent._optimizer.learning_rate))  # the last step's rate
    expected = [rate * (1 - k / 10) for k in range(10)] + [0.0, 0.0]
    np.testing.assert_allclose(applied, expected, rtol=1e-5, atol=1e-12)
    assert int(agent._optimizer.iterations) == 12


def test_learning_rate_decay_steps_must_be_a_positive_int():
    env = _cartpole()
    with pytest.raises(ValueError, match="ppo_agent.learning_rate_decay_steps must be an int "
                                         ">= 1, got 0"):
        agents.ppo_agent(env.time_step_spec(), env.action_spec(), tf.Variable(0, tf.int64),
                         learning_rate_decay_steps=0)


def test_the_value_loss_is_the_coefficient_times_the_mean_squared_error():
    """tf-agents' value loss has no 0.5 factor: ppo2's vf_coef 0.5 x 0.5 (x)^2
    is value_pred_loss_coef = 0.25 here."""
    env = _cartpole()
    with gin.unlock_config():
        gin.bind_parameter("PPOClipAgent.value_pred_loss_coef", 0.25)
        gin.bind_parameter("PPOClipAgent.normalize_observations", False)
    try:
        agent = agents.ppo_agent(env.time_step_spec(), env.action_spec(),
                                 tf.Variable(0, tf.int64), actor_fc_layer_params=(8,),
                                 value_fc_layer_params=(8,))
    finally:
        gin.clear_config()
    observation = tf.constant([[0.1, -0.2, 0.3, 0.0], [1.0, 0.5, -0.5, 0.2],
                               [0.0, 0.0, 0.0, 0.0]], tf.float32)
    time_steps = ts.TimeStep(step_type=tf.ones([3], tf.int32), reward=tf.zeros([3]),
                             discount=tf.ones([3]), observation=observation)
    values, _ = agent._value_net(observation)
    returns = tf.constant([1.0, -2.0, 0.5])
    weights = tf.constant([1.0, 1.0, 0.0])                    # the last one masked
    loss = agent.value_estimation_loss(time_steps, returns, weights).numpy()
    v = values.numpy()
    expected = 0.25 * ((1.0 - v[0]) ** 2 + (-2.0 - v[1]) ** 2) / 3.0   # mean over the batch
    np.testing.assert_allclose(loss, expected, rtol=1e-5)


def _kernels(network, fragment):
    """The kernels of `network` whose names hold `fragment`, in the order
    they were made (Keras numbers layer names process-wide)."""
    return [v.numpy() for v in network.trainable_weights
            if fragment in v.name and "kernel" in v.name]


def test_orthogonal_init_has_ppo2s_gains_and_zero_biases():
    env = _cartpole()
    agent = agents.ppo_agent(env.time_step_spec(), env.action_spec(), tf.Variable(0, tf.int64),
                             actor_fc_layer_params=(8, 8, 8), shared_torso=True,
                             orthogonal_init=True)
    agent.initialize()
    agent.collect_policy.action(env.reset())                  # builds every layer
    first, second, third = _kernels(agent._actor_net, "EncodingNetwork")
    np.testing.assert_allclose(first @ first.T, 2.0 * np.eye(4), atol=1e-5)  # [4, 8]
    np.testing.assert_allclose(second.T @ second, 2.0 * np.eye(8), atol=1e-5)
    np.testing.assert_allclose(third.T @ third, 2.0 * np.eye(8), atol=1e-5)
    assert not np.allclose(second, third)                     # one initializer per kernel
    [logits] = _kernels(agent._actor_net, "logits")           # [8, 2]
    np.testing.assert_allclose(logits.T @ logits, 1e-4 * np.eye(2), atol=1e-9)
    [value] = _kernels(agent._value_net, "value")             # [8, 1]
    np.testing.assert_allclose(value.T @ value, [[1.0]], atol=1e-5)
    biases = [v.numpy() for v in agent.variables_to_train() if "bias" in v.name]
    assert len(biases) == 5 and all(not b.any() for b in biases)


def test_orthogonal_init_gains_on_a_convolutional_torso():
    env = suites.load("suite_gym", "CartPole-v0", batch_size=1)  # for the action spec only
    from tf_agents.specs import tensor_spec
    pixels = tensor_spec.BoundedTensorSpec([12, 12, 2], tf.uint8, 0, 255)
    time_step_spec = ts.time_step_spec(pixels)
    agent = agents.ppo_agent(time_step_spec, env.action_spec(), tf.Variable(0, tf.int64),
                             conv_layer_params=((4, 4, 2),), actor_fc_layer_params=(16,),
                             orthogonal_init=True)
    observation = tf.zeros([1, 12, 12, 2], tf.uint8)
    agent.collect_policy.action(ts.restart(observation, batch_size=1))
    [conv] = _kernels(agent._actor_net, "conv2d")
    conv = conv.reshape(-1, 4)                                 # [4 * 4 * 2, 4]
    np.testing.assert_allclose(conv.T @ conv, 2.0 * np.eye(4), atol=1e-5)


def test_orthogonal_init_is_for_discrete_actors():
    env = suites.load("suite_gym", "Pendulum-v1", batch_size=1)
    with pytest.raises(ValueError, match="ppo_agent.orthogonal_init: ppo2's initialization is "
                                         "for the discrete actor"):
        agents.ppo_agent(env.time_step_spec(), env.action_spec(), tf.Variable(0, tf.int64),
                         orthogonal_init=True)


def _pixel_specs():
    from tf_agents.specs import tensor_spec
    action = tensor_spec.BoundedTensorSpec((), tf.int64, 0, 2)
    return ts.time_step_spec(tensor_spec.BoundedTensorSpec([12, 12, 2], tf.uint8, 0, 255)), action


@pytest.mark.parametrize("builder", ["ppo_agent", "impala_agent"])
def test_a_bfloat16_torso_computes_in_bfloat16_over_float32_variables(builder):
    time_step_spec, action_spec = _pixel_specs()
    make = lambda policy: getattr(agents, builder)(
        time_step_spec, action_spec, tf.Variable(0, tf.int64), conv_layer_params=((4, 4, 2),),
        **{"actor_fc_layer_params" if builder == "ppo_agent" else "fc_layer_params": (16,)},
        torso_dtype_policy=policy)
    tf.keras.utils.set_random_seed(0)
    mixed = make("mixed_bfloat16")
    tf.keras.utils.set_random_seed(0)
    full = make("float32")
    observation = tf.constant(np.random.default_rng(0).integers(0, 256, [3, 12, 12, 2]),
                              tf.uint8)
    time_step = ts.restart(observation, batch_size=3)
    for agent in (mixed, full):
        agent.collect_policy.action(time_step)                # builds every layer
    for a, b in zip(mixed.collect_policy.variables(), full.collect_policy.variables()):
        b.assign(a)                                           # the same weights
    net = mixed._actor_net if builder == "ppo_agent" else mixed._network
    layers = {layer.name: layer for layer in net._flatten_layers(include_self=False)}
    torso = [l for name, l in layers.items() if name.startswith(("conv2d", "dense"))]
    assert len(torso) == 2 and all(l.compute_dtype == "bfloat16" for l in torso)
    # Pixels go from uint8 to bfloat16 at once and are scaled there, by
    # bfloat16's 1 / 255: within two bfloat16 roundings (2 x 2^-8) of / 255.
    scaling = [l for name, l in layers.items() if name.startswith("rescaling")]
    assert [l.compute_dtype for l in scaling] == ["bfloat16"]
    scaled = scaling[0](observation)
    assert scaled.dtype == tf.bfloat16
    bf16 = lambda x: tf.cast(x, tf.bfloat16)
    np.testing.assert_array_equal(tf.cast(scaled, tf.float32),
                                  tf.cast(bf16(observation) * bf16(1 / 255), tf.float32))
    np.testing.assert_allclose(tf.cast(scaled, tf.float32), observation.numpy() / 255.0,
                               rtol=2 * 2 ** -8)
    assert all(v.dtype == tf.float32 for v in mixed.collect_policy.variables())
    logits = lambda agent: agent.collect_policy.distribution(time_step).action.logits
    assert logits(mixed).dtype == tf.float32                 # the heads stay float32
    # bfloat16 keeps 8 bits of mantissa: the logits agree to ~1e-2 of their size.
    np.testing.assert_allclose(logits(mixed), logits(full), atol=2e-2 * float(
        tf.reduce_max(tf.abs(logits(full)))) + 1e-6)
    with pytest.raises(ValueError, match=f"{builder}.torso_dtype_policy must be one of "
                                         f"\\('float32', 'mixed_bfloat16', 'auto'\\), "
                                         f"got 'float16'"):
        make("float16")


def test_auto_torso_is_bfloat16_where_the_kernel_choice_says(monkeypatch):
    # Which CPUs and choices say so: tests/test_kernels.py.
    time_step_spec, action_spec = _pixel_specs()
    for has, compute in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(kernels, "bf16_torsos", lambda has=has: has)
        agent = agents.ppo_agent(time_step_spec, action_spec, tf.Variable(0, tf.int64),
                                 conv_layer_params=((4, 4, 2),), actor_fc_layer_params=(16,),
                                 torso_dtype_policy="auto")
        conv = [l for l in agent._actor_net._flatten_layers(include_self=False)
                if l.name.startswith("conv2d")]
        assert [l.compute_dtype for l in conv] == [compute]


def test_episode_log_records_each_episode_with_the_env_steps_it_ended_by():
    # Two rows, their unrolls of 3 arriving in turns; row 7 ends an episode
    # across two unrolls, row 2 ends one inside its second.
    log = EpisodeLog()
    row7 = make_traj(np.array([[FIRST, MID, MID]]), np.array([[MID, MID, MID]]),
                     np.array([[1.0, 2.0, 0.5]], np.float32))
    row2 = make_traj(np.array([[FIRST, MID, MID]]), np.array([[MID, MID, MID]]),
                     np.array([[-1.0, 0.0, 0.0]], np.float32))
    log(row7, np.array([7]))
    log(row2, np.array([2]))
    assert log.episodes == [] and log.env_steps == 6
    both = make_traj(np.array([[MID, LAST, FIRST], [MID, MID, LAST]]),
                     np.array([[LAST, FIRST, MID], [MID, LAST, FIRST]]),
                     np.array([[3.0, 0.0, 4.0], [-1.0, -1.0, 0.0]], np.float32))
    log(both, np.array([7, 2]))
    # Row 7: 1 + 2 + 0.5 + 3 over 4 transitions; row 2: -1 - 1 - 1 over 5
    # (a boundary transition LAST -> FIRST adds nothing).
    assert log.episodes == [(12, 6.5, 4), (12, -3.0, 5)]
    log(make_traj(np.array([[MID]]), np.array([[LAST]]), np.array([[2.0]], np.float32)),
        np.array([7]))
    assert log.episodes[-1] == (13, 6.0, 2) and log.env_steps == 13


def test_reward_clip_trains_on_clipped_rewards_and_leaves_the_experience_as_it_was():
    """A PPO agent with reward_clip (-1, 1) trained on rewards of 7 takes exactly
    the step its unclipped twin takes on rewards of 1 (and not the one it takes
    on 7s); the experience it was given keeps its 7s. (tf-agents' reward
    normalizer, which would hide the scale, is off, as in ppo_pong.gin.)"""
    env = _cartpole()
    with gin.unlock_config():
        gin.bind_parameter("PPOClipAgent.normalize_rewards", False)
    try:
        _assert_reward_clip_trains_on_clipped_rewards(env)
    finally:
        gin.clear_config()


def _assert_reward_clip_trains_on_clipped_rewards(env):

    def build(**kwargs):
        tf.keras.utils.set_random_seed(3)
        return agents.ppo_agent(env.time_step_spec(), env.action_spec(),
                                tf.Variable(0, tf.int64), actor_fc_layer_params=(8,),
                                value_fc_layer_params=(8,), num_epochs=1, num_minibatches=1,
                                **kwargs)

    clipped, plain, twin = build(reward_clip=(-1.0, 1.0)), build(), build()
    assert type(clipped).__name__ == "RewardClippedMinibatchPPOClipAgent"
    for other in (plain, twin):
        for a, b in zip(clipped.variables_to_train(), other.variables_to_train()):
            b.assign(a)
    ones = _linked(_collect(env, plain.collect_policy, 3))
    assert set(np.unique(ones.reward.numpy())) == {0.0, 1.0}   # CartPole's, FIRSTs' 0
    sevens = ones._replace(reward=ones.reward * 7.0)
    loss_clipped = float(clipped.train(sevens).loss)
    loss_plain = float(plain.train(ones).loss)
    assert loss_clipped == pytest.approx(loss_plain, rel=1e-6)
    for a, b in zip(clipped.variables_to_train(), plain.variables_to_train()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)
    assert float(tf.reduce_max(sevens.reward)) == 7.0
    assert float(twin.train(sevens).loss) != pytest.approx(loss_plain, rel=1e-3)


@pytest.mark.parametrize("bad", [(1.0, -1.0), (0.0,), "(-1, 1)", (True, 2.0)])
def test_reward_clip_refuses_anything_but_low_below_high(bad):
    env = _cartpole()
    with pytest.raises(ValueError, match=r"^ppo_agent.reward_clip must be \(low, high\) with "
                                         r"low < high, got ") as info:
        agents.ppo_agent(env.time_step_spec(), env.action_spec(), tf.Variable(0, tf.int64),
                         reward_clip=bad)
    assert str(info.value).splitlines()[0].endswith(f"got {bad!r}")
