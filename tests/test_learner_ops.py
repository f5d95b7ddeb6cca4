"""benchmarks/learner_ops.py: the profiler's op events grouped by kind, and
a tiny run end to end (PPO CartPole's learner), natively and on an
emulated host kind; benchmarks/kernel_choice.py's rounds end to end."""

import json
import os
import subprocess
import sys

import pytest

from alf_async.testing.bench import op_groups

pytestmark = pytest.mark.timeout(200)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name, expected", [
    ("while/body/_1/TorsoValueNetwork/conv2d/Conv2D:_MklNativeFusedConv2D", "convolutions"),
    ("gradients/conv2d_1/Conv2D_grad:_MklNativeConv2DBackpropFilterWithBias", "convolutions"),
    ("while/body/_418/dense/MatMul:_MklMatMul", "matmuls"),
    ("while/body/_418/Adam/Adam/update_step/ResourceApplyAdam:ResourceApplyAdam", "optimizer"),
    ("while/body/_418/Adam/mul_3:Mul", "optimizer"),
    ("while/body/_418/clip_by_global_norm/mul_1:Mul", "optimizer"),
    ("Adam/AssignSubVariableOp:AssignSubVariableOp", "optimizer"),
    ("while/body/_418/ActorDistributionNetwork/Cast:Cast", "casts"),
    ("while/body/_418/mul:Mul", "the rest"),
    ("while/body/_418/GatherV2_3:GatherV2", "the rest"),
])
def test_ops_are_grouped_by_type_and_scope(name, expected):
    assert op_groups.group(name) == expected


def test_learner_ops_tiny_ppo_run_on_the_emulated_kind_records_it(tmp_path):
    out = tmp_path / "ops.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "learner_ops.py"),
         "--gin_file", os.path.join(REPO, "gin_configs", "ppo_cartpole.gin"),
         "--calls", "1", "--warmup_calls", "1", "--floor_secs", "0.3", "--host_kind", "avx2",
         "--kernel_choice", "off", "--json", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=180,
        env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[0] == (
        "[alf_async] kernels: avx2 host (emulated); kernel choice off; oneDNN off "
        "(TensorFlow's default without AVX-512 VNNI, BF16 or AMX); 'auto' torsos compute in "
        "float32")
    record = json.loads(out.read_text())
    groups = record["groups_ms"]
    assert list(groups) == list(op_groups.GROUPS)
    assert sum(groups.values()) == pytest.approx(record["ops_ms"], rel=1e-9)
    # CartPole's dense networks: matmuls, no convolutions; Adam's ops.
    assert groups["convolutions"] == 0.0
    assert groups["matmuls"] > 0 and groups["optimizer"] > 0 and groups["the rest"] > 0
    assert record["cpu_ms"] > 0
    # 1 unroll x 16 CartPoles x 64 steps a call (ppo_cartpole.gin).
    assert record["env_steps_per_call"] == 1024 and record["calls"] == 1
    assert record["host"]["tensorflow"] == "2.15.1"
    assert "all ops" in proc.stdout and "of process CPU" in proc.stdout
    # The floor: the bare networks, 4 epochs x 4 minibatches of 256 transitions.
    assert (record["floor_batch"], record["floor_gradient_steps"]) == (256, 16)
    assert record["floor_ms"] > 0 and "floor" in proc.stdout
    # What ran: the emulated kind, TensorFlow's defaults there.
    assert record["gin_bindings"] == ["Runtime.kernel_choice = 'off'"]
    chosen = record["host"]["kernels"]
    assert (chosen["emulated_kind"], chosen["onednn"], chosen["choice"]) == ("avx2", False, "off")
    assert chosen["variables"]["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    # This CPU's kind or one below it only.
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "learner_ops.py"), "--host_kind",
         "amx"], capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=REPO))
    if "amx_tile" not in open("/proc/cpuinfo").read():
        assert proc.returncode == 2 and proc.stderr.startswith(
            "learner_ops.py: error: host kind 'amx' cannot be emulated on this CPU"), proc.stderr


def test_kernel_choice_alternates_onednn_off_and_on_under_the_emulated_kind(tmp_path):
    out = tmp_path / "choice.json"
    script = os.path.join(REPO, "benchmarks", "kernel_choice.py")
    proc = subprocess.run(
        [sys.executable, script, "--gin_files",
         os.path.join(REPO, "gin_configs", "ppo_cartpole.gin"), "--rounds", "1",
         "--part_secs", "0.3", "--host_kind", "avx2", "--json", str(out)],
        capture_output=True, text=True, timeout=180, env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = json.loads(out.read_text())
    assert saved["host_kind"] == "avx2"
    assert saved["emulation"] == {"ALF_ASYNC_HOST_KIND": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    [(gin_file, by_setting)] = saved["results"].items()
    assert gin_file.endswith("ppo_cartpole.gin") and sorted(by_setting) == ["0", "1"]
    for records in by_setting.values():
        [record] = records
        assert record["learner"] > 0 and record["inference"] > 0
        assert record["learner_unit"] == "env step"
    # ppo_cartpole.gin's 64-unit networks: TensorFlow's default (off) on the AVX2 kind.
    table = [line for line in proc.stdout.splitlines() if line.startswith("ppo_cartpole.gin")]
    assert len(table) == 1 and table[0].endswith("oneDNN off"), proc.stdout
    again = subprocess.run([sys.executable, script, "--from_json", str(out)], capture_output=True,
                           text=True, timeout=60, env=dict(os.environ, PYTHONPATH=REPO))
    assert again.returncode == 0 and table[0] in again.stdout.splitlines(), again.stdout
