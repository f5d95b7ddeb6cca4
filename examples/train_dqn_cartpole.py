"""DQN on CartPole-v0 with alf_async's Python API: no CLI, no gin.

Part 1 calls the same `train()` the CLI calls, with its settings groups (the
values of gin_configs/dqn_cartpole.gin). Part 2 wires the pieces by hand —
environments, agent, replayer, driver — and runs them with the Learner that
`train()` runs (alf_async.learning.learner), with a hook of its own.

    python examples/train_dqn_cartpole.py [--root_dir /tmp/alf_async_dqn_cartpole] [--by_hand]
        [--verbose]

Both use the main job's agent (double DQN, 3-step returns, gamma 0.99, a soft
target update, the squared TD loss): tf-agents' DqnAgent defaults (gamma 1.0,
the target network copied every step) do not learn CartPole.
"""

import argparse
import functools
import sys

from alf_async import quiet

quiet.quiet(verbose="--verbose" in sys.argv[1:])  # before TensorFlow and gym are imported

import tensorflow as tf  # noqa: E402
from tf_agents.agents.dqn import dqn_agent  # noqa: E402
from tf_agents.utils import common  # noqa: E402

from alf_async import AsyncOffPolicyDriver, trainer  # noqa: E402

from alf_async.learning import agents, replayers  # noqa: E402
from alf_async.settings import Evaluation, Layout, Runtime, Schedule, Task  # noqa: E402
from alf_async.environments import suites  # noqa: E402
from alf_async.learning.evaluation import Evaluator  # noqa: E402
from alf_async.learning.learner import Hook, Learner  # noqa: E402
from alf_async.driver.metrics import by_name  # noqa: E402

# gin_configs/dqn_cartpole.gin's agent.
AGENT_FN = functools.partial(
    agents.dqn_agent, agent_class=dqn_agent.DdqnAgent, fc_layer_params=(128, 128),
    learning_rate=5e-4, epsilon_greedy=1.0, epsilon_final=0.05, epsilon_decay_steps=1000,
    # DqnAgent's own arguments (in gin: DqnAgent.n_step_update = 3, ...).
    agent_kwargs=dict(gamma=0.99, n_step_update=3, target_update_tau=0.005,
                      target_update_period=1,
                      td_errors_loss_fn=common.element_wise_squared_loss))


def with_train(root_dir):
    """Part 1: the training loop, checkpoints, summaries and evaluation of `train()`."""
    result = trainer.train(
        root_dir,
        task=Task(env_name="CartPole-v0", agent_fn=AGENT_FN,
                  replayer_fn=functools.partial(replayers.UniformReplayer, capacity_per_row=3000)),
        layout=Layout(env_threads=1, rows_per_env_thread=32),
        schedule=Schedule(unroll_length=8, rows_per_batch=32, initial_collect_steps=1000,
                          train_steps_per_iteration=16, sample_batch_size=64,
                          num_env_steps=2000000),
        evaluation=Evaluation(interval=250, episodes=10, stop_at_return=195.0),
        runtime=Runtime(seed=1))
    if result.stopped_by == "already_finished":
        return  # train() said so
    solved = ("not solved" if result.solved_secs is None else
              f"solved after {result.solved_secs:.1f} s of training")
    print(f"{solved}; train step {result.global_step}, {result.env_steps} env steps "
          f"(checkpoint in {root_dir})")


class PrintReturn(Hook):
    """Prints the collect policy's AverageReturn metric every 25 iterations."""

    def after_iteration(self, learner, train_step_before, train_step):
        if learner.iterations % 25 == 0:
            average_return = by_name(learner.driver.get_metrics())["AverageReturn"].result()
            print(f"iteration {learner.iterations}: collect policy AverageReturn "
                  f"{float(average_return):.1f}")


def by_hand(num_iterations=150):
    """Part 2: the pieces train() wires, built by hand, run by a Learner.

    Returns:
        The greedy policy's average return over 10 episodes at the end.
    """
    # Before TF runs any op: one inter-op thread per env and actor thread (the
    # driver's hint otherwise; alf-async-train: Runtime.inter_op_threads).
    tf.config.threading.set_inter_op_parallelism_threads(3)
    env_constructor = suites.make_env_constructor("suite_gym", "CartPole-v0", batch_size=16,
                                                  seed=1)
    eval_env = suites.load("suite_gym", "CartPole-v0", batch_size=10, seed=2)
    agent = AGENT_FN(eval_env.time_step_spec(), eval_env.action_spec(),
                     tf.Variable(0, dtype=tf.int64))
    agent.initialize()
    replayer = replayers.UniformReplayer(agent.collect_data_spec, num_rows=2 * 16,
                                         capacity_per_row=3000)
    # Two env threads of 16 CartPoles each; the actor acts with the agent's
    # collect policy, whose variables the learner updates as it trains. Each
    # run_async() hands one unroll [16 envs, 8 steps] to the replayer: 128
    # env steps, then 8 train steps (the main job's 16 per 256).
    driver = AsyncOffPolicyDriver(env_constructor, agent.collect_policy, num_envs=2,
                                  unroll_length=8, exp_observers=[replayer])
    learner = Learner(agent, driver, replayer, train_steps_per_iteration=8,
                      sample_batch_size=64, initial_collect_steps=1000, hooks=[PrintReturn()])
    try:
        learner.run(num_iterations=num_iterations)  # stops the driver on every exit path
        average_return, _ = Evaluator(eval_env, agent.policy)()
    finally:
        eval_env.close()
    print(f"trained {learner.train_step} steps, last loss {float(learner.loss.loss):.4g}; "
          f"greedy policy AverageReturn {average_return:.1f} over 10 episodes")
    return average_return


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root_dir", default="/tmp/alf_async_dqn_cartpole")
    parser.add_argument("--by_hand", action="store_true", help="run part 2 instead")
    parser.add_argument("--verbose", action="store_true",
                        help="show third-party output (TensorFlow's banner, gym's notices)")
    args = parser.parse_args()
    if args.by_hand:
        by_hand()
    else:
        with_train(args.root_dir)


if __name__ == "__main__":
    main()
