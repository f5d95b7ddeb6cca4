"""Train DQN on CartPole from the logs of a scripted policy: off-policy, from files.

1. A scripted controller (push the cart toward where the pole leans, with
   `--epsilon` random actions) plays gym's CartPole-v0 and its episodes are
   written as JSON lines (alf_async.environments.external.offline.EpisodeLogWriter).
   Episodes stopped by the 200-step time limit are written without `done`:
   their unknown last transition is never trained on.
2. The logs are loaded straight into a uniform replay buffer
   (alf_async.environments.external.offline.load_into_replayer: no driver, no policy
   inference per logged step; the *logged* actions are what it holds), and a
   DQN agent trains from it. The simulator is not in the loop. (For logs
   that arrive while training runs, an OfflineEnv feeds them through the
   driver instead: see alf_async/environments/external/offline.py.)
3. The TD loss is printed as it falls (the mean of every 500 train steps),
   and the greedy policy is played on the real CartPole before and after
   training.

The defaults are chosen for learning from a fixed log, where DQN's max over
actions extrapolates: a mostly random logger (--epsilon 0.8) covers both
actions in the states the learned policy visits, and a short horizon
(gamma 0.8, target network copied every 20 steps) keeps Q bounded. With
gamma 0.95 on these logs Q grew past 10^4 within 1,200 steps (plain
tf-agents DQN on the same transitions did the same, so it is the data and
the algorithm, not the pipeline).

Run it from the repository's root:

    python examples/train_from_logs.py [--episodes 400] [--train_steps 3000]
        [--log_dir DIR] [--verbose]

It prints what was logged and loaded, the loss every 500 train steps, and
the greedy policy's return before and after training
(examples/expected/train_from_logs.txt; docs/guides/examples.md shows a
whole run). There is no gin file for it: everything is built in Python.
"""

import argparse
import os
import sys
import tempfile
import time

from alf_async import quiet

quiet.quiet(verbose="--verbose" in sys.argv[1:])  # before gym is imported

import gym  # noqa: E402
import numpy as np  # noqa: E402

# TensorFlow and the rest of alf_async are imported once the arguments are
# checked: a wrong argument is answered at once, with one line.


def scripted_action(obs, rng, epsilon):
    """Push toward the pole's lean (angle plus a bit of angular velocity)."""
    if rng.random() < epsilon:
        return int(rng.integers(2))
    return int(obs[2] + 0.3 * obs[3] > 0)


def generate_logs(path, num_episodes, epsilon, seed=0):
    """Plays the scripted policy; writes its episodes; returns their returns."""
    from alf_async.environments.external.offline import EpisodeLogWriter  # pylint: disable=import-outside-toplevel
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
    action_fn = tf.function(lambda t: agent.policy.action(t).action, autograph=False)
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


WINDOW = 500  # train steps per printed loss


def train(agent, replayer, train_steps, batch_size=64):
    """`train_steps` DQN steps on windows of 2 sampled from `replayer`;
    returns the loss of every step."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    @tf.function(autograph=False)
    def step():
        return agent.train(replayer.sample(batch_size, num_steps=2)).loss

    losses = []
    start = time.monotonic()
    for i in range(1, train_steps + 1):
        losses.append(float(step()))
        if i % WINDOW == 0:
            print(f"train steps {i:5d}  mean loss {np.mean(losses[-WINDOW:]):.4f}  "
                  f"({time.monotonic() - start:.0f} s)", flush=True)
    return losses


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=400, help="scripted episodes logged")
    parser.add_argument("--epsilon", type=float, default=0.8,
                        help="random actions of the scripted policy")
    parser.add_argument("--train_steps", type=int, default=3000)
    parser.add_argument("--rows", type=int, default=4,
                        help="replay buffer rows the episodes are spread over")
    parser.add_argument("--gamma", type=float, default=0.8)
    parser.add_argument("--target_update_period", type=int, default=20)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--verbose", action="store_true",
                        help="show third-party output (TensorFlow's banner, gym's notices)")
    parser.add_argument("--log_dir", default=None,
                        help="an existing directory for the logs (default: a temporary "
                             "directory, removed at the end)")
    args = parser.parse_args(argv)
    if args.log_dir is not None and not os.path.isdir(args.log_dir):
        parser.exit(2, f"{parser.prog}: error: --log_dir {args.log_dir!r} is not an existing "
                       f"directory\n")
    if args.log_dir is not None:
        run(args, args.log_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="cartpole_logs_") as log_dir:
            run(args, log_dir)


def run(args, log_dir):
    from alf_async.environments.external.offline import load_into_replayer  # pylint: disable=import-outside-toplevel
    from alf_async.learning.replayers import UniformReplayer  # pylint: disable=import-outside-toplevel
    from serve_cartpole import build_dqn, cartpole_specs  # pylint: disable=import-outside-toplevel
    path = os.path.join(log_dir, "scripted.jsonl")
    returns = generate_logs(path, args.episodes, args.epsilon)
    print(f"logged {len(returns)} scripted episodes, {sum(returns):.0f} steps, mean return "
          f"{np.mean(returns):.1f} -> {path}")

    action_spec, observation_spec = cartpole_specs()
    agent = build_dqn(action_spec, observation_spec, gamma=args.gamma,
                      learning_rate=args.learning_rate,
                      target_update_period=args.target_update_period)
    capacity = int(sum(returns)) + 2 * args.episodes   # every logged step fits
    replayer = UniformReplayer(agent.collect_data_spec, num_rows=args.rows,
                               capacity_per_row=capacity)
    start = time.monotonic()
    stats = load_into_replayer([path], replayer, agent.collect_data_spec, num_rows=args.rows)
    secs = time.monotonic() - start
    print(f"loaded {stats.episodes} episodes ({stats.logged_steps} logged steps, "
          f"{stats.transitions} transitions) into the replay buffer in {secs:.2f} s "
          f"({stats.logged_steps / max(secs, 1e-9):,.0f} steps/s)")
    print(f"greedy policy before training: mean return {evaluate(agent):.1f}")
    losses = train(agent, replayer, args.train_steps)
    first, last = np.mean(losses[:WINDOW]), np.mean(losses[-WINDOW:])
    print(f"loss: first {WINDOW} steps {first:.4f} -> last {WINDOW} steps {last:.4f}")
    print(f"greedy policy after training: mean return {evaluate(agent):.1f} "
          f"(the scripted logger: {np.mean(returns):.1f})")


if __name__ == "__main__":
    main()
