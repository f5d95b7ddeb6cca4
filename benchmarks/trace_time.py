"""Time to trace a train step, with and without the optimizer's slots built first.

For alf_async.learning.agents.dqn_agent (CartPole-v0, the dqn_cartpole.gin network:
DdqnAgent, QNetwork 128x128, 3-step) and sac_agent (Pendulum-v1, default
networks), each case in its own process (3 rounds each): the seconds of
`get_concrete_function` of a tf.function around `agent.train`, and how many
times it traced. Without the prebuild the optimizer creates its slot
variables inside the first trace, and a tf.function that creates variables
is traced again.

    python benchmarks/trace_time.py [--rounds 3]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def one(agent_name, prebuild):
    """In the child: (seconds to trace, traces)."""
    import tensorflow as tf
    from tf_agents.agents.dqn import dqn_agent as dqn_agent_lib
    from tf_agents.environments import suite_gym
    from tf_agents.specs import tensor_spec
    from tf_agents.utils import common

    from alf_async.learning import agents

    env = suite_gym.load("CartPole-v0" if agent_name == "dqn" else "Pendulum-v1")
    time_step_spec = tensor_spec.from_spec(env.time_step_spec())
    action_spec = tensor_spec.from_spec(env.action_spec())
    step = tf.Variable(0, dtype=tf.int64)
    if agent_name == "dqn":
        agent = agents.dqn_agent(time_step_spec, action_spec, step, fc_layer_params=(128, 128),
                                 agent_class=dqn_agent_lib.DdqnAgent,
                                 agent_kwargs=dict(n_step_update=3),
                                 prebuild_optimizer=prebuild)
    else:
        if not prebuild:  # sac_agent has no flag: this child process skips the build
            agents.build_optimizer = lambda optimizer, variables: None
        agent = agents.sac_agent(time_step_spec, action_spec, step)
    agent.initialize()
    spec = tf.nest.map_structure(lambda s: tf.TensorSpec([64, agent.train_sequence_length or 2]
                                                         + s.shape.as_list(), s.dtype),
                                 agent.collect_data_spec)
    traces = []

    def train(exp):
        traces.append(1)
        return agent.train(exp)

    start = time.perf_counter()
    common.function(train).get_concrete_function(spec)
    return time.perf_counter() - start, len(traces)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        agent_name, prebuild = args.child.split(":")
        print(json.dumps(one(agent_name, prebuild == "on")))
        return
    print("| train step | optimizer slots | traces | seconds to trace (median of rounds) |")
    print("|---|---|---:|---:|")
    for agent_name in ("dqn", "sac"):
        for prebuild in ("off", "on"):
            secs, traces = [], set()
            for _ in range(args.rounds):
                out = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--child",
                     f"{agent_name}:{prebuild}"], capture_output=True, text=True, timeout=600)
                line = [x for x in out.stdout.splitlines() if x.startswith("[")]
                if not line:
                    raise RuntimeError(out.stderr[-3000:])
                s, n = json.loads(line[-1])
                secs.append(s)
                traces.add(n)
            label = "built first" if prebuild == "on" else "made in the first trace"
            print(f"| {agent_name} | {label} | {sorted(traces)} | "
                  f"{statistics.median(secs):.2f} |", flush=True)


if __name__ == "__main__":
    main()
