"""The learner's collectors: started with it, restarted when they die, stopped with it.

    collectors = launch_collectors('local', 2, 'localhost:8000', 'R/collector_config.gin', 'R')
    collectors.start(); ...; collectors.check(); ...; collectors.stop()

`Collectors.launcher` chooses how:

- 'local' (`LocalCollectors`): child processes on this machine,
  `python -m alf_async.bin.collect --replay_address ADDRESS --gin_file
  R/collector_config.gin --gin_param 'collect.collector_id = i'
  --gin_param "collect.summary_dir = 'R/collectors/i'"` (plus `collect.seed
  = seed + i` when the run has a seed), each in a session of its own (a
  Ctrl-C in the learner's terminal reaches the learner only, which stops
  them in order) with its output in R/collectors/i/log.txt. Each child asks
  the kernel for SIGKILL if the thread that started it ends
  (PR_SET_PDEATHSIG, set by alf-async-collect itself when
  `ALF_ASYNC_PARENT_PID` names its parent: no Python runs between fork and
  exec), so a learner killed with SIGKILL leaves none behind.
- 'ray' (`RayCollectors`): one Ray actor per collector (`ensure_ray` as for
  Ray environments: `launch_collectors.ray_address` None starts a local
  Ray, 'auto' joins the cluster), each running `collector.collect` on the
  run's gin config; `launch_collectors.ray_actor_options` places them
  (e.g. {'num_cpus': 1} to spread them over the cluster's machines).
- 'none': none; collectors are started by hand (`alf-async-collect`).

A collector that dies (SIGKILL, a crash, a lost Ray node) is restarted
within a restart budget with the environments' names and meaning
(`recovery.CrashRecovery`): `launch_collectors.max_restarts` restarts of
one collector within any `restart_window_secs`; each restart prints one
line. The death that would exceed the budget makes `check()` raise
`CollectorCrashError` (the learner's `ReplayFeed` calls it while it
waits), which stops the learner with that message.

Threads: `start()`, `check()`, `stop()`, `pids()` and `restarts` are called
by the learner's thread (`stop()` by any thread, once or more). One
monitor thread per launcher owns the collectors: it starts them, polls
them every `poll_secs` and restarts the dead, and at `stop()` stops them
(SIGINT, or the actor's stop(); after `stop_grace_secs` SIGKILL / ray.kill)
before it ends. `start()` blocks until every collector was started;
`stop()` blocks until they are gone (at most `stop_grace_secs` plus a few
seconds).
"""

import os
import signal
import subprocess
import sys
import threading
import time

import gin

from alf_async.environments.processes.recovery import CrashRecovery
from alf_async.errors import missing_extra

# alf-async-collect dies with the process (thread) this names (bin/collect.py).
PARENT_PID_ENV = "ALF_ASYNC_PARENT_PID"


class CollectorCrashError(RuntimeError):
    """A collector died more often than `max_restarts` within the window."""


@gin.configurable
def launch_collectors(kind, num_collectors, address, config_path, root_dir, print_fn=print,
                      seed=None, max_restarts=10, restart_window_secs=600.0,
                      stop_grace_secs=10.0, ray_address=None, ray_num_cpus=None,
                      ray_actor_options=None):
    """The launcher of `num_collectors` collectors (not started).

    Args:
        kind: 'local' (child processes), 'ray' (Ray actors) or 'none'.
        num_collectors: how many.
        address: 'host:port' of the learner's Reverb server.
        config_path: the run's gin config (root_dir/collector_config.gin).
        root_dir: the run's directory (collectors/i/ goes there).
        print_fn: callable(str) for the restart lines.
        seed: the run's seed (collector i gets seed + i; None: unseeded).
        max_restarts: restarts of one collector allowed within
            `restart_window_secs` (as SubprocessEnv's and Ray environments').
        restart_window_secs: the sliding window of `max_restarts`.
        stop_grace_secs: how long `stop()` waits for a collector to end its
            iteration before killing it.
        ray_address: `ensure_ray`'s (Ray only).
        ray_num_cpus: `ensure_ray`'s (Ray only).
        ray_actor_options: the collector actors' Ray options (default
            {'num_cpus': 0}).
    """
    args = dict(num_collectors=num_collectors, address=address, config_path=config_path,
                root_dir=root_dir, print_fn=print_fn, seed=seed, max_restarts=max_restarts,
                restart_window_secs=restart_window_secs, stop_grace_secs=stop_grace_secs)
    if kind == "local":
        return LocalCollectors(**args)
    if kind == "ray":
        return RayCollectors(ray_address=ray_address, ray_num_cpus=ray_num_cpus,
                             actor_options=ray_actor_options, **args)
    if kind == "none":  # collectors started by hand: nothing to start or restart
        return LocalCollectors(**dict(args, num_collectors=0))
    raise ValueError(f"Collectors.launcher must be 'local', 'ray' or 'none', got {kind!r}")


class _Launcher(object):
    """The monitor thread and restart budget shared by both kinds; a
    subclass says how to start, poll and stop one collector."""

    what = "collector"

    def __init__(self, num_collectors, address, config_path, root_dir, print_fn, seed,
                 max_restarts, restart_window_secs, stop_grace_secs, poll_secs=0.1):
        self._n = num_collectors
        self._address = address
        self._config_path = config_path
        self._root_dir = root_dir
        self._print = print_fn
        self._seed = seed
        self._grace = stop_grace_secs
        self._poll = poll_secs
        self._budgets = [CrashRecovery(f"collector {i}", f"its {self.what}", max_restarts,
                                       restart_window_secs, CollectorCrashError)
                         for i in range(num_collectors)]
        self._workers = [None] * num_collectors
        self._stopping = threading.Event()
        self._started = threading.Event()
        self._failure = None
        self._error = None
        self._thread = None
        self._lock = threading.Lock()

    @property
    def restarts(self):
        """Restarts so far, all collectors together."""
        return sum(b.restarts for b in self._budgets)

    def params(self, i):
        """Collector i's gin bindings over the run's config."""
        summary_dir = os.path.join(self._root_dir, "collectors", str(i))
        params = [f"collect.collector_id = {i}", f"collect.summary_dir = {summary_dir!r}"]
        if self._seed is not None:
            params.append(f"collect.seed = {self._seed + i}")
        return params

    def start(self):
        """Starts the monitor thread, which starts every collector; returns
        once they were started (raises what stopped it from starting them)."""
        self._thread = threading.Thread(target=self._monitor, name="collector_monitor",
                                        daemon=True)
        self._thread.start()
        while not self._started.wait(0.1):
            if not self._thread.is_alive():
                break
        if self._error is not None:
            raise self._error

    def check(self):
        """Raises `CollectorCrashError` once a collector spent its budget (or
        the monitor's own error)."""
        if self._error is not None:
            raise self._error
        if self._failure is not None:
            raise self._failure

    def stop(self):
        """Stops every collector and the monitor thread (idempotent)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(self._grace + 30)
            if self._thread.is_alive():
                raise RuntimeError("the collector monitor did not end within "
                                   f"{self._grace + 30:g} s")

    def _monitor(self):
        try:
            for i in range(self._n):
                self._workers[i] = self._start_one(i)
            self._started.set()
            while not self._stopping.wait(self._poll):
                for i in range(self._n):
                    worker = self._workers[i]
                    if worker is None:
                        continue
                    reason = self._death(worker)
                    if reason is not None:
                        self._restart(i, worker, reason)
        except BaseException as e:  # pylint: disable=broad-except  (raised by check())
            self._error = e
        finally:
            self._started.set()
            self._stop_all()

    def _restart(self, i, worker, reason):
        try:
            self._budgets[i].charge(reason)
        except CollectorCrashError as e:
            self._workers[i] = None
            self._failure = e
            self._print(f"[alf_async] {e}")
            return
        new = self._start_one(i)
        self._workers[i] = new
        self._print(f"[alf_async] collector {i} ({self._describe(worker)}) died ({reason}); "
                    f"restarted as {self._describe(new)} (restart "
                    f"{self._budgets[i].restarts})")

    def _stop_all(self):
        workers = [w for w in self._workers if w is not None]
        for w in workers:
            self._ask_stop(w)
        deadline = time.monotonic() + self._grace
        while time.monotonic() < deadline and any(self._death(w) is None for w in workers):
            time.sleep(0.05)
        for w in workers:
            self._kill(w)


class LocalCollectors(_Launcher):
    """Collectors as child processes (see module docstring)."""

    what = "process"

    def pids(self):
        """The live collectors' pids (None for one that spent its budget)."""
        return [None if p is None else p.pid for p in self._workers]

    def _start_one(self, i):
        directory = os.path.join(self._root_dir, "collectors", str(i))
        os.makedirs(directory, exist_ok=True)
        args = [sys.executable, "-m", "alf_async.bin.collect", "--replay_address",
                self._address, "--gin_file", self._config_path]
        for p in self.params(i):
            args += ["--gin_param", p]
        with open(os.path.join(directory, "log.txt"), "a") as log:
            log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(args)}\n")
            log.flush()
            return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    env=dict(os.environ, **{PARENT_PID_ENV: str(os.getpid())}))

    def _death(self, process):
        code = process.poll()
        if code is None:
            return None
        return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"

    def _describe(self, process):
        return f"pid {process.pid}"

    def _ask_stop(self, process):
        if process.poll() is None:
            try:
                process.send_signal(signal.SIGINT)
            except ProcessLookupError:
                pass

    def _kill(self, process):
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.wait()


class _CollectorActor(object):
    """Runs inside a Ray actor: one collector on the run's gin config."""

    def __init__(self):
        self._stop = threading.Event()

    def pid(self):
        return os.getpid()

    def run(self, address, config, params):
        import gin as gin_  # pylint: disable=import-outside-toplevel
        from alf_async.distributed import collector  # pylint: disable=import-outside-toplevel
        from alf_async import quiet
        quiet.quiet(verbose=False)
        gin_.parse_config(config, skip_unknown=True)
        for p in params:
            gin_.parse_config(p, skip_unknown=True)
        built = collector.collect(address, self._stop)
        return built.run()

    def stop(self):
        self._stop.set()


class RayCollectors(_Launcher):
    """Collectors as Ray actors (see module docstring)."""

    what = "Ray actor"

    def __init__(self, ray_address=None, ray_num_cpus=None, actor_options=None, **kwargs):
        super().__init__(**kwargs)
        try:
            import ray  # pylint: disable=import-outside-toplevel
        except ModuleNotFoundError as e:
            raise missing_extra(e, "Collectors.launcher = 'ray'", "Ray", "ray", "ray") from None
        from alf_async.environments.processes.ray_env import ensure_ray  # pylint: disable=import-outside-toplevel
        self._ray = ray
        self._owns_ray = ray_address is None and not ray.is_initialized()
        ensure_ray(ray_address, ray_num_cpus)
        self._actor_class = ray.remote(max_concurrency=2)(_CollectorActor)
        self._options = dict(actor_options or {"num_cpus": 0})
        with open(self._config_path) as f:
            self._config = f.read()

    def stop(self):
        """Stops the collector actors, then a local Ray this launcher started
        (its agent processes would outlive the learner otherwise)."""
        try:
            super().stop()
        finally:
            if self._owns_ray:
                from alf_async.environments.processes.ray_env import shutdown  # pylint: disable=import-outside-toplevel
                shutdown()

    def actors(self):
        """The live collectors' Ray actor handles (None for one that spent
        its budget)."""
        return [None if w is None else w[0] for w in self._workers]

    def _start_one(self, i):
        actor = self._actor_class.options(**self._options).remote()
        return actor, actor.run.remote(self._address, self._config, self.params(i))

    def _death(self, worker):
        ready, _ = self._ray.wait([worker[1]], timeout=0)
        if not ready:
            return None
        try:
            self._ray.get(ready[0])
            return "its run() returned"
        except Exception as e:  # pylint: disable=broad-except  (the actor's error or death)
            return type(e).__name__

    def _describe(self, worker):
        return f"actor {worker[0]._actor_id.hex()[:8]}"  # pylint: disable=protected-access

    def _ask_stop(self, worker):
        try:
            worker[0].stop.remote()
        except Exception:  # pylint: disable=broad-except  (already dead)
            pass

    def _kill(self, worker):
        try:
            self._ray.kill(worker[0])
        except Exception:  # pylint: disable=broad-except
            pass
