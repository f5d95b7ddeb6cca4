"""The driver's own cost per env step, on each of its paths, beside
lockstep's over the same environment layer.

A tiny environment (CountingEnv: a few numpy writes a step) and a policy
that costs almost nothing (a constant action), so that what is left is the
driver's machinery: queue ops, hand-offs between threads, entries into
Python. Each path runs `--rows` environment rows:

    path        alf_async                                   lockstep over the same layer
    graph       graph loop, CountingEnvs in one batch       DynamicStepDriver, same batch
    rows        rows on worker threads (blocking_step)      DynamicStepDriver, same batch
    envpool     EnvPool CartPole, asynchronous pool (rows)  DynamicStepDriver, lockstep pool
    envpool_lockstep                                        DynamicStepDriver, lockstep pool
                EnvPool CartPole, a lockstep pool per env
                thread, stepped in its graph loop with no
                step token (the step frees the GIL)
    subprocess  rows in child processes (SubprocessEnv)     DynamicStepDriver, same children
                over its default transport (shared memory)
    subprocess_pipe                                         DynamicStepDriver, same children
                the same over transport='pipe' (pickled
                messages on pipes), to compare the two
    subprocess_batched                                      DynamicStepDriver, same children
                --envs_per_process environments in each
                child (default transport), a batch per
                child stepped in lockstep: one wake-up of
                a child per that many env steps
    external    ExternalEnv slots, one client thread each   (none: its clients drive it)

alf_async runs in each of `--layouts` (env threads x rows, each with one
actor thread and with none: `num_actor_queues=0`); its learner only
dequeues. Rows paths also print the bare-thread ceiling: one Python thread
per row stepping its environment (in process, or its child) with no TF.
The subprocess paths also print "bare processes", the ceiling of the
layer: one child process per row stepping its environment alone in a loop,
a fixed action, no driver and nothing from the parent per step
(benchmarks/bare_processes.py). Rounds alternate the sides.

Per env step, medians of the rounds:
- cpu_us: CPU of the whole process and its children (benchmarks/usage.py);
- parent_us, children_us: its two parts, the driver's process's and its
  child processes'. One process's CPU bounds what it can feed on any number
  of cores: for each alf_async side the table prints that per-process
  ceiling, 1e6 / parent_us steps/s (proc_max/s);
- own_us: cpu_us less that of the environment layer alone (lockstep's
  batch stepped in a Python loop, no TF): the collector's own CPU;
- cs: context switches, likewise;
- tf_ops: ops the driver's graphs run (counted in their traced graphs:
  the env thread's loop body per T steps, the actor's pass per pass run)
  plus the eager ops and concrete-function calls its Python loops make
  (counted as they are called);
- py_entries: the driver's entries into Python from a wait or from TF
  (numpy_function callbacks, eager TF calls, which release the GIL and
  take it back, row-worker steps and stepper receives): the GIL
  acquisitions the driver asks for, not the interpreter's periodic
  switches.

    python benchmarks/driver_cost.py [--paths graph rows envpool envpool_lockstep
        subprocess subprocess_pipe subprocess_batched external] [--envs_per_process 8]
        [--rows 16] [--layouts 1x16 2x8] [--rounds 3] [--seconds 3] [--json out.json]
"""

import argparse
import collections
import json
import statistics
import sys
import threading

import host_info  # benchmarks/ is this script's directory
from alf_async.testing.bench.graph_ops import body_ops, graph_ops_per_step
from driver_counts import (Counter, count_driver_parts, count_env_steps, patch_eager_queue_ops,
                           python_entries)

PATHS = ("graph", "rows", "envpool", "envpool_lockstep", "subprocess", "subprocess_pipe",
         "subprocess_batched", "external")
SUBPROCESS_PATHS = ("subprocess", "subprocess_pipe", "subprocess_batched")
ENVS_PER_PROCESS = [8]   # subprocess_batched's envs_per_process (--envs_per_process)


# ------------------------------------------------------------------ the paths

def make_policy(tf_env):
    """A TFPolicy whose action is the spec's minimum, for any batch: no
    network, a handful of ops."""
    import tensorflow as tf   # pylint: disable=import-outside-toplevel
    from tf_agents.policies import tf_policy   # pylint: disable=import-outside-toplevel
    from tf_agents.trajectories import policy_step   # pylint: disable=import-outside-toplevel

    class ConstantPolicy(tf_policy.TFPolicy):
        def _action(self, time_step, policy_state, seed):
            spec = self.action_spec
            batch = tf.shape(time_step.step_type)[:1]
            action = tf.fill(tf.concat([batch, spec.shape.as_list()], 0),
                             tf.constant(spec.minimum, spec.dtype))
            return policy_step.PolicyStep(action, policy_state, ())

        def _distribution(self, time_step, policy_state):
            raise NotImplementedError

    return ConstantPolicy(tf_env.time_step_spec(), tf_env.action_spec())


def constructors(path, episode_length=200):
    """(alf_async's env constructor(batch size), lockstep's TFEnvironment
    constructor(batch size), bare-thread row constructor or None)."""
    if path in SUBPROCESS_PATHS:
        return subprocess_constructors(path, episode_length)[:3]
    from alf_async.testing.envs import (BlockingCountingEnv, CountingEnv,   # pylint: disable=import-outside-toplevel
                                        CountingEnvConstructor)
    if path in ("graph", "rows"):
        cls = CountingEnv if path == "graph" else BlockingCountingEnv
        kwargs = {} if path == "graph" else dict(latency=0.0)

        def make(b):
            return CountingEnvConstructor(batch_size=b, episode_length=episode_length,
                                          env_cls=cls, **kwargs)()
        return make, make, lambda: cls(episode_length=episode_length, **kwargs)
    if path in ("envpool", "envpool_lockstep"):
        from alf_async.environments.suites import suite_envpool   # pylint: disable=import-outside-toplevel
        stepping = "rows" if path == "envpool" else "lockstep"
        return ((lambda b: suite_envpool.load("CartPole-v1", batch_size=b, seed=0,
                                              stepping=stepping)),
                (lambda b: suite_envpool.load("CartPole-v1", batch_size=b, seed=0,
                                              stepping="lockstep")), None)
    raise ValueError(path)


def subprocess_constructors(path, episode_length=200):
    """`constructors` of a subprocess path, plus the constructor each bare
    process calls in its child: (alf_async's, lockstep's, bare thread's row,
    bare process's env)."""
    import functools   # pylint: disable=import-outside-toplevel
    from alf_async.environments import subprocess_env_constructor  # pylint: disable=import-outside-toplevel
    from alf_async.environments.processes.subprocess_env import SubprocessEnv  # pylint: disable=import-outside-toplevel
    from alf_async.testing.envs import CountingEnv   # pylint: disable=import-outside-toplevel
    one = functools.partial(CountingEnv, episode_length=episode_length)
    # The default transport on `subprocess`; the pickled pipes on `subprocess_pipe`.
    # subprocess_batched: envs_per_process environments in each child (a
    # batch smaller than that gets one child for all).
    transport = dict(transport="pipe") if path == "subprocess_pipe" else {}

    def make(b):
        per_process = min(ENVS_PER_PROCESS[0], b) if path == "subprocess_batched" else 1
        return subprocess_env_constructor(one, num_envs=b, envs_per_process=per_process,
                                          **transport)()
    return make, make, lambda: SubprocessEnv(one, **transport), one


def alf_round(path, layout, queues, seconds, unroll_length):
    """Usage per step of alf_async on `path` in `layout` (threads, rows)."""
    threads, rows = layout
    if path == "external":
        return external_round(layout, queues, seconds, unroll_length)
    make, _, _ = constructors(path)
    probe = make(1)
    policy = make_policy(probe)
    probe.close()
    return measure_counted(lambda: make(rows), policy, threads, queues, seconds, unroll_length)


def measure_counted(env_constructor, policy, threads, queues, seconds, unroll_length):
    """`measure_driver` of a driver of `threads` env threads, with its graph
    ops and Python entries per env step counted."""
    from alf_async import AsyncOffPolicyDriver   # pylint: disable=import-outside-toplevel
    from usage import measure_driver   # pylint: disable=import-outside-toplevel
    driver = AsyncOffPolicyDriver(env_constructor, policy, num_envs=threads,
                                  num_actor_queues=queues, actor_queue_cap=threads,
                                  learn_queue_cap=threads, unroll_length=unroll_length)
    graph = graph_ops_per_step(driver)
    counter = Counter()
    count_driver_parts(driver, counter)
    undo = patch_eager_queue_ops(counter)
    try:
        result = measure_driver(driver, seconds)
    finally:
        undo()
    return finish(result, graph, counter, driver.get_perf_stats(), driver)


def finish(result, graph, counter, stats, driver):
    """`result` with tf_ops and py_entries per env step."""
    steps = max(stats["env_steps"], 1)
    passes = stats["actor_batches"]
    # Actor passes run, each its graph's ops (graph["actor"] is per row of
    # a full request: scale back to per pass).
    actor_ops = graph["actor"] * driver.env_batch_size * passes
    graph_loop_steps = sum(int(t._steps.numpy())   # pylint: disable=protected-access
                           for t in driver._env_threads)   # pylint: disable=protected-access
    env_ops = graph["env_thread"] * graph_loop_steps
    result["tf_ops"] = (env_ops + actor_ops + counter.counts["eager_ops"]) / steps
    result["py_entries"] = python_entries(counter.counts) / steps
    return result


def external_round(layout, queues, seconds, unroll_length):
    """ExternalEnv slots fed by one in-process client thread per slot."""
    import numpy as np   # pylint: disable=import-outside-toplevel
    from tf_agents.specs import array_spec   # pylint: disable=import-outside-toplevel
    from alf_async.environments import ExternalEnv   # pylint: disable=import-outside-toplevel
    from alf_async.environments.external.episode_records import ExternalEnvStoppedError  # pylint: disable=import-outside-toplevel
    threads, rows = layout
    obs_spec = array_spec.ArraySpec((3,), np.float32, "observation")
    act_spec = array_spec.BoundedArraySpec((), np.int32, 0, 1, "action")

    class Clients(ExternalEnv):
        def run(self):
            workers = [threading.Thread(target=self.client, daemon=True)
                       for _ in range(threads * rows)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()

        def client(self):
            obs = np.zeros(3, np.float32)
            try:
                while True:
                    episode = self.start_episode()
                    self.get_action(episode, obs)
                    for _ in range(199):
                        self.get_action(episode, obs, reward=1.0)
                    self.end_episode(episode, obs)
            except ExternalEnvStoppedError:
                return         # the driver stopped
            except Exception as e:   # pylint: disable=broad-except
                print(f"client: {type(e).__name__}: {e}", file=sys.stderr)

    ext = Clients(act_spec, obs_spec, max_concurrent=threads * rows + 4)
    make = ext.env_constructor(slots_per_env=rows)
    from tf_agents.specs import tensor_spec   # pylint: disable=import-outside-toplevel
    from tf_agents.trajectories import time_step as ts   # pylint: disable=import-outside-toplevel

    class _Specs(object):
        def time_step_spec(self):
            return ts.time_step_spec(tensor_spec.from_spec(obs_spec))

        def action_spec(self):
            return tensor_spec.from_spec(act_spec)
    return measure_counted(make, make_policy(_Specs()), threads, queues, seconds, unroll_length)


def lockstep_round(path, rows, seconds):
    """Usage per step of tf-agents' DynamicStepDriver over `rows` rows of
    the same layer, with its traced ops and numpy_function entries."""
    from tf_agents.drivers import dynamic_step_driver   # pylint: disable=import-outside-toplevel
    from tf_agents.utils import common   # pylint: disable=import-outside-toplevel
    from usage import Usage   # pylint: disable=import-outside-toplevel
    _, make, _ = constructors(path)
    env = make(rows)
    try:
        policy = make_policy(env)
        counter = Counter()
        count_env_steps(env, counter)
        steps_per_run = rows * 16
        driver = dynamic_step_driver.DynamicStepDriver(env, policy, num_steps=steps_per_run)
        run = common.function(driver.run, autograph=False)
        time_step, policy_state = run()
        counter.counts.clear()        # traced and warm: count from here
        concrete = run.get_concrete_function(time_step, policy_state)
        ops_per_step = body_ops(concrete) / rows     # one batch step per iteration
        steps, usage = 0, Usage()
        while usage.elapsed() < seconds:
            time_step, policy_state = run(time_step, policy_state)
            steps += steps_per_run
        result = usage.per_step(steps)
    finally:
        env.close()
    result["tf_ops"] = ops_per_step
    # Its Python steps, and one eager call per run of steps_per_run.
    result["py_entries"] = python_entries(counter.counts) / max(steps, 1) + 1.0 / steps_per_run
    return result


def env_alone_round(path, rows, seconds):
    """The environment layer alone: lockstep's batch of `rows` stepped in a
    Python loop with a fixed action and no TF. Subtracted from each side's
    CPU, it leaves the collector's own (`own_us`)."""
    import numpy as np   # pylint: disable=import-outside-toplevel
    from usage import Usage   # pylint: disable=import-outside-toplevel
    _, make, _ = constructors(path)
    env = make(rows)
    try:
        pyenv = env.pyenv
        spec = pyenv.action_spec()
        action = np.full((rows,) + spec.shape, spec.minimum, spec.dtype)
        pyenv.reset()
        pyenv.step(action)
        steps, usage = 0, Usage()
        while usage.elapsed() < seconds:
            for _ in range(16):
                pyenv.step(action)
            steps += 16 * rows
        result = usage.per_step(steps)
    finally:
        env.close()
    result["tf_ops"] = 0.0
    result["py_entries"] = 1.0 / rows
    return result


def ceiling_round(path, rows, seconds):
    """Bare Python threads, one per row, each stepping its environment with
    a fixed action and no TF: the ceiling for rows stepped on threads."""
    import numpy as np   # pylint: disable=import-outside-toplevel
    from usage import Usage   # pylint: disable=import-outside-toplevel
    _, _, make_row = constructors(path)
    envs = [make_row() for _ in range(rows)]
    stop, counts = threading.Event(), [0] * rows

    def work(i):
        env, action = envs[i], np.int32(0)
        env.reset()
        while not stop.is_set():
            env.step(action)
            counts[i] += 1
    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(rows)]
    usage = Usage()
    for t in threads:
        t.start()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join()
    result = usage.per_step(sum(counts))
    for env in envs:
        env.close()
    result["tf_ops"] = 0.0
    result["py_entries"] = 1.0
    return result


def bare_processes_round(path, rows, seconds):
    """One child process per row stepping its environment alone, a fixed
    action, no driver, nothing from the parent per step: the ceiling of the
    child-process layer (benchmarks/bare_processes.py)."""
    import bare_processes   # pylint: disable=import-outside-toplevel
    one = subprocess_constructors(path)[3]
    result = bare_processes.measure([one] * rows, seconds)
    result["tf_ops"] = 0.0
    result["py_entries"] = 0.0
    return result


# ------------------------------------------------------------------ the table

FIELDS = ("rate", "cpu_us", "parent_us", "children_us", "cs", "tf_ops", "py_entries")


def split_cpu(result):
    """`result` (a Usage.per_step with counts) with the driver's process's
    CPU per env step (`parent_us`) and its children's (`children_us`)."""
    result["parent_us"] = result["parent_cpu_us"]
    result["children_us"] = result["children_cpu_us"]
    return result


def medians(rounds):
    return {f: statistics.median(r[f] for r in rounds) for f in FIELDS}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--layouts", nargs="+", default=["1x16", "2x8"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--unroll_length", type=int, default=16)
    parser.add_argument("--json", default=None)
    parser.add_argument("--envs_per_process", type=int, default=ENVS_PER_PROCESS[0],
                        help="environments per child process on the subprocess_batched path")
    host_info.add_kernel_flags(parser)
    args = parser.parse_args()
    host_info.choose_kernels(args, [])
    ENVS_PER_PROCESS[0] = args.envs_per_process
    layouts = [tuple(int(x) for x in text.split("x")) for text in args.layouts]
    for t, b in layouts:
        if t * b != args.rows:
            parser.error(f"--layouts {t}x{b} has {t * b} rows, --rows is {args.rows}")
    table = collections.OrderedDict()
    for path in args.paths:
        sides = collections.OrderedDict()
        if path != "external":
            sides["lockstep"] = lambda p=path: lockstep_round(p, args.rows, args.seconds)
        if path != "external":
            sides["environment alone"] = lambda p=path: env_alone_round(p, args.rows,
                                                                        args.seconds)
        if path in ("rows",) + SUBPROCESS_PATHS:
            sides["bare threads"] = lambda p=path: ceiling_round(p, args.rows, args.seconds)
        if path in SUBPROCESS_PATHS:
            sides["bare processes"] = lambda p=path: bare_processes_round(p, args.rows,
                                                                          args.seconds)
        for t, b in layouts:
            for queues in (1, 0):
                name = f"alf_async {t}x{b}, " + ("1 actor" if queues else "acting itself")
                sides[name] = (lambda p=path, layout=(t, b), q=queues:
                               alf_round(p, layout, q, args.seconds, args.unroll_length))
        rounds = collections.defaultdict(list)
        for r in range(args.rounds):
            for name, run in sides.items():
                rounds[name].append(split_cpu(run()))
                print(f"  {path} round {r + 1} {name}: " + " ".join(
                    f"{f}={rounds[name][-1][f]:.3g}" for f in FIELDS), flush=True)
        table[path] = {name: dict(medians(rs), rounds=rs) for name, rs in rounds.items()}
    machine = host_info.host()
    print(f"\nper env step, medians of {args.rounds} rounds; {host_info.describe(machine)}")
    print("cpu_us = parent_us (the driver's process) + children_us (its child processes); "
          "own_us: cpu_us less the environment alone's; own/lockstep: its ratio to "
          "lockstep's own_us;\nproc_max/s: 1e6 / parent_us, the steps/s one driver process "
          "can feed at most (alf_async sides)")
    print(f"{'path':<17}{'side':<32}{'steps/s':>9}{'cpu_us':>8}{'parent_us':>10}"
          f"{'children_us':>12}{'own_us':>8}{'cs':>7}{'tf_ops':>8}{'py_entries':>11}"
          f"{'own/lockstep':>13}{'proc_max/s':>11}")
    for path, sides in table.items():
        alone = sides.get("environment alone")
        for name, m in sides.items():
            m["own_us"] = m["cpu_us"] - alone["cpu_us"] if alone else None
        base = sides.get("lockstep")
        for name, m in sides.items():
            own = "-" if m["own_us"] is None else f"{m['own_us']:.1f}"
            ratio = (f"{m['own_us'] / base['own_us']:.2f}x"
                     if base and m["own_us"] is not None and base["own_us"] > 0 else "-")
            ceiling = (f"{1e6 / m['parent_us']:,.0f}"
                       if name.startswith("alf_async") and m["parent_us"] > 0 else "-")
            if ceiling != "-":
                m["proc_max_rate"] = 1e6 / m["parent_us"]
            print(f"{path:<17}{name:<32}{m['rate']:>9,.0f}{m['cpu_us']:>8.1f}"
                  f"{m['parent_us']:>10.1f}{m['children_us']:>12.1f}{own:>8}"
                  f"{m['cs']:>7.2f}{m['tf_ops']:>8.1f}{m['py_entries']:>11.3f}{ratio:>13}"
                  f"{ceiling:>11}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(host=machine, args=vars(args), table=table), f, indent=1)


if __name__ == "__main__":
    main()
