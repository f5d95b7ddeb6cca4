"""The benchmarks' host record, the per-thread CPU accounting and
step_breakdown.py end to end on a tiny run (PPO CartPole, alf_async)."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from alf_async import kernels
from alf_async.testing.bench import host as host_info
from alf_async.testing.bench import thread_cpu
from alf_async.testing.bench.layout_rows import forward_rows

pytestmark = pytest.mark.timeout(240)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_host_record_names_cpu_extensions_versions_and_calibration(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    monkeypatch.setenv("ALF_ASYNC_HOST_KIND", "avx2")
    machine = host_info.record(kernels.in_effect())   # benchmarks/host_info.py's host()
    assert set(machine) == {"cpu", "cores", "cpu_flags", "tensorflow", "env", "kernels",
                            "python_loop_secs", "numpy_matmul_secs"}
    # What ran: the emulated kind, and oneDNN off as the variable says.
    assert machine["kernels"]["emulated_kind"] == machine["kernels"]["host_kind"] == "avx2"
    assert machine["kernels"]["onednn"] is False
    assert machine["kernels"]["auto_torso_dtype"] == "float32"
    assert machine["env"]["ALF_ASYNC_HOST_KIND"] == "avx2"
    assert machine["cores"] == os.cpu_count()
    assert machine["tensorflow"] == "2.15.1"
    assert machine["env"]["OMP_NUM_THREADS"] == "3"
    assert machine["env"]["TF_ENABLE_ONEDNN_OPTS"] == "0"
    assert "PATH" not in machine["env"]
    assert set(machine["cpu_flags"]) <= set(host_info.VECTOR_FLAGS)
    assert machine["python_loop_secs"] > 0 and machine["numpy_matmul_secs"] > 0
    line = host_info.describe(dict(cpu="X", cpu_flags=["avx512f", "amx_tile"],
                                   python_loop_secs=0.1, numpy_matmul_secs=0.4))
    assert line == "X (AMX), calibration 0.1 s / 0.4 s"   # a record made before the kernels
    assert host_info.describe(dict(cpu="X", python_loop_secs=0.1, numpy_matmul_secs=0.4)) == (
        "X (flags not recorded), calibration 0.1 s / 0.4 s")
    assert host_info.describe(dict(machine, cpu="X", cpu_flags=["avx512f"],
                                   python_loop_secs=0.1, numpy_matmul_secs=0.4)) == (
        "X (AVX-512), emulating avx2, oneDNN off, calibration 0.1 s / 0.4 s")


def _burn(secs):
    end = time.thread_time() + secs
    while time.thread_time() < end:
        pass


def test_thread_groups_sum_to_the_process_cpu():
    """Named threads land in their groups with the CPU they burned; a thread
    that ends between the samples is the unaccounted part; the groups sum
    to the process's CPU seconds."""
    ended = threading.Thread(target=_burn, args=(0.2,), name="bystander")
    go = threading.Event()
    ended.start()
    first = thread_cpu.sample()
    ended.join()

    def worker(secs):
        _burn(secs)
        go.wait(30)

    workers = [threading.Thread(target=worker, args=(0.3,), name="env0"),
               threading.Thread(target=worker, args=(0.1,), name="env1_row2"),
               threading.Thread(target=worker, args=(0.2,), name="actor0")]
    for w in workers:
        w.start()
    while sum(thread_cpu.sample()["threads"].get(w.native_id, (0, ""))[0] for w in workers) < 0.6:
        time.sleep(0.01)
    last = thread_cpu.sample()
    go.set()
    for w in workers:
        w.join()
    groups = thread_cpu.split(first, last)
    assert groups["env threads"] == pytest.approx(0.4, abs=0.02)
    assert groups["actor threads"] == pytest.approx(0.2, abs=0.02)
    # The bystander burned up to 0.2 s after the first sample, then ended.
    assert 0.0 <= groups[thread_cpu.UNACCOUNTED] <= 0.22
    assert sum(groups.values()) == pytest.approx(last["cpu_secs"] - first["cpu_secs"], abs=1e-9)
    assert thread_cpu.group(None) == thread_cpu.NATIVE
    assert thread_cpu.group("queue_closer") == thread_cpu.OTHER
    assert thread_cpu.group("MainThread") == "main thread"


def test_step_breakdown_tiny_ppo_run(tmp_path):
    out = tmp_path / "breakdown.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "step_breakdown.py"),
         "--gin_file", os.path.join(REPO, "gin_configs", "ppo_cartpole.gin"),
         "--sides", "alf_async", "--seconds", "8", "--warmup_secs", "5",
         "--part_secs", "0.2", "--json", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=200,
        env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.returncode == 0, proc.stdout[-3000:]
    (record,) = json.loads(out.read_text())
    assert record["side"] == "alf_async"
    assert record["rows"] == 16   # actor_queue_cap 1 x env_batch_size 16
    # Whole batches of 1 unroll x 16 CartPoles x 64 steps between the samples.
    assert record["window_env_steps"] > 0 and record["window_env_steps"] % 1024 == 0
    assert record["host"]["tensorflow"] == "2.15.1"
    alone, whole = record["alone_ms"], record["whole_ms"]
    assert set(alone) == {"env stepping", "actor inference", "learner", "driver (the rest)"}
    assert all(alone[p] > 0 for p in ("env stepping", "actor inference", "learner"))
    assert sum(alone.values()) == pytest.approx(whole, rel=1e-9)
    threads = record["threads_ms"]
    assert sum(threads.values()) == pytest.approx(whole, rel=1e-9)
    # Every thread alive at both samples: nothing of the whole unaccounted.
    assert abs(threads[thread_cpu.UNACCOUNTED]) < 0.05 * whole
    floors = record["floors"]
    # The collect policy runs the actor net: CartPole's 4-64-64-2 dense
    # layers, 2 x 4,480 multiply-adds and 130 bias adds.
    assert floors["forward_flops"] == 2 * (4 * 64 + 64 * 64 + 64 * 2) + 64 + 64 + 2
    # The bare networks: 4 epochs x 4 minibatches of 1,024 / 4 transitions.
    assert (floors["bare_batch"], floors["bare_gradient_steps"]) == (256, 16)
    assert floors["ms"]["learner"] == pytest.approx(floors["bare_step_ms"] * 16 / 1024,
                                                    rel=1e-9)
    assert floors["ms"]["actor inference"] > 0
    assert "env stepping" not in floors["ms"]   # no EnvPool CartPole floor
    # The kernels chosen for ppo_cartpole.gin (dense): TensorFlow's default.
    assert record["host"]["kernels"]["choice"] == "auto"
    assert "whole run" in proc.stdout and "driver (the rest)" in proc.stdout


@pytest.mark.parametrize("bindings, side, rows", [
    ([], "alf_async", 8),                       # ppo_pong.gin: one env thread of 8 acting itself
    ([], "tf_agents", 8),
    (["Layout.env_threads = 2", "Layout.rows_per_env_thread = 4", "Layout.actor_queues = 1",
      "Layout.actor_queue_cap = 2"], "alf_async", 8),   # an actor batching 2 env threads of 4
    (["Layout.env_threads = 2", "Layout.rows_per_env_thread = 4", "Layout.actor_queues = 2"],
     "alf_async", 4),                           # actor_queue_cap unbound: Layout's 1
])
def test_forward_rows_follow_the_layout_the_gin_file_gives(bindings, side, rows):
    import gin
    from alf_async.bin.train import parse_gin
    gin.clear_config()
    try:
        parse_gin([os.path.join(REPO, "gin_configs", "ppo_pong.gin")], bindings)
        assert forward_rows(side) == rows
    finally:
        gin.clear_config()
