"""1 learner + K collector processes on loopback (gin_configs/dqn_cartpole_distributed.gin).

    python benchmarks/distributed.py [--collectors 1 2] [--seeds 0 1 2 3 4] [--minutes 5]
    python benchmarks/distributed.py --kills 20 [--kill_interval 5] [--collectors 2]
    python benchmarks/distributed.py --collectors 2 --seeds 0 --minutes 5 --single_gin '' \
        --past_solved --gin_param 'Evaluation.stop_at_return = None'   (samples per insert, 5 min)

Scaling mode (default). For each K in --collectors and each seed, one
`alf-async-train` run with `Collectors.count = K` (the collectors are
child processes on this machine, talking to the learner's Reverb server
over loopback), stopped when an evaluation reaches 195 (solved) or after
--minutes. Every --sample_secs the script reads the server's table info
(`reverb.Client(address).server_info()`: size, the rate limiter's
insert/sample counts) and reports per run:

- insert rate per collector: items inserted per second / K (items are
  windows; one per env step once a stream has its first window);
- the learner's sample rate: samples/s and train steps/s (samples /
  Schedule.sample_batch_size);
- samples per insert: observed (samples / inserts over the run, from the
  first sample on) against the configured `replay_table.samples_per_insert`,
  and the largest deviation of the limiter's `inserts x spi - samples` from
  its centre `spi x min_size` at any reading, against the error buffer
  ((max_diff - min_diff) / 2): the limiter keeps it within the buffer;
- time to solve: the learner's loop seconds at the first evaluation >= 195
  (its eval line), the whole command's wall time until then, and when the
  first item was inserted (the collectors' start-up: process, TensorFlow
  import, agent, driver), to subtract.

Then the single-process trainer on --single_gin (default
gin_configs/dqn_cartpole.gin, the job the distributed config splits
between collectors) for each seed, the same way.

Kill mode (--kills N > 0): one run with K = the first of --collectors
(default 2), never stopped by evaluation; every --kill_interval seconds it
SIGKILLs one collector (alternating) and measures how long until the
learner printed its restart line and until the new collector printed
`connected to ...; collecting` (back), and that the learner's train step
grew over every interval (it never stopped). Then SIGINT, and it counts the
collector processes left (pids seen alive after the learner exited).
A pass: every collector back within 10 s of its kill, the learner's train
step growing over every interval, and no collector left after SIGINT.

Output: one line per run, then a JSON summary (--json to write it to a file).
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

from host_info import host  # benchmarks/ is this script's directory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DISTRIBUTED_GIN = os.path.join(REPO, "gin_configs", "dqn_cartpole_distributed.gin")
SINGLE_GIN = os.path.join(REPO, "gin_configs", "dqn_cartpole.gin")
SOLVED = 195.0
ENV = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
EVAL = re.compile(r"\[alf_async\] eval at train step (\d+) \(([\d.]+) s, (\d+) env steps\): "
                  r"greedy policy AverageReturn (-?[\d.]+)")
PROGRESS = re.compile(r"\[alf_async\] iteration \d+ \| env steps \d+ .*\| train steps (\d+) ")
ADDRESS = re.compile(r"\[alf_async\] collectors connect to (\S+):(\d+) ")


class Run(object):
    """One alf-async-train process; a thread collects its stdout lines with times."""

    def __init__(self, root_dir, gin_file, params):
        args = [sys.executable, "-m", "alf_async.bin.train", "--root_dir", root_dir,
                "--gin_file", gin_file]
        for p in params:
            args += ["--gin_param", p]
        self.start = time.monotonic()
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True, env=ENV,
                                        cwd=REPO, start_new_session=True)
        self.lines = []  # (seconds since start, line)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append((time.monotonic() - self.start, line.rstrip("\n")))

    def find(self, pattern):
        for t, line in list(self.lines):
            m = pattern.match(line)
            if m:
                return t, m
        return None

    def alive(self):
        return self.process.poll() is None

    def stop(self, timeout=120):
        if self.alive():
            self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._reader.join(5)

    def solved(self):
        """(loop seconds, wall seconds, train step, env steps) of the first
        evaluation >= SOLVED, or None."""
        for t, line in list(self.lines):
            m = EVAL.match(line)
            if m and float(m.group(4)) >= SOLVED:
                return float(m.group(2)), t, int(m.group(1)), int(m.group(3))
        return None

    def train_step(self):
        steps = [int(m.group(1)) for m in (PROGRESS.match(l) for _, l in list(self.lines)) if m]
        return steps[-1] if steps else 0


def collector_pids(pid):
    import psutil  # pylint: disable=import-outside-toplevel
    try:
        children = psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return []
    pids = []
    for c in children:
        try:
            if "alf_async.bin.collect" in " ".join(c.cmdline()):
                pids.append(c.pid)
        except psutil.Error:
            pass
    return sorted(pids)


def alive(pid):
    import psutil  # pylint: disable=import-outside-toplevel
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for_address(run, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and run.alive():
        found = run.find(ADDRESS)
        if found:
            return f"localhost:{found[1].group(2)}"
        time.sleep(0.1)
    raise RuntimeError(f"the learner printed no address in {timeout} s: {run.lines[-5:]}")


def table_reading(client):
    table = client.server_info(timeout=10)["replay"]
    limiter = table.rate_limiter_info
    return dict(t=time.monotonic(), size=int(table.current_size),
                inserts=int(limiter.insert_stats.completed),
                samples=int(limiter.sample_stats.completed),
                spi=float(limiter.samples_per_insert), min_size=int(limiter.min_size_to_sample),
                min_diff=float(limiter.min_diff), max_diff=float(limiter.max_diff))


def distributed_run(k, seed, minutes, sample_secs, root, batch_size, extra, past_solved=False):
    import reverb  # pylint: disable=import-outside-toplevel
    root_dir = os.path.join(root, f"k{k}_seed{seed}")
    run = Run(root_dir, DISTRIBUTED_GIN, [f"Collectors.count = {k}", f"Runtime.seed = {seed}"]
              + extra)
    readings = []
    try:
        client = reverb.Client(wait_for_address(run))
        deadline = run.start + 60 * minutes
        while (run.alive() and time.monotonic() < deadline and
               (past_solved or run.solved() is None)):
            try:
                readings.append(table_reading(client))
            except Exception:  # pylint: disable=broad-except  (the learner just stopped)
                break
            time.sleep(sample_secs)
    finally:
        run.stop()
    return summarize(k, seed, run, readings, batch_size)


def summarize(k, seed, run, readings, batch_size):
    solved = run.solved()
    result = dict(collectors=k, seed=seed, solved_loop_secs=solved and solved[0],
                  solved_wall_secs=solved and solved[1], solved_env_steps=solved and solved[3],
                  exit_code=run.process.returncode)
    inserting = [r for r in readings if r["inserts"] > 0]
    if inserting:
        # The learner's loop starts before its collectors have imported
        # TensorFlow: the first insert is where collection really starts.
        result["first_insert_wall_secs"] = inserting[0]["t"] - run.start
    sampling = [r for r in readings if r["samples"] > 0]
    if len(sampling) >= 2:
        first, last = sampling[0], sampling[-1]
        dt = last["t"] - first["t"]
        inserts, samples = last["inserts"] - first["inserts"], last["samples"] - first["samples"]
        centre = first["spi"] * first["min_size"]
        buffer = (first["max_diff"] - first["min_diff"]) / 2
        result.update(
            insert_rate_per_collector=inserts / dt / k, samples_per_sec=samples / dt,
            train_steps_per_sec=samples / dt / batch_size,
            samples_per_insert_configured=first["spi"],
            samples_per_insert_observed=samples / inserts if inserts else None,
            max_deviation=max(abs(r["inserts"] * r["spi"] - r["samples"] - centre)
                              for r in sampling),
            error_buffer=buffer, readings=len(sampling), secs_measured=dt)
    return result


def single_run(seed, minutes, root, gin_file):
    run = Run(os.path.join(root, f"single_seed{seed}"), gin_file, [f"Runtime.seed = {seed}"])
    deadline = run.start + 60 * minutes
    while run.alive() and time.monotonic() < deadline:
        time.sleep(0.5)
    run.stop()
    solved = run.solved()
    return dict(collectors=0, seed=seed, solved_loop_secs=solved and solved[0],
                solved_wall_secs=solved and solved[1], solved_env_steps=solved and solved[3],
                exit_code=run.process.returncode)


def kill_run(k, kills, interval, root, extra):
    """The kill mode (module docstring)."""
    root_dir = os.path.join(root, f"kills_k{k}")
    run = Run(root_dir, DISTRIBUTED_GIN, [
        f"Collectors.count = {k}", "Evaluation.stop_at_return = None",
        "Outputs.log_interval_secs = 0.5",  # train steps seen between kills
        f"launch_collectors.max_restarts = {kills + 1}"] + extra)
    seen, results, stalls = set(), [], 0
    try:
        wait_for_address(run)
        deadline = time.monotonic() + 120
        while len(collector_pids(run.process.pid)) < k or run.train_step() == 0:
            if time.monotonic() > deadline or not run.alive():
                raise RuntimeError(f"the learner did not start training: {run.lines[-5:]}")
            time.sleep(0.2)
        for n in range(kills):
            step_before = run.train_step()
            index = n % k  # the collectors in turn
            wait_until = time.monotonic() + 30
            while True:
                pids = collector_pids(run.process.pid)
                seen.update(pids)
                by_index = {_index_of(pid): pid for pid in pids}
                if index in by_index or time.monotonic() > wait_until:
                    break
                time.sleep(0.1)
            victim = by_index[index]
            connected_before = _connected_lines(root_dir, index)
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            restart_secs = back_secs = None
            restart = re.compile(rf"\[alf_async\] collector \d+ \(pid {victim}\) died")
            while time.monotonic() - killed_at < max(interval, 30):
                if restart_secs is None and run.find(restart):
                    restart_secs = time.monotonic() - killed_at
                if back_secs is None and _connected_lines(root_dir, index) > connected_before:
                    back_secs = time.monotonic() - killed_at
                if back_secs is not None and time.monotonic() - killed_at >= interval:
                    break
                time.sleep(0.05)
            grew = run.train_step() > step_before and run.alive()
            stalls += 0 if grew else 1
            results.append(dict(pid=victim, collector=index, restart_secs=restart_secs,
                                back_secs=back_secs, learner_trained_meanwhile=grew))
            print(f"kill {n + 1}/{kills}: collector {index} (pid {victim}) restarted after "
                  f"{_secs(restart_secs)}, back (connected) after {_secs(back_secs)}; learner "
                  f"train step {step_before} -> {run.train_step()}", flush=True)
        seen.update(collector_pids(run.process.pid))
    finally:
        run.stop()
    left = sorted(pid for pid in seen if alive(pid))
    backs = [r["back_secs"] for r in results]
    return dict(collectors=k, kills=len(results), learner_exit_code=run.process.returncode,
                learner_stalled_intervals=stalls,
                max_back_secs=None if None in backs or not backs else max(backs),
                never_back=sum(b is None for b in backs),
                max_restart_secs=max((r["restart_secs"] or float("inf")) for r in results)
                if results else None,
                collector_pids_seen=len(seen), processes_left=left, kills_detail=results)


def _secs(value):
    return "never" if value is None else f"{value:.2f} s"


def _index_of(pid):
    import psutil  # pylint: disable=import-outside-toplevel
    try:
        cmdline = psutil.Process(pid).cmdline()
    except psutil.Error:
        return None
    for part in cmdline:
        m = re.match(r"collect\.collector_id = (\d+)", part)
        if m:
            return int(m.group(1))
    return None


def _connected_lines(root_dir, index):
    path = os.path.join(root_dir, "collectors", str(index), "log.txt")
    try:
        with open(path) as f:
            return f.read().count("[alf_async collector] connected to ")
    except OSError:
        return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--collectors", type=int, nargs="+", default=None,
                        help="K values (default 1 2; kill mode: the first, default 2)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--minutes", type=float, default=5.0,
                        help="each run's cap (wall time of the whole command)")
    parser.add_argument("--sample_secs", type=float, default=2.0,
                        help="seconds between readings of the server's table info")
    parser.add_argument("--single_gin", default=SINGLE_GIN,
                        help="the single-process run's gin file ('' skips it)")
    parser.add_argument("--kills", type=int, default=0,
                        help="kill mode: SIGKILL this many collectors during one run")
    parser.add_argument("--kill_interval", type=float, default=5.0)
    parser.add_argument("--sample_batch_size", type=int, default=64,
                        help="the distributed gin's Schedule.sample_batch_size (for train steps/s)")
    parser.add_argument("--gin_param", action="append", default=[],
                        help="extra bindings for the distributed runs")
    parser.add_argument("--past_solved", action="store_true",
                        help="keep each distributed run (and the readings) going until --minutes "
                             "even once solved (with --gin_param 'Evaluation.stop_at_return = "
                             "None': the samples-per-insert check over a long run)")
    parser.add_argument("--root", default=None, help="run directories (default: a temp dir)")
    parser.add_argument("--json", default=None, help="write the summary here")
    args = parser.parse_args()
    machine = host()   # before the runs, on a quiet machine
    root = args.root or tempfile.mkdtemp(prefix="alf_async_distributed_")
    if args.kills:
        summary = kill_run((args.collectors or [2])[0], args.kills, args.kill_interval, root,
                           args.gin_param)
        print(json.dumps({k: v for k, v in summary.items() if k != "kills_detail"}))
    else:
        runs = []
        for k in args.collectors or [1, 2]:
            for seed in args.seeds:
                result = distributed_run(k, seed, args.minutes, args.sample_secs, root,
                                         args.sample_batch_size, args.gin_param,
                                         args.past_solved)
                runs.append(result)
                print(json.dumps(result), flush=True)
        if args.single_gin:
            for seed in args.seeds:
                result = single_run(seed, args.minutes, root, args.single_gin)
                runs.append(result)
                print(json.dumps(result), flush=True)
        summary = dict(runs=runs, by_collectors={})
        for k in sorted({r["collectors"] for r in runs}):
            mine = [r for r in runs if r["collectors"] == k]
            solved = sorted(r["solved_loop_secs"] for r in mine if r["solved_loop_secs"])
            summary["by_collectors"][k] = dict(
                runs=len(mine), unsolved=len(mine) - len(solved),
                median_solved_loop_secs=solved[len(solved) // 2] if solved else None)
        print(json.dumps(summary["by_collectors"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(summary, host=machine), f, indent=1)
    print(f"run directories in {root}")


if __name__ == "__main__":
    main()
