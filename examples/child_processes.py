"""Your own environment in child processes, surviving a crash.

What it shows: a gymnasium environment class of your own (`Corridor`, below)
stepped in 8 child processes (`subprocess_env_constructor`: one
SubprocessEnv each, each under its own GIL) by one env thread, which waits
on all of them at once; a DQN agent (`alf_async.learning.agents.dqn_agent`)
learns to walk right on them. Partway through, one child kills itself with
SIGKILL, as a crashing simulator would: it is restarted, the episode it was
in ends as a truncation, training goes on, and the restart is counted
(`restarts_of`; a `train()` run writes it to TensorBoard as Env/restarts).

The same from the CLI: `Task.make_env_constructor =
@make_subprocess_env_constructor` (gin_configs/dqn_cartpole_subprocess.gin),
with `Task.env_name = 'my_module:MyEnv-v0'` for a class of yours that
`my_module` registers with gymnasium (docs/guides/your-environment.md).
Needs gymnasium: `pip install -e '.[gymnasium]'`.

Run it from the repository's root:

    python examples/child_processes.py [--num_env_steps 8192] [--crash_at_step 200]
        [--verbose]

It prints the layout, a line every 32 iterations, what was trained, the
restarts and the collect policy's episodes (examples/expected/child_processes.txt;
docs/guides/examples.md shows a whole run). A corridor walked straight to
its right end returns +1 in 4 steps.
"""

import argparse
import functools
import os
import signal
import sys
import tempfile

from alf_async import quiet

quiet.quiet(verbose="--verbose" in sys.argv[1:])  # before TensorFlow and gym are imported

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tf_agents.environments.tf_py_environment import TFPyEnvironment  # noqa: E402

from alf_async import AsyncOffPolicyDriver  # noqa: E402
from alf_async.driver.metrics import by_name  # noqa: E402
from alf_async.environments import as_py_environment, subprocess_env_constructor  # noqa: E402
from alf_async.environments.capabilities import restarts_of  # noqa: E402
from alf_async.learning import Learner, UniformReplayer, agents  # noqa: E402
from alf_async.learning.learner import Hook  # noqa: E402

ROWS = 8             # child processes, all stepped by one env thread
UNROLL_LENGTH = 8    # a batch: ROWS x UNROLL_LENGTH env steps
TRAIN_STEPS_PER_ITERATION = 8
INITIAL_COLLECT_STEPS = 256


class Corridor(gym.Env):
    """Your simulator: a corridor of `length` cells, starting in the middle.

    Actions: 0 steps left, 1 steps right. Reaching the right end returns +1,
    the left end -1 (either ends the episode); 50 steps cut it short
    (truncated). The observation is the position, one-hot.

    To show a crash, the first child (of any run sharing `crash_file`) whose
    own step count reaches `crash_at_step` creates `crash_file` and kills
    its process; a restarted child finds the file and goes on.
    """

    def __init__(self, length=9, crash_file=None, crash_at_step=0):
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, 1.0, (length,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._crash_file = crash_file
        self._crash_at_step = crash_at_step
        self._steps_in_process = 0
        self._position = self._t = 0

    def _observation(self):
        observation = np.zeros(self.length, np.float32)
        observation[self._position] = 1.0
        return observation

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)   # the walk starts in the middle every time
        self._position, self._t = self.length // 2, 0
        return self._observation(), {}

    def step(self, action):
        self._steps_in_process += 1
        if self._crash_at_step and self._steps_in_process == self._crash_at_step:
            self._crash_once()
        self._position += 1 if int(action) == 1 else -1
        self._t += 1
        at_end = self._position in (0, self.length - 1)
        reward = 0.0 if not at_end else (1.0 if self._position else -1.0)
        return self._observation(), reward, at_end, self._t >= 50 and not at_end, {}

    def _crash_once(self):
        try:
            os.close(os.open(self._crash_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return   # another child crashed already
        os.kill(os.getpid(), signal.SIGKILL)


class Progress(Hook):
    """Prints the counters and the restarts so far every 32 iterations."""

    def after_iteration(self, learner, train_step_before, train_step):
        if learner.iterations % 32 == 0:
            print(f"iteration {learner.iterations}: env steps {learner.env_steps}, train steps "
                  f"{learner.train_step}, children restarted so far "
                  f"{restarts_of(learner.driver.environments[0])}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num_env_steps", type=int, default=8192,
                        help="stop once this many env steps were collected")
    parser.add_argument("--crash_at_step", type=int, default=200,
                        help="the step (of a child's own) at which one child kills itself; "
                             "0: none does")
    parser.add_argument("--verbose", action="store_true",
                        help="show third-party output (TensorFlow's banner, gym's notices)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="child_processes_") as scratch:
        # The env constructor each child calls: picklable (a class of this
        # file, sent by value, with its arguments).
        make_corridor = functools.partial(Corridor, crash_file=os.path.join(scratch, "crashed"),
                                          crash_at_step=args.crash_at_step)
        env_constructor = subprocess_env_constructor(
            make_corridor, num_envs=ROWS,
            step_timeout=30.0,              # seconds before a silent child counts as hung
            max_restarts=3, restart_window_secs=600.0)   # more within the window: the run fails
        spec_env = TFPyEnvironment(as_py_environment(Corridor()))   # in this process: the specs
        agent = agents.dqn_agent(spec_env.time_step_spec(), spec_env.action_spec(),
                                 tf.Variable(0, dtype=tf.int64), fc_layer_params=(32,),
                                 learning_rate=1e-3, epsilon_greedy=0.1,
                                 agent_kwargs=dict(gamma=0.9, target_update_period=20))
        replayer = UniformReplayer(agent.collect_data_spec, num_rows=ROWS,
                                   capacity_per_row=2000)
        driver = AsyncOffPolicyDriver(env_constructor, agent.collect_policy, num_envs=1,
                                      num_actor_queues=1, unroll_length=UNROLL_LENGTH,
                                      exp_observers=[replayer])
        learner = Learner(agent, driver, replayer,
                          train_steps_per_iteration=TRAIN_STEPS_PER_ITERATION,
                          sample_batch_size=64, initial_collect_steps=INITIAL_COLLECT_STEPS,
                          hooks=[Progress()])
        print(f"layout: 1 env thread over {ROWS} Corridors in child processes, 1 actor thread; "
              f"batches of {ROWS} rows x {UNROLL_LENGTH} steps = {ROWS * UNROLL_LENGTH} env "
              f"steps", flush=True)
        stopped_by = learner.run(num_env_steps=args.num_env_steps)  # closes the children too
    print(f"stopped ({stopped_by}) at iteration {learner.iterations}: {learner.train_step} train "
          f"steps on {learner.env_steps} env steps")
    print(f"children restarted: {restarts_of(driver.environments[0])}")
    metrics = {name: metric.result().numpy() for name, metric in
               by_name(driver.get_metrics()).items()}
    print(f"collect policy: {int(metrics['NumberOfEpisodes'])} episodes, the last ones' "
          f"AverageReturn {metrics['AverageReturn']:.2f}, AverageEpisodeLength "
          f"{metrics['AverageEpisodeLength']:.1f}")


if __name__ == "__main__":
    main()
