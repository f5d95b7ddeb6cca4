"""Layout.choice: 'auto' measures this run's environments and policy, runs
the fastest layout, writes it into the operative config, and a resumed run
reuses it without measuring; a given layout runs as given; bad layouts are
refused with one line before anything starts."""

import glob
import os
import re
import subprocess
import sys
import threading
import time

import gin
import pytest

from alf_async import trainer
from alf_async import settings
from alf_async.driver.layout import parse_layout
from alf_async.testing import processes
from conftest import signal_when_ready  # noqa: E402
from test_trainer import SMOKE_GIN  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(autouse=True)
def smoke():
    gin.clear_config()
    gin.parse_config_files_and_bindings([SMOKE_GIN], [])
    yield
    gin.clear_config()


def _latest_config(root_dir):
    paths = glob.glob(os.path.join(root_dir, "operative_config-*.gin"))
    return open(max(paths, key=os.path.getmtime)).read()


def test_auto_runs_the_fastest_writes_it_and_a_resumed_run_reuses_it(tmp_path):
    with gin.unlock_config():
        gin.bind_parameter("Layout.choice", "auto")
    lines = []
    first = trainer.train(str(tmp_path), layout=settings.Layout(auto_budget_secs=6.0),
                          schedule=settings.Schedule(num_iterations=8), print_fn=lines.append)
    chosen = [line for line in lines if line.endswith("(Layout.choice = 'auto')")]
    assert len(chosen) == 1, lines
    match = re.match(r"\[alf_async\] layout (.+?): [\d,]+ env steps/s, the fastest of (\d+) "
                     r"measured in ([\d.]+) s", chosen[0])
    assert match, chosen[0]
    name = match.group(1)
    layout = parse_layout(name)
    # smoke.gin: 2 env threads x 2 rows, learner batches of 1 x 2 rows.
    assert layout.num_envs * layout.env_batch_size == 4 and 2 % layout.env_batch_size == 0
    assert float(match.group(3)) < 6.0 + 5.0
    assert first.stopped_by == "num_iterations" and first.env_steps == 8 * 2 * 4
    config = _latest_config(str(tmp_path))
    assert f"Layout.choice = {name!r}" in config and "Layout.choice = 'auto'" not in config
    lines = []
    second = trainer.train(str(tmp_path), schedule=settings.Schedule(num_iterations=12),
                           print_fn=lines.append)
    assert (f"[alf_async] layout {name}: chosen when this run started (Layout.choice = "
            f"'auto'), not measured again") in lines
    assert not any("the fastest of" in line for line in lines)
    assert second.env_steps == 12 * 2 * 4
    assert f"Layout.choice = {name!r}" in _latest_config(str(tmp_path))


def test_a_given_layout_runs_as_given_with_the_learner_batch_kept(tmp_path):
    lines = []
    result = trainer.train(str(tmp_path),
                           layout=settings.Layout(choice="4x1, 2 actor queues (cap 2), in process"),
                           schedule=settings.Schedule(num_iterations=5), print_fn=lines.append)
    # The learner batch keeps its 2 rows: 2 unrolls of 1 row, 4 steps each.
    assert result.env_steps == 5 * 2 * 4
    assert not [line for line in lines if line.startswith("[alf_async] layout") or
                "measuring layouts" in line]   # nothing measured


def test_a_run_whose_env_threads_act_themselves_trains_as_the_threaded_one_does(tmp_path):
    steps = {}
    for queues in (0, 1):
        with gin.unlock_config():
            gin.bind_parameter("Layout.actor_queues", queues)
        result = trainer.train(str(tmp_path / str(queues)),
                               schedule=settings.Schedule(num_iterations=6),
                               print_fn=lambda line: None)
        assert result.stopped_by == "num_iterations"
        steps[queues] = (result.env_steps, int(result.global_step))
    # smoke.gin: 6 learner batches of 2 rows x 4 steps, 6 train steps each way.
    assert steps[0] == steps[1] == (6 * 2 * 4, 6)


@pytest.mark.parametrize("layout, message", [
    ("2x8", "Layout.choice must be None, 'auto' or a layout: a layout looks like '2x8, 1 actor "
            "queue (cap 2), in process' (or 'no actor queue'; 'in child processes'; ', receives "
            "of 4' for EnvPool), got '2x8'"),
    ("1x8, 1 actor queue (cap 1), in process",
     "Layout.choice '1x8, 1 actor queue (cap 1), in process' has 8 environments; "
     "Layout.env_threads x Layout.rows_per_env_thread = 4"),
    ("1x4, 1 actor queue (cap 1), in process",
     "Layout.choice '1x4, 1 actor queue (cap 1), in process': its env batch size 4 does not "
     "divide the learner batch's 2 rows (Schedule.rows_per_batch)"),
])
def test_a_bad_layout_is_refused_with_one_line_before_anything_runs(tmp_path, layout, message):
    with pytest.raises(trainer.ConfigError) as raised:
        trainer.train(str(tmp_path), layout=settings.Layout(choice=layout),
                      print_fn=lambda line: None)
    assert str(raised.value).splitlines()[0] == message   # gin adds the configurable's name
    assert not glob.glob(os.path.join(str(tmp_path), "train", "checkpoint"))


def test_a_stop_while_measuring_runs_nothing(tmp_path):
    stop = threading.Event()
    stop.set()
    lines = []
    result = trainer.train(str(tmp_path), layout=settings.Layout(choice="auto"), stop_event=stop,
                           print_fn=lines.append)
    assert result.stopped_by == "stop_event" and result.global_step == 0
    assert lines == [
        "[alf_async] Layout.choice = 'auto': measuring layouts of 4 environments for up to 20 s",
        "[alf_async] stopped (stop_event) while measuring layouts; nothing was run"]
    assert not glob.glob(os.path.join(str(tmp_path), "operative_config-*.gin"))


def _pids_below(root):
    return set(processes.descendants(root))


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigint_while_measuring_exits_0_and_leaves_no_process_behind(tmp_path):
    # smoke.gin's CartPoles are suite_gym's, so child processes are among
    # the candidates: whatever processes the measuring started must be gone.
    proc = subprocess.Popen(
        [sys.executable, "-m", "alf_async.bin.train", "--root_dir", str(tmp_path),
         "--gin_file", SMOKE_GIN, "--gin_param", "Layout.choice = 'auto'",
         "--gin_param", "Layout.auto_budget_secs = 60.0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)

    def after_four_seconds():
        time.sleep(4.0)
        return _pids_below(proc.pid)

    output, elapsed, below = signal_when_ready(
        proc, lambda line: line.startswith(
            "[alf_async] Layout.choice = 'auto': measuring layouts"),
        before_signal=after_four_seconds)
    assert proc.returncode == 0, output[-3000:]
    assert elapsed < 10
    assert "[alf_async] stopped (stop_event) while measuring layouts; nothing was run" in output
    deadline = time.monotonic() + 5
    while any(map(_alive, below)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in below if _alive(pid)]
    assert not glob.glob(os.path.join(str(tmp_path), "operative_config-*.gin"))
