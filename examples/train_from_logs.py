"""Train DQN on CartPole from the logs of a scripted policy: off-policy, from files.

1. A scripted controller (push the cart toward where the pole leans, with
   `--epsilon` random actions) plays gym's CartPole-v0 and its episodes are
   written as JSON lines (alf_async.environments.offline.EpisodeLogWriter).
   Episodes stopped by the 200-step time limit are written without `done`:
   their unknown last transition is never trained on.
2. An OfflineEnv replays the logs (in epochs, forever) into the driver, whose
   trajectories hold the *logged* actions; a DQN agent
   trains from a uniform replay buffer. The simulator is not in the loop.
3. The learner's TD loss is printed as it falls (alf_async's Learner: one
   loss per iteration of 4 train steps), and the greedy policy is played on
   the real CartPole before and after training.

The defaults are chosen for learning from a fixed log, where DQN's max over
actions extrapolates: a mostly random logger (--epsilon 0.8) covers both
actions in the states the learned policy visits, and a short horizon
(gamma 0.8, target network copied every 20 steps) keeps Q bounded. With
gamma 0.95 on these logs Q grew past 10^4 within 1,200 steps (plain
tf-agents DQN on the same transitions did the same, so it is the data and
the algorithm, not the pipeline).

    python examples/train_from_logs.py [--episodes 400] [--train-steps 3000]

(There is no gin file for this example: gin configuration belongs to
alf_async/trainer.py; this builds the Learner from Python alone.)
"""

import argparse
import os
import tempfile
import time

import gym
import numpy as np

from alf_async.environments.offline import EpisodeLogWriter, OfflineEnv
from alf_async.learner import Hook, crossed
from serve_cartpole import LossLog, build_dqn, build_learner, cartpole_specs


def scripted_action(obs, rng, epsilon):
    """Push toward the pole's lean (angle plus a bit of angular velocity)."""
    if rng.random() < epsilon:
        return int(rng.integers(2))
    return int(obs[2] + 0.3 * obs[3] > 0)


def generate_logs(path, num_episodes, epsilon, seed=0):
    """Plays the scripted policy; writes its episodes; returns their returns."""
    env = gym.make("CartPole-v0")
    rng = np.random.default_rng(seed)
    returns = []
    with EpisodeLogWriter(path) as log:
        for e in range(num_episodes):
            obs = env.reset(seed=seed * 100_000 + e)
            done, total = False, 0.0
            while not done:
                action = scripted_action(obs, rng, epsilon)
                next_obs, reward, done, info = env.step(action)
                truncated = info.get("TimeLimit.truncated", False)
                log.write_step(f"scripted-{e}", obs, action, reward,
                               done=done and not truncated,
                               next_observation=next_obs if done and not truncated else None)
                obs, total = next_obs, total + reward
            returns.append(total)
    env.close()
    return returns


def evaluate(agent, num_episodes=10, seed=10_000):
    """Mean return of the agent's greedy policy on the real CartPole-v0."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tf_agents.trajectories import time_step as ts  # pylint: disable=import-outside-toplevel
    env = gym.make("CartPole-v0")
    action_fn = tf.function(lambda t: agent.policy.action(t).action)
    returns = []
    for e in range(num_episodes):
        obs, done, total = env.reset(seed=seed + e), False, 0.0
        step_type = ts.StepType.FIRST
        while not done:
            time_step = ts.TimeStep(
                step_type=tf.constant([step_type], tf.int32),
                reward=tf.zeros([1]), discount=tf.ones([1]),
                observation=tf.constant(obs[None], tf.float32))
            obs, reward, done, _ = env.step(int(action_fn(time_step)[0]))
            step_type = ts.StepType.MID
            total += reward
        returns.append(total)
    env.close()
    return float(np.mean(returns))


WINDOW = 250  # train steps per printed loss


class Progress(Hook):
    """Prints the mean loss of each WINDOW train steps."""

    def __init__(self, offline, loss_log):
        self._offline = offline
        self._loss_log = loss_log
        self._start = time.monotonic()

    def after_iteration(self, learner, train_step_before, train_step):
        if crossed(train_step_before, train_step, WINDOW):
            recent = self._loss_log.losses[-WINDOW // 4:]
            print(f"train steps {train_step:5d}  mean loss {np.mean(recent):.4f}  "
                  f"(logged steps fed {self._offline.steps_fed}, "
                  f"{time.monotonic() - self._start:.0f} s)", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=400, help="scripted episodes logged")
    parser.add_argument("--epsilon", type=float, default=0.8,
                        help="random actions of the scripted policy")
    parser.add_argument("--train-steps", type=int, default=3000)
    parser.add_argument("--slots", type=int, default=4, help="episodes fed at once")
    parser.add_argument("--gamma", type=float, default=0.8)
    parser.add_argument("--target-update-period", type=int, default=20)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--log-dir", default=None, help="default: a temporary directory")
    args = parser.parse_args()

    log_dir = args.log_dir or tempfile.mkdtemp(prefix="cartpole_logs_")
    path = os.path.join(log_dir, "scripted.jsonl")
    returns = generate_logs(path, args.episodes, args.epsilon)
    print(f"logged {len(returns)} scripted episodes, {sum(returns):.0f} steps, mean return "
          f"{np.mean(returns):.1f} -> {path}")

    action_spec, observation_spec = cartpole_specs()
    agent = build_dqn(action_spec, observation_spec, gamma=args.gamma,
                      learning_rate=args.learning_rate,
                      target_update_period=args.target_update_period)
    offline = OfflineEnv([path], action_spec, observation_spec, num_epochs=None,
                         num_workers=args.slots)
    loss_log = LossLog()
    progress = Progress(offline, loss_log)
    learner = build_learner(
        offline, agent, num_slots=args.slots, unroll_length=8, learn_queue_cap=args.slots,
        train_steps_per_iteration=4, hooks=[loss_log, progress])
    print(f"greedy policy before training: mean return {evaluate(agent):.1f}")
    learner.run(num_train_steps=args.train_steps)
    offline.join(5)
    # One loss per iteration of 4 train steps: windows of WINDOW train steps.
    first = np.mean(loss_log.losses[:WINDOW // 4])
    last = np.mean(loss_log.losses[-WINDOW // 4:])
    print(f"loss: first {WINDOW} steps {first:.4f} -> last {WINDOW} steps {last:.4f}")
    print(f"greedy policy after training: mean return {evaluate(agent):.1f} "
          f"(the scripted logger: {np.mean(returns):.1f})")


if __name__ == "__main__":
    main()
