"""Slow environments: alf_async's driver vs tf-agents' lockstep collection.

N CartPole-v0 environments whose every step first sleeps a random time of
mean M (a remote or heavy simulator; seeded per environment). The latency
bound is N / M env steps per second: every environment stepping back to back
with no wait for actions.

  lockstep   DynamicStepDriver over TFPyEnvironment(BatchedPyEnvironment(
             N suite_gym envs, multithreading=True)): each batch step waits
             for the slowest of the N.
  alf_async  --layouts env threads x envs, the same suite_gym environments
             (declaring blocking_step = True, so env threads step them from
             Python), one actor with dynamic batching, unroll 8; a
             layout ending in :0 (1x32:0) has no actor: each env thread
             acts itself (num_actor_queues=0).

  ceiling    no policy and no TF: one plain Python thread per environment,
             stepping it with a fixed action and reporting to one loop that
             sends the next action at once. What this machine's GIL and
             thread switches allow for these environments (each suite_gym
             step holds the GIL ~50 us, each sleep costs a system call); no
             collector built on Python threads can beat it.

With --processes every environment runs in a child process on both sides:

  lockstep   DynamicStepDriver over TFPyEnvironment(ParallelPyEnvironment(
             N constructors)): tf-agents' own child processes, each batch
             step waits for the slowest.
  lockstep threads
             the in-process lockstep above (BatchedPyEnvironment,
             multithreading=True, under DynamicStepDriver), a second
             baseline: --baselines parallel threads (the default with
             --processes) runs both, the first named is "vs lockstep".
  alf_async  --layouts env threads x envs over subprocess_env_constructor
             (SubprocessEnv children, --transport: shared_memory, the
             default, or pipe, the pickled pipes): each env thread waits on
             its rows' children at once and steps whichever rows are ready,
             with no worker thread per row (subprocess_rows.py).
  ceiling    no policy and no TF: one Python loop stepping N SubprocessEnvs
             (--transport) with a fixed action, whichever are ready (one
             epoll set).
  bare processes
             N child processes, each stepping its environment alone in a
             loop with a fixed action: no driver and nothing from the parent
             per step, the ceiling of the processes themselves
             (bare_processes.py); steps/s = their total steps / seconds.

Same process, alternating rounds, the same DQN collect policy (QNetwork
64x64); the driver's learner only dequeues. Prints steps/s, CPU us and
context switches per env step (the process and its children), the ratio to
lockstep and the fractions of the bound and of the ceiling. With
--processes a second table gives each collector's ratio to each baseline,
its fraction of bare processes, and its CPU per env step split into the
driver's process's and its children's. TF's thread pools are process-wide,
so --intra_op_threads/--inter_op_threads apply to every side.

--round_trip adds, for each alf_async layout, where its env threads' time
goes per env step (the medians of the rounds): sending requests (the
enqueue, and taking the GIL back after it; beside it what that op costs
alone, timed on this thread beforehand), waiting for replies, and the env
threads' CPU, wait for a core and sleep (/proc's per-thread schedstat);
for one env thread with an actor, also per request (times the batch).
Without --processes it then gives the row workers' CPU, wait for a core and
context switches per env step beside the ceiling's threads: what a step costs
when a batched reply wakes a row's worker against one woken alone.

    python benchmarks/latency_bound.py [--num_envs 32] [--mean_ms 1]
        [--dist exp|const|lognormal] [--layouts 1x32 2x16 4x8 1x32:0] [--rounds 3]
        [--seconds 5] [--intra_op_threads 0] [--inter_op_threads 0] [--processes]
        [--baselines parallel threads] [--transport shared_memory|pipe] [--round_trip]
"""

import argparse
import functools
import queue
import re
import select
import statistics
import threading
import time

import gym
import numpy as np
from tf_agents.environments import (batched_py_environment, parallel_py_environment, suite_gym,
                                    tf_py_environment)
from tf_agents.system import system_multiprocessing

import tensorflow as tf

from alf_async import AsyncOffPolicyDriver
from alf_async.environments import (close_subprocess_envs, create_subprocess_envs,
                                    subprocess_env_constructor)
from alf_async.testing.policies import dqn_collect_policy
import bare_processes  # benchmarks/ is this script's directory
from usage import Usage, measure_driver, measure_dynamic_step_driver, parse_layout

ENV = "CartPole-v0"


class RandomLatency(gym.Wrapper):
    """Sleeps a seeded random time before each step."""

    def __init__(self, env, mean_secs, dist, seed):
        super().__init__(env)
        self._rng = np.random.default_rng(seed)
        self._mean, self._dist = mean_secs, dist

    def _latency(self):
        if self._dist == "const":
            return self._mean
        if self._dist == "lognormal":  # sigma 1, scaled to the mean
            return self._mean * self._rng.lognormal(-0.5, 1.0)
        return self._rng.exponential(self._mean)

    def step(self, action):
        time.sleep(self._latency())
        return self.env.step(action)


def slow_env(seed, mean_secs, dist):
    """One suite_gym environment that sleeps before each step; declares blocking_step."""
    env = suite_gym.wrap_env(RandomLatency(gym.make(ENV).env, mean_secs, dist, seed),
                             max_episode_steps=200)
    env.blocking_step = True
    return env


def slow_envs(seeds, mean_secs, dist):
    """A TFPyEnvironment over slow_env environments, stepped by threads in lockstep."""
    envs = [slow_env(seed, mean_secs, dist) for seed in seeds]
    return tf_py_environment.TFPyEnvironment(
        batched_py_environment.BatchedPyEnvironment(envs, multithreading=len(envs) > 1))


BASELINES = {"parallel": "lockstep", "threads": "lockstep threads"}


def baseline_names(args):
    """The lockstep sides' names in --baselines order: "lockstep" is
    ParallelPyEnvironment with --processes and the in-process lockstep
    without; with --processes the in-process one is "lockstep threads"."""
    if not args.processes:
        return ["lockstep"]
    return list(dict.fromkeys(BASELINES[b] for b in args.baselines))


def lockstep_round(policy, args, seconds, name="lockstep"):
    seeds = range(args.num_envs)
    if args.processes and name == "lockstep":
        env = tf_py_environment.TFPyEnvironment(parallel_py_environment.ParallelPyEnvironment(
            [functools.partial(slow_env, s, args.mean_ms / 1000, args.dist) for s in seeds],
            start_serially=False))
    else:
        env = slow_envs(seeds, args.mean_ms / 1000, args.dist)
    try:
        return measure_dynamic_step_driver(env, policy, args.num_envs * 10, seconds)
    finally:
        env.close()


def async_round(policy, args, layout, seconds):
    threads, per_thread, actor_queues = layout
    if args.processes:
        # Seeds by env index in the children: subprocess_env_constructor
        # numbers them 10_000, 10_001, ...
        env_constructor = subprocess_env_constructor(
            functools.partial(seeded_slow_env, mean_secs=args.mean_ms / 1000, dist=args.dist),
            num_envs=per_thread, first_env_index=10_000, transport=args.transport)
    else:
        seeds = iter(range(10_000, 20_000))

        def env_constructor():
            return slow_envs([next(seeds) for _ in range(per_thread)], args.mean_ms / 1000,
                             args.dist)
    return measure_driver(AsyncOffPolicyDriver(
        env_constructor, policy, num_envs=threads, num_actor_queues=actor_queues,
        actor_queue_cap=threads, learn_queue_cap=threads, unroll_length=8), seconds,
                          probe=env_thread_counters if args.round_trip else None)


def threads_usage(pattern):
    """Cumulative CPU and run-queue seconds (/proc schedstat) and voluntary
    and involuntary context switches of this process's Python threads whose
    name fullmatches `pattern`."""
    total = dict(cpu=0.0, runq=0.0, vcs=0, ics=0)
    for thread in threading.enumerate():
        if re.fullmatch(pattern, thread.name):
            task = f"/proc/self/task/{thread.native_id}"
            with open(f"{task}/schedstat") as f:
                ran, waited, _ = f.read().split()
            with open(f"{task}/status") as f:
                status = f.read()
            total["cpu"] += int(ran) / 1e9
            total["runq"] += int(waited) / 1e9
            for key, field in (("vcs", "voluntary"), ("ics", "nonvoluntary")):
                total[key] += int(re.search(rf"^{field}_ctxt_switches:\s+(\d+)", status,
                                            re.M).group(1))
    return total


def env_thread_counters(driver):
    """Cumulative counters of the driver's env threads (named env0, env1, ...):
    CPU and waiting for a core, sending requests and waiting for replies
    (get_perf_stats); and of their row workers (env0_row0, ...): CPU, waiting
    for a core and context switches."""
    env, rows = threads_usage(r"env\d+"), threads_usage(r"env\d+_row\d+")
    stats = driver.get_perf_stats()
    return dict(cpu=env["cpu"], runq=env["runq"], request=stats["request_secs"],
                reply=stats["action_wait_secs"],
                **{f"row_{k}": v for k, v in rows.items()})


def enqueue_alone_secs(policy, rows, calls=2000):
    """What one request's enqueue op costs alone (this thread, no other
    thread running): the time step and env ids of `rows` rows, as an env
    thread sends them, into a queue of its own."""
    specs = tf.nest.flatten(policy.time_step_spec) + [tf.TensorSpec([], tf.int32)]
    components = [np.zeros([rows] + s.shape.as_list(), s.dtype.as_numpy_dtype) for s in specs]
    scratch = tf.queue.FIFOQueue(calls + 100, [s.dtype for s in specs])
    handle = scratch.queue_ref   # alive while `scratch` is
    for _ in range(100):
        tf.raw_ops.QueueEnqueueV2(handle=handle, components=components)
    start = time.perf_counter()
    for _ in range(calls):
        tf.raw_ops.QueueEnqueueV2(handle=handle, components=components)
    return (time.perf_counter() - start) / calls


def print_round_trip(names, layouts, rows, policy):
    """The --round_trip table (see the module docstring)."""
    alone = ", ".join(f"{b} rows {enqueue_alone_secs(policy, b) * 1e6:.0f} us"
                      for b in sorted({layout[1] for layout in layouts}))
    print(f"\nenv threads' time per env step, us (--round_trip; the enqueue op alone, "
          f"per request: {alone})")
    print(f"{'collector':22s} {'request':>8s} {'reply':>8s} {'CPU':>8s} {'run queue':>9s} "
          f"{'asleep':>8s}  per request of the batch (1 env thread, an actor)")
    for name, (threads, _, actors) in zip(names, layouts):
        med = {k: statistics.median(x["probe"][k] for x in rows[name])
               for k in rows[name][0]["probe"]}
        rate = statistics.median(x["rate"] for x in rows[name])
        asleep = threads / rate - med["cpu"] - med["runq"]
        us = [med["request"], med["reply"], med["cpu"], med["runq"], asleep]
        line = f"{name:22s} " + " ".join(f"{v * 1e6:8.1f}" for v in us[:3]) + \
            f" {us[3] * 1e6:9.1f} {us[4] * 1e6:8.1f}"
        if threads == 1 and actors:
            batch = statistics.median(x["batch"] for x in rows[name])
            line += "  " + ", ".join(f"{label} {v * batch * 1e3:.2f} ms" for label, v in
                                     zip(["request", "reply", "CPU", "run queue", "asleep"], us))
        print(line)


def print_row_workers(names, rows):
    """The --round_trip table of the row workers (the ceiling's threads, the
    env threads' row workers): per env step, the medians of the rounds."""
    print(f"\nrow workers' time per env step (--round_trip)\n{'collector':22s} {'CPU us':>8s} "
          f"{'run queue us':>12s} {'voluntary cs':>12s} {'involuntary cs':>14s}")
    for name in names:
        med = {k: statistics.median(x["probe"][f"row_{k}"] for x in rows[name])
               for k in ("cpu", "runq", "vcs", "ics")}
        print(f"{name:22s} {med['cpu'] * 1e6:8.1f} {med['runq'] * 1e6:12.1f} "
              f"{med['vcs']:12.2f} {med['ics']:14.2f}")


def seeded_slow_env(mean_secs, dist):
    """slow_env seeded with its child's env index (inside a SubprocessEnv child)."""
    from alf_async.environments import current_env_index  # pylint: disable=import-outside-toplevel
    return slow_env(current_env_index(), mean_secs, dist)


def ceiling_round(args, seconds):
    """No policy, no TF: the environments stepped with a fixed action, each
    as soon as it is ready (a thread per environment; with --processes one
    loop over the children's pipes)."""
    if args.processes:
        return process_ceiling_round(args, seconds)
    envs = slow_envs(range(20_000, 20_000 + args.num_envs), args.mean_ms / 1000,
                     args.dist).pyenv.envs
    ready, inboxes = queue.SimpleQueue(), [queue.SimpleQueue() for _ in envs]
    action = np.zeros(envs[0].action_spec().shape, envs[0].action_spec().dtype)

    def work(env, inbox):
        env.reset()
        while inbox.get() is not None:
            env.step(action)
            ready.put(inbox)

    threads = [threading.Thread(target=work, args=(e, i), name=f"ceiling_row{k}", daemon=True)
               for k, (e, i) in enumerate(zip(envs, inboxes))]
    for t, inbox in zip(threads, inboxes):
        t.start()
        inbox.put(True)
    before = threads_usage(r"ceiling_row\d+")
    steps, usage = 0, Usage()
    while usage.elapsed() < seconds:
        inbox = ready.get()
        inbox.put(True)
        steps += 1
    result = usage.per_step(steps)
    result["probe"] = {f"row_{k}": (v - before[k]) / steps
                       for k, v in threads_usage(r"ceiling_row\d+").items()}
    for inbox in inboxes:
        inbox.put(None)
    for t in threads:
        t.join()
    for e in envs:
        e.close()
    return result


def process_ceiling_round(args, seconds):
    """One loop over N SubprocessEnvs: each is sent its next step as soon as
    its reply is in (one epoll set over the pipes), a fixed action, no TF."""
    envs = create_subprocess_envs([
        functools.partial(slow_env, s, args.mean_ms / 1000, args.dist)
        for s in range(20_000, 20_000 + args.num_envs)], transport=args.transport)
    poll, receive, row_of = select.epoll(), {}, {}
    action = np.zeros(envs[0].action_spec().shape, envs[0].action_spec().dtype)

    def issue(row, request):
        receive[row] = request()
        conn, _ = envs[row].reply_waitable()
        row_of[conn.fileno()] = row
        poll.register(conn.fileno(), select.EPOLLIN)

    try:
        for row, env in enumerate(envs):
            issue(row, env.reset_async)
        steps, usage = 0, Usage()
        while usage.elapsed() < seconds:
            for fd, _ in poll.poll(1.0):
                poll.unregister(fd)
                row = row_of.pop(fd)
                receive.pop(row)()
                issue(row, functools.partial(envs[row].step_async, action))
                steps += 1
        result = usage.per_step(steps)
        for row in list(receive):
            receive.pop(row)()
    finally:
        poll.close()
        close_subprocess_envs(envs)
    return result


def bare_processes_round(args, seconds):
    """N child processes, each stepping its environment alone (see the
    module docstring)."""
    return bare_processes.measure([
        functools.partial(slow_env, s, args.mean_ms / 1000, args.dist)
        for s in range(30_000, 30_000 + args.num_envs)], seconds)


def print_processes_table(names, bases, rows):
    """The --processes table (see the module docstring): per collector, the
    medians of the rounds, ratios per round."""
    bare = statistics.median(x["rate"] for x in rows["bare processes"])
    print(f"\nbare processes: {bare:.0f} steps/s; CPU us per env step, the driver's process "
          f"(parent) and its child processes (children)")
    print(f"{'collector':22s} {'steps/s':>9s}" + "".join(f" {'vs ' + b:>19s}" for b in bases) +
          f" {'of bare processes':>17s} {'parent us':>9s} {'children us':>11s}")
    for name in names:
        med = {k: statistics.median(x[k] for x in rows[name])
               for k in ("rate", "parent_cpu_us", "children_cpu_us")}
        ratios = [statistics.median(a["rate"] / b["rate"] for a, b in zip(rows[name], rows[base]))
                  for base in bases]
        print(f"{name:22s} {med['rate']:9.0f}" + "".join(f" {r:18.2f}x" for r in ratios) +
              f" {med['rate'] / bare:17.0%} {med['parent_cpu_us']:9.1f} "
              f"{med['children_cpu_us']:11.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num_envs", type=int, default=32)
    parser.add_argument("--mean_ms", type=float, default=1.0)
    parser.add_argument("--dist", choices=["exp", "const", "lognormal"], default="exp")
    parser.add_argument("--layouts", nargs="+", default=["1x32", "2x16", "4x8"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--intra_op_threads", type=int, default=0, help="0: TF's default")
    parser.add_argument("--inter_op_threads", type=int, default=0, help="0: TF's default")
    parser.add_argument("--processes", action="store_true",
                        help="every environment in a child process, on both sides")
    parser.add_argument("--baselines", nargs="+", choices=sorted(BASELINES), default=None,
                        help="with --processes, the lockstep sides: ParallelPyEnvironment "
                             "(lockstep) and the in-process one (lockstep threads); default both")
    parser.add_argument("--transport", choices=["shared_memory", "pipe"],
                        default="shared_memory",
                        help="with --processes, SubprocessEnv's transport on the alf_async "
                             "and ceiling sides")
    parser.add_argument("--round_trip", action="store_true",
                        help="where the env threads' time goes (see the module docstring)")
    args = parser.parse_args()
    if args.baselines is None:
        args.baselines = ["parallel", "threads"] if args.processes else ["threads"]
    elif not args.processes and args.baselines != ["threads"]:
        parser.error("--baselines other than threads need --processes")
    tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)
    layouts = [parse_layout(x) for x in args.layouts]
    for threads, per_thread, _ in layouts:
        if threads * per_thread != args.num_envs:
            parser.error(f"layout {threads}x{per_thread} is not {args.num_envs} environments")
    bound = args.num_envs / (args.mean_ms / 1000)
    policy = dqn_collect_policy(tf_py_environment.TFPyEnvironment(suite_gym.load(ENV)))
    bases = baseline_names(args)
    layout_names = [f"alf_async {x}" for x in args.layouts]
    ceilings = ["ceiling"] + (["bare processes"] if args.processes else [])
    names = bases + layout_names + ceilings
    rows = {name: [] for name in names}
    for r in range(args.rounds):
        for name in bases:
            rows[name].append(lockstep_round(policy, args, args.seconds, name))
        rows["ceiling"].append(ceiling_round(args, args.seconds))
        if args.processes:
            rows["bare processes"].append(bare_processes_round(args, args.seconds))
        for name, layout in zip(layout_names, layouts):
            rows[name].append(async_round(policy, args, layout, args.seconds))
        print(f"round {r + 1}: " + ", ".join(f"{n} {v[-1]['rate']:.0f}" for n, v in rows.items()),
              flush=True)
    ceiling = statistics.median(x["rate"] for x in rows["ceiling"])
    print(f"\n{args.num_envs} envs{' in child processes' if args.processes else ''}, "
          f"{args.dist} latency of mean {args.mean_ms} ms: "
          f"bound {bound:.0f} steps/s; TF threads intra {args.intra_op_threads or 'default'}, "
          f"inter {args.inter_op_threads or 'default'}"
          + (f"; transport {args.transport}" if args.processes else ""))
    print(f"{'collector':22s} {'steps/s':>9s} {'vs lockstep':>11s} {'of bound':>9s} "
          f"{'of ceiling':>10s} {'CPU us/step':>11s} {'cs/step':>8s} {'batch':>6s}")
    for name in names:
        med = {k: statistics.median(x[k] for x in rows[name])
               for k in rows[name][0] if k != "probe"}
        ratio = statistics.median(a["rate"] / b["rate"]
                                  for a, b in zip(rows[name], rows[bases[0]]))
        print(f"{name:22s} {med['rate']:9.0f} {ratio:10.2f}x {med['rate'] / bound:8.0%} "
              f"{med['rate'] / ceiling:9.0%} {med['cpu_us']:11.1f} {med['cs']:8.2f} {med.get('batch', 0):6.1f}")
    if args.processes:
        print_processes_table(names, bases, rows)
    if args.round_trip:
        print_round_trip(layout_names, layouts, rows, policy)
        if not args.processes:
            print_row_workers(layout_names + ["ceiling"], rows)


if __name__ == "__main__":
    # ParallelPyEnvironment's children need tf-agents' multiprocessing set up
    # (handle_main would parse our flags with absl).
    system_multiprocessing.enable_interactive_mode()
    main()
