"""DQN on CartPole-v0 built by hand: the driver, a replayer and the learner loop.

What it shows: the three pieces `train()` wires, built in Python with
tf-agents' own `DdqnAgent` (the README's quick start, with a hook of its
own and a greedy evaluation at the end). The values are
gin_configs/dqn_cartpole.gin's, but its epsilon decay (a fixed 0.1 here)
and its evaluations while training:

- `AsyncOffPolicyDriver`: one env thread stepping 32 CartPoles batched in
  one environment, one actor thread running the collect policy, unrolls of
  8 steps: each batch the learner takes is 32 x 8 = 256 env steps;
- `UniformReplayer`: one replay ring per environment row (an n-step sample
  never joins two environments);
- `Learner`: takes each batch into the replayer, then runs 16 train steps,
  once 1000 env steps were collected; `PrintEvery` is a hook of this file.

Run it from the repository's root:

    python examples/dqn_by_hand.py [--num_env_steps 40000] [--seed 1] [--verbose]

It prints the layout, a line every 25 iterations, what was trained, and the
greedy policy's return over 10 episodes (examples/expected/dqn_by_hand.txt;
docs/guides/examples.md shows a whole run): a few seconds of training on
two cores.
"""

import argparse
import sys
import time

from alf_async import quiet

quiet.quiet(verbose="--verbose" in sys.argv[1:])  # before TensorFlow and gym are imported

import tensorflow as tf  # noqa: E402
from tf_agents.agents.dqn.dqn_agent import DdqnAgent  # noqa: E402
from tf_agents.environments.tf_py_environment import TFPyEnvironment  # noqa: E402
from tf_agents.networks.q_network import QNetwork  # noqa: E402
from tf_agents.utils.common import element_wise_squared_loss  # noqa: E402

from alf_async import AsyncOffPolicyDriver  # noqa: E402
from alf_async.driver.metrics import by_name  # noqa: E402
from alf_async.environments import load_batched  # noqa: E402
from alf_async.learning import Learner, UniformReplayer  # noqa: E402
from alf_async.learning.evaluation import Evaluator  # noqa: E402
from alf_async.learning.learner import Hook  # noqa: E402

ROWS = 32            # CartPoles in the env thread's batched environment
UNROLL_LENGTH = 8    # steps per unroll: a batch is ROWS x UNROLL_LENGTH env steps
TRAIN_STEPS_PER_ITERATION = 16
INITIAL_COLLECT_STEPS = 1000


class PrintEvery(Hook):
    """Prints the learner's counters and the collect policy's return every
    `iterations` iterations (a hook runs on the learner's thread)."""

    def __init__(self, iterations):
        self._iterations = iterations

    def after_iteration(self, learner, train_step_before, train_step):
        if learner.iterations % self._iterations == 0:
            average_return = by_name(learner.driver.get_metrics())["AverageReturn"].result()
            loss = "-" if learner.loss is None else f"{float(learner.loss.loss):.4g}"
            print(f"iteration {learner.iterations}: env steps {learner.env_steps}, train steps "
                  f"{learner.train_step}, loss {loss}, collect policy AverageReturn "
                  f"{float(average_return):.1f}", flush=True)


def build_agent(env):
    """Double DQN with 3-step returns, a soft target update and the squared
    TD loss (gin_configs/dqn_cartpole.gin's agent, without its epsilon decay)."""
    q_network = QNetwork(env.observation_spec(), env.action_spec(), fc_layer_params=(128, 128))
    agent = DdqnAgent(env.time_step_spec(), env.action_spec(), q_network,
                      tf.keras.optimizers.Adam(5e-4), gamma=0.99, n_step_update=3,
                      target_update_tau=0.005, td_errors_loss_fn=element_wise_squared_loss,
                      train_step_counter=tf.Variable(0, dtype=tf.int64))
    agent.initialize()
    return agent


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num_env_steps", type=int, default=40000,
                        help="stop once this many env steps were collected")
    parser.add_argument("--seed", type=int, default=1, help="seeds TensorFlow and the CartPoles")
    parser.add_argument("--verbose", action="store_true",
                        help="show third-party output (TensorFlow's banner, gym's notices)")
    args = parser.parse_args()
    tf.random.set_seed(args.seed)

    def make_env():
        """The driver's env constructor: called once per env thread."""
        return TFPyEnvironment(load_batched("CartPole-v0", ROWS, seed=args.seed))

    eval_env = TFPyEnvironment(load_batched("CartPole-v0", 10, seed=args.seed + 1000))
    agent = build_agent(eval_env)
    replayer = UniformReplayer(agent.collect_data_spec, num_rows=ROWS, capacity_per_row=3000)
    driver = AsyncOffPolicyDriver(make_env, agent.collect_policy, num_envs=1,
                                  num_actor_queues=1, unroll_length=UNROLL_LENGTH,
                                  exp_observers=[replayer])
    learner = Learner(agent, driver, replayer,
                      train_steps_per_iteration=TRAIN_STEPS_PER_ITERATION,
                      sample_batch_size=64, initial_collect_steps=INITIAL_COLLECT_STEPS,
                      hooks=[PrintEvery(25)])
    print(f"layout: 1 env thread x {ROWS} CartPoles, 1 actor thread; batches of {ROWS} rows x "
          f"{UNROLL_LENGTH} steps = {ROWS * UNROLL_LENGTH} env steps", flush=True)
    start = time.monotonic()
    stopped_by = learner.run(num_env_steps=args.num_env_steps)  # stops the driver on every path
    seconds = time.monotonic() - start
    print(f"stopped ({stopped_by}) at iteration {learner.iterations}: {learner.train_step} train "
          f"steps on {learner.env_steps} env steps in {seconds:.1f} s")
    try:
        average_return, _ = Evaluator(eval_env, agent.policy)()
    finally:
        eval_env.close()
    print(f"greedy policy: AverageReturn {average_return:.1f} over 10 episodes")


if __name__ == "__main__":
    main()
