"""Choosing the driver's layout by measuring the user's own environments and
policy, as FFTW's measured plans, cuDNN's autotuner and `tf.data.AUTOTUNE`
do, instead of guessing.

    choice = choose_layout(env_constructor, policy, num_rows=16)
    choice.layout      # Layout(num_envs=2, env_batch_size=8, num_actor_queues=1,
                       #        actor_queue_cap=2, processes=False)
    choice.rates       # [(Layout, env steps/s)], every candidate measured, fastest first

A layout splits `num_rows` environment rows into `num_envs` env
threads of `env_batch_size` rows, served by `num_actor_queues` actor threads
taking up to `actor_queue_cap` env threads' requests per forward pass, with
the environments in this process or (`processes`) in child processes.

`env_constructor` returns a TFEnvironment. Called as
`env_constructor(batch_size=B)` (and `recv_batch_size=R` for EnvPool) when
it takes a `batch_size` argument, it gives environments of any batch size,
and every split of the rows is a candidate. The driver's own zero-arg
env_constructor gives environments of one batch size B, and the candidates
are the layouts of `num_rows / B` env threads of B rows.

How it chooses, within `budget_secs`:

1. **Profile** (`profile`): one environment stepped alone in this thread
   with random actions: a step's wall time, this thread's CPU time in it
   (for a Python environment, the GIL is held then), the whole process's
   (EnvPool's own threads step without the GIL), whether the driver steps
   its rows one by one (`stepping.stepping_of`: `BlockingStep` or
   `RowStepping` environments) and
   whether they come in receives (EnvPool); the policy's batched forward
   pass timed at batch sizes 1, 2, 4, ... up to `num_rows`.
2. **Candidates** (`layout_model.candidates`): every split of the rows
   into env threads (in process, and in child processes when a
   constructor for them is given), with one or two actor threads, ranked
   by a cost model of the profile (`layout_model.predicted_rate`): Python
   stepping is serialized by the GIL, each request costs a fixed amount of
   CPU, inference runs beside it on another core, waits overlap across env
   threads (and across the rows of a row-stepped thread), an actor batches
   the requests that came while its last forward pass ran. The model only
   orders what to measure; the measurement decides.
3. **Measure** (`measure_rate`), in `layout_model.measuring_order`: the
   best-ranked split of each number of env threads, and in turns with
   them the other variants (actor threads, receive size) of the fastest
   split measured so far; each candidate as a real
   `AsyncOffPolicyDriver` on the user's constructor and policy whose
   learner only dequeues, for a few seconds after its first batch (its
   graphs traced); env steps per second from the driver's counters. A
   candidate is measured only if it is expected to fit what is left of the
   budget (as long as the longest yet in its place, in process or in child
   processes); after the first, the budget's end is a deadline: a candidate
   still starting then is stopped and not counted.

Threads: `choose_layout` runs on the caller's thread and starts, for each
candidate, a driver and a watcher thread that stops it when `stop_event` is
set or the deadline comes; both are stopped before it returns or raises.
It blocks for about `budget_secs` at most (plus the first candidate's
start-up if that alone is longer, and the stopping of the last).
"""

import collections
import functools
import inspect
import os
import re
import threading
import time

import numpy as np
import tensorflow as tf
from tf_agents.specs import array_spec, tensor_spec

from alf_async.driver.async_driver import AsyncOffPolicyDriver, DriverStoppedError
from alf_async.driver.layout_model import Layout, Profile, candidates, measuring_order
from alf_async.driver.stepping import stepping_of
from alf_async.environments import capabilities
from alf_async.environments.suites.envpool_envs import LockstepEnvPoolEnv

LayoutChoice = collections.namedtuple("LayoutChoice", ["layout", "rates", "profile", "secs"])
LayoutChoice.__doc__ = """The fastest layout measured.

layout: the `Layout` chosen; rates: [(Layout, env steps/s)] of every
candidate measured, fastest first; profile: the `Profile` that ranked the
candidates; secs: seconds spent profiling and measuring.
"""

_ACTIONS = 16    # random actions drawn for profiling, cycled


def format_layout(layout):
    """'2x8, 1 actor queue (cap 2), in process': how logs and configs name it
    (', receives of 4' for an EnvPool receive size; '2x8, no actor queue,
    in process' for env threads that act themselves)."""
    queues = "queue" if layout.num_actor_queues == 1 else "queues"
    where = "in child processes" if layout.processes else "in process"
    receives = "" if layout.recv_batch_size is None else (
        f", receives of {layout.recv_batch_size}")
    actors = ("no actor queue" if layout.num_actor_queues == 0 else
              f"{layout.num_actor_queues} actor {queues} (cap {layout.actor_queue_cap})")
    return f"{layout.num_envs}x{layout.env_batch_size}, {actors}, {where}{receives}"


def parse_layout(text):
    """The `Layout` that `format_layout` named.

    Raises:
        ValueError: `text` is not a layout `format_layout` writes.
    """
    match = re.fullmatch(r"\s*(\d+)x(\d+), (?:(\d+) actor queues? \(cap (\d+)\)|no actor queue), "
                         r"in (process|child processes)(?:, receives of (\d+))?\s*", str(text))
    if match is None:
        raise ValueError(f"a layout looks like '2x8, 1 actor queue (cap 2), in process' "
                         f"(or 'no actor queue'; 'in child processes'; ', receives of 4' for "
                         f"EnvPool), got {text!r}")
    envs, rows, queues, cap = (int(g or d) for g, d in zip(match.groups()[:4], "0001"))
    recv = None if match.group(6) is None else int(match.group(6))
    return Layout(envs, rows, queues, cap, match.group(5) == "child processes", recv)


def check_layout(layout, rows, batch_rows=None, processes=True):
    """Refuses a `layout` that does not fit a run, with one line.

    Args:
        layout: the `Layout`.
        rows: the run's environment rows (num_envs x env_batch_size).
        batch_rows: the rows of a learner batch, which the layout's env batch
            size must divide (None: any).
        processes: whether the run's environments can run in child processes.

    Raises:
        ValueError: naming what does not fit.
    """
    name = format_layout(layout)
    if layout.num_envs * layout.env_batch_size != rows:
        raise ValueError(f"Layout.choice {name!r} has {layout.num_envs * layout.env_batch_size} "
                         f"environments; Layout.env_threads x Layout.rows_per_env_thread = {rows}")
    if batch_rows is not None and batch_rows % layout.env_batch_size:
        raise ValueError(f"Layout.choice {name!r}: its env batch size {layout.env_batch_size} "
                         f"does not divide the learner batch's {batch_rows} rows "
                         f"(Schedule.rows_per_batch)")
    if layout.num_actor_queues > layout.num_envs:
        raise ValueError(f"Layout.choice {name!r}: more actor queues than env threads")
    if layout.processes and not processes:
        raise ValueError(f"Layout.choice {name!r}: child processes need the default "
                         f"Task.make_env_constructor and suite_gym, suite_gymnasium or "
                         f"suite_atari")


def describe_choice(choice):
    """One line: the layout chosen, its rate, how many were measured in how
    long, and the next two."""
    others = "; ".join(f"{format_layout(layout)} {rate:,.0f}/s"
                       for layout, rate in choice.rates[1:3])
    return (f"layout {format_layout(choice.layout)}: {choice.rates[0][1]:,.0f} env steps/s, "
            f"the fastest of {len(choice.rates)} measured in {choice.secs:.1f} s" +
            (f" (then {others})" if others else ""))


def cores():
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def profile(env_constructor, policy, num_rows, seconds=1.0, clock=time.monotonic):
    """Measures one environment's step and the policy's forward pass (see
    the module docstring). Runs on the caller's thread.

    Args:
        env_constructor: as `choose_layout`'s (with a fixed batch size B, a
            B-row environment is stepped and each row costs a B-th).
        policy: the TFPolicy the driver will act with.
        num_rows: the largest batch the policy is timed at.
        seconds: about how long stepping the environment takes.
        clock: a zero-arg callable returning seconds.

    Returns:
        A `Profile`.
    """
    any_batch = takes_batch_size(env_constructor)
    env = env_constructor(batch_size=1) if any_batch else env_constructor()
    try:
        py_env = capabilities.python_env(env)
        rows_stepped = stepping_of(env).rows_one_by_one
        receives = isinstance(py_env, LockstepEnvPoolEnv)   # its rows come in receives
        rows = env.batch_size or 1
        step_secs, step_cpu_secs, step_gil_secs = (
            secs / rows for secs in _time_steps(env, seconds, clock))
        time_step = env.reset()
        if rows > 1:
            time_step = tf.nest.map_structure(lambda t: t[:1], time_step)
    finally:
        env.close()
    return Profile(step_secs, step_cpu_secs, step_gil_secs, rows_stepped, receives,
                   _time_inference(policy, time_step, num_rows, clock), cores(),
                   None if any_batch else rows)


def takes_batch_size(env_constructor):
    """Whether `env_constructor` takes a `batch_size` argument (see the
    module docstring)."""
    try:
        parameters = inspect.signature(env_constructor).parameters.values()
    except (TypeError, ValueError):   # no signature to read: the driver's zero-arg kind
        return False
    return any(p.name == "batch_size" or p.kind == p.VAR_KEYWORD for p in parameters)


def _time_steps(env, seconds, clock):
    """(wall, process CPU, this thread's CPU) seconds per step of all of
    `env`'s rows, random actions drawn before the clock starts (tf-agents'
    `sample_spec_nest` costs more per call than a CartPole step)."""
    py_env = capabilities.python_env(env)
    if py_env is not None:
        rng = np.random.RandomState(0)   # tf-agents samples specs with RandomState
        outer = (py_env.batch_size,) if py_env.batched else ()
        actions = [array_spec.sample_spec_nest(py_env.action_spec(), rng, outer_dims=outer)
                   for _ in range(_ACTIONS)]
        step = py_env.step
        py_env.reset()
    else:
        actions = [tensor_spec.sample_spec_nest(env.action_spec(), outer_dims=(env.batch_size,))
                   for _ in range(_ACTIONS)]
        step = env.step
        env.reset()
    step(actions[0])                    # a first step may build or warm things
    steps, start = 0, clock()
    process_start, thread_start = time.process_time(), time.thread_time()
    while steps < 5 or (clock() - start < seconds and steps < 100000):
        step(actions[steps % _ACTIONS])
        steps += 1
    wall = clock() - start
    thread = min(time.thread_time() - thread_start, wall)
    process = max(time.process_time() - process_start, thread)
    return wall / steps, process / steps, thread / steps


def _batch_sizes(num_rows):
    sizes, b = [], 1
    while b < num_rows:
        sizes.append(b)
        b *= 2
    return sizes + [num_rows]


def _time_inference(policy, time_step, num_rows, clock):
    """{batch size: seconds} of `policy.action`, traced once for any batch."""
    batched = tensor_spec.add_outer_dims_nest(policy.time_step_spec, (None,))
    state_spec = tensor_spec.add_outer_dims_nest(policy.policy_state_spec, (None,))
    action = tf.function(policy.action, input_signature=[batched, state_spec],
                         autograph=False)
    result = {}
    for b in _batch_sizes(num_rows):
        tiled = tf.nest.map_structure(lambda t: tf.repeat(t, b, axis=0), time_step)
        state = policy.get_initial_state(b)
        tf.nest.map_structure(lambda t: t.numpy(), action(tiled, state))   # traced, warm
        times = []
        for _ in range(3):
            start = clock()
            tf.nest.map_structure(lambda t: t.numpy(), action(tiled, state))
            times.append(clock() - start)
        result[b] = sorted(times)[1]
    return result


def driver_env_constructor(env_constructor, layout):
    """The driver's zero-arg env_constructor for `layout` from
    `env_constructor` (`choose_layout`'s): called with its env batch size
    (and its EnvPool receive size), or itself if it takes no batch size."""
    if not takes_batch_size(env_constructor):
        return env_constructor
    if layout.recv_batch_size is None:
        return functools.partial(env_constructor, batch_size=layout.env_batch_size)
    return functools.partial(env_constructor, batch_size=layout.env_batch_size,
                             recv_batch_size=layout.recv_batch_size)


def measure_rate(env_constructor, policy, layout, seconds, unroll_length=8,
                 stop_event=None, clock=time.monotonic, deadline=None):
    """Env steps per second of `layout`: a driver whose learner only
    dequeues (one unroll of every env thread at a time), measured for
    `seconds` after its first batch.

    Args:
        env_constructor: as `choose_layout`'s (the in-process or the
            child-process one, as `layout.processes` says).
        policy: the TFPolicy to act with.
        layout: the `Layout` to run.
        seconds: how long to count.
        unroll_length: steps per unroll.
        stop_event: a `threading.Event`; once set, the driver is stopped.
        clock: a zero-arg callable returning seconds.
        deadline: a `clock()` time by which to have stopped counting: the
            count ends there if it began, else the driver is stopped there
            and nothing is counted. None: no deadline.

    Returns:
        env steps per second up to the last batch counted, or None if
            `deadline` came before a batch was counted.

    Raises:
        DriverStoppedError: `stop_event` was set.
        Exception: whatever the environments or the policy raised, with its type.
    """
    driver = AsyncOffPolicyDriver(
        driver_env_constructor(env_constructor, layout), policy, num_envs=layout.num_envs,
        num_actor_queues=layout.num_actor_queues, actor_queue_cap=layout.actor_queue_cap,
        unroll_length=unroll_length, learn_queue_cap=layout.num_envs)
    done, late = threading.Event(), threading.Event()
    watcher = None
    if stop_event is not None or deadline is not None:
        def watch():
            while not done.wait(0.05):
                if stop_event is not None and stop_event.is_set():
                    driver.stop()
                    return
                if deadline is not None and clock() >= deadline:
                    late.set()
                    driver.stop()
                    return
        watcher = threading.Thread(target=watch, name="layout_watcher", daemon=True)
        watcher.start()

    def stopped_by_deadline():
        return late.is_set() and not (stop_event is not None and stop_event.is_set())

    try:
        driver.start()
        try:
            driver.get_training_exps()       # every graph traced once a batch came
        except DriverStoppedError:
            if stopped_by_deadline():
                return None
            raise
        start, steps = clock(), driver.get_perf_stats()["env_steps"]
        end = start + seconds if deadline is None else min(start + seconds, deadline - 0.1)
        counted = (start, steps)      # (time, env steps) at the last batch
        while clock() < end:
            try:
                driver.get_training_exps()
            except DriverStoppedError:
                if stopped_by_deadline():
                    break             # the deadline came while a batch was on its way
                raise
            counted = (clock(), driver.get_perf_stats()["env_steps"])
        if counted[0] <= start:
            return None
        return (counted[1] - steps) / (counted[0] - start)
    finally:
        done.set()
        if watcher is not None:
            watcher.join()
        driver.stop()
        if stop_event is not None and stop_event.is_set():
            raise DriverStoppedError("measuring layouts was stopped")


def choose_layout(env_constructor, policy, num_rows,
                  process_env_constructor=None, budget_secs=20.0, seconds_per_candidate=1.5,
                  unroll_length=8, batch_rows=None, stop_event=None, print_fn=None,
                  clock=time.monotonic, measure=None):
    """Measures candidate layouts for `num_rows` rows of the user's
    environments and `policy`, and returns the fastest (see the module
    docstring).

    Args:
        env_constructor: callable returning an in-process TFEnvironment:
            `env_constructor(batch_size=B)` for B rows (also given
            `recv_batch_size=R` for EnvPool), or the driver's zero-arg kind,
            whose batch size every candidate then keeps (see the module
            docstring).
        policy: the TFPolicy the driver will act with (its collect policy).
        num_rows: environment rows in total (num_envs x env_batch_size).
        process_env_constructor: the same for environments in child
            processes; None: in process only.
        budget_secs: seconds to spend at most, profiling included (the
            first candidate is measured whatever it takes, and stopping the
            last may run past it).
        seconds_per_candidate: how long each candidate is counted.
        unroll_length: steps per unroll, as the run will have it.
        batch_rows: if set, only layouts whose env_batch_size divides it (the
            rows of a learner batch, so that it keeps its size).
        stop_event: a `threading.Event`; once set, measuring stops.
        print_fn: callable(str) for one line per candidate measured (None: silent).
        clock: a zero-arg callable returning seconds.
        measure: callable(layout, seconds) -> env steps/s, replacing the
            driver measurement (`measure_rate`); for tests and for tools
            with their own measure.

    Returns:
        A `LayoutChoice`.

    Raises:
        ValueError: `num_rows` is not an integer >= 1,
            `seconds_per_candidate` is not > 0, or no split of
            `num_rows` into env threads fits (a fixed batch size must divide it,
            an env batch size must divide `batch_rows`).
        DriverStoppedError: `stop_event` was set before a layout was chosen.
        Exception: whatever the environments or the policy raised, with its type.
    """
    if not isinstance(num_rows, int) or isinstance(num_rows, bool) or (
            num_rows < 1):
        raise ValueError(f"num_rows must be an integer >= 1, got {num_rows!r}")
    if not seconds_per_candidate > 0:
        raise ValueError(
            f"seconds_per_candidate must be > 0, got {seconds_per_candidate!r}")
    start = clock()
    profile_ = profile(env_constructor, policy, num_rows,
                       seconds=min(1.0, budget_secs / 10), clock=clock)
    ranked = candidates(profile_, num_rows,
                        processes=process_env_constructor is not None, batch_rows=batch_rows)
    if not ranked:
        fixed = profile_.fixed_batch_size
        reasons = ([f"env_constructor's environments have {fixed} rows"] if fixed else []) + (
            [f"an env batch size must divide the learner's {batch_rows} rows"]
            if batch_rows is not None else [])
        raise ValueError(f"no split of {num_rows} environments into env threads "
                         f"fits: {'; '.join(reasons)}")
    if measure is None:
        def measure(layout, seconds):
            make = process_env_constructor if layout.processes else env_constructor
            # After the first candidate, the budget is a deadline (measure_rate's).
            return measure_rate(make, policy, layout, seconds, unroll_length, stop_event, clock,
                                deadline=start + budget_secs if rates else None)
    rates, longest = [], {}   # {processes: the longest a candidate there took}
    for layout in measuring_order(ranked, rates):
        if stop_event is not None and stop_event.is_set():
            raise DriverStoppedError("measuring layouts was stopped")
        # The first of a place (child processes start slower) is expected
        # to take as long as the longest yet.
        expected = longest.get(layout.processes, max(longest.values(), default=0.0))
        if rates and clock() - start + expected > budget_secs:
            continue
        began = clock()
        rate = measure(layout, seconds_per_candidate)
        longest[layout.processes] = max(longest.get(layout.processes, 0.0), clock() - began)
        if rate is None:     # the deadline came first
            break
        rates.append((layout, rate))
        if print_fn is not None:
            print_fn(f"[alf_async] layout {format_layout(layout)}: {rate:,.0f} env steps/s")
    rates.sort(key=lambda item: -item[1])
    return LayoutChoice(rates[0][0], rates, profile_, clock() - start)
