"""The floors of an unroll agent's learner and inference: its bare network,
timed in the process that times the agent, with the same kernels.

- The learner's floor: the networks of an agent built as the timed one
  (the same layers, dtypes and initializers; pass a fresh agent, whose
  variables these steps train on random data) at the learner's batch, one forward
  pass, the backward pass of a plain loss (the actions' negative
  log-likelihood plus the values' squared error) and one step of the
  agent's optimizer class (same configuration), in one tf.function, on a
  fixed batch of random observations, times the agent's gradient steps
  per env step. PPO (`ppo.MinibatchPPOClipAgent`): minibatches of
  transitions, num_epochs x num_minibatches steps per batch; IMPALA
  (`impala.ImpalaAgent`): the whole [B, T + 1] batch, one step.
- Inference's floor: the actor network's forward pass on `rows`
  observations, per row.
- Inference itself (`inference_alone`): the policy's action on `rows`
  time steps, per row (step_breakdown.py's "actor inference" part).

What the agent does above its floor: PPO's value pass over the batch
(GAE needs every step's value; one forward pass, ~1/13 of a Nature-CNN
update's FLOPs), the minibatch gathers, advantages, the clipped loss and
the gradient clipping. Imports no TensorFlow until called.

Run as a script, it times inference per call at several row counts, the
collect policy's action beside its bare actor network's forward pass:

    python benchmarks/bare_network.py --gin_file gin_configs/ppo_pong.gin --rows 1 8 32 \
        [--host_kind avx2] [--intra_op_threads 1]
"""

import argparse
import os
import sys
import time


def cpu_per_call(fn, secs, readings=3):
    """Process CPU seconds per call of `fn` (after one warm-up call): the
    least of `readings` readings, each timed until `secs / readings` of CPU
    time have passed."""
    return least_cpu_per_call([fn], secs, readings)[0]


def least_cpu_per_call(fns, secs, readings=3):
    """`cpu_per_call` of each of `fns`, their readings taken in turn (one of
    each, then again), so that a slower spell of the host falls on all."""
    for fn in fns:
        fn()
    best = [float("inf")] * len(fns)
    for _ in range(readings):
        for i, fn in enumerate(fns):
            calls, start = 0, time.process_time()
            while calls == 0 or time.process_time() - start < secs / readings:
                fn()
                calls += 1
            best[i] = min(best[i], (time.process_time() - start) / calls)
    return best


def _forward(agent):
    """callable(observations, training, with_values=True) -> (action distribution,
    values or None) over the agent's networks, and their trainable variables."""
    import tensorflow as tf
    if hasattr(agent, "_actor_net"):   # tf-agents' PPO agents
        actor, value = agent._actor_net, agent._value_net   # pylint: disable=protected-access

        def forward(observations, training, with_values=True):
            distribution, _ = actor(observations, step_type=None, network_state=(),
                                    training=training)
            if not with_values:
                return distribution, None
            return distribution, value(observations, step_type=None, network_state=(),
                                       training=training)[0]

        return forward, agent.variables_to_train()
    network = agent.network   # impala.ImpalaAgent

    def forward(observations, training, with_values=True):
        del with_values   # one network gives both
        (logits, values), _ = network(observations, step_type=None, training=training)
        return tf.compat.v1.distributions.Categorical(logits=logits), values

    return forward, network.trainable_variables


def learner_batch(agent, rows, steps):
    """(transitions per gradient step, gradient steps per batch) of `agent`
    on a batch of `rows` unrolls of `steps` steps."""
    if hasattr(agent, "num_minibatches"):
        return rows * steps // agent.num_minibatches, agent.num_epochs * agent.num_minibatches
    return rows * (steps + 1), 1


def _batch(agent, size, seed):
    import tensorflow as tf
    from tf_agents.specs import tensor_spec
    observations = tensor_spec.sample_spec_nest(agent.time_step_spec.observation,
                                                outer_dims=(size,), seed=seed)
    actions = tensor_spec.sample_spec_nest(agent.action_spec, outer_dims=(size,), seed=seed)
    return (tf.nest.map_structure(tf.constant, observations), tf.constant(actions),
            tf.random.stateless_normal([size], seed=(seed, 1)))


def learner_floor_step(agent, rows, steps, seed=0):
    """A function making one gradient step of `agent`'s bare networks at the
    learner's batch (module docstring), and the gradient steps per env step
    of a batch of `rows` x `steps` env steps."""
    import tensorflow as tf
    forward, variables = _forward(agent)
    config = agent._optimizer.get_config()   # pylint: disable=protected-access
    optimizer = type(agent._optimizer).from_config(config)   # pylint: disable=protected-access
    optimizer.build(variables)
    size, gradient_steps = learner_batch(agent, rows, steps)
    observations, actions, targets = _batch(agent, size, seed)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            distribution, values = forward(observations, True)
            loss = (-tf.reduce_mean(tf.cast(distribution.log_prob(actions), tf.float32))
                    + tf.reduce_mean(tf.square(tf.cast(values, tf.float32) - targets)))
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    return (lambda: step().numpy()), gradient_steps / (rows * steps)


def learner_floor(agent, rows, steps, secs, seed=0):
    """CPU ms per env step of `agent`'s bare networks' training at the
    learner's batch (`learner_floor_step`) on a batch of `rows` x `steps`
    env steps, and the CPU ms of one such gradient step."""
    step, steps_per_env_step = learner_floor_step(agent, rows, steps, seed)
    per_step = cpu_per_call(step, secs)
    return 1000.0 * per_step * steps_per_env_step, 1000.0 * per_step


def inference_floor(agent, rows, secs, seed=0):
    """CPU ms per env step of the actor network's forward pass on `rows`
    observations (no distribution sampling, no policy wrapping)."""
    import tensorflow as tf
    forward, _ = _forward(agent)
    observations, _, _ = _batch(agent, rows, seed)

    @tf.function
    def act():
        distribution, _ = forward(observations, False, with_values=False)
        return distribution.logits if hasattr(distribution, "logits") else distribution.mean()

    return 1000.0 * cpu_per_call(lambda: act().numpy(), secs) / rows


def inference_alone(policy, time_step_spec, rows, secs):
    """CPU ms per env step of the policy's action on `rows` time steps."""
    import tensorflow as tf
    from tf_agents.specs import tensor_spec
    time_step = tensor_spec.sample_spec_nest(time_step_spec, outer_dims=(rows,), seed=0)
    state = policy.get_initial_state(rows)
    action = tf.function(lambda: policy.action(time_step, state))
    return 1000.0 * cpu_per_call(action, secs) / rows



def main():
    import host_info
    parser = argparse.ArgumentParser(description="Inference per call: the collect policy "
                                                 "beside its bare actor network")
    parser.add_argument("--gin_file", default=os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gin_configs",
        "ppo_pong.gin"))
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--secs", type=float, default=3.0, help="CPU seconds per timing")
    parser.add_argument("--intra_op_threads", type=int, help="TF's intra-op pool (default: TF's)")
    host_info.add_kernel_flags(parser)
    args = parser.parse_args()
    bindings = host_info.choose_kernels(args, [args.gin_file])   # before TensorFlow
    machine = host_info.host()
    from alf_async.bin.train import parse_gin
    parse_gin([args.gin_file], bindings)
    import gin
    import tensorflow as tf
    if args.intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)

    import unroll_sync
    from alf_async.environments import suites
    q = gin.query_parameter
    env = suites.load(q("Task.suite"), q("Task.env_name"), batch_size=1, seed=0)
    agent = unroll_sync.gin_agent_fn()(env.time_step_spec(), env.action_spec(),
                                       tf.Variable(0, dtype=tf.int64))
    env.close()
    print(f"CPU ms per call, {args.gin_file}; host: {host_info.describe(machine)}"
          + (f"; {args.intra_op_threads} intra-op threads" if args.intra_op_threads else ""))
    for rows in args.rows:
        policy = inference_alone(agent.collect_policy, agent.time_step_spec,
                                                rows, args.secs)
        bare = inference_floor(agent, rows, args.secs)
        print(f"  {rows:4d} rows: the collect policy {policy * rows:7.3f} "
              f"({policy:.3f} a row), its bare actor network {bare * rows:7.3f} "
              f"({bare:.3f} a row)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
