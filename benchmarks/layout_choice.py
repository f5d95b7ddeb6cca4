"""Layout.choice = 'auto' against the table of every layout, per workload.

For each workload, in one process: `choose_layout` runs as a training run's
start would (its default 20 s budget) and picks a layout; then every
candidate layout it could have measured is measured in alternating rounds
(each round visits every candidate once, in a new order), each for
--seconds after its first batch, with the same driver measurement
(`layout.measure_rate`: the learner only dequeues). Prints, per workload:
every candidate's predicted and measured rate (median of the rounds), the
choice, the best of the table, the ratio choice / best, the seconds
`choose_layout` spent measuring, and the table's noise floor (`noise_floor`:
how the fastest of one round fares in the others).

The table's best is the fastest of many medians, so where candidates are
within the machine's noise of each other it is biased upwards (the fastest
of a few noisy rates is likely one that drew high). So the choice is also
measured head to head against the table's best in fresh rounds
(--head_to_head rounds, each counting both, in turns, first one then the
other), and the median of those rounds' ratios is printed beside the
table's ratio: the same two layouts, measured as the other benchmarks
measure a speed-up.

Workloads (those of the collection benchmarks, and one no test has seen):

  cartpole64   64 in-process CartPole-v0 (suite_gym's BatchedGymEnv), the
               DQN collect policy (64x64), child processes offered too
  blocking32   32 CartPole-v0 whose steps sleep exp(10 ms) first
               (latency_bound.py's environments, blocking_step), same policy
  lognormal48  48 of them sleeping lognormal(1 ms) instead (sigma 1): steps
               that block briefly, the row workers contending for the GIL
  atari16      16 in-process Breakout games (suite_atari), the Nature-CNN
               DQN collect policy, child processes offered too
  envpool16    a 16-game EnvPool Breakout pool (suite_envpool), the same
               policy; receive sizes among the candidates
  mixed16      16 environments no test has seen: each step either computes
               (a GIL-holding Python loop of ~--compute_ms) or waits
               (~--wait_ms), switching at random per step

    python benchmarks/layout_choice.py [--workloads cartpole64 blocking32 lognormal48
        atari16 envpool16 mixed16] [--rounds 2] [--seconds 3] [--budget 20] [--head_to_head 4]
"""

import argparse
import functools
import itertools
import random
import statistics
import time

import gym
import numpy as np
import tensorflow as tf
from tf_agents.environments import batched_py_environment, suite_gym, tf_py_environment

from alf_async.driver import layout as layout_lib
from alf_async.driver import layout_model
from alf_async.environments import suites
from alf_async.learning import agents
from alf_async.testing.policies import dqn_collect_policy
from latency_bound import slow_envs  # benchmarks/ is this script's directory

NATURE_CNN = dict(conv_layer_params=((32, 8, 4), (64, 4, 2), (64, 3, 1)), fc_layer_params=(512,))


class ComputeOrWait(gym.Wrapper):
    """CartPole whose every step first either burns `compute_secs` in a
    Python loop (holding the GIL) or sleeps `wait_secs`, at random."""

    def __init__(self, env, compute_secs, wait_secs, seed):
        super().__init__(env)
        self._rng = random.Random(seed)
        self._compute, self._wait = compute_secs, wait_secs

    def step(self, action):
        if self._rng.random() < 0.5:
            end = time.perf_counter() + self._compute
            while time.perf_counter() < end:
                pass
        else:
            time.sleep(self._wait)
        return self.env.step(action)


def mixed_envs(seeds, compute_secs, wait_secs):
    envs = [suite_gym.wrap_env(ComputeOrWait(gym.make("CartPole-v0").env, compute_secs,
                                             wait_secs, seed), max_episode_steps=200)
            for seed in seeds]
    return tf_py_environment.TFPyEnvironment(
        batched_py_environment.BatchedPyEnvironment(envs, multithreading=False))


def _seeded(make_batch):
    """choose_layout's env_constructor(batch_size) over `make_batch(seeds)`,
    fresh seeds per call."""
    seeds = itertools.count(10_000)

    def env_constructor(batch_size, **kwargs):
        return make_batch([next(seeds) for _ in range(batch_size)])
    return env_constructor


def _suite(suite, env_name, seed=0):
    return suites.sized_env_constructor(suites.make_env_constructor, suite, env_name, seed)


def _children(suite, env_name, seed=0):
    return suites.sized_env_constructor(suites.make_subprocess_env_constructor, suite,
                                        env_name, seed)


def _dqn_policy(env_constructor, **network):
    env = env_constructor(batch_size=1)
    try:
        if not network:
            return dqn_collect_policy(env)
        agent = agents.dqn_agent(env.time_step_spec(), env.action_spec(),
                                 tf.Variable(0, dtype=tf.int64), epsilon_greedy=0.1, **network)
        agent.initialize()
        return agent.collect_policy
    finally:
        env.close()


def workload(name, args):
    """(env_constructor, process_env_constructor or None, policy, rows)."""
    if name == "cartpole64":
        make = _suite("suite_gym", "CartPole-v0")
        return make, _children("suite_gym", "CartPole-v0"), _dqn_policy(make), 64
    if name == "blocking32":
        make = _seeded(functools.partial(slow_envs, mean_secs=0.010, dist="exp"))
        return make, None, _dqn_policy(make), 32
    if name == "lognormal48":
        make = _seeded(functools.partial(slow_envs, mean_secs=0.001, dist="lognormal"))
        return make, None, _dqn_policy(make), 48
    if name == "atari16":
        make = _suite("suite_atari", "ALE/Breakout-v5")
        return make, _children("suite_atari", "ALE/Breakout-v5"), _dqn_policy(
            make, **NATURE_CNN), 16
    if name == "envpool16":
        make = _suite("suite_envpool", "Breakout-v5")
        return make, None, _dqn_policy(make, **NATURE_CNN), 16
    if name == "mixed16":
        make = _seeded(functools.partial(mixed_envs, compute_secs=args.compute_ms / 1000,
                                         wait_secs=args.wait_ms / 1000))
        return make, None, _dqn_policy(make), 16
    raise ValueError(name)


def run_workload(name, args):
    make, make_children, policy, rows = workload(name, args)
    choice = layout_lib.choose_layout(make, policy, rows, process_env_constructor=make_children,
                                      budget_secs=args.budget)
    table_layouts = layout_model.candidates(choice.profile, rows,
                                          processes=make_children is not None)

    def measure(layout):
        builder = make_children if layout.processes else make
        return layout_lib.measure_rate(builder, policy, layout, args.seconds)

    rates = {layout: [] for layout in table_layouts}
    order = list(table_layouts)
    rng = random.Random(0)
    for _ in range(args.rounds):
        rng.shuffle(order)
        for layout in order:
            rates[layout].append(measure(layout))
    medians = {layout: statistics.median(values) for layout, values in rates.items()}
    best = max(medians, key=medians.get)
    print(f"\n== {name}: {rows} environments; profile: step {choice.profile.step_secs * 1e6:.0f} "
          f"us (CPU {choice.profile.step_cpu_secs * 1e6:.0f} us, of it this thread's "
          f"{choice.profile.step_gil_secs * 1e6:.0f} us), forward pass "
          + ", ".join(f"b{b} {s * 1e3:.2f} ms" for b, s in sorted(
              choice.profile.inference_secs.items())), flush=True)
    print(f"{'layout':58s} {'predicted':>10s} {'measured':>10s} {'rounds':>20s}  choose_layout")
    measured_by_choice = dict(choice.rates)
    for layout in sorted(table_layouts, key=lambda l: -medians[l]):
        mark = ""
        if layout in measured_by_choice:
            mark = f"measured {measured_by_choice[layout]:,.0f}/s"
        if layout == choice.layout:
            mark += "  <- chosen"
        print(f"{layout_lib.format_layout(layout):58s} "
              f"{layout_model.predicted_rate(choice.profile, layout):10,.0f} "
              f"{medians[layout]:10,.0f} "
              f"{' / '.join(f'{v:,.0f}' for v in rates[layout]):>20s}  {mark}")
    ratio = medians[choice.layout] / medians[best]
    print(f"{name}: chose {layout_lib.format_layout(choice.layout)} "
          f"({len(choice.rates)} measured in {choice.secs:.1f} s); best "
          f"{layout_lib.format_layout(best)}; chosen / best = {ratio:.3f}", flush=True)
    floor = noise_floor(rates)
    if floor:
        print(f"{name}: noise floor: the fastest of one whole round, in each other round, "
              f"over that round's fastest: median {statistics.median(floor):.3f}, "
              f"min {min(floor):.3f} ({len(floor)} pairs)", flush=True)
    if choice.layout == best:
        head = 1.0
    elif args.head_to_head:
        head = head_to_head(choice.layout, best, args.head_to_head, measure)
    else:
        head = float("nan")
    print(f"{name}: head to head, chosen / best = {head:.3f}", flush=True)
    return ratio, choice.secs, statistics.median(floor) if floor else float("nan"), head


def head_to_head(chosen, best, rounds, measure):
    """The median over `rounds` of chosen's rate over best's, each round
    measuring both (`measure(layout)` -> env steps/s), in turns first."""
    ratios = []
    for i in range(rounds):
        pair = (chosen, best) if i % 2 == 0 else (best, chosen)
        rate = {layout: measure(layout) for layout in pair}
        ratios.append(rate[chosen] / rate[best])
        print(f"  head to head round {i + 1}: chosen {rate[chosen]:,.0f}/s, best "
              f"{rate[best]:,.0f}/s, ratio {ratios[-1]:.3f}", flush=True)
    return statistics.median(ratios)


def noise_floor(rates):
    """For each ordered pair of rounds (i, j): the rate in round j of round
    i's fastest layout, over round j's fastest. A chooser that measured
    every candidate for --seconds, as the table does, scores this against
    the table; where it falls under 1, the table's gaps are its noise."""
    rounds = len(next(iter(rates.values())))
    ratios = []
    for i, j in itertools.permutations(range(rounds), 2):
        pick = max(rates, key=lambda layout: rates[layout][i])
        ratios.append(rates[pick][j] / max(values[j] for values in rates.values()))
    return ratios


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", nargs="+",
                        default=["cartpole64", "blocking32", "atari16", "envpool16", "mixed16"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--budget", type=float, default=20.0)
    parser.add_argument("--head_to_head", type=int, default=4,
                        help="rounds of the choice against the table's best (0: none)")
    parser.add_argument("--compute_ms", type=float, default=0.3)
    parser.add_argument("--wait_ms", type=float, default=2.0)
    args = parser.parse_args()
    np.random.seed(0)
    summary = {}
    for name in args.workloads:
        summary[name] = run_workload(name, args)
    print("\nworkload      chosen / best   seconds measuring   noise floor (median)   "
          "head to head")
    for name, (ratio, secs, floor, head) in summary.items():
        print(f"{name:13s} {ratio:13.3f} {secs:19.1f} {floor:22.3f} {head:14.3f}")


if __name__ == "__main__":
    main()
