"""Every example in examples/, run as a user runs it, prints what its
examples/expected/NAME.txt says and really trained.

Each test runs the example's command (the expected file's "$" line) with
this Python in a new directory, with a timeout, matches its whole output
(stdout and stderr together: nothing of TensorFlow's or gym's may show)
against the expected lines, then checks exact things the run's settings
give: its train steps, env steps and iterations, the files it wrote, the
restart a crashing child causes, the steps a client played against those
that reached the learner, the collectors' reports behind the learner's env
steps. The commands cut the examples short (a few seconds of training each).
"""

import ast
import glob
import importlib.util
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
EXAMPLES = os.path.join(REPO, "examples")
EXPECTED = os.path.join(EXAMPLES, "expected")
GUIDE = os.path.join(REPO, "docs", "guides", "examples.md")
ENV = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
           PYTHONUNBUFFERED="1")   # the order a terminal shows stdout and stderr in
ENV.pop("TF_CPP_MIN_LOG_LEVEL", None)  # the examples must silence TensorFlow's banner themselves
NUMBER = r"[-+]?(?:\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?|nan|inf)"


def _pattern(text):
    """A line of an expected file as a regex: <N> a number, <*> any text,
    a run of spaces any run of spaces."""
    parts = re.split(r"(<N>|<\*>| +)", text)
    regex = "".join(NUMBER if p == "<N>" else ".*" if p == "<*>" else " +" if p.isspace() and p
                    else re.escape(p) for p in parts)
    return re.compile(regex)


def read_expected(name):
    """(argv, [line regexes], [regexes of "* " lines]) of examples/expected/NAME.txt."""
    argv, lines, anywhere = None, [], []
    with open(os.path.join(EXPECTED, f"{name}.txt"), encoding="utf-8") as f:
        for line in f.read().splitlines():
            if line.startswith("#"):
                continue
            if line.startswith("$ "):
                argv = shlex.split(line[2:])
                assert argv[0] == "python" and argv[1].startswith("examples/"), line
                argv = [sys.executable, os.path.join(REPO, argv[1])] + argv[2:]
            elif line.startswith("* "):
                anywhere.append(_pattern(line[2:]))
            else:
                lines.append(_pattern(line))
    assert argv is not None, f"no $ line in {name}.txt"
    return argv, lines, anywhere


def check_output(name, output):
    """Every output line is the next expected line or a "* " line; every
    expected line came."""
    _, lines, anywhere = read_expected(name)
    position = 0
    for line in output.splitlines():
        if position < len(lines) and lines[position].fullmatch(line):
            position += 1
        elif not any(p.fullmatch(line) for p in anywhere):
            raise AssertionError(f"{name}: unexpected line {line!r} (expected "
                                 f"{lines[position].pattern if position < len(lines) else 'the end'!r})"
                                 f"\n--- output:\n{output}")
    assert position == len(lines), (f"{name}: missing {lines[position].pattern!r}"
                                    f"\n--- output:\n{output}")


def run_example(name, cwd, timeout, tmpdir=None):
    """Runs examples/NAME.py as its expected file says (its temporary files
    in `tmpdir`); returns its output."""
    argv, _, _ = read_expected(name)
    env = ENV if tmpdir is None else dict(ENV, TMPDIR=str(tmpdir))
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          cwd=cwd, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:]
    check_output(name, proc.stdout)
    return proc.stdout


def _needs(module, package, extra):
    """Skips the test, saying why, when `module` is not installed (looked up,
    not imported: importing dm-reverb would import TensorFlow here)."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{package} is not installed: pip install -e '.[{extra}]'")


def search(pattern, output):
    match = re.search(pattern, output, re.M)
    assert match, (pattern, output)
    return match


def checkpoints(root_dir):
    """The train steps of root_dir/train's checkpoints."""
    return sorted(int(re.fullmatch(r"ckpt-(\d+)\.index", os.path.basename(p)).group(1))
                  for p in glob.glob(os.path.join(root_dir, "train", "ckpt-*.index")))


def summaries(root_dir, part):
    return glob.glob(os.path.join(root_dir, part, "events.out.tfevents.*"))


# --------------------------------------------------------------- the examples


@pytest.mark.timeout(120)
def test_dqn_by_hand(tmp_path):
    output = run_example("dqn_by_hand", tmp_path, timeout=110)
    # 6656 env steps are 26 batches of 32 rows x 8 steps; training starts at
    # the 4th (1024 >= 1000 initial steps), 16 train steps each: 23 x 16.
    assert "stopped (num_env_steps) at iteration 26: 368 train steps on 6656 env steps" in output
    assert os.listdir(tmp_path) == []   # it writes nothing


def _gin_bindings(path):
    """{'Scope.name': value} of a gin file's literal bindings."""
    bindings = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            match = re.match(r"^([\w.]+) = ([^#@%]+?)\s*(#.*)?$", line)
            if match:
                bindings[match.group(1)] = ast.literal_eval(match.group(2))
    return bindings


@pytest.mark.timeout(30)
def test_dqn_by_hand_has_the_values_of_dqn_cartpole_gin_it_claims():
    # Its docstring says: gin_configs/dqn_cartpole.gin's agent, without its
    # epsilon decay, and the file's layout and schedule.
    gin = _gin_bindings(os.path.join(REPO, "gin_configs", "dqn_cartpole.gin"))
    with open(os.path.join(EXAMPLES, "dqn_by_hand.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    constants = {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body
                 if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}
    calls = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            calls.setdefault(name, []).append(node)

    def keyword(call, name):
        value = next(k.value for k in calls[call][0].keywords if k.arg == name)
        return value.id if isinstance(value, ast.Name) else ast.literal_eval(value)

    assert constants["ROWS"] == gin["Layout.rows_per_env_thread"] == gin["Schedule.rows_per_batch"]
    assert (gin["Layout.env_threads"], gin["Layout.actor_queues"]) == (1, 1)
    assert keyword("AsyncOffPolicyDriver", "num_envs") == 1
    assert keyword("AsyncOffPolicyDriver", "num_actor_queues") == 1
    assert constants["UNROLL_LENGTH"] == gin["Schedule.unroll_length"]
    assert constants["TRAIN_STEPS_PER_ITERATION"] == gin["Schedule.train_steps_per_iteration"]
    assert constants["INITIAL_COLLECT_STEPS"] == gin["Schedule.initial_collect_steps"]
    assert keyword("Learner", "sample_batch_size") == gin["Schedule.sample_batch_size"]
    assert keyword("UniformReplayer", "capacity_per_row") == gin["UniformReplayer.capacity_per_row"]
    assert keyword("QNetwork", "fc_layer_params") == gin["dqn_agent.fc_layer_params"]
    assert ast.literal_eval(calls["Adam"][0].args[0]) == gin["dqn_agent.learning_rate"]
    for name in ("gamma", "n_step_update", "target_update_tau"):
        assert keyword("DdqnAgent", name) == gin[f"DqnAgent.{name}"], name
    assert keyword("DdqnAgent", "td_errors_loss_fn") == "element_wise_squared_loss"
    assert "DqnAgent.td_errors_loss_fn = @element_wise_squared_loss" in open(
        os.path.join(REPO, "gin_configs", "dqn_cartpole.gin"), encoding="utf-8").read()


@pytest.mark.timeout(120)
def test_ppo_cartpole(tmp_path):
    run_example("ppo_cartpole", tmp_path, timeout=110)
    root = tmp_path / "runs" / "ppo_cartpole"
    # 4 batches of 1024 env steps, each 4 epochs x 4 minibatches: the
    # checkpoint at exit is train step 64; evaluations every 16 train steps.
    assert checkpoints(root) == [64]
    assert len(summaries(root, "train")) == 1 and len(summaries(root, "eval")) == 1
    assert os.path.exists(root / "operative_config-16.gin")


@pytest.mark.timeout(120)
def test_sac_pendulum(tmp_path):
    output = run_example("sac_pendulum", tmp_path, timeout=110)
    root = tmp_path / "runs" / "sac_pendulum"
    # 32 batches of 16 env steps; from the 16th (256 initial steps) 16 train
    # steps each: 17 x 16 = 272, the step the new agent restored.
    assert checkpoints(root) == [272]
    assert "restored train step 272 from runs/sac_pendulum/train/ckpt-272" in output


@pytest.mark.timeout(120)
def test_child_processes(tmp_path):
    _needs("gymnasium", "gymnasium", "gymnasium")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    output = run_example("child_processes", tmp_path, timeout=110, tmpdir=scratch)
    # 32 batches of 8 rows x 8 steps; from the 4th (256 initial steps) 8
    # train steps each: 29 x 8. Exactly one child killed itself, restarted once.
    assert "stopped (num_env_steps) at iteration 32: 232 train steps on 2048 env steps" in output
    assert output.count("the environment process died") == 1
    assert "children restarted: 1\n" in output
    assert int(search(r"^collect policy: (\d+) episodes", output).group(1)) > 0
    assert os.listdir(scratch) == []   # its crash file's directory is gone


@pytest.mark.timeout(120)
def test_serve_cartpole_and_its_client(tmp_path):
    server_argv, _, _ = read_expected("serve_cartpole")
    client_argv, _, _ = read_expected("cartpole_client")
    server = subprocess.Popen(server_argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, cwd=tmp_path, env=ENV)
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(tmp_path / "server_address"):
            assert server.poll() is None, server.stdout.read()
            assert time.monotonic() < deadline, "no server_address within 60 s"
            time.sleep(0.1)
        client = subprocess.run(client_argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, cwd=tmp_path, env=ENV, timeout=60)
        assert client.returncode == 0, client.stdout
        server.send_signal(signal.SIGINT)
        server_output, _ = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert server.returncode == 0, server_output
    check_output("cartpole_client", client.stdout)
    check_output("serve_cartpole", server_output)
    played = int(search(r"^2 clients \(remote\): (\d+) steps", client.stdout).group(1))
    stopped = search(r"^stopped at iteration (\d+): (\d+) train steps on (\d+) env steps \(the "
                     r"clients' steps in whole unrolls: (\d+), in (\d+) whole episodes\)$",
                     server_output)
    iterations, train_steps, env_steps, unrolled, episodes = map(int, stopped.groups())
    # A batch is 8 unrolls of 8 steps (one a slot, or two of a busy slot);
    # a train step after each.
    assert iterations >= 1 and env_steps == 64 * iterations
    assert train_steps == iterations
    # Every step a client played was one action of the server's. The env
    # thread ships 8 whole unrolls at once (a busy slot's two may be among
    # them), so the steps not shipped yet are at most 7 whole unrolls and
    # what each of the 8 slots holds of its next one (at most 7 steps).
    assert played - (7 * 8 + 8 * 7) <= unrolled <= played
    assert 0 < episodes <= 60
    assert "127.0.0.1:" in open(tmp_path / "server_address", encoding="utf-8").read()


@pytest.mark.timeout(150)
def test_learner_with_collectors(tmp_path):
    _needs("reverb", "dm-reverb", "reverb")
    output = run_example("learner_with_collectors", tmp_path, timeout=140)
    root = tmp_path / "runs" / "dqn_cartpole_distributed"
    port = search(r"collectors connect to localhost:(\d+) ", output).group(1)
    iterations, train_step, env_steps = map(int, search(
        r"stopped \(num_env_steps\) at iteration (\d+), train step (\d+), env steps (\d+);",
        output).groups())
    assert train_step == 4 * iterations and train_step > 0   # 4 train steps an iteration
    assert checkpoints(root) == [train_step]
    # The learner's env steps are what the collectors reported. Each
    # collector's log says how many its own loop took; its reports count
    # the batch waiting in its learn queue too (16 rows x 8 steps).
    collected = [int(n) for n in re.findall(r"^collector \d: stopped \(stop_event\) after (\d+) "
                                            r"env steps", output, re.M)]
    assert collected and 2048 <= env_steps <= sum(collected) + 16 * 8 * len(collected)
    logs = [open(p, encoding="utf-8").read()
            for p in sorted(glob.glob(str(root / "collectors" / "*" / "log.txt")))]
    assert len(logs) == 2
    for log in logs:   # a collector that reported had connected to this learner
        assert ("[alf_async collector] stopped (stop_event) after" not in log or
                f"[alf_async collector] connected to localhost:{port}; collecting" in log), log
    assert glob.glob(str(root / "replay" / "*" / "DONE"))   # the replay table, checkpointed


@pytest.mark.timeout(120)
def test_dqn_breakout(tmp_path):
    _needs("ale_py", "ale-py", "atari")
    output = run_example("dqn_breakout", tmp_path, timeout=110)
    root = tmp_path / "runs" / "dqn_breakout_short"
    # 3 batches of 2 x 8 games x 8 steps; from the 2nd (256 initial steps)
    # 32 train steps each.
    assert checkpoints(root) == [64]
    size = float(search(r"ckpt-64: (\S+) MiB", output).group(1))
    files = glob.glob(str(root / "train" / "ckpt-64.*"))
    assert size == round(sum(map(os.path.getsize, files)) / 2**20, 1)


@pytest.mark.timeout(120)
def test_train_from_logs(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    output = run_example("train_from_logs", tmp_path, timeout=110, tmpdir=scratch)
    logged = search(r"^logged 100 scripted episodes, (\d+) steps, mean return (\S+) ", output)
    steps, mean_return = int(logged.group(1)), float(logged.group(2))
    assert round(steps / 100, 1) == mean_return   # a CartPole step returns 1
    loaded = search(r"^loaded 100 episodes \((\d+) logged steps, (\d+) transitions\)", output)
    assert int(loaded.group(1)) == steps
    assert os.listdir(scratch) == []   # the temporary log directory is gone


@pytest.mark.timeout(60)
def test_train_from_logs_refuses_a_missing_log_dir_in_one_line(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    missing = str(tmp_path / "no" / "such" / "dir")
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, "train_from_logs.py"),
                           "--log_dir", missing], capture_output=True, text=True, timeout=50,
                          cwd=tmp_path, env=dict(ENV, TMPDIR=str(scratch)))
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == (f"train_from_logs.py: error: --log_dir {missing!r} is not an "
                           f"existing directory\n")
    assert os.listdir(scratch) == []


# ------------------------------------------------------------ the whole set


def example_names():
    return sorted(os.path.splitext(os.path.basename(p))[0]
                  for p in glob.glob(os.path.join(EXAMPLES, "*.py")))


@pytest.mark.timeout(30)
def test_every_example_has_its_expected_output_a_test_and_a_guide_section():
    with open(__file__, encoding="utf-8") as f:
        tests = f.read()
    with open(GUIDE, encoding="utf-8") as f:
        guide = f.read()
    for name in example_names():
        with open(os.path.join(EXAMPLES, f"{name}.py"), encoding="utf-8") as f:
            source = f.read()
        docstring = source.split('"""')[1]
        assert f"examples/expected/{name}.txt" in docstring, name
        assert os.path.exists(os.path.join(EXPECTED, f"{name}.txt")), name
        assert read_expected(name)[0][1] == os.path.join(REPO, "examples", f"{name}.py")
        assert f'"{name}"' in tests, f"no test runs {name}"
        assert f"python examples/{name}.py" in guide, f"{name} has no section in {GUIDE}"
    assert sorted(os.path.splitext(n)[0] for n in os.listdir(EXPECTED)) == example_names()


@pytest.mark.timeout(30)
def test_every_flag_of_every_example_is_snake_case():
    # One flag style: the CLI's (--root_dir, --gin_param), not --root-dir.
    for name in example_names():
        with open(os.path.join(EXAMPLES, f"{name}.py"), encoding="utf-8") as f:
            flags = re.findall(r"add_argument\(\s*\"(--[^\"]+)\"", f.read())
        assert flags, name
        assert [f for f in flags if not re.fullmatch(r"--[a-z]+(_[a-z]+)*", f)] == [], name


@pytest.mark.timeout(60)
def test_the_clis_verbose_shows_the_third_party_output(tmp_path):
    # (The examples take --verbose too; the CLI is where users meet it first.)
    proc = subprocess.run(
        [sys.executable, "-m", "alf_async.bin.train", "--verbose", "--root_dir",
         str(tmp_path / "run"), "--gin_file", os.path.join(REPO, "gin_configs", "smoke.gin"),
         "--gin_param", "Schedule.num_iterations = 1"],
        capture_output=True, text=True, timeout=50, cwd=REPO, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert "Gym has been unmaintained since 2022" in output  # gym's import notice
    assert "[alf_async] stopped (num_iterations) at iteration 1, " in proc.stdout
