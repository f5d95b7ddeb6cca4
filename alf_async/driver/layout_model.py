"""The cost model that orders the candidate layouts `choose_layout`
measures (see alf_async/driver/layout.py): what a layout is, what the
profile of an environment and a policy holds, the rate the model expects
of a layout, the candidates, and the order to measure them in. The model
only orders what to measure; the measurement decides.
"""

import collections
import itertools

Layout = collections.namedtuple(
    "Layout", ["num_envs", "env_batch_size", "num_actor_queues", "actor_queue_cap",
               "processes", "recv_batch_size"], defaults=(False, None))
Layout.__doc__ = """Where the driver's environment rows run and who serves them.

num_envs: env threads; env_batch_size: rows in each one's environment;
num_actor_queues: actor threads; actor_queue_cap: env threads' requests per
forward pass at most; processes: environments in child processes;
recv_batch_size: rows per receive of an EnvPool pool (None: not EnvPool, or
its default).
"""

Profile = collections.namedtuple(
    "Profile", ["step_secs", "step_cpu_secs", "step_gil_secs", "rows_stepped", "receives",
                "inference_secs", "cores", "fixed_batch_size"], defaults=(None,))
Profile.__doc__ = """What one environment and the policy cost, measured.

step_secs: wall seconds of one environment step (a row's); step_cpu_secs: the CPU
seconds the whole process spent on it (an EnvPool pool's own threads
included); step_gil_secs: the stepping thread's CPU seconds in it (the GIL
is held then, for a Python environment); rows_stepped: the driver steps the
rows of a batch of these environments one by one (their waits overlap);
receives: its rows come in receives of `recv_batch_size` (EnvPool);
inference_secs: {batch size: seconds of one forward pass of the policy};
cores: the cores this process may run on; fixed_batch_size: the rows of
every environment the constructor gives (a zero-arg constructor's), None
if it gives any batch size.
"""

# The driver's CPU cost of one env thread's request (its numpy_function,
# queue round trip, routing) and of each row in it, fitted on the
# collection benchmarks (docs/results/collection.md and its results files), and
# what a row in a child process costs the driver's process per step over
# shared memory (its frames, the copy of its time step, waking the child),
# fitted on benchmarks/results/driver_cost_processes.json (the subprocess
# path's driver's process less the in-process path's). They scale the model's
# terms against each other; the measurement decides.
REQUEST_SECS = 480e-6
ROW_SECS = 8e-6
# The same for an env thread that acts itself (num_actor_queues=0), from
# benchmarks/driver_cost.py: in its graph loop the round trip and the hand-off
# to an actor are gone (~210 us less per request of 16 rows); its Python
# loops (rows stepped one by one) call a traced forward pass from Python,
# which costs more than the round trip to a graph actor (~550 us a call
# against ~70 us).
OWN_GRAPH_REQUEST_SECS = 270e-6
OWN_PYTHON_REQUEST_SECS = 700e-6
PROCESS_STEP_SECS = 60e-6
# The limits on a layout's rate are combined as a soft minimum, the
# SOFT_MIN_POWER-norm of their reciprocals, rather than the tightest alone:
# a pipeline runs below its tightest limit when its other stages are loaded
# too (their queues wait), so of two layouts with the same tightest limit
# the one with more room elsewhere runs faster.
SOFT_MIN_POWER = 4


def inference_secs(profile_, batch):
    """Seconds of one forward pass at `batch`, interpolated between the
    batch sizes `profile_` timed."""
    sizes = sorted(profile_.inference_secs)
    if batch <= sizes[0]:
        return profile_.inference_secs[sizes[0]]
    for low, high in zip(sizes, sizes[1:]):
        if batch <= high:
            f_low, f_high = profile_.inference_secs[low], profile_.inference_secs[high]
            return f_low + (f_high - f_low) * (batch - low) / (high - low)
    return profile_.inference_secs[sizes[-1]] * batch / sizes[-1]


def predicted_rate(profile_, layout):
    """Env steps per second the cost model expects of `layout`: the soft
    minimum (`SOFT_MIN_POWER`) of its `rate_limits`. It ranks the
    candidates to measure; it is not a measurement."""
    limits = rate_limits(profile_, layout).values()
    return sum(limit ** -SOFT_MIN_POWER for limit in limits) ** (-1.0 / SOFT_MIN_POWER)


def rate_limits(profile_, layout):
    """The env steps per second that each part of the driver allows
    `layout`, by the cost model.

    Each env thread repeats a round: step its B rows (one after another, or
    all at once where rows are stepped one by one or live in child
    processes), send its request (one per receive for EnvPool), wait for the
    forward pass of the requests waiting with it (`requests_per_forward`);
    an env thread that acts itself runs the forward pass of its own request.
    The Python side of stepping (the stepping thread's CPU in process, the
    pipes with processes, the driver's per-request and per-row costs) holds
    the GIL, so the env threads' Python work adds up on one core; the rest
    of a step's CPU (EnvPool's threads, the children) and the forward passes
    run on the other cores.

    Returns:
        {'rounds': the env threads' rounds, 'gil': the Python work on one
            core, 'cores': all the CPU on the profile's cores, 'actors': the
            actor threads' forward passes}.
    """
    python, elsewhere, env_time = _stepping(profile_, layout)
    batch = (layout.recv_batch_size or layout.env_batch_size) * requests_per_forward(
        profile_, layout)
    forward = inference_secs(profile_, batch)
    return {
        "rounds": layout.num_envs * layout.env_batch_size / (env_time + forward),
        "gil": 1.0 / python,
        "cores": profile_.cores / (python + elsewhere + forward / batch),
        # Env threads that act themselves run their forward passes side by side.
        "actors": (layout.num_actor_queues or layout.num_envs) * batch / forward,
    }


def _stepping(profile_, layout):
    """(GIL seconds per env step, other CPU seconds per env step, seconds of
    an env thread's stepping per round)."""
    B = layout.env_batch_size
    wait = max(profile_.step_secs - profile_.step_cpu_secs, 0.0)
    request_rows = layout.recv_batch_size or B
    if layout.num_actor_queues:
        request = REQUEST_SECS
    else:
        # Rows stepped one by one (also every child process's) act from Python.
        python_loop = profile_.rows_stepped or layout.processes
        request = OWN_PYTHON_REQUEST_SECS if python_loop else OWN_GRAPH_REQUEST_SECS
    if layout.processes:
        python = PROCESS_STEP_SECS + ROW_SECS + request / B     # GIL, per step
        elsewhere = profile_.step_cpu_secs                          # in the children
        return python, elsewhere, profile_.step_cpu_secs + wait + B * python
    python = profile_.step_gil_secs + ROW_SECS + request / request_rows
    elsewhere = profile_.step_cpu_secs - profile_.step_gil_secs
    if profile_.rows_stepped:
        return python, elsewhere, wait + elsewhere * B / request_rows + B * python
    return python, elsewhere, B * (python + elsewhere + wait)


def requests_per_forward(profile_, layout):
    """Requests an actor's forward pass takes, expected, between 1 and the
    cap.

    An actor takes what is waiting and waits for no more (actor_thread.py),
    so a pass of F seconds gathers the requests of the env threads that
    came back from their T seconds of stepping (per request) while the last
    pass ran. By Little's law over the actor's n env threads, each with one
    request out, a pass takes n F / (F + max(T, F)): n F / (T + F) where
    stepping is the longer, and n / 2 where it is the shorter, since the
    threads then fall into two halves that step while the other half's pass
    runs (two threads on one actor take turns).
    """
    if layout.num_actor_queues == 0:
        return 1.0          # each env thread acts for its own request
    request_rows = layout.recv_batch_size or layout.env_batch_size
    request_secs = _stepping(profile_, layout)[2] * request_rows / layout.env_batch_size
    n = -(-layout.num_envs // layout.num_actor_queues)
    cap = min(layout.actor_queue_cap, n)
    k = 1.0
    for _ in range(8):     # a fixed point: the pass's length depends on its batch
        forward = inference_secs(profile_, k * request_rows)
        k = min(max(n * forward / (forward + max(request_secs, forward)), 1.0), cap)
    return k


def candidates(profile_, num_rows, processes=False, max_threads=None, batch_rows=None):
    """Every layout of `num_rows` rows worth considering, best
    predicted first: each split into env threads (at most `max_threads`,
    default 4 per core; with `batch_rows`, only splits whose env batch size
    divides it; with the profile's `fixed_batch_size`, only splits into env
    batches of that size, however many threads) with env threads that act
    themselves (no actor queue), with one actor thread taking every waiting
    request, and, with two env threads or more on two cores or more, two
    actor threads;
    in child processes too when `processes`; for EnvPool, in process only,
    with receives of the whole pool, half and a quarter of it.

    Returns:
        [Layout]: the best predicted (`predicted_rate`) of each number of
            env threads and place, best first: two in process, then in
            child processes and in process in turn; then the others, best
            first.
    """
    max_threads = max_threads or 4 * profile_.cores
    fixed = profile_.fixed_batch_size
    layouts = []
    for num_envs in range(1, num_rows + 1):
        if num_rows % num_envs:
            continue
        rows = num_rows // num_envs
        if (batch_rows is not None and batch_rows % rows) or (
                rows != fixed if fixed else num_envs > max_threads):
            continue
        for queues in (0, 1, 2):
            if queues > num_envs or (queues > 1 and profile_.cores < 2):
                continue
            cap = -(-num_envs // queues) if queues else 1
            if profile_.receives:   # EnvPool: smaller receives, sooner actions
                layouts += [Layout(num_envs, rows, queues, cap, False, recv)
                            for recv in sorted({rows, max(1, rows // 2), max(1, rows // 4)})]
                continue
            for where in ((False, True) if processes else (False,)):
                layouts.append(Layout(num_envs, rows, queues, cap, where))
    ranked = sorted(layouts, key=lambda layout: -predicted_rate(profile_, layout))
    # The best of each number of env threads first, so that the first few
    # measured differ where the model is least sure; in process and in
    # child processes taken in turn, in process first (it starts sooner),
    # since the model knows the children's costs least.
    firsts = {False: [], True: []}
    seen = set()
    for layout in ranked:
        if (layout.num_envs, layout.processes) not in seen:
            seen.add((layout.num_envs, layout.processes))
            firsts[layout.processes].append(layout)
    # Two in-process splits come before the first child-process one: a
    # child-process candidate can take most of the budget to start (64
    # children), and the model's ranking of one env thread against two is
    # least sure where a step is cheap.
    turns = firsts[False][:2] + [
        layout for pair in itertools.zip_longest(firsts[True], firsts[False][2:])
        for layout in pair if layout is not None]
    return turns + [layout for layout in ranked if layout not in turns]


def measuring_order(ranked, rates):
    """Yields `ranked` (`candidates`) in the order to measure it: the first
    two as ranked, then in turns the best-ranked variant not yet yielded
    (another actor count or receive size) of the fastest split measured so
    far (or, if it has none left, the next as ranked), and the next as
    ranked. The model ranks splits into env threads better than it ranks
    the variants of one split, whose rates lie close.

    Args:
        ranked: [Layout], best first.
        rates: [(Layout, env steps/s)] measured so far; read at each step,
            as the caller adds to it.
    """
    def split(layout):
        return layout.num_envs, layout.env_batch_size, layout.processes

    pending = list(ranked)
    for turn in itertools.count():
        if not pending:
            return
        layout = pending[0]
        if turn >= 2 and turn % 2 == 0 and rates:
            fastest = split(max(rates, key=lambda item: item[1])[0])
            layout = next((l for l in pending if split(l) == fastest), layout)
        pending.remove(layout)
        yield layout
