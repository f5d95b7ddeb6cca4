"""A quiet start for every shipped gin file (issue 49): started by
alf-async-train as users start it, each prints nothing before its first
progress line but the lines alf_async prints there by design.

Each single-process file runs one iteration with no evaluation due (its
one progress line comes at the end, then the line saying it stopped); the
few bindings added make the run short and change nothing of the start.
A job whose first iteration waits for others (the serving job's clients,
a learner's collectors) runs until it says where to connect, then gets
SIGINT. The runs are child processes, two at a time (a start is mostly
imports and tracing, on one core). Files whose environments need an
optional extra are marked with it and skipped where it is not installed
(CI installs them all). `COVERED_ELSEWHERE` names the files whose quiet
start other tests assert in the runs they make anyway; a test checks that
every file in gin_configs/ is started by one or the other.
"""

import concurrent.futures
import glob
import importlib.util
import os
import re
import signal
import subprocess
import sys
import types

import pytest

from alf_async import kernels
from cli_runs import (GIN_CONFIGS, REPO, lines_before_progress,  # tests/ is on sys.path
                      without_kernels_line)

pytestmark = pytest.mark.timeout(240)

ENV = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
ENV.pop("TF_CPP_MIN_LOG_LEVEL", None)  # the CLI must silence TF's banner by itself
ENV.pop("RAY_AUTH_MODE", None)  # Ray as a new user has it: the mode unset

# One iteration, its progress line at the end, no evaluation due.
ONE_ITERATION = ["Schedule.num_iterations = 1", "Outputs.log_interval_secs = 1e9",
                 "Evaluation.interval = 1000000000"]
# The pixel replay (1M frames) would make the checkpoint at exit the longest
# part of the run; its size does not change the start.
SMALL_PIXEL_REPLAY = ["PixelReplayer.capacity_per_row = 1000"]
# A PPO iteration of 128-step unrolls is most of its run (~10 s of CPU);
# the start is the same with 16 (the minibatches still divide the batch).
SHORT_UNROLLS = ["Schedule.unroll_length = 16"]


def _needs(module, extra):
    return pytest.mark.skipif(importlib.util.find_spec(module) is None,
                              reason=f"needs the [{extra}] extra")


EXTRAS = {"ale_py": "atari", "envpool": "envpool", "mujoco": "mujoco", "ray": "ray",
          "gymnasium": "gymnasium", "reverb": "reverb"}
# {gin file: (the modules its environments need, more bindings)}.
SINGLE_PROCESS = {
    "dqn_cartpole.gin": ((), []),
    "dqn_cartpole_subprocess.gin": ((), []),
    "dqn_cartpole_gymnasium.gin": (("gymnasium",), []),
    "dqn_cartpole_ray.gin": (("ray",), []),
    "dqn_breakout_envpool.gin": (("envpool",), SMALL_PIXEL_REPLAY),
    "dqn_pong.gin": (("ale_py",), SMALL_PIXEL_REPLAY),
    "ppo_pong.gin": (("envpool",), SHORT_UNROLLS),
    "ppo_breakout.gin": (("envpool",), SHORT_UNROLLS),
    "ppo_hopper.gin": (("mujoco",), SHORT_UNROLLS),
    "impala_pong.gin": (("envpool",), []),
    "sac_pendulum.gin": ((), []),
    "sac_pendulum_subprocess.gin": ((), []),
    "sac_pendulum_gymnasium.gin": (("gymnasium",), []),
    "sac_hopper.gin": (("mujoco",), []),
}
# Jobs whose first iteration waits for others, run until they say where to
# connect, then stopped: {gin file: (modules, bindings, the line that says
# it)}. The learner's collectors write to their own logs (collectors/i/log.txt).
WAITING = {
    "dqn_cartpole_serving.gin": ((), ["make_serving_env_constructor.port = 0"],
                                 r"\[alf_async\] serving on http://127\.0\.0\.1:\d+ \(written "
                                 r"to {root_dir}/server_address\)"),
    "sac_pendulum_distributed.gin": (("reverb",), ["Collectors.launcher = 'none'"],
                                     r"\[alf_async\] collectors connect to (\S+:\d+) \(written "
                                     r"to {root_dir}/replay_address\): alf-async-collect "
                                     r"--replay_address \1 --gin_file \.\.\."),
}
# {gin file: the test that asserts its quiet start in a run it makes anyway,
# with `lines_before_progress` or, for the whole run, `third_party_lines`}.
COVERED_ELSEWHERE = {
    "smoke.gin": "test_resume.py",
    "dqn_breakout.gin": "test_atari_training.py",
    "ppo_cartpole.gin": "test_unroll_training.py",
    "sac_halfcheetah.gin": "test_mujoco.py",
    "dqn_cartpole_distributed.gin": "test_distributed.py",
    "ppo_cartpole_distributed.gin": "test_distributed_unrolls.py",
}
PROGRESS = re.compile(r"\[alf_async\] iteration 1 \| env steps [1-9]\d* \(\d+/s\) \| train steps "
                      r"\d+ \(\d+/s\) \| collect policy AverageReturn \S+ \| loss \S+"
                      r"( \| policy lag \d+\.\d)?$")


def start(gin_file, root_dir):
    """Runs `gin_file` for one iteration in `root_dir`; returns (exit code, its
    output's lines, stdout and stderr together)."""
    args = [sys.executable, "-m", "alf_async.bin.train", "--root_dir", root_dir,
            "--gin_file", os.path.join(GIN_CONFIGS, gin_file)]
    for binding in ONE_ITERATION + SINGLE_PROCESS[gin_file][1]:
        args += ["--gin_param", binding]
    proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=220, cwd=REPO, env=ENV)
    return proc.returncode, proc.stdout.splitlines()


def start_waiting(gin_file, root_dir):
    """Runs `gin_file` until it says where to connect, then sends SIGINT;
    returns (exit code, its output's lines, stdout and stderr together)."""
    args = [sys.executable, "-m", "alf_async.bin.train", "--root_dir", root_dir,
            "--gin_file", os.path.join(GIN_CONFIGS, gin_file)]
    for binding in WAITING[gin_file][1]:
        args += ["--gin_param", binding]
    ready = re.compile(WAITING[gin_file][2].format(root_dir=re.escape(root_dir)))
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO, env=ENV)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if ready.fullmatch(lines[-1]):
                proc.send_signal(signal.SIGINT)
                break
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, lines + output.splitlines()


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """{gin file: (its root_dir, a future of its `start`)} for the files this
    session selected and can run, two at a time in the order of the tests."""
    root = tmp_path_factory.mktemp("quiet_start")
    selected = [item.callspec.params["gin_file"] for item in request.session.items
                if item.module is request.module and "gin_file" in getattr(
                    item, "callspec", types.SimpleNamespace(params={})).params]
    with concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="quiet_start") as pool:
        futures = {}
        for name in selected:
            if _installed(name):
                root_dir = str(root / name[:-len(".gin")])
                run = start if name in SINGLE_PROCESS else start_waiting
                futures[name] = (root_dir, pool.submit(run, name, root_dir))
        yield futures
        pool.shutdown(cancel_futures=True)


def _installed(gin_file):
    modules = (SINGLE_PROCESS.get(gin_file) or WAITING[gin_file])[0]
    return all(importlib.util.find_spec(m) is not None for m in modules)


def _params(configs):
    return [pytest.param(name, marks=[_needs(m, EXTRAS[m]) for m in config[0]])
            for name, config in configs.items()]


def _kernels_line(gin_file, bindings):
    """The kernels line the start of `gin_file` prints on this host."""
    return kernels.choose_for_gin([os.path.join(GIN_CONFIGS, gin_file)], bindings,
                                  environ=ENV).line()


@pytest.mark.parametrize("gin_file", _params(SINGLE_PROCESS))
def test_a_shipped_config_starts_quietly(runs, gin_file):
    root_dir, run = runs[gin_file]
    returncode, lines = run.result()
    assert returncode == 0, "\n".join(lines[-40:])   # the whole traceback, unabridged
    assert lines_before_progress(lines) == [], lines[:40]
    assert len(lines) == 3, lines[:40]
    [kernel_choice, progress, stopped] = lines
    assert kernel_choice == _kernels_line(gin_file, ONE_ITERATION + SINGLE_PROCESS[gin_file][1])
    assert PROGRESS.match(progress), progress
    assert stopped.startswith("[alf_async] stopped (num_iterations) at iteration 1, train step "), \
        stopped
    assert stopped.endswith(f"; checkpoint in {os.path.join(root_dir, 'train')}"), stopped


@pytest.mark.parametrize("gin_file", _params(WAITING))
def test_a_shipped_job_that_waits_for_others_starts_quietly(runs, gin_file):
    root_dir, run = runs[gin_file]
    returncode, lines = run.result()
    assert returncode == 0, "\n".join(lines[-40:])
    reverb_port = "reverb" in WAITING[gin_file][0]
    assert len(lines) == 5 + reverb_port, lines[:40]
    assert _kernels_line(gin_file, WAITING[gin_file][1]) in lines
    lines = without_kernels_line(lines)
    if reverb_port:
        # Who can reach the learner's port, in one line before its address
        # (its collectors are another machine's: collector_launcher 'none').
        from alf_async.distributed import learner_role  # pylint: disable=import-outside-toplevel
        exposure, lines = lines[0], lines[1:]
        port = int(lines[0].split(" (written")[0].rsplit(":", 1)[1])
        assert exposure == learner_role.exposure_line(port, remote=True), exposure
    [ready, signalled, progress, stopped] = lines
    assert re.fullmatch(WAITING[gin_file][2].format(root_dir=re.escape(root_dir)), ready), ready
    assert signalled == ("[alf_async] SIGINT: stopping, then writing a checkpoint (send it "
                         "again to abort without one)")
    assert progress == ("[alf_async] iteration 0 | env steps 0 (0/s) | train steps 0 (0/s) | "
                        "collect policy AverageReturn 0.0 | loss -")
    assert stopped == (f"[alf_async] stopped (stop_event) at iteration 0, train step 0, env "
                       f"steps 0; checkpoint in {os.path.join(root_dir, 'train')}"), stopped


def test_every_shipped_gin_file_is_started_by_a_quiet_start_test():
    shipped = sorted(os.path.basename(p) for p in glob.glob(os.path.join(GIN_CONFIGS, "*.gin")))
    assert sorted(list(SINGLE_PROCESS) + list(WAITING) + list(COVERED_ELSEWHERE)) == shipped
    for gin_file, test_file in COVERED_ELSEWHERE.items():
        with open(os.path.join(REPO, "tests", test_file)) as f:
            source = f.read()
        assert gin_file in source, (gin_file, test_file)
        assert "lines_before_progress(" in source or "third_party_lines(" in source, test_file


# A Reverb server with a checkpointer, checkpointed and stopped, with one
# line of another kind written to stderr (file descriptor 2) meanwhile.
REVERB_CALLS = """
import os, sys
from alf_async import quiet
if sys.argv[1] == "quiet":
    quiet.quiet()
import reverb
table = reverb.Table.queue("q", 10)
with quiet.reverb_info_dropped():
    server = reverb.Server([table], checkpointer=reverb.checkpointers.DefaultCheckpointer(
        sys.argv[2]))
    os.write(2, b"not Reverb's\\n")
with quiet.reverb_info_dropped():
    path = reverb.Client(f"localhost:{server.port}").checkpoint()
with quiet.reverb_info_dropped():
    with quiet.reverb_info_dropped():  # a block inside a block
        server.stop()
print(os.path.dirname(path) == sys.argv[2])
"""


@_needs("reverb", "reverb")
@pytest.mark.parametrize("mode", ["quiet", "verbose"])
def test_reverb_info_lines_are_dropped_in_a_quiet_process_and_nothing_else(tmp_path, mode):
    proc = subprocess.run([sys.executable, "-c", REVERB_CALLS, mode, str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=REPO, env=ENV)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == "True\n"
    stderr = [line for line in proc.stderr.splitlines() if line]
    if mode == "quiet":
        assert stderr == ["not Reverb's"]
        return
    reverb_lines = [re.sub(r"^\[reverb/cc/[\w/.]+:\d+\] +", "", line) for line in stderr
                    if line.startswith("[reverb/cc/")]
    assert [line.split(" ", 3)[:3] for line in reverb_lines] == [
        ["Initializing", "TFRecordCheckpointer", "in"], ["Loading", "latest", "checkpoint"],
        ["Started", "replay", "server"], ["Stored", "checkpoint", "to"],
        ["Shutting", "down", "replay"]], stderr
    assert "not Reverb's" in stderr
