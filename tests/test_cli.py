"""alf-async-train as a newcomer meets it: --help without TensorFlow,
one-line configuration errors with exit 2 and no traceback, Ctrl-C before
training. Each runs the real CLI in a subprocess."""

import inspect
import logging
import os
import signal
import subprocess
import sys
import time

import gin
import pytest

from alf_async.bin import train as train_cli
from alf_async.bin import train_help

pytestmark = pytest.mark.timeout(120)

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
GIN = os.path.join(REPO, "gin_configs")
SMOKE_GIN = os.path.join(GIN, "smoke.gin")
ENV = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))


def cli(*args):
    return [sys.executable, "-m", "alf_async.bin.train"] + list(args)


def run(args, timeout=90):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env=ENV)


def assert_one_error_line(proc, expected):
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [f"alf-async-train: error: {expected}"]


# ------------------------------------------------------------------ --help

def test_help_lists_the_settings_without_importing_tensorflow():
    proc = run(cli("--help"))
    assert proc.returncode == 0 and proc.stderr == ""
    for line in ("  Schedule.num_env_steps = None", "  Task.env_name = REQUIRED",
                 "  Task.replayer_fn = @UniformReplayer", "  Runtime.inter_op_threads = None",
                 "  Schedule.sample_batch_size = 64", "  Layout.env_threads = 1",
                 "  --verbose"):
        assert line in proc.stdout.splitlines() or any(
            out.startswith(line) for out in proc.stdout.splitlines()), line
    probe = run([sys.executable, "-c",
                 "import sys\n"
                 "from alf_async.bin import train\n"
                 "try:\n    train.main(['--help'])\nexcept SystemExit as e:\n"
                 "    assert e.code == 0\n"
                 "print(sorted(m for m in sys.modules if m.split('.')[0] in "
                 "('tensorflow', 'tf_agents', 'gym', 'gin')))\n"])
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.splitlines()[-1] == "[]"


def test_the_help_table_is_the_real_signature():
    from alf_async import settings  # imports TensorFlow: the table must match it
    rows = train_help.setting_bindings()
    groups = [getattr(settings, group) for group in train_help.GROUPS]
    assert [(group, name) for group, name, _, _ in rows] == [
        (cls.__name__, name) for cls in groups
        for name in inspect.signature(cls.__init__).parameters if name != "self"]
    for group, name, default, description in rows:
        real = inspect.signature(getattr(settings, group).__init__).parameters[name].default
        assert description, name
        if default == "REQUIRED":
            assert real is gin.REQUIRED, name
        elif default.startswith("@"):
            assert real.__name__ == default[1:], name
        else:
            assert eval(default) == real, name  # pylint: disable=eval-used


def test_train_takes_the_settings_groups():
    from alf_async import trainer  # pylint: disable=import-outside-toplevel
    assert list(inspect.signature(trainer.train).parameters) == [
        "root_dir", "task", "layout", "schedule", "evaluation", "outputs", "runtime",
        "collectors", "stop_event", "print_fn"]


def test_every_moved_binding_names_a_real_one():
    import gin as gin_lib  # pylint: disable=import-outside-toplevel
    from alf_async import settings  # noqa: F401  (registers the groups)  pylint: disable=import-outside-toplevel
    from alf_async.distributed import collector  # noqa: F401  pylint: disable=import-outside-toplevel
    from alf_async.bin import moved_bindings  # pylint: disable=import-outside-toplevel
    for old, new in moved_bindings.MOVED_BINDINGS.items():
        selector, name = new.rsplit(".", 1)
        configurable = gin_lib.config._REGISTRY.get_match(selector.split("/")[-1])  # pylint: disable=protected-access
        assert configurable is not None, (old, new)
        assert name in inspect.signature(configurable.wrapped).parameters, (old, new)


@pytest.mark.parametrize("binding, line", [
    ("train.num_envs = 2", "train.num_envs moved: bind Layout.env_threads instead "
                           "(docs/guides/training-runs.md lists every setting)"),
    ("train.learn_queue_cap = 2",
     "train.learn_queue_cap moved: bind Schedule.rows_per_batch instead (rows, not env "
     "threads' unrolls: learn_queue_cap x rows_per_env_thread) (docs/guides/training-runs.md lists "
     "every setting)"),
    ("train.async_eval = True", "train.async_eval moved: bind Evaluation.in_background "
                                "instead (docs/guides/training-runs.md lists every setting)"),
    ("collect.num_envs = 2", "collect.num_envs moved: bind collect/Layout.env_threads "
                             "instead (docs/guides/many-machines.md lists every setting)"),
])
def test_a_moved_binding_names_its_new_binding(tmp_path, binding, line):
    assert_one_error_line(
        run(cli("--root_dir", str(tmp_path), "--gin_file", SMOKE_GIN, "--gin_param", binding)),
        f"--gin_param {binding!r}: {line}")
    moved = tmp_path / "moved.gin"
    moved.write_text(f"include '{SMOKE_GIN}'\n{binding}\n")
    assert_one_error_line(
        run(cli("--root_dir", str(tmp_path), "--gin_file", str(moved))),
        f"gin file {moved}: {line}")


# ------------------------------------------------------------------ config errors

def test_no_gin_file(tmp_path):
    assert_one_error_line(
        run(cli("--root_dir", str(tmp_path))),
        "no --gin_file: give at least one, e.g. --gin_file gin_configs/dqn_cartpole.gin")


def test_missing_gin_file(tmp_path):
    missing = str(tmp_path / "nope.gin")
    assert_one_error_line(run(cli("--root_dir", str(tmp_path), "--gin_file", missing)),
                          f"gin file not found: {missing}")


def test_root_dir_that_is_a_file(tmp_path):
    path = tmp_path / "run"
    path.write_text("")
    assert_one_error_line(run(cli("--root_dir", str(path), "--gin_file", SMOKE_GIN)),
                          f"--root_dir {path} is a file, not a directory")


def test_root_dir_under_a_file(tmp_path):
    (tmp_path / "file").write_text("")
    path = tmp_path / "file" / "run"
    assert_one_error_line(run(cli("--root_dir", str(path), "--gin_file", SMOKE_GIN)),
                          f"--root_dir {path} cannot be created: {tmp_path / 'file'} is a file")


def test_root_dir_that_cannot_be_written():
    # /proc takes no new files, even for root (a chmod'ed directory would not stop root).
    path = "/proc/alf_async_no_such_run"
    proc = run(cli("--root_dir", path, "--gin_file", SMOKE_GIN))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"alf-async-train: error: --root_dir {path} cannot be created: "
                           f"/proc is not writable (")


@pytest.mark.parametrize("param, expected", [
    ("dqn_agent.learning_rate = 'fast'",
     "dqn_agent.learning_rate must be a number > 0, got 'fast'"),
    ("dqn_agent.fc_layer_params = (-5,)",
     "dqn_agent.fc_layer_params must be a tuple of layer sizes (ints >= 1), got (-5,)"),
    ("Layout.env_threads = two",
     "--gin_param 'Layout.env_threads = two': Failed to parse token 'two' (line 1) "
     "(a string value needs quotes)"),
    ("Runtime.inter_op_threads = 0", "Runtime.inter_op_threads must be None or an int >= 1, got 0"),
])
def test_bad_values_name_their_binding(tmp_path, param, expected):
    proc = run(cli("--root_dir", str(tmp_path), "--gin_file", SMOKE_GIN, "--gin_param", param))
    assert_one_error_line(proc, expected)
    assert os.listdir(tmp_path) == []


def test_gin_files_without_the_required_bindings(tmp_path):
    overlay = tmp_path / "my_overlay.gin"
    overlay.write_text("Layout.env_threads = 4\n")
    proc = run(cli("--root_dir", str(tmp_path / "run"), "--gin_file", str(overlay)))
    assert_one_error_line(
        proc, f"Task.env_name and Task.agent_fn not bound by {overlay}: an overlay gin file "
              f"needs its base first (or an `include` of it), e.g. "
              f"--gin_file gin_configs/dqn_cartpole.gin")


@pytest.mark.parametrize("overlay, base", [
    ("dqn_cartpole_subprocess.gin", "dqn_cartpole.gin"),
    ("dqn_cartpole_ray.gin", "dqn_cartpole.gin"),
    ("dqn_cartpole_gymnasium.gin", "dqn_cartpole.gin"),
    ("sac_pendulum_subprocess.gin", "sac_pendulum.gin"),
    ("sac_pendulum_gymnasium.gin", "sac_pendulum.gin"),
])
def test_an_overlay_alone_is_its_base_plus_the_overlay(overlay, base, tmp_path, monkeypatch,
                                                       caplog):
    monkeypatch.chdir(tmp_path)  # the include is found beside the overlay, from anywhere
    caplog.set_level(logging.INFO)
    gin.clear_config()
    try:
        train_cli.parse_gin([os.path.join(GIN, base)], [])
        expected = gin.config_str()
        gin.clear_config()
        train_cli.parse_gin([os.path.join(GIN, base), os.path.join(GIN, overlay)], [])
        both = gin.config_str()
        gin.clear_config()
        train_cli.parse_gin([os.path.join(GIN, overlay)], [])
        alone = gin.config_str()
    finally:
        gin.clear_config()
    assert alone == both != expected
    # gin's lookups of the include under other search paths say nothing.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


# ------------------------------------------------------------------ Ctrl-C before training

def test_ctrl_c_during_the_imports_exits_130_with_one_line(tmp_path):
    proc = subprocess.Popen(cli("--root_dir", str(tmp_path), "--gin_file", SMOKE_GIN),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, env=ENV)
    try:
        deadline = time.monotonic() + 60
        # TensorFlow's library is mapped: the CLI is inside `import tensorflow`.
        while "libtensorflow" not in _maps(proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.005)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130
    assert "Traceback" not in err
    assert err.splitlines() == [train_cli.INTERRUPTED_BEFORE]
    assert out == "" and os.listdir(tmp_path) == []


def _maps(pid):
    try:
        with open(f"/proc/{pid}/maps") as f:
            return f.read()
    except OSError:
        return ""


class _Writes:
    def __init__(self):
        self.writes = []

    def write(self, text):
        self.writes.append(text)

    def flush(self):
        pass


def test_a_line_on_stderr_is_one_write_so_another_threads_line_cannot_land_inside_it(
        monkeypatch):
    # The CLI's stderr and its trainer's stdout often share one pipe; print()
    # would write the text and its newline in two, with room between.
    stderr = _Writes()
    monkeypatch.setattr(sys, "stderr", stderr)
    train_cli.say_on_stderr(train_cli.WRITE_FINISHED)
    assert stderr.writes == [train_cli.WRITE_FINISHED + "\n"]


# ------------------------------------------------------------------ missing extras

def _without(tmp_path, *modules):
    """An env whose PYTHONPATH puts a package of each name first, each failing to
    import as an uninstalled one does (ModuleNotFoundError naming it)."""
    stubs = tmp_path / "stubs"
    for module in modules:
        (stubs / module).mkdir(parents=True)
        (stubs / module / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{module}'\", name='{module}')\n")
    return dict(ENV, PYTHONPATH=str(stubs) + os.pathsep + ENV["PYTHONPATH"])


def test_ray_envs_without_ray_say_which_extra(tmp_path):
    proc = subprocess.run(
        cli("--root_dir", str(tmp_path / "run"), "--gin_file",
            os.path.join(GIN, "dqn_cartpole_ray.gin")),
        capture_output=True, text=True, timeout=90, cwd=REPO, env=_without(tmp_path, "ray"))
    assert_one_error_line(proc, "make_ray_env_constructor needs Ray, which is not installed: "
                                "pip install -e '.[ray]'")


def test_a_missing_extra_is_named_only_when_it_is_the_module_missing():
    from alf_async.errors import ConfigError, missing_extra
    ray_missing = ModuleNotFoundError("No module named 'ray'", name="ray")
    line = missing_extra(ray_missing, "Collectors.launcher = 'ray'", "Ray", "ray", "ray")
    assert type(line) is ConfigError
    assert str(line) == ("Collectors.launcher = 'ray' needs Ray, which is not installed: "
                         "pip install -e '.[ray]'")
    broken = ModuleNotFoundError("No module named 'grpc'", name="grpc")
    assert missing_extra(broken, "Collectors.launcher = 'ray'", "Ray", "ray", "ray") is broken


def test_distributed_gin_without_reverb_says_which_extra(tmp_path):
    proc = subprocess.run(
        cli("--root_dir", str(tmp_path / "run"), "--gin_file",
            os.path.join(GIN, "dqn_cartpole_distributed.gin")),
        capture_output=True, text=True, timeout=90, cwd=REPO, env=_without(tmp_path, "reverb"))
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 2, proc.stderr[-3000:]
    [line] = proc.stderr.splitlines()
    assert line.startswith("alf-async-train: error: gin file ")
    assert "No configurable matching '" in line
    assert line.endswith("(it needs dm-reverb, which did not import: ModuleNotFoundError: "
                         "No module named 'reverb'; pip install -e '.[reverb]')")


def test_a_gin_files_import_finds_a_module_beside_it(tmp_path):
    """`import` in a gin file finds a user's module in the gin file's directory,
    from any working directory: the user's env registers itself there."""
    user = tmp_path / "user"
    user.mkdir()
    (user / "my_settings.py").write_text(
        "import gin\n\n@gin.configurable\ndef episode_steps(n=7):\n    return n\n")
    (user / "run.gin").write_text(
        "import my_settings\nepisode_steps.n = 3\nSchedule.num_iterations = 1\n")
    proc = subprocess.run(
        cli("--root_dir", str(tmp_path / "run"), "--gin_file", os.path.join(GIN, "smoke.gin"),
            "--gin_file", str(user / "run.gin")),
        capture_output=True, text=True, timeout=110, cwd=str(tmp_path), env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [config] = (tmp_path / "run").glob("operative_config-*.gin")
    assert "import my_settings" in config.read_text().splitlines()
