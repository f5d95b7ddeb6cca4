"""The learner role (Collectors.count > 0) with real processes and a real
Reverb server: the learner CLI starts its collectors, restarts one killed
with SIGKILL, stops them all on SIGINT with replay and agent checkpointed,
and a rerun restores both and its collectors reconnect; the feed's waits
and the launcher's restart budget on their own; Ray collectors restarted
when their actor is killed; bad settings exit 2; both distributed configs
parse for both roles."""

import os
import re
import signal
import subprocess
import sys
import threading
import time

import gin
import pytest

reverb = pytest.importorskip("reverb")
psutil = pytest.importorskip("psutil")

import numpy as np  # noqa: E402
import portpicker  # noqa: E402
import tensorflow as tf  # noqa: E402

from alf_async.distributed import collector, launcher, learner_role  # noqa: E402
from alf_async.distributed.learner_role import ReplayFeed  # noqa: E402
from alf_async.driver import DriverStoppedError  # noqa: E402
from alf_async.distributed.reverb_replayer import REPLAY_TABLE, replay_table  # noqa: E402
from alf_async.testing.distributed_jobs import (DISTRIBUTED_GIN, ENV, GIN,  # noqa: E402
                                             PROGRESS, Learner)
from cli_runs import lines_before_progress  # noqa: E402  (tests/ is on sys.path)
from test_trainer import read_scalars  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))


@pytest.fixture(autouse=True)
def _clear_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def connected(root_dir):
    """How many times the collectors said they were connected (in their logs)."""
    count = 0
    for i in (0, 1):
        try:
            with open(os.path.join(root_dir, "collectors", str(i), "log.txt")) as f:
                count += f.read().count("[alf_async collector] connected to localhost:")
        except OSError:
            pass
    return count


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.1)


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie (not reaped yet) is gone too
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.timeout(150)
def test_learner_with_collectors_survives_sigkill_stops_on_sigint_and_resumes(tmp_path):
    learner = Learner(tmp_path)
    started = []
    try:
        announced = learner.wait_for(
            lambda l: re.match(r"\[alf_async\] collectors connect to (\S+:\d+) \(written to ", l),
            60, "address line")
        address = announced.group(1)
        with open(tmp_path / "replay_address") as f:
            assert f.read() == address + "\n"
        assert address.endswith(":" + address.rsplit(":", 1)[1])
        learner.wait_for(lambda l: (m := PROGRESS.match(l)) and int(m.group(1)) > 0, 60,
                         "training")
        # A quiet start (issue 49): who can reach the port and the address
        # (local collectors: localhost) alone before the first progress
        # line, nothing on stderr (not Reverb's server log either).
        port = int(announced.string.split(" connect to ")[1].split(" ")[0].rsplit(":", 1)[1])
        assert announced.string.startswith(f"[alf_async] collectors connect to localhost:{port} ")
        assert lines_before_progress(list(learner.lines)) == [
            learner_role.exposure_line(port, remote=False), announced.string]
        assert learner.err == []
        pids = learner.collector_pids()
        assert len(pids) == 2
        started += pids
        wait_until(lambda: connected(tmp_path) == 2, 60, "both collectors connected")

        # The rate limiter holds samples per insert within its error buffer.
        port = address.rsplit(":", 1)[1]
        table = reverb.Client(f"localhost:{port}").server_info()[REPLAY_TABLE]
        limiter = table.rate_limiter_info
        diff = (limiter.insert_stats.completed * limiter.samples_per_insert -
                limiter.sample_stats.completed)
        assert limiter.samples_per_insert == 4.0 and limiter.max_diff - limiter.min_diff == 800
        assert limiter.min_diff <= diff <= limiter.max_diff + limiter.samples_per_insert

        os.kill(pids[0], signal.SIGKILL)
        killed_at = time.monotonic()
        restarted = learner.wait_for(
            lambda l: re.match(rf"\[alf_async\] collector (\d) \(pid {pids[0]}\) died \(signal "
                               rf"SIGKILL\); restarted as pid (\d+) \(restart 1\)$", l),
            10, "restart line")
        new_pid = int(restarted.group(2))
        assert new_pid not in pids and time.monotonic() - killed_at < 10
        assert new_pid in learner.collector_pids()
        started.append(new_pid)
        step_at_kill = learner.train_step()
        learner.wait_for(lambda l: (m := PROGRESS.match(l)) and int(m.group(1)) > step_at_kill,
                         30, "training after the kill")
        wait_until(lambda: connected(tmp_path) == 3, 60, "the new collector connected")

        learner.process.send_signal(signal.SIGINT)
        learner.finish(60)
        assert learner.process.returncode == 0, learner.err[-30:]
        assert not [line for line in learner.err if "Traceback" in line]
        assert all(_gone(pid) for pid in started)
        stopped = re.match(r"\[alf_async\] stopped \(stop_event\) at iteration \d+, train step "
                           r"(\d+), env steps (\d+); checkpoint in ", learner.lines[-1])
        assert stopped, learner.lines[-5:]
        train_step = int(stopped.group(1))
        assert train_step > step_at_kill
        assert os.path.exists(tmp_path / "train" / "checkpoint")
        assert [d for d in os.listdir(tmp_path / "replay")
                if os.path.exists(tmp_path / "replay" / d / "DONE")]
        logs = [open(tmp_path / "collectors" / str(i) / "log.txt").read() for i in (0, 1)]
        assert sum(log.count("=== ") for log in logs) == 3  # 2 started + 1 restart
        train_tags = read_scalars(str(tmp_path / "train"))
        assert {"Metrics/AverageReturn", "Losses/td_loss", "Replay/size",
                "Replay/samples_per_insert", "Collectors/restarts"} <= set(train_tags)
        assert train_tags["Collectors/restarts"][-1][1] == 1.0
        assert any("Metrics/AverageReturn" in read_scalars(str(tmp_path / "collectors" / str(i)))
                   for i in (0, 1))

        # The rerun restores the agent, the replay table, and collectors reconnect.
        again = Learner(tmp_path)
        try:
            again.wait_for(lambda l: l.startswith(
                f"[alf_async] resumed from {tmp_path / 'train'}") and
                f"global step {train_step}," in l, 60, "resume line")
            restored = again.wait_for(lambda l: re.match(
                r"\[alf_async\] replay restored from .*: (\d+) items", l), 60, "replay line")
            assert int(restored.group(1)) > 0
            again.wait_for(lambda l: (m := PROGRESS.match(l)) and int(m.group(1)) > train_step,
                           60, "training after the resume")
            started += again.collector_pids()
            assert len(again.collector_pids()) == 2
            again.process.send_signal(signal.SIGINT)
            again.finish(60)
            assert again.process.returncode == 0, again.err[-30:]
            assert all(_gone(pid) for pid in started)
        finally:
            again.kill()
    finally:
        learner.kill()
        for pid in started:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("param, message", [
    ("Collectors.count = -1", "Collectors.count must be an int >= 0, got -1"),
    ("Collectors.launcher = 'nope'",
     "Collectors.launcher must be 'local', 'ray' or 'none', got 'nope'"),
])
def test_bad_learner_settings_exit_2_with_one_line(tmp_path, param, message):
    proc = subprocess.run(
        [sys.executable, "-m", "alf_async.bin.train", "--root_dir", str(tmp_path),
         "--gin_file", DISTRIBUTED_GIN, "--gin_param", param], capture_output=True, text=True,
        timeout=50, env=ENV, cwd=REPO)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"alf-async-train: error: {message}"]
    assert proc.stdout == ""
    assert not os.path.exists(tmp_path / "replay_address")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", ["dqn_cartpole_distributed.gin", "sac_pendulum_distributed.gin"])
def test_distributed_configs_parse_for_both_roles(name):
    from alf_async.bin import train as train_cli
    from alf_async.distributed import learner_role  # registers its knobs
    del learner_role
    path = os.path.join(GIN, name)
    train_cli.parse_gin([path], [])
    assert gin.query_parameter("Collectors.count") == 2
    assert gin.query_parameter("Task.replayer_fn").configurable.name == "ReverbReplayer"
    gin.clear_config()
    # The collector's way (alf-async-collect): the learner's train.* skipped.
    gin.parse_config_files_and_bindings([path], [], skip_unknown=True)
    assert gin.query_parameter("collect/Task.agent_fn").configurable.name in ("dqn_agent", "sac_agent")
    assert gin.query_parameter("collect/Layout.rows_per_env_thread") == (16 if "dqn" in name else 2)


def _server():
    spec = {"x": tf.TensorSpec([], tf.float32)}
    table = replay_table(spec, 1, max_size=1000, samples_per_insert=2.0, min_size=10,
                         error_buffer=20.0)
    return reverb.Server([table, collector.stats_table()])


@pytest.mark.timeout(30)
def test_a_stats_table_restored_without_policy_step_still_gets_reports_and_no_ages(tmp_path):
    # A learner resumed from a replay checkpoint keeps that checkpoint's
    # stats table signature, which may predate the policy_step field.
    from tf_agents.metrics import tf_metrics
    old = {k: v for k, v in collector.STATS_SIGNATURE.items() if k != "policy_step"}
    server = reverb.Server([replay_table({"x": tf.TensorSpec([], tf.float32)}, 1, max_size=10,
                                         samples_per_insert=2.0, min_size=1, error_buffer=20.0),
                            reverb.Table.queue(collector.STATS_TABLE, 10, signature=old)])
    client = reverb.Client(f"localhost:{server.port}")
    metrics = [tf_metrics.NumberOfEpisodes(), tf_metrics.EnvironmentSteps(),
               tf_metrics.AverageReturnMetric(), tf_metrics.AverageEpisodeLengthMetric()]
    metrics[0].number_episodes.assign(2)
    metrics[1].environment_steps.assign(30)
    collector.StatsReporter(client, 3, metrics, tf.Variable(24, dtype=tf.int64)).report()
    none = launcher.LocalCollectors(
        num_collectors=0, address="unused", config_path="unused", root_dir=str(tmp_path),
        print_fn=print, seed=None, max_restarts=0, restart_window_secs=1.0, stop_grace_secs=1.0)
    feed = ReplayFeed(client, 1, 0, none, train_step=tf.Variable(30, dtype=tf.int64))
    feed.start()
    try:
        client.insert({"x": np.float32(0)}, {REPLAY_TABLE: 1.0})
        assert feed.run_async() == 30
        assert {m.name: float(m.result()) for m in feed.get_step_metrics()} == {
            "NumberOfEpisodes": 2.0, "EnvironmentSteps": 30.0}
        assert feed.variable_ages() == {}
        assert "Collectors/variable_age" not in feed.health().scalars(1)
    finally:
        feed.stop()
        server.stop()


@pytest.mark.timeout(30)
def test_a_resumed_learner_listens_on_its_last_port_unless_it_is_taken(tmp_path):
    # Collectors started by hand keep --replay_address: a resumed learner
    # (root_dir/replay_address) comes back on its port.
    assert learner_role.previous_port(str(tmp_path)) is None
    (tmp_path / learner_role.ADDRESS_FILE).write_text("10.213.0.1:41234\n")
    assert learner_role.previous_port(str(tmp_path)) == 41234

    def server(previous):
        return learner_role.LearnerServer(
            {"x": tf.TensorSpec([], tf.float32)}, 2, {"v": tf.Variable(0.0)},
            str(tmp_path / "replay"), previous_port=previous)

    free = portpicker.pick_unused_port()
    first = server(free)
    try:
        assert (first.port, first.moved_from) == (free, None)
        # Still held (by a learner that did not exit): another port, said.
        second = server(free)
        assert second.port != free and second.moved_from == free
        second.stop()
    finally:
        first.stop()


@pytest.mark.timeout(30)
def test_feed_waits_for_the_rate_limiter_counts_reports_and_stops_from_another_thread(tmp_path):
    server = _server()
    client = reverb.Client(f"localhost:{server.port}")
    none = launcher.LocalCollectors(
        num_collectors=0, address="unused", config_path="unused", root_dir=str(tmp_path),
        print_fn=print, seed=None, max_restarts=0, restart_window_secs=1.0, stop_grace_secs=1.0)
    # 8 samples per iteration, none in flight; min_diff = 2 x 10 - 20 = 0.
    train_step = tf.Variable(30, dtype=tf.int64)
    feed = ReplayFeed(client, 8, 0, none, train_step=train_step)
    feed.check_schedule()
    feed.start()
    try:
        result = []
        waiting = threading.Thread(target=lambda: result.append(feed.run_async()))
        waiting.start()
        for i in range(9):
            client.insert({"x": np.float32(i)}, {REPLAY_TABLE: 1.0})
        for report in ({"collector": 0, "episodes": 2, "env_steps": 30, "average_return": 10.0,
                        "average_length": 15.0, "policy_step": 24},
                       {"collector": 1, "episodes": 1, "env_steps": 20, "average_return": 20.0,
                        "average_length": 25.0, "policy_step": 30}):
            client.insert({k: np.asarray(v, collector.STATS_SIGNATURE[k].dtype.as_numpy_dtype)
                           for k, v in report.items()}, {collector.STATS_TABLE: 1.0})
        waiting.join(0.5)
        assert waiting.is_alive()  # 9 items: below min_size 10
        client.insert({"x": np.float32(9)}, {REPLAY_TABLE: 1.0})  # 10 x 2 - 8 >= 0
        waiting.join(5)
        assert result == [50]
        values = {m.name: float(m.result()) for m in feed.get_metrics()}
        assert values == {"NumberOfEpisodes": 3.0, "EnvironmentSteps": 50.0,
                          "AverageReturn": 15.0, "AverageEpisodeLength": 20.0}
        # Each collector's variables were this many train steps behind when read.
        assert feed.variable_ages() == {0: 6, 1: 0}
        health = feed.health().scalars(1)
        assert (health["Collectors/variable_age"], health["Collectors/variable_age_max"]) == (3, 6)
        # Nothing sampled, so the next call is ready too (returns 0 new steps).
        assert feed.run_async() == 0
        list(client.sample(REPLAY_TABLE, num_samples=16))  # 10 x 2 - 16 - 8 < 0: not ready
        errors = []

        def wait_then_fail():
            try:
                feed.run_async()
            except DriverStoppedError as e:
                errors.append(e)

        waiting = threading.Thread(target=wait_then_fail)
        waiting.start()
        time.sleep(0.3)
        stopped_at = time.monotonic()
        feed.stop()
        waiting.join(5)
        assert len(errors) == 1 and time.monotonic() - stopped_at < 1.0
    finally:
        feed.stop()
        server.stop()


@pytest.mark.timeout(60)
def test_a_collector_that_keeps_dying_spends_its_budget_and_raises(tmp_path):
    lines = []
    # A config file that does not exist: the collector exits 2 at once.
    collectors = launcher.LocalCollectors(
        num_collectors=1, address="localhost:1", config_path=str(tmp_path / "missing.gin"),
        root_dir=str(tmp_path), print_fn=lines.append, seed=None, max_restarts=2,
        restart_window_secs=600.0, stop_grace_secs=2.0)
    collectors.start()
    try:
        deadline = time.monotonic() + 40
        error = None
        while error is None and time.monotonic() < deadline:
            try:
                collectors.check()
            except launcher.CollectorCrashError as e:
                error = e
            time.sleep(0.1)
        assert error is not None, lines
        assert str(error) == ("collector 0: its process died (exit code 2) and was already "
                              "restarted 2 times in the last 600 s (max_restarts=2); giving up")
        assert collectors.restarts == 2
        restarts = [l for l in lines if "restarted as pid" in l]
        assert len(restarts) == 2 and all(re.fullmatch(
            r"\[alf_async\] collector 0 \(pid \d+\) died \(exit code 2\); restarted as pid \d+ "
            r"\(restart [12]\)", l) for l in restarts)
        assert lines[-1] == f"[alf_async] {error}"
        log = open(tmp_path / "collectors" / "0" / "log.txt").read()
        assert log.count("=== ") == 3 and log.count("gin file not found") == 3
    finally:
        collectors.stop()
    assert collectors.pids() == [None]


COLLECT_GIN = """
collect/Task.env_name = 'CartPole-v0'
collect/Task.agent_fn = @dqn_agent
collect/Layout.env_threads = 1
collect/Layout.rows_per_env_thread = 2
collect.unroll_length = 4
collect.variable_update_interval = 0.5
dqn_agent.fc_layer_params = (16,)
DqnAgent.n_step_update = 1
"""


@pytest.mark.timeout(120)
def test_ray_collectors_write_get_restarted_when_killed_and_stop(tmp_path):
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from tf_agents.experimental.distributed import reverb_variable_container
    from alf_async.learning import agents
    from alf_async.environments.processes import ray_env
    from alf_async.environments import suites
    gin.parse_config(COLLECT_GIN)
    env = suites.load("suite_gym", "CartPole-v0", batch_size=1)
    step = tf.Variable(3, dtype=tf.int64)
    agent = agents.dqn_agent(env.time_step_spec(), env.action_spec(), step)
    env.close()
    variables = collector.policy_variables(agent.collect_policy, step)
    server = reverb.Server([
        replay_table(agent.collect_data_spec, 2, samples_per_insert=1.0, min_size=1,
                     error_buffer=10.0 ** 6), collector.variable_table(variables),
        collector.stats_table()])
    address = f"localhost:{server.port}"
    reverb_variable_container.ReverbVariableContainer(
        address, table_names=[collector.VARIABLE_TABLE]).push(variables, collector.VARIABLE_TABLE)
    config = tmp_path / "collector_config.gin"
    config.write_text(COLLECT_GIN)
    client = reverb.Client(address)
    lines = []
    collectors = launcher.launch_collectors(
        "ray", 1, address, str(config), str(tmp_path), print_fn=lines.append, max_restarts=1,
        stop_grace_secs=5.0, ray_num_cpus=2)

    def wait_for_items(more_than, timeout):
        deadline = time.monotonic() + timeout
        while client.server_info()[REPLAY_TABLE].current_size <= more_than:
            collectors.check()
            assert time.monotonic() < deadline, (lines, more_than)
            time.sleep(0.2)
        return client.server_info()[REPLAY_TABLE].current_size

    try:
        collectors.start()
        size = wait_for_items(10, 60)
        actor = collectors.actors()[0]
        ray.kill(actor)
        deadline = time.monotonic() + 10
        while not lines:
            assert time.monotonic() < deadline, "no restart within 10 s"
            time.sleep(0.1)
        assert re.fullmatch(r"\[alf_async\] collector 0 \(actor \w+\) died \(\w+\); restarted "
                            r"as actor \w+ \(restart 1\)", lines[0]), lines
        assert collectors.restarts == 1
        wait_for_items(size + 10, 60)
        collectors.check()
    finally:
        collectors.stop()
        server.stop()
        stopped_ray = not ray.is_initialized()
        ray_env.shutdown()
    assert stopped_ray  # the launcher started Ray, so it stopped it (and its actors)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bindings, message", [
    (["Task.replayer_fn = @UniformReplayer"],
     "Collectors.count > 0 needs Task.replayer_fn = @ReverbReplayer (collectors write to "
     "the learner's Reverb server)"),
    (["replay_table.min_size = 100", "replay_table.error_buffer = 100.0"],
     "replay_table's error_buffer 100 is too small for one iteration: the learner needs 320 "
     "samples (train_steps_per_iteration x sample_batch_size + "
     "ReverbReplayer.max_in_flight_samples_per_worker) within twice the error buffer; set "
     "replay_table.error_buffer >= 162 or lower Schedule.train_steps_per_iteration"),
])
def test_a_learner_that_cannot_work_is_a_config_error_before_any_collector(
        tmp_path, bindings, message):
    from alf_async.distributed import learner_role
    from alf_async import trainer
    from alf_async.bin.train import parse_gin
    del learner_role  # registers its knobs
    parse_gin([DISTRIBUTED_GIN], ["dqn_agent.fc_layer_params = (16,)"] + bindings)
    with pytest.raises(trainer.ConfigError) as raised:
        trainer.train(str(tmp_path), print_fn=lambda line: None)
    assert trainer.one_line(raised.value) == message  # what the CLI prints
    assert not os.path.exists(tmp_path / "replay_address")
    assert not os.path.exists(tmp_path / "collectors")
