"""Evaluation of the greedy policy on separate environments."""

import numpy as np
import tensorflow as tf
from tf_agents.policies import epsilon_greedy_policy, greedy_policy
from tf_agents.utils import common


def eval_policy(policy, greedy=False, epsilon=None):
    """The policy an evaluation runs: `policy`, or tf-agents'
    `GreedyPolicy(policy)` with `greedy`, acting uniformly at random with
    probability `epsilon` around it if set (see `trainer.train`'s
    greedy_eval and eval_epsilon)."""
    if greedy:
        policy = greedy_policy.GreedyPolicy(policy)
    if epsilon is None:
        return policy
    return epsilon_greedy_policy.EpsilonGreedyPolicy(policy, epsilon=float(epsilon))


class Evaluator(object):
    """Runs `policy` for exactly one episode in each row of a batched `env`.

    Why not `metric_utils.eager_compute`: its DynamicEpisodeDriver counts
    episodes over the whole batch, so on a batched env the rows that finish
    first start new (shorter) episodes that get counted while long ones are
    cut, which biases the average towards short episodes. Here each of the
    B rows plays one episode and is masked once it ends; the whole loop is
    one graph call.

    Threads: one thread at a time calls it; `cancel` may be called from any
    thread, also while a call runs.
    """

    def __init__(self, env, policy, max_steps=100000):
        """
        Args:
            env: a TFEnvironment of batch size B = episodes per evaluation.
            policy: a TFPolicy (e.g. the agent's greedy `agent.policy`).
            max_steps: a bound on the episode length.
        """
        self._env = env
        self._policy = policy
        self._max_steps = max_steps
        self._cancelled = tf.Variable(False, trainable=False, name="evaluation_cancelled")
        self._run = common.function(self._run_graph, autograph=False)

    @property
    def num_episodes(self):
        return self._env.batch_size

    def trace(self):
        """Builds the evaluation graph without running it."""
        self._run.get_concrete_function()

    def __call__(self):
        """Returns (average return, average episode length) over the B episodes
        (of the steps played, once cancelled)."""
        returns, lengths = self._run()
        return float(np.mean(returns.numpy())), float(np.mean(lengths.numpy()))

    def cancel(self):
        """Ends the running call at its next step, and every later call at
        its first: for good (the episodes are cut, their averages meaningless)."""
        self._cancelled.assign(True)

    @property
    def cancelled(self):
        return bool(self._cancelled.numpy())

    def _run_graph(self):
        B = self._env.batch_size
        time_step = self._env.reset()
        state = self._policy.get_initial_state(B)
        zeros = tf.zeros([B], tf.float32)

        def cond(i, time_step, state, returns, lengths, done):
            return tf.logical_and(
                tf.logical_and(i < self._max_steps, tf.logical_not(tf.reduce_all(done))),
                tf.logical_not(self._cancelled.read_value()))

        def body(i, time_step, state, returns, lengths, done):
            step = self._policy.action(time_step, state)
            next_time_step = self._env.step(step.action)
            reward = tf.reshape(tf.cast(next_time_step.reward, tf.float32), [B, -1])
            active = tf.logical_not(done)
            returns += tf.where(active, tf.reduce_sum(reward, axis=1), 0.0)
            lengths += tf.where(active, 1.0, 0.0)
            done = tf.logical_or(done, next_time_step.is_last())
            return i + 1, next_time_step, step.state, returns, lengths, done

        _, _, _, returns, lengths, _ = tf.while_loop(
            cond, body, (tf.constant(0), time_step, state, zeros, zeros, tf.zeros([B], tf.bool)))
        return returns, lengths


# ----------------------------------------------------------------- summaries
