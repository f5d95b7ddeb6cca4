"""DQN on CartPole-v0 with alf_async's Python API: no CLI, no gin.

Part 1 calls the same `train()` the CLI calls, with plain arguments (the
values of gin_configs/dqn_cartpole.gin). Part 2 wires the pieces by hand —
environments, agent, replayer, driver — and runs them with the Learner that
`train()` runs (alf_async.learner), with a hook of its own.

    python examples/train_dqn_cartpole.py [--root_dir /tmp/alf_async_dqn_cartpole] [--by_hand]
"""

import argparse
import functools

import tensorflow as tf
from tf_agents.agents.dqn import dqn_agent
from tf_agents.utils import common

from alf_async import AsyncOffPolicyDriver, agents, replayers, trainer
from alf_async.environments import suites
from alf_async.learner import Hook, Learner
from alf_async.metrics import by_name


def with_train(root_dir):
    """Part 1: the training loop, checkpoints, summaries and evaluation of `train()`."""
    agent_fn = functools.partial(
        agents.dqn_agent, agent_class=dqn_agent.DdqnAgent, fc_layer_params=(128, 128),
        learning_rate=5e-4, epsilon_greedy=1.0, epsilon_final=0.05, epsilon_decay_steps=1000,
        # DqnAgent's own arguments (in gin: DqnAgent.n_step_update = 3, ...).
        agent_kwargs=dict(n_step_update=3, target_update_tau=0.005,
                          td_errors_loss_fn=common.element_wise_squared_loss))
    result = trainer.train(
        root_dir, env_name="CartPole-v0", agent_fn=agent_fn,
        replayer_fn=functools.partial(replayers.UniformReplayer, capacity_per_row=3000),
        num_envs=1, env_batch_size=32, unroll_length=8, learn_queue_cap=1,
        initial_collect_steps=1000, train_steps_per_iteration=16, sample_batch_size=64,
        num_env_steps=2000000, eval_interval=250, num_eval_episodes=10,
        stop_at_eval_return=195.0, seed=1)
    print(f"solved after {result.solved_secs} s; train step {result.global_step}, "
          f"{result.env_steps} env steps; run again to resume from {root_dir}")


class PrintReturn(Hook):
    """Prints the AverageReturn metric every 50 iterations."""

    def after_iteration(self, learner, train_step_before, train_step):
        if learner.iterations % 50 == 0:
            average_return = by_name(learner.driver.get_metrics())["AverageReturn"].result()
            print(f"iteration {learner.iterations}: AverageReturn {float(average_return):.1f}")


def by_hand(num_iterations=300):
    """Part 2: the pieces train() wires, built by hand, run by a Learner."""
    env_constructor = suites.make_env_constructor("suite_gym", "CartPole-v0", batch_size=8,
                                                  seed=1)
    spec_env = suites.load("suite_gym", "CartPole-v0")
    agent = agents.dqn_agent(spec_env.time_step_spec(), spec_env.action_spec(),
                             tf.Variable(0, dtype=tf.int64))
    spec_env.close()
    agent.initialize()
    replayer = replayers.UniformReplayer(agent.collect_data_spec, num_rows=2 * 8,
                                         capacity_per_row=2000)
    # Two env threads of 8 CartPoles each; the actor acts with the agent's
    # collect policy, whose variables the learner updates as it trains. Each
    # run_async() hands one unroll [8 envs, 8 steps] to the replayer.
    driver = AsyncOffPolicyDriver(env_constructor, agent.collect_policy, num_envs=2,
                                  unroll_length=8, exp_observers=[replayer])
    learner = Learner(agent, driver, replayer, train_steps_per_iteration=1,
                      sample_batch_size=64, initial_collect_steps=500, hooks=[PrintReturn()])
    learner.run(num_iterations=num_iterations)  # stops the driver on every exit path
    print(f"trained {learner.train_step} steps, last loss {float(learner.loss.loss):.4g}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root_dir", default="/tmp/alf_async_dqn_cartpole")
    parser.add_argument("--by_hand", action="store_true", help="run part 2 instead")
    args = parser.parse_args()
    if args.by_hand:
        by_hand()
    else:
        with_train(args.root_dir)


if __name__ == "__main__":
    main()
