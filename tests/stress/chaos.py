"""Chaos trials: tests/stress/test_chaos.py runs them in reduced counts;
run as a script (or through reliability.py, `print_full_figures`) they run
at full counts and print the figures (benchmarks/chaos.py runs this script):

    python tests/stress/chaos.py [--chaos_kills 100] [--chaos_interval 2.0] [--checkpoint_kills 20]


- `kill_trial`: a DQN training run on SubprocessEnvs (CountingEnvs in child
  processes) while a chaos thread `kill -9`s a random child every few
  seconds. Checked per env row over every learner batch: each kill is one
  counted restart and one truncation (LAST with discount 1, then a boundary
  step, then a FIRST at step 0), every other step counts up by exactly one
  (nothing lost or repeated), and no child is alive after stop().
- `checkpoint_trial`: the `alf-async-train` CLI killed with SIGKILL at random
  moments after it starts training, each time resumed on the same root_dir:
  every resume starts from the checkpoint that was the latest on disk (and it
  loads), and global step / env steps / iterations never go backwards.
"""

import functools
import gc
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np

from tf_agents.trajectories.time_step import StepType

from alf_async.testing.envs import OBS_ENV, OBS_STEP

FIRST, MID, LAST = int(StepType.FIRST), int(StepType.MID), int(StepType.LAST)
SMOKE_GIN = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "gin_configs", "smoke.gin")


def held_segments():
    """The memfd segments of SubprocessEnvs this process still holds or maps."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/memfd:alf_async_env_slots"):
            held.append(f"fd {fd}")
    with open("/proc/self/maps") as f:
        held += [line.split()[0] for line in f if "memfd:alf_async_env_slots" in line]
    return held


def pid_alive(pid):
    """True if `pid` runs and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


# ------------------------------------------------------------------ kill trial

def _tiny_dqn(time_step_spec, action_spec):
    import tensorflow as tf
    from tf_agents.agents.dqn import dqn_agent
    from tf_agents.networks import q_network
    net = q_network.QNetwork(
        time_step_spec.observation, action_spec,
        preprocessing_layers=tf.keras.layers.Lambda(lambda x: tf.cast(x, tf.float32) * 1e-3),
        fc_layer_params=(8,))
    agent = dqn_agent.DqnAgent(time_step_spec, action_spec, q_network=net,
                               optimizer=tf.keras.optimizers.Adam(1e-3),
                               epsilon_greedy=0.2, gamma=0.9)
    agent.initialize()
    return agent


def check_row(step_type, next_step_type, discount, t):
    """Checks one env row's concatenated transitions; returns
    (truncations, errors) where errors lists every step that was lost,
    repeated or malformed."""
    errors = []
    k, n, truncations = 0, len(t), 0
    while k < n - 1:
        if next_step_type[k] == LAST:
            if discount[k] != 1.0:
                errors.append(f"step {k}: an episode end with discount {discount[k]}")
                k += 1
                continue
            truncations += 1
            if k + 2 < n:
                if not (t[k + 1] == t[k] and step_type[k + 1] == LAST and
                        next_step_type[k + 1] == FIRST and step_type[k + 2] == FIRST and
                        t[k + 2] == 0):
                    errors.append(f"step {k}: a truncation not followed by boundary + FIRST "
                                  f"(t {t[k:k + 3]}, step_type {step_type[k:k + 3]})")
                k += 2
            else:
                k = n
            continue
        if t[k + 1] != t[k] + 1:
            errors.append(f"step {k}: step_in_episode {t[k]} -> {t[k + 1]}")
        k += 1
    return truncations, errors


def kill_trial(*args, **kwargs):
    """`run_kill_trial`, then the shared-memory segments it left
    (`segments_left`): new /dev/shm entries, and the memfd segments this
    process still holds or maps once the run's objects are gone."""
    shm_before = set(os.listdir("/dev/shm"))
    result = run_kill_trial(*args, **kwargs)
    gc.collect()
    result["segments_left"] = sorted(set(os.listdir("/dev/shm")) - shm_before) + held_segments()
    return result


def run_kill_trial(num_kills=100, interval=2.0, seed=0, num_envs=2, env_batch_size=2,
                   unroll_length=8, learn_queue_cap=2, train=True, timeout_secs=None,
                   log=None):
    """A DQN training run on 2 x 2 SubprocessEnvs while a chaos thread kills a
    random child every ~`interval` seconds (uniform in [0.5, 1.5] x interval),
    `num_kills` times. Returns a dict of figures (see the keys at the end).

    The learner is alf_async's `Learner` (one train step per learner batch,
    on exactly that batch: a OneTimeReplayer); an exp_observer beside the
    replayer records every row of every batch. Kills start once every row
    has reached the learner, and a child is only picked once its previous
    restart has been seen to finish (its row's new FIRST after the
    truncation reached the learner), so every kill is mid-episode (episodes
    never end by themselves) and owes exactly one restart and one truncation.
    """
    from alf_async import AsyncOffPolicyDriver
    from alf_async.environments import subprocess_env_constructor
    from alf_async.learning.learner import Hook, Learner
    from alf_async.learning.replayers import OneTimeReplayer
    from alf_async.testing.envs import CountingEnv

    rng = np.random.default_rng(seed)
    timeout_secs = timeout_secs or (num_kills * interval * 2 + 120)
    env_constructor = subprocess_env_constructor(
        functools.partial(CountingEnv, episode_length=10**9), num_envs=env_batch_size,
        step_timeout=30.0, max_restarts=num_kills + 10, restart_window_secs=3600.0)
    spec_env = env_constructor()
    time_step_spec, action_spec = spec_env.time_step_spec(), spec_env.action_spec()
    spec_env.close()
    agent = _tiny_dqn(time_step_spec, action_spec)
    replayer = OneTimeReplayer()
    rows = {}  # env_id -> list of (step_type, next_step_type, discount, obs) per unroll
    lock = threading.Lock()
    pending = set()   # env ids killed whose new FIRST the learner has not seen yet
    kills = {}        # env_id -> kills
    pids_seen = set()
    chaos_done = threading.Event()
    warm = threading.Event()  # every row reached the learner once
    stop_chaos = threading.Event()
    chaos_error = []
    start = time.monotonic()

    def record(exp, env_ids):
        """The exp_observer that checks every batch (on the learner's thread)."""
        st, nst = exp.step_type.numpy(), exp.next_step_type.numpy()
        disc, obs = exp.discount.numpy(), exp.observation.numpy()
        with lock:
            for r, env_id in enumerate(env_ids.numpy()):
                env_id = int(env_id)
                unrolls = rows.setdefault(env_id, [])
                # The restart is done once the new child's FIRST (after
                # the boundary LAST) reached the learner.
                prev = np.concatenate([unrolls[-1][0][-1:] if unrolls else [FIRST], st[r]])
                unrolls.append((st[r], nst[r], disc[r], obs[r]))
                if env_id in pending and ((prev[1:] == FIRST) & (prev[:-1] == LAST)).any():
                    pending.discard(env_id)
            if len(rows) == num_envs * env_batch_size:
                warm.set()

    driver = AsyncOffPolicyDriver(env_constructor, agent.collect_policy, num_envs=num_envs,
                                  unroll_length=unroll_length, learn_queue_cap=learn_queue_cap,
                                  exp_observers=[record, replayer])

    def child(env_id):
        return driver.environments[env_id // env_batch_size].pyenv.envs[env_id % env_batch_size]

    def chaos():
        try:
            n = 0
            while not warm.wait(0.05):
                if stop_chaos.is_set():
                    return
            while n < num_kills and not stop_chaos.is_set():
                if stop_chaos.wait(rng.uniform(0.5, 1.5) * interval):
                    return
                while not stop_chaos.is_set():
                    with lock:
                        ready = [e for e in range(num_envs * env_batch_size)
                                 if e not in pending]
                    if ready:
                        break
                    time.sleep(0.02)
                else:
                    return
                victim = int(rng.choice(ready))
                env = child(victim)
                pid = env.pid
                with lock:
                    pending.add(victim)
                    kills[victim] = kills.get(victim, 0) + 1
                    pids_seen.add(pid)
                os.kill(pid, signal.SIGKILL)
                n += 1
                if log:
                    log(f"kill {n}/{num_kills}: env {victim} pid {pid}")
        except Exception as e:  # pylint: disable=broad-except
            chaos_error.append(e)
        finally:
            chaos_done.set()

    chaos_thread = threading.Thread(target=chaos, name="chaos", daemon=True)

    class Chaos(Hook):
        """Starts the chaos thread; ends the run a few batches after the last
        kill's truncation reached the learner (the chaos thread stopped
        first), or at the timeout."""

        def __init__(self):
            self.tail = None
            self.losses = []
            self.timed_out = False
            self.stopping_at = None

        def begin(self, learner):
            pids_seen.update(e.pid for env in driver.environments for e in env.pyenv.envs)
            chaos_thread.start()

        def after_iteration(self, learner, train_step_before, train_step):
            if train_step > train_step_before:
                self.losses.append(float(learner.loss.loss))
            if chaos_done.is_set():
                with lock:
                    if not pending:
                        self.tail = (self.tail or 0) + 1
            self.timed_out = time.monotonic() - start > timeout_secs
            if (self.tail is not None and self.tail >= 2) or self.timed_out:
                stop_chaos.set()
                chaos_thread.join(10)
                self.stopping_at = time.monotonic()
                learner.request_stop("chaos_done")

    hook = Chaos()
    learner = Learner(agent if train else None, driver, replayer, train_steps_per_iteration=1,
                      hooks=[hook])
    error = None
    try:
        learner.run()
    except Exception as e:  # pylint: disable=broad-except
        error = f"{type(e).__name__}: {e}"
    finally:
        stop_chaos.set()
        chaos_thread.join(10)
    # How long the learner took to stop the driver once it decided to stop.
    stop_secs = time.monotonic() - (hook.stopping_at or time.monotonic())
    if hook.timed_out:
        error = error or f"timed out after {timeout_secs:.0f} s"
    restarts = {e: child(e).restarts for e in range(num_envs * env_batch_size)}
    pids_seen.update(e.pid for env in driver.environments for e in env.pyenv.envs if e.pid)
    elapsed = time.monotonic() - start
    deadline = time.monotonic() + 5
    while any(pid_alive(p) for p in pids_seen) and time.monotonic() < deadline:
        time.sleep(0.05)
    children_left = sorted(p for p in pids_seen if pid_alive(p))
    truncations, step_errors, env_rows_steps, index_errors = {}, [], 0, []
    for env_id, unrolls in sorted(rows.items()):
        st, nst, disc, obs = (np.concatenate([u[k] for u in unrolls]) for k in range(4))
        env_rows_steps += len(st)
        if len(set(obs[:, OBS_ENV].tolist())) != 1:
            index_errors.append(env_id)
        n_trunc, errs = check_row(st, nst, disc, obs[:, OBS_STEP])
        truncations[env_id] = n_trunc
        step_errors += [f"env {env_id} {e}" for e in errs]
    all_ids = range(num_envs * env_batch_size)
    mismatched = [e for e in all_ids
                  if not (kills.get(e, 0) == restarts[e] == truncations.get(e, 0))]
    losses = hook.losses
    return dict(
        kills=sum(kills.values()), restarts=sum(restarts.values()),
        truncations=sum(truncations.values()),
        per_env={e: (kills.get(e, 0), restarts[e], truncations.get(e, 0)) for e in all_ids},
        mismatched_envs=mismatched, step_errors=step_errors[:20],
        num_step_errors=len(step_errors), env_index_errors=index_errors,
        env_steps=learner.env_steps, steps_checked=env_rows_steps,
        batches=learner.iterations, train_steps=learner.train_step,
        final_loss=losses[-1] if losses else None,
        loss_finite=bool(np.all(np.isfinite(losses))) if losses else None,
        children_seen=len(pids_seen), children_left=children_left,
        chaos_error=repr(chaos_error[0]) if chaos_error else None,
        error=error, stop_secs=stop_secs, secs=elapsed)


def kill_trial_ok(r, num_kills):
    return (r["error"] is None and r["chaos_error"] is None and r["kills"] == num_kills and
            not r["mismatched_envs"] and r["num_step_errors"] == 0 and
            not r["env_index_errors"] and not r["children_left"] and
            not r["segments_left"] and
            r["loss_finite"] is not False and r["stop_secs"] < 10)


# ------------------------------------------------------------ checkpoint trial

_RESUMED = re.compile(r"\[alf_async\] resumed from (\S+): global step (\d+), env steps (\d+), "
                      r"iteration (\d+)")
_PROGRESS = re.compile(r"\[alf_async\] iteration (\d+) \| env steps (\d+) .*\| train steps "
                       r"(\d+)")
_STOPPED = re.compile(r"\[alf_async\] stopped \((\w+)\) at iteration (\d+), train step (\d+), "
                      r"env steps (\d+)")


def _train_cmd(root_dir, gin_file, gin_params):
    cmd = [sys.executable, "-m", "alf_async.bin.train", "--root_dir", root_dir,
           "--gin_file", gin_file]
    for p in gin_params:
        cmd += ["--gin_param", p]
    return cmd


def _latest(root_dir):
    """(path, step, counters) of the latest complete checkpoint, read from
    disk (raises on a corrupt or partial one); counters: the trainer's
    checkpointed {"env_steps", "iterations"}."""
    import tensorflow as tf
    path = tf.train.latest_checkpoint(os.path.join(root_dir, "train"))
    if path is None:
        return None, None, {}
    reader = tf.train.load_checkpoint(path)
    counters = {}
    for name in reader.get_variable_to_shape_map():
        if name.startswith("counters/"):
            counters[name.split("/")[1]] = int(reader.get_tensor(name))
    return path, int(path.rsplit("-", 1)[1]), counters


def _temp_files(root_dir):
    train_dir = os.path.join(root_dir, "train")
    if not os.path.isdir(train_dir):
        return set()
    return {name for name in os.listdir(train_dir) if "temp" in name}


def _run_once(cmd, kill_after, timeout, log):
    """Runs the CLI; SIGKILLs it `kill_after` seconds after its first progress
    line (None: let it finish). Returns (returncode, output lines, killed)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    lines, killed = [], [False]
    timer = [None]

    def kill():
        killed[0] = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    watchdog = threading.Timer(timeout, kill)
    watchdog.start()
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if (kill_after is not None and timer[0] is None and
                    line.startswith("[alf_async] iteration")):
                timer[0] = threading.Timer(kill_after, kill)
                timer[0].start()
        proc.wait()
    finally:
        watchdog.cancel()
        if timer[0] is not None:
            timer[0].cancel()
        if proc.poll() is None:
            kill()
            proc.wait()
    timed_out = killed[0] and (kill_after is None or timer[0] is None)
    return proc.returncode, lines, killed[0] and not timed_out, timed_out


def checkpoint_trial(num_kills=20, seed=0, root_dir=None, gin_file=SMOKE_GIN,
                     max_kill_delay=3.0, checkpoint_interval=10, final_iterations=50,
                     run_timeout=120.0, log=None):
    """`num_kills` cycles of: start (or resume) the CLI on `root_dir`, SIGKILL
    it at a random moment in [0, max_kill_delay] s after its first progress
    line; then one last run that finishes `final_iterations` more iterations.
    Returns a dict of figures."""
    import tempfile
    rng = np.random.default_rng(seed)
    own_dir = root_dir is None
    root_dir = root_dir or tempfile.mkdtemp(prefix="alf_async_ckpt_")
    params = ["Schedule.num_iterations = 1000000", f"Outputs.checkpoint_interval = {checkpoint_interval}",
              "Evaluation.episodes = 0", "Outputs.log_interval_secs = 0.2"]
    cycles, problems = [], []
    high = dict(global_step=0, env_steps=0, iteration=0)  # highest resume point so far
    reached = 0  # the highest iteration any run printed
    start = time.monotonic()

    def check_counters(where, gs, es, it):
        for name, v in (("global_step", gs), ("env_steps", es), ("iteration", it)):
            if v < high[name]:
                problems.append(f"{where}: {name} went back {high[name]} -> {v}")
            high[name] = max(high[name], v)

    for cycle in range(num_kills + 1):
        final = cycle == num_kills
        before_path, before_step, before_counters = _latest(root_dir)
        temps_before = _temp_files(root_dir)
        run_params = list(params)
        if final:
            # More iterations than any run reached: the final run must train.
            reached = max(reached, before_counters.get("iterations", 0))
            run_params[0] = f"Schedule.num_iterations = {reached + final_iterations}"
        delay = None if final else float(rng.uniform(0, max_kill_delay))
        t0 = time.monotonic()
        rc, lines, killed, timed_out = _run_once(_train_cmd(root_dir, gin_file, run_params),
                                                 delay, run_timeout, log)
        secs = time.monotonic() - t0
        text = "\n".join(lines)
        resumed = _RESUMED.search(text)
        info = dict(cycle=cycle, kill_after=delay, returncode=rc, killed=killed, secs=secs,
                    before=before_step, resumed_step=None)
        where = f"cycle {cycle}"
        if timed_out:
            problems.append(f"{where}: timed out after {run_timeout} s")
        if "Traceback" in text or (final and rc != 0) or (not final and not killed):
            problems.append(f"{where}: run failed (rc {rc}):\n" + "\n".join(lines[-15:]))
        if before_path is None:
            if resumed:
                problems.append(f"{where}: resumed from {resumed.group(1)} with no checkpoint")
        elif not resumed:
            problems.append(f"{where}: did not resume from {before_path}")
        else:
            path, gs, es, it = resumed.group(1), *map(int, resumed.groups()[1:])
            info.update(resumed_step=gs, resumed_env_steps=es, resumed_iteration=it)
            if os.path.basename(path) != os.path.basename(before_path) or gs != before_step \
                    or (es, it) != (before_counters.get("env_steps"),
                                    before_counters.get("iterations")):
                problems.append(f"{where}: resumed from {path} (step {gs}, env steps {es}, "
                                f"iteration {it}), the latest was {before_path} "
                                f"{before_counters}")
        # Within one run, counters go up; across runs, the resume point never
        # goes back past the previous resume point.
        if resumed:
            check_counters(where + " resume", info["resumed_step"], info["resumed_env_steps"],
                           info["resumed_iteration"])
        run_high = dict(high)
        for m in _PROGRESS.finditer(text):
            it, es, gs = map(int, m.groups())
            reached = max(reached, it)
            for name, v in (("global_step", gs), ("env_steps", es), ("iteration", it)):
                if v < run_high[name]:
                    problems.append(f"{where}: {name} went back {run_high[name]} -> {v} "
                                    "within a run")
                run_high[name] = max(run_high[name], v)
        after_path, after_step, _ = _latest(root_dir)
        info["after"] = after_step
        # A kill during a save leaves the save's temporary files behind.
        info["mid_save"] = bool(killed and _temp_files(root_dir) - temps_before)
        if before_step is not None and (after_step is None or after_step < before_step):
            problems.append(f"{where}: latest checkpoint went back {before_step} -> {after_step}")
        if final:
            m = _STOPPED.search(text)
            info["stopped"] = m.group(0) if m else None
            if not m or m.group(1) != "num_iterations":
                problems.append(f"{where}: the final run did not finish: {lines[-3:]}")
            elif int(m.group(3)) <= (info["resumed_step"] or 0):
                problems.append(f"{where}: the final run did not train: {m.group(0)}")
        cycles.append(info)
        if log:
            log(f"{where}: kill after {delay}, rc {rc}, ckpt {before_step} -> resumed "
                f"{info['resumed_step']} -> latest {after_step}, mid-save "
                f"{info['mid_save']} ({secs:.1f} s)")
    resumes = [c for c in cycles if c["resumed_step"] is not None]
    if own_dir:
        import shutil
        shutil.rmtree(root_dir, ignore_errors=True)
    return dict(kills=sum(c["killed"] for c in cycles), cycles=len(cycles),
                resumes=len(resumes), fresh_starts=len(cycles) - len(resumes),
                resumed_steps=[c["resumed_step"] for c in cycles],
                kills_mid_save=sum(bool(c.get("mid_save")) for c in cycles),
                final=cycles[-1].get("stopped"), problems=problems,
                secs=time.monotonic() - start)


# ---------------------------------------------------------- full-count figures

def add_flags(parser):
    """The flags `print_full_figures` reads."""
    parser.add_argument("--chaos_kills", type=int, default=100,
                        help="children kill -9'ed during the SubprocessEnv training run")
    parser.add_argument("--chaos_interval", type=float, default=2.0,
                        help="mean seconds between two kills")
    parser.add_argument("--checkpoint_kills", type=int, default=20,
                        help="kill -9 + resume cycles of the training CLI")
    parser.add_argument("--chaos_verbose", action="store_true",
                        help="print every kill and every kill/resume cycle")


def print_full_figures(args):
    """Runs both chaos trials at the counts in `args` (see `add_flags`; also
    reads args.seed), prints the figures, returns a list of failures."""
    seed = getattr(args, "seed", 0)
    log = print if getattr(args, "chaos_verbose", False) else None
    bad = []
    if args.chaos_kills:
        r = kill_trial(args.chaos_kills, args.chaos_interval, seed=seed, log=log)
        print(f"\nCrashing simulators: {r['kills']} kill -9 of SubprocessEnv children "
              f"(~{args.chaos_interval:g} s apart) during a DQN training run on 2 x 2 "
              "CountingEnvs")
        print(f"  per env (kills, restarts, truncations): {r['per_env']}")
        print(f"  env steps checked {r['steps_checked']} in {r['batches']} learner batches, "
              f"{r['train_steps']} train steps (final loss {r['final_loss']})")
        print(f"  steps lost or repeated: {r['num_step_errors']}; envs with kills != restarts "
              f"!= truncations: {r['mismatched_envs']}; children seen {r['children_seen']}, "
              f"left {len(r['children_left'])}; shared-memory segments left "
              f"{len(r['segments_left'])}; stop() {r['stop_secs']:.2f} s; "
              f"{r['secs']:.0f} s; error {r['error']}")
        if not kill_trial_ok(r, args.chaos_kills):
            bad.append(dict(trial="kill", **{k: r[k] for k in (
                "kills", "mismatched_envs", "step_errors", "children_left", "segments_left",
                "error",
                "chaos_error")}))
    if args.checkpoint_kills:
        r = checkpoint_trial(args.checkpoint_kills, seed=seed, log=log)
        print(f"\nCheckpoints: {r['kills']} kill -9 of alf-async-train (smoke.gin, "
              "checkpoint every 10 train steps) at random moments, each resumed")
        print(f"  resumes {r['resumes']} (fresh starts {r['fresh_starts']}), resumed at global "
              f"steps {r['resumed_steps']}")
        print(f"  kills that left a save's temporary files behind (killed mid-save): "
              f"{r['kills_mid_save']}")
        print(f"  final run: {r['final']}; problems {len(r['problems'])}; {r['secs']:.0f} s")
        bad += [dict(trial="checkpoint", problem=p) for p in r["problems"]]
    return bad


def main():
    import argparse
    parser = argparse.ArgumentParser(description="chaos trials at full counts")
    add_flags(parser)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    bad = print_full_figures(args)
    print(f"\n{len(bad)} failures")
    for b in bad:
        print("  ", b)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
