"""The kernel choice (alf_async.kernels): oneDNN and 'auto' torsos from the
CPU's flags, the user's environment and the run's networks; its start
line; host-kind emulation; and that TensorFlow runs what was chosen."""

import os
import subprocess
import sys

import pytest

from alf_async import kernels

from cli_runs import GIN_CONFIGS, REPO  # tests/ is on sys.path

pytestmark = pytest.mark.timeout(120)

AVX2 = frozenset("fpu sse4_2 avx avx2 fma".split())
SKYLAKE = AVX2 | {"avx512f", "avx512bw", "avx512vl"}            # AVX-512, no VNNI
CASCADE_LAKE = SKYLAKE | {"avx512_vnni"}                          # TF turns oneDNN on
ZEN4 = CASCADE_LAKE | {"avx512_bf16"}
SAPPHIRE_RAPIDS = ZEN4 | {"amx_tile", "amx_bf16", "amx_int8", "avx512_fp16"}
ALDER_LAKE = AVX2 | {"avx_vnni"}                                  # AVX2 with AVX-VNNI


def test_host_kinds_from_flags():
    assert [kernels.host_kind(f) for f in (AVX2, ALDER_LAKE, SKYLAKE, CASCADE_LAKE, ZEN4,
                                           SAPPHIRE_RAPIDS)] == [
        "avx2", "avx2", "avx512", "avx512", "avx512_bf16", "amx"]


def test_an_emulated_kind_drops_the_flags_it_lacks_and_cannot_be_above_the_cpu():
    assert kernels.emulated_flags(SAPPHIRE_RAPIDS, "avx2") == AVX2
    assert kernels.emulated_flags(ALDER_LAKE, "avx2") == AVX2
    assert kernels.emulated_flags(SAPPHIRE_RAPIDS, "avx512") == CASCADE_LAKE
    assert kernels.emulated_flags(SAPPHIRE_RAPIDS, "avx512_bf16") == ZEN4 | {"avx512_fp16"}
    assert kernels.emulated_flags(ZEN4, "avx512_bf16") == ZEN4
    with pytest.raises(kernels.ConfigError, match=r"^host kind 'amx' cannot be emulated "
                       r"on this CPU, which is 'avx512': a host emulates its own kind or one "
                       r"below it \(avx2, avx512\)$"):
        kernels.emulated_flags(CASCADE_LAKE, "amx")
    with pytest.raises(kernels.ConfigError, match=r"^host kind 'sse': expected one of "
                       r"\('avx2', 'avx512', 'avx512_bf16', 'amx'\)$"):
        kernels.emulated_flags(AVX2, "sse")


@pytest.mark.parametrize("flags, environ, networks, choice, onednn, environ_set, torso", [
    # TensorFlow leaves oneDNN off on AVX2: convolutional and wide networks turn it on.
    (AVX2, {}, "convolutional", "auto", True, {"TF_ENABLE_ONEDNN_OPTS": "1"}, "float32"),
    (AVX2, {}, "narrow", "auto", False, {}, "float32"),
    (AVX2, {}, "wide", "auto", True, {"TF_ENABLE_ONEDNN_OPTS": "1"}, "float32"),
    (SKYLAKE, {}, "convolutional", "auto", True, {"TF_ENABLE_ONEDNN_OPTS": "1"}, "float32"),
    # Where TensorFlow turns it on, nothing is set.
    (CASCADE_LAKE, {}, "convolutional", "auto", True, {}, "float32"),
    (CASCADE_LAKE, {}, "narrow", "auto", True, {}, "float32"),
    (ALDER_LAKE, {}, "convolutional", "auto", True, {}, "float32"),
    (ZEN4, {}, "convolutional", "auto", True, {}, "bfloat16"),
    (SAPPHIRE_RAPIDS, {}, "narrow", "auto", True, {}, "bfloat16"),
    # The user's setting always wins (TensorFlow reads 0/1/true/false in any case).
    (AVX2, {"TF_ENABLE_ONEDNN_OPTS": "0"}, "convolutional", "auto", False, {}, "float32"),
    (AVX2, {"TF_ENABLE_ONEDNN_OPTS": "True"}, "narrow", "auto", True, {}, "float32"),
    (ZEN4, {"TF_ENABLE_ONEDNN_OPTS": "0"}, "convolutional", "auto", False, {}, "bfloat16"),
    (AVX2, {"TF_ENABLE_ONEDNN_OPTS": "yes"}, "convolutional", "auto", False, {}, "float32"),
    # Off: TensorFlow's defaults, float32 'auto' torsos.
    (AVX2, {}, "convolutional", "off", False, {"ALF_ASYNC_KERNEL_CHOICE": "off"}, "float32"),
    (ZEN4, {}, "convolutional", "off", True, {"ALF_ASYNC_KERNEL_CHOICE": "off"}, "float32"),
    # Emulated AVX2 on an AMX host: oneDNN capped at AVX2; TensorFlow's AVX2
    # default (off) must be set, since the real CPU's is on.
    (SAPPHIRE_RAPIDS, {"ALF_ASYNC_HOST_KIND": "avx2"}, "convolutional", "auto", True,
     {"ONEDNN_MAX_CPU_ISA": "AVX2"}, "float32"),
    (SAPPHIRE_RAPIDS, {"ALF_ASYNC_HOST_KIND": "avx2"}, "narrow", "auto", False,
     {"ONEDNN_MAX_CPU_ISA": "AVX2", "TF_ENABLE_ONEDNN_OPTS": "0"}, "float32"),
    (CASCADE_LAKE, {"ALF_ASYNC_HOST_KIND": "avx2"}, "convolutional", "off", False,
     {"ONEDNN_MAX_CPU_ISA": "AVX2", "TF_ENABLE_ONEDNN_OPTS": "0",
      "ALF_ASYNC_KERNEL_CHOICE": "off"}, "float32"),
    (SAPPHIRE_RAPIDS, {"ALF_ASYNC_HOST_KIND": "avx512_bf16"}, "convolutional", "auto", True,
     {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, "bfloat16"),
    # The user's own cap stays.
    (SAPPHIRE_RAPIDS, {"ALF_ASYNC_HOST_KIND": "avx2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
     "convolutional",
     "auto", True, {}, "float32"),
    # What a parent process's choice set is not the user's: chosen again.
    (AVX2, {"TF_ENABLE_ONEDNN_OPTS": "1", "ALF_ASYNC_KERNELS_SET": "TF_ENABLE_ONEDNN_OPTS"},
     "narrow", "auto", False, {}, "float32"),
])
def test_the_choice(flags, environ, networks, choice, onednn, environ_set, torso):
    made = kernels.choose(flags, environ, networks, choice)
    assert (made.onednn, made.torso_dtype, made.choice) == (onednn, torso, choice)
    # It sets these, and says it set them.
    listed = dict(environ_set, ALF_ASYNC_KERNELS_SET=",".join(sorted(environ_set)))
    assert made.environ == (listed if environ_set else {})
    assert made.emulated == environ.get("ALF_ASYNC_HOST_KIND")


def test_the_start_line_says_what_was_chosen_and_why():
    line = lambda *args: kernels.choose(*args).line()
    assert line(AVX2, {}, "convolutional") == (
        "[alf_async] kernels: avx2 host; oneDNN on (convolutions train faster with it; "
        "TensorFlow leaves it off here); 'auto' torsos compute in float32")
    assert line(AVX2, {}, "narrow") == (
        "[alf_async] kernels: avx2 host; oneDNN off (TensorFlow's default without AVX-512 "
        "VNNI, BF16 or AMX; narrow dense networks train slower with it); 'auto' torsos "
        "compute in float32")
    assert line(AVX2, {}, "wide") == (
        "[alf_async] kernels: avx2 host; oneDNN on (dense layers of 256+ units train faster "
        "with it; TensorFlow leaves it off here); 'auto' torsos compute in float32")
    assert line(ZEN4, {}, "convolutional") == (
        "[alf_async] kernels: avx512_bf16 host; oneDNN on (TensorFlow's default with "
        "avx512_bf16); 'auto' torsos compute in bfloat16")
    assert line(AVX2, {"TF_ENABLE_ONEDNN_OPTS": "0"}, "convolutional") == (
        "[alf_async] kernels: avx2 host; oneDNN off (TF_ENABLE_ONEDNN_OPTS=0, yours); 'auto' "
        "torsos compute in float32")
    assert line(AVX2, {"TF_ENABLE_ONEDNN_OPTS": "on"}, "convolutional") == (
        "[alf_async] kernels: avx2 host; oneDNN off (TF_ENABLE_ONEDNN_OPTS='on' is not 0 or "
        "1: TensorFlow's default); 'auto' torsos compute in float32")
    assert line(SAPPHIRE_RAPIDS, {"ALF_ASYNC_HOST_KIND": "avx2"}, "convolutional", "off") == (
        "[alf_async] kernels: avx2 host (emulated); kernel choice off; oneDNN off "
        "(TensorFlow's default without AVX-512 VNNI, BF16 or AMX); 'auto' torsos compute in "
        "float32")
    assert kernels.choose(AVX2, {}, "wide").line("[alf_async collector]").startswith(
        "[alf_async collector] kernels: avx2 host; oneDNN on")


def test_an_unknown_choice_is_refused():
    with pytest.raises(kernels.ConfigError, match=r"^Runtime.kernel_choice must be one of "
                       r"\('auto', 'off'\), got 'fast'$"):
        kernels.choose(AVX2, {}, "narrow", "fast")


def test_apply_writes_the_environment_and_refuses_once_tensorflow_is_imported(monkeypatch):
    environ = {"PATH": "/bin"}
    choice = kernels.choose(AVX2, {}, "convolutional")
    kernels.apply(choice, environ)
    assert environ == {"PATH": "/bin", "TF_ENABLE_ONEDNN_OPTS": "1",
                       "ALF_ASYNC_KERNELS_SET": "TF_ENABLE_ONEDNN_OPTS",
                       "ALF_ASYNC_KERNELS_LINE": choice.line()}
    assert kernels.start_line(environ) == choice.line()
    # A child's choice replaces its parent's: a dense run keeps TensorFlow's default.
    narrow = kernels.choose(AVX2, environ, "narrow")
    kernels.apply(narrow, environ)
    assert environ == {"PATH": "/bin", "ALF_ASYNC_KERNELS_LINE": narrow.line()}
    import tensorflow  # noqa: F401  pylint: disable=unused-import,import-outside-toplevel
    for name in ("TF_ENABLE_ONEDNN_OPTS", "ALF_ASYNC_KERNELS_SET", "ALF_ASYNC_KERNELS_LINE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="TensorFlow is already imported"):
        kernels.apply(kernels.choose(AVX2, {}, "convolutional"))
    assert kernels.start_line() is None   # nothing written
    monkeypatch.setattr(os, "environ", dict(os.environ))   # what the next apply writes
    kernels.apply(kernels.choose(CASCADE_LAKE, {}, "convolutional"))   # no kernel to set
    assert kernels.start_line() is not None


def _cpuinfo(tmp_path, flags):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: X\nflags\t\t: {' '.join(sorted(flags))}\n")
    return str(path)


def test_auto_torsos_follow_the_emulated_kind_and_the_choice(tmp_path):
    cpuinfo = _cpuinfo(tmp_path, SAPPHIRE_RAPIDS)
    assert kernels.real_flags(cpuinfo) == SAPPHIRE_RAPIDS
    assert kernels.real_flags(str(tmp_path / "missing")) == frozenset()
    assert kernels.bf16_torsos({}, cpuinfo) is True
    assert kernels.bf16_torsos({"ALF_ASYNC_HOST_KIND": "avx512"}, cpuinfo) is False
    assert kernels.bf16_torsos({"ALF_ASYNC_HOST_KIND": "avx512_bf16"}, cpuinfo) is True
    assert kernels.bf16_torsos({"ALF_ASYNC_KERNEL_CHOICE": "off"}, cpuinfo) is False
    assert kernels.bf16_torsos({}, _cpuinfo(tmp_path, CASCADE_LAKE)) is False


def test_the_record_of_what_is_in_effect(tmp_path):
    cpuinfo = _cpuinfo(tmp_path, SAPPHIRE_RAPIDS)
    environ = {"PATH": "/bin"}
    kernels.apply(kernels.choose(SAPPHIRE_RAPIDS, {"ALF_ASYNC_HOST_KIND": "avx2"}, "narrow"),
                  environ)
    environ["ALF_ASYNC_HOST_KIND"] = "avx2"
    del environ["ALF_ASYNC_KERNELS_LINE"]
    assert kernels.in_effect(environ, cpuinfo) == dict(
        cpu_kind="amx", emulated_kind="avx2", host_kind="avx2", onednn=False, choice="auto",
        variables={"TF_ENABLE_ONEDNN_OPTS": "0", "ONEDNN_MAX_CPU_ISA": "AVX2",
                   "ALF_ASYNC_HOST_KIND": "avx2",
                   "ALF_ASYNC_KERNELS_SET": "ONEDNN_MAX_CPU_ISA,TF_ENABLE_ONEDNN_OPTS"},
        auto_torso_dtype="float32")
    assert kernels.in_effect({}, cpuinfo) == dict(
        cpu_kind="amx", emulated_kind=None, host_kind="amx", onednn=True, choice="auto",
        variables={}, auto_torso_dtype="bfloat16")


def test_the_runs_networks_and_choice_are_read_from_its_gin_files_without_tensorflow(tmp_path):
    gin = lambda name: os.path.join(GIN_CONFIGS, name)
    settings = lambda *files, params=(): kernels.gin_settings([gin(f) for f in files], params)
    assert settings("ppo_pong.gin") == ("convolutional", "auto")
    assert settings("dqn_breakout.gin") == ("convolutional", "auto")
    assert settings("sac_halfcheetah.gin") == ("wide", "auto")     # 256 x 256
    assert settings("dqn_cartpole.gin") == ("narrow", "auto")      # 128 x 128
    assert settings("ppo_cartpole.gin") == ("narrow", "auto")      # 64 x 64
    assert settings("ppo_pong.gin", params=["Runtime.kernel_choice = 'off'"]) == (
        "convolutional", "off")
    assert settings("dqn_cartpole.gin", params=["dqn_agent.fc_layer_params = (512,)"]) == (
        "wide", "auto")
    # An overlay's include is followed; later bindings win.
    overlay = tmp_path / "overlay.gin"
    overlay.write_text(f"include '{gin('impala_pong.gin')}'\n"
                       f"impala_agent.conv_layer_params = None\n")
    assert kernels.gin_settings([str(overlay)]) == ("wide", "auto")   # its (512,) dense layer
    # No layer sizes bound: the builder's default widths.
    bare = tmp_path / "bare.gin"
    for agent_fn, networks in (("@sac_agent", "wide"), ("@dqn_agent", "narrow"),
                               ("@my_agent", "narrow")):
        bare.write_text(f"Task.env_name = 'Pendulum-v1'\nTask.agent_fn = {agent_fn}\n")
        assert kernels.gin_settings([str(bare)]) == (networks, "auto")
    # A file gin cannot parse is left to gin's own error.
    broken = tmp_path / "broken.gin"
    broken.write_text("Layout.env_threads = (\n")
    assert kernels.gin_settings([str(broken)]) == ("narrow", "auto")


def test_the_builders_widest_defaults_are_their_signatures():
    import inspect   # pylint: disable=import-outside-toplevel
    from alf_async.learning import agents   # pylint: disable=import-outside-toplevel
    read = kernels.builder_widest_default()
    assert read == {"dqn_agent": 64, "sac_agent": 256, "ppo_agent": 64, "impala_agent": 64}
    for builder, widest in read.items():
        parameters = inspect.signature(getattr(agents, builder)).parameters
        assert max(n for name, p in parameters.items() if name.endswith("fc_layer_params")
                   for n in p.default) == widest, builder


ENV = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
for _name in ("TF_ENABLE_ONEDNN_OPTS", "ONEDNN_MAX_CPU_ISA", "ALF_ASYNC_HOST_KIND",
              "ALF_ASYNC_KERNEL_CHOICE", "ALF_ASYNC_KERNELS_SET"):
    ENV.pop(_name, None)

# In a child: choose for a gin file, apply, import TensorFlow, print its oneDNN state.
CHILD = """
import sys
from alf_async import kernels
choice = kernels.choose_for_gin([sys.argv[1]], sys.argv[2:])
kernels.apply(choice)
from tensorflow.python.util import _pywrap_util_port
print(choice.onednn, _pywrap_util_port.IsMklEnabled())
"""


@pytest.mark.parametrize("environ, bindings", [
    ({}, []), ({"ALF_ASYNC_HOST_KIND": "avx2"}, ["Runtime.kernel_choice = 'off'"]),
    ({"ALF_ASYNC_HOST_KIND": "avx2"}, []), ({"TF_ENABLE_ONEDNN_OPTS": "0"}, [])])
def test_tensorflow_runs_the_kernels_chosen(environ, bindings):
    proc = subprocess.run([sys.executable, "-c", CHILD, os.path.join(GIN_CONFIGS, "ppo_pong.gin"),
                           *bindings], capture_output=True, text=True, timeout=100, cwd=REPO,
                          env=dict(ENV, TF_CPP_MIN_LOG_LEVEL="2", **environ))
    assert proc.returncode == 0, proc.stderr[-2000:]
    chosen, running = proc.stdout.split()
    assert chosen == running


def _train(args, environ=None):
    return subprocess.run([sys.executable, "-m", "alf_async.bin.train", *args],
                          capture_output=True, text=True, timeout=100, cwd=REPO,
                          env=dict(ENV, **(environ or {})))


def test_the_cli_refuses_a_kernel_setting_that_cannot_apply_in_one_line(tmp_path):
    root = str(tmp_path / "run")
    gin_file = os.path.join(GIN_CONFIGS, "dqn_cartpole.gin")
    proc = _train(["--root_dir", root, "--gin_file", gin_file,
                   "--gin_param", "Runtime.kernel_choice = 'fast'"])
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == ("alf-async-train: error: Runtime.kernel_choice must be one of "
                           "('auto', 'off'), got 'fast'\n")
    proc = _train(["--root_dir", root, "--gin_file", gin_file], {"ALF_ASYNC_HOST_KIND": "sse"})
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == ("alf-async-train: error: host kind 'sse': expected one of ('avx2', "
                           "'avx512', 'avx512_bf16', 'amx')\n")
    assert not os.path.exists(root)
