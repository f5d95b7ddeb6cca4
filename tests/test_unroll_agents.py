"""The unroll agents (ppo_agent, impala_agent) and the policy lag: the
behaviour recorded at act time is what training corrects against, the
lag's values on a scripted schedule, and each agent trains on the
learner's linked unrolls."""

import functools

import gin
import numpy as np
import pytest
import tensorflow as tf
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory

from alf_async import AsyncOffPolicyDriver
from alf_async import settings
from alf_async.environments import suites
from alf_async.learning import agents
from alf_async.learning.learner import Learner
from alf_async.learning.policy_lag import PolicyLag, StampedInfo, TrainStepStampedPolicy
from alf_async.learning.replayers import OneTimeReplayer
from alf_async.testing.envs import CountingEnvConstructor
from alf_async.testing.policies import CountingPolicy
from test_trainer import read_scalars  # noqa: E402  (tests/ is on sys.path)

pytestmark = pytest.mark.timeout(120)


def _cartpole():
    return suites.load("suite_gym", "CartPole-v0", batch_size=4, seed=0)


def _collect(env, policy, steps):
    """`steps` steps of `policy` on `env` as a batch-major Trajectory [B, steps]."""
    time_step = env.reset()
    state = policy.get_initial_state(env.batch_size)
    items = []
    for _ in range(steps):
        action_step = policy.action(time_step, state)
        next_time_step = env.step(action_step.action)
        items.append(trajectory.from_transition(time_step, action_step, next_time_step))
        time_step, state = next_time_step, action_step.state
    return tf.nest.map_structure(lambda *t: tf.stack(t, axis=1), *items)


def _linked(exp):
    replayer = OneTimeReplayer()
    replayer(exp, np.arange(exp.step_type.shape[0], dtype=np.int32))
    return replayer.sample()


def _perturb(variables, seed, scale=0.3):
    rng = np.random.default_rng(seed)
    for v in variables:
        v.assign_add(rng.normal(0.0, scale, v.shape).astype(v.dtype.as_numpy_dtype))


def test_impala_trains_against_the_behaviour_recorded_at_act_time():
    # The network's initial weights, so that the perturbed ratio's distance
    # from 1 does not hang on the random ops the tests before this one made.
    tf.random.set_seed(0)
    env = _cartpole()
    agent = agents.impala_agent(env.time_step_spec(), env.action_spec(),
                                tf.Variable(0, dtype=tf.int64), fc_layer_params=(16,))
    exp = _linked(_collect(env, agent.collect_policy, 6))
    recorded = exp.policy_info.log_probability.numpy()
    # With the acting weights unchanged every importance ratio is exactly 1.
    loss = agent._loss(exp, None)[1]   # pylint: disable=protected-access
    np.testing.assert_allclose(loss.mean_rho.numpy(), 1.0, rtol=1e-6)
    # Other weights: the ratio is pi_new / mu with mu the recorded one (a
    # perturbation of 0.3 left it within 0.01 of 1 for 2 of 6 initial seeds).
    _perturb(agent.network.trainable_variables, seed=1, scale=1.0)
    (logits, _), _ = agent.network(exp.observation)
    log_pi = tf.nn.log_softmax(logits).numpy()
    actions = exp.action.numpy()
    valid = ~exp.is_boundary().numpy()[:, :-1]
    rhos = np.exp(np.take_along_axis(log_pi, actions[..., None], -1)[..., 0] - recorded)[:, :-1]
    expected = rhos[valid].mean()
    assert abs(expected - 1.0) > 0.01
    np.testing.assert_allclose(agent._loss(exp, None)[1].mean_rho.numpy(), expected,  # pylint: disable=protected-access
                               rtol=1e-5)
    before = agent.train_step_counter.numpy()
    info = agent.train(exp)
    assert agent.train_step_counter.numpy() == before + 1
    assert np.isfinite(info.loss.numpy())


def test_ppo_trains_against_the_dist_params_recorded_at_act_time():
    """One epoch, one minibatch: the clipped fraction of the importance
    ratios is 0 with the acting weights, and with other weights exactly the
    fraction of |pi/mu - 1| > 0.2 computed from the recorded logits."""
    tf.random.set_seed(0)   # the actions sampled, so that the fraction is the same every run
    env = _cartpole()
    step = tf.Variable(0, dtype=tf.int64)
    with gin.unlock_config():
        gin.bind_parameter("PPOClipAgent.importance_ratio_clipping", 0.2)
        # The network sees raw observations (the expected ratios below apply it).
        gin.bind_parameter("PPOClipAgent.normalize_observations", False)
    try:
        agent = agents.ppo_agent(env.time_step_spec(), env.action_spec(), step,
                                 actor_fc_layer_params=(16,), value_fc_layer_params=(16,),
                                 num_epochs=1, num_minibatches=1)
    finally:
        gin.clear_config()
    exp = _linked(_collect(env, agent.collect_policy, 6))
    assert agent.train(exp).extra.clip_fraction.numpy() == 0.0
    assert step.numpy() == 1
    exp = _linked(_collect(env, agent.collect_policy, 6))
    recorded = exp.policy_info["dist_params"]["logits"].numpy()
    _perturb(agent._actor_net.trainable_variables, seed=2, scale=0.3)   # pylint: disable=protected-access
    dist, _ = agent._actor_net(exp.observation, exp.step_type, ())   # pylint: disable=protected-access
    actions = exp.action.numpy()[..., None]
    log_pi = np.take_along_axis(tf.nn.log_softmax(dist.logits).numpy(), actions, -1)[..., 0]
    log_mu = np.take_along_axis(tf.nn.log_softmax(recorded).numpy(), actions, -1)[..., 0]
    ratio = np.exp(log_pi - log_mu)[:, :-1]
    expected = np.mean(np.abs(ratio - 1.0) > 0.2)
    assert expected > 0.5   # had the agent taken its current policy as the behaviour: 0
    np.testing.assert_allclose(agent.train(exp).extra.clip_fraction.numpy(), expected,
                               rtol=1e-6)
    assert step.numpy() == 2


def test_each_agent_writes_its_losses_once_per_train_call_under_losses(tmp_path):
    env = _cartpole()
    ppo_step, impala_step = tf.Variable(0, dtype=tf.int64), tf.Variable(0, dtype=tf.int64)
    ppo = agents.ppo_agent(env.time_step_spec(), env.action_spec(), ppo_step,
                           actor_fc_layer_params=(8,), value_fc_layer_params=(8,),
                           num_epochs=3, num_minibatches=2)
    impala = agents.impala_agent(env.time_step_spec(), env.action_spec(), impala_step,
                                 fc_layer_params=(8,))
    writers = {name: tf.summary.create_file_writer(str(tmp_path / name))
               for name in ("ppo", "impala")}
    with tf.summary.record_if(True):
        with writers["ppo"].as_default():
            ppo_info = ppo.train(_linked(_collect(env, ppo.collect_policy, 5)))
        with writers["impala"].as_default():
            impala_info = impala.train(_linked(_collect(env, impala.collect_policy, 5)))
    for writer in writers.values():
        writer.close()
    # PPO: the means over the update's 6 gradient steps, at the step it ends
    # on, under tf-agents' PPO tags; no single minibatch's summary.
    written = read_scalars(str(tmp_path / "ppo"))
    extra = ppo_info.extra
    expected = {name: float(getattr(extra, name)) for name in (
        "policy_gradient_loss", "value_estimation_loss", "l2_regularization_loss",
        "entropy_regularization_loss", "kl_penalty_loss", "clip_fraction")}
    expected["total_abs_loss"] = sum(abs(v) for k, v in expected.items() if k != "clip_fraction")
    assert set(written) == {"Losses/" + name for name in expected}
    for name, value in expected.items():
        assert written["Losses/" + name] == [(6, pytest.approx(value, rel=1e-5))], name
    # IMPALA: one gradient step, written at the step it starts from (as
    # tf-agents' DQN and SAC write theirs).
    written = read_scalars(str(tmp_path / "impala"))
    assert written == {
        "Losses/loss": [(0, pytest.approx(float(impala_info.loss), rel=1e-5))],
        **{f"{family}/{name}": [(0, pytest.approx(float(getattr(impala_info.extra, name)),
                                                  rel=1e-5))]
           for family, names in (("Losses", ("policy_gradient_loss", "value_estimation_loss",
                                             "entropy")),
                                 ("Learner", ("mean_rho", "clipped_rho_fraction")))
           for name in names}}


def test_ppo_makes_epochs_times_minibatches_gradient_steps_per_batch():
    env = _cartpole()
    step = tf.Variable(0, dtype=tf.int64)
    agent = agents.ppo_agent(env.time_step_spec(), env.action_spec(), step,
                             actor_fc_layer_params=(8,), value_fc_layer_params=(8,),
                             num_epochs=3, num_minibatches=2)
    exp = _linked(_collect(env, agent.collect_policy, 5))
    variables = [v.numpy() for v in agent.variables_to_train()]
    tf.function(agent.train)(exp)
    assert step.numpy() == 6
    assert all(not np.array_equal(a, v.numpy())
               for a, v in zip(variables, agent.variables_to_train()))


def test_ppo_bootstraps_gae_with_the_last_steps_value():
    """tensorflow/agents#953: GAE's final value is V(x_T), not V(x_{T-1})."""
    env = _cartpole()
    with gin.unlock_config():
        gin.bind_parameter("PPOClipAgent.use_gae", True)
    try:
        agent = agents.ppo_agent(env.time_step_spec(), env.action_spec(),
                                 tf.Variable(0, dtype=tf.int64))
    finally:
        gin.clear_config()
    rewards = tf.constant([[1.0, 0.0]])
    discounts = tf.constant([[0.9, 0.9]])
    values = tf.constant([[0.5, 2.0, 10.0]])
    advantages = agent.compute_advantages(rewards, None, discounts, values).numpy()
    delta1 = 0.0 + 0.9 * 10.0 - 2.0
    delta0 = 1.0 + 0.9 * 2.0 - 0.5
    np.testing.assert_allclose(advantages, [[delta0 + 0.9 * 0.95 * delta1, delta1]], rtol=1e-6)


def _stamped_unroll(policy, counter, stamps, time_step_spec):
    """A [1, len(stamps)] Trajectory acted with the counter at each stamp."""
    items = []
    for k, stamp in enumerate(stamps):
        counter.assign(stamp)
        time_step = ts.TimeStep(
            step_type=tf.constant([1 if k else 0], tf.int32), reward=tf.zeros([1]),
            discount=tf.ones([1]),
            observation=tf.constant([[0, k, k]], time_step_spec.observation.dtype))
        step = policy.action(time_step)
        items.append(trajectory.Trajectory(
            step_type=time_step.step_type, observation=time_step.observation,
            action=step.action, policy_info=step.info,
            next_step_type=tf.constant([1], tf.int32), reward=tf.zeros([1]),
            discount=tf.ones([1])))
    return tf.nest.map_structure(lambda *t: tf.stack(t, axis=1), *items)


def test_policy_lag_on_a_scripted_schedule():
    """Steps acted at train steps 3, 4, 4, 7 (the last only bootstraps),
    trained at train step 10: lags 7, 6, 6 after the inert first step."""
    probe = CountingEnvConstructor(batch_size=1)()
    counter = tf.Variable(0, dtype=tf.int64)
    policy = TrainStepStampedPolicy(CountingPolicy(probe.time_step_spec(), probe.action_spec()),
                                    counter)
    assert isinstance(policy.info_spec, StampedInfo)
    replayer = PolicyLag(OneTimeReplayer(policy.trajectory_spec, 1), counter)
    assert replayer.policy_lag() is None
    replayer(_stamped_unroll(policy, counter, [3, 4, 4, 7], probe.time_step_spec()),
             np.array([0], np.int32))
    counter.assign(10)
    sample = tf.function(replayer.sample)
    exp = sample()
    assert exp.policy_info == ()   # the stamps are gone: CountingPolicy's own info
    assert replayer.policy_lag() == (pytest.approx((7 + 6 + 6) / 3), 7)
    # The next unroll (acted at 8, 8, 9, 11): its first trained step is the
    # one acted at 7, the step the two unrolls share.
    replayer(_stamped_unroll(policy, counter, [8, 8, 9, 11], probe.time_step_spec())._replace(
        step_type=tf.constant([[1, 1, 1, 1]], tf.int32)), np.array([0], np.int32))
    counter.assign(12)
    sample()
    assert replayer.policy_lag() == (pytest.approx((5 + 4 + 4 + 3) / 4), 5)


@pytest.mark.parametrize("builder", ["ppo", "impala"])
def test_the_learner_trains_unroll_agents_on_linked_unrolls(builder):
    """A real driver and Learner: every batch is trained on once, the lag is
    measured, the train step counts each agent's gradient steps."""
    def make_env():
        return suites.load("suite_gym", "CartPole-v0", batch_size=2)

    env = make_env()
    step = tf.Variable(0, dtype=tf.int64)
    if builder == "ppo":
        agent = agents.ppo_agent(env.time_step_spec(), env.action_spec(), step,
                                 actor_fc_layer_params=(8,), value_fc_layer_params=(8,),
                                 num_epochs=2, num_minibatches=2)
        per_batch = 4
    else:
        agent = agents.impala_agent(env.time_step_spec(), env.action_spec(), step,
                                    fc_layer_params=(8,))
        per_batch = 1
    policy = TrainStepStampedPolicy(agent.collect_policy, step)
    replayer = PolicyLag(OneTimeReplayer(policy.trajectory_spec, 4), step)
    driver = AsyncOffPolicyDriver(make_env, policy, num_envs=2, unroll_length=5,
                                  learn_queue_cap=2, exp_observers=[replayer])
    learner = Learner(agent, driver, replayer)
    assert learner.run(num_iterations=6) == "num_iterations"
    assert learner.train_step == 6 * per_batch
    assert learner.env_steps == 6 * 2 * 2 * 5
    mean, most = replayer.policy_lag()
    assert 0 <= mean <= most <= 6 * per_batch
    assert np.isfinite(learner.loss.loss.numpy())


def test_ppo_on_pixels_learns_catch(tmp_path):
    """The convolutional path end to end (uint8 screens scaled inside the
    networks, the driver, linked unrolls, minibatched PPO): PixelCatch,
    where a random policy scores about -0.6, is solved (+0.9 over 16
    greedy games) within 60,000 env steps."""
    from alf_async import trainer
    from alf_async.environments import suites as suites_lib
    from alf_async.testing.envs import load_pixel_catch
    suites_lib.register_suite("pixel_catch", load_pixel_catch)
    for name, value in (("importance_ratio_clipping", 0.2), ("use_gae", True),
                        ("normalize_observations", False), ("normalize_rewards", False),
                        ("entropy_regularization", 0.01)):
        gin.bind_parameter(f"PPOClipAgent.{name}", value)
    try:
        agent_fn = functools.partial(agents.ppo_agent, conv_layer_params=((8, 3, 1),),
                                     actor_fc_layer_params=(32,), value_fc_layer_params=(32,),
                                     learning_rate=1e-3)
        result = trainer.train(
            str(tmp_path),
            task=settings.Task(env_name="catch", suite="pixel_catch", agent_fn=agent_fn,
                               replayer_fn=OneTimeReplayer),
            layout=settings.Layout(env_threads=2, rows_per_env_thread=8),
            schedule=settings.Schedule(unroll_length=16, rows_per_batch=16,
                                       num_env_steps=60_000),
            evaluation=settings.Evaluation(episodes=16, interval=32, stop_at_return=0.9),
            runtime=settings.Runtime(seed=0), print_fn=lambda line: None)
    finally:
        gin.clear_config()
    assert result.stopped_by == "stop_at_eval_return", result.evaluations[-3:]
    assert result.evaluations[0][3] < 0.5   # it did not start solved


def test_ppo_on_pixels_leaves_them_unnormalized_and_refuses_to_normalize_them():
    """tf-agents' observation normalizer (PPOClipAgent's default) casts what
    it normalized back to uint8: ppo_agent turns it off for pixels, and a
    binding that turns it on is refused with the binding to set."""
    from alf_async.testing.envs import load_pixel_catch
    env = load_pixel_catch("catch", batch_size=2, seed=0)
    make = lambda: agents.ppo_agent(env.time_step_spec(), env.action_spec(),
                                    tf.Variable(0, dtype=tf.int64),
                                    conv_layer_params=((4, 3, 1),), actor_fc_layer_params=(8,))
    assert make()._observation_normalizer is None   # pylint: disable=protected-access
    cartpole = _cartpole()
    assert agents.ppo_agent(cartpole.time_step_spec(), cartpole.action_spec(),
                            tf.Variable(0, dtype=tf.int64)
                            )._observation_normalizer is not None   # tf-agents' default
    with gin.unlock_config():
        gin.bind_parameter("PPOClipAgent.normalize_observations", True)
    try:
        with pytest.raises(ValueError, match=r"^PPOClipAgent.normalize_observations: these "
                           r"observations are uint8 pixels .* bind "
                           r"PPOClipAgent.normalize_observations = False, or leave it unbound"):
            make()
    finally:
        gin.clear_config()


def test_the_value_head_shares_the_actors_torso():
    """ppo_agent with convolutions: one torso; the value head reads the
    actor's torso output for the same observations (computed once) and
    equals a fresh computation; the value loss reaches the torso."""
    from alf_async.learning.ppo import TorsoValueNetwork
    from alf_async.testing.envs import load_pixel_catch
    env = load_pixel_catch("catch", batch_size=2, seed=0)
    agent = agents.ppo_agent(env.time_step_spec(), env.action_spec(),
                             tf.Variable(0, dtype=tf.int64), conv_layer_params=((4, 3, 1),),
                             actor_fc_layer_params=(8,))
    actor, value = agent._actor_net, agent._value_net   # pylint: disable=protected-access
    assert isinstance(value, TorsoValueNetwork)
    heads = actor._projection_networks   # pylint: disable=protected-access
    torso = {v.ref() for v in actor.trainable_variables} - {
        v.ref() for v in heads.trainable_variables}
    assert torso <= {v.ref() for v in value.trainable_variables}
    obs = tf.cast(tf.random.uniform([3, 8, 8, 1], 0, 256, tf.int32), tf.uint8)
    fresh, _ = value(obs)                 # the torso computed

    def both(observation):
        actor(observation, None, ())      # the actor remembers its torso output ...
        return value(observation)[0]      # ... and the value head reads it

    graph = tf.function(both).get_concrete_function(tf.TensorSpec(obs.shape, tf.uint8)).graph
    assert [op.type for op in graph.get_operations()].count("Conv2D") == 1
    with tf.GradientTape() as tape:
        reused = both(obs)
        loss = tf.reduce_sum(tf.square(reused))
    np.testing.assert_allclose(reused.numpy(), fresh.numpy(), rtol=1e-6)
    grads = tape.gradient(loss, [v.deref() for v in torso])
    assert all(g is not None and np.any(g.numpy() != 0) for g in grads)


def _op_types(graph_def):
    """Every op type of a GraphDef, its function library's (a while loop's
    body, a nested tf.function) included, with their counts."""
    import collections   # pylint: disable=import-outside-toplevel
    counts = collections.Counter(node.op for node in graph_def.node)
    for function in graph_def.library.function:
        counts.update(node.op for node in function.node_def)
    return counts


@pytest.mark.parametrize("builder", ["ppo_agent", "impala_agent"])
def test_a_train_call_runs_each_convolution_once_forward_and_once_backward_per_step(builder):
    """The learner's conv work is one forward and one backward pass per
    gradient step (the policy and value heads share one torso pass), plus
    PPO's one value pass over the batch: no second torso pass for the value
    head, none for the behaviour policy (its distribution is the unroll's
    `policy_info`)."""
    from alf_async.testing.envs import load_pixel_catch
    env = load_pixel_catch("catch", batch_size=2, seed=0)
    make = getattr(agents, builder)
    agent = make(env.time_step_spec(), env.action_spec(), tf.Variable(0, dtype=tf.int64),
                 conv_layer_params=((4, 3, 1), (4, 3, 1)),
                 **({"actor_fc_layer_params": (8,)} if builder == "ppo_agent" else
                    {"fc_layer_params": (8,)}))
    spec = tf.nest.map_structure(
        lambda s: tf.TensorSpec([2, 5] + s.shape.as_list(), s.dtype), agent.collect_data_spec)
    graph_def = tf.function(agent.train).get_concrete_function(spec).graph.as_graph_def()
    ops = _op_types(graph_def)
    # PPO: the value pass over the batch, then each minibatch step (one while
    # loop body): 2 forward convolutions; IMPALA: one step on the batch.
    forward = 2 + 2 if builder == "ppo_agent" else 2
    assert ops["Conv2D"] == forward, ops
    assert ops["Conv2DBackpropFilter"] == 2, ops
    # The first one's input gradient is built, and pruned when the graph
    # runs: nothing reads it (oneDNN's verbose log shows no backward_data
    # for it).
    assert ops["Conv2DBackpropInput"] == 2, ops
