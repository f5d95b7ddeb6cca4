"""alf-async-collect as a real process against a real Reverb server: it
writes windows, pulls the variables, stops on SIGINT; an unreachable server
is retried, then one line and exit 1; so is a server that goes away."""

import os
import signal
import subprocess
import sys
import time

import gin
import numpy as np
import pytest
import tensorflow as tf
from tf_agents.trajectories.time_step import StepType

reverb = pytest.importorskip("reverb")

from alf_async.learning import agents  # noqa: E402

from alf_async import settings  # noqa: E402
from alf_async.distributed import collector  # noqa: E402
from alf_async.environments import suites  # noqa: E402
from alf_async.distributed.reverb_replayer import REPLAY_TABLE, replay_table  # noqa: E402

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
COLLECT_GIN = """
collect/Task.env_name = 'CartPole-v0'
collect/Task.agent_fn = @dqn_agent
collect.sequence_length = 2
collect/Layout.env_threads = 1
collect/Layout.rows_per_env_thread = 2
collect.unroll_length = 4
collect.variable_update_interval = 0.5
dqn_agent.fc_layer_params = (16,)
DqnAgent.n_step_update = 1
"""


@pytest.fixture(autouse=True)
def _clear_gin():
    yield
    gin.clear_config()


def run_collect(tmp_path, address, *params):
    path = tmp_path / "collect.gin"
    path.write_text(COLLECT_GIN)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    args = [sys.executable, "-m", "alf_async.bin.collect", "--replay_address", address,
            "--gin_file", str(path)]
    for p in params:
        args += ["--gin_param", p]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=str(tmp_path))


def start_server(with_stats=False):
    """A learner's tables (variables pushed, train step 7) on a new server."""
    gin.parse_config(COLLECT_GIN)
    env = suites.load("suite_gym", "CartPole-v0", batch_size=1)
    step = tf.Variable(7, dtype=tf.int64)
    agent = agents.dqn_agent(env.time_step_spec(), env.action_spec(), step)
    env.close()
    variables = collector.policy_variables(agent.collect_policy, step)
    # Nobody samples here: an error buffer of 1,000 would block the
    # collector's inserts (and with them its variable pulls and stats
    # reports) once it wrote ~1,000 windows, which a fast start reaches
    # before its first report.
    tables = [replay_table(agent.collect_data_spec, 2, samples_per_insert=1.0, min_size=1,
                           error_buffer=1e7), collector.variable_table(variables)]
    server = reverb.Server(tables + ([collector.stats_table()] if with_stats else []))
    address = f"localhost:{server.port}"
    from tf_agents.experimental.distributed import reverb_variable_container
    reverb_variable_container.ReverbVariableContainer(
        address, table_names=[collector.VARIABLE_TABLE]).push(variables, collector.VARIABLE_TABLE)
    gin.clear_config()
    return server, address


@pytest.mark.timeout(90)
def test_collector_writes_windows_and_pulls_variables(tmp_path):
    server, address = start_server()
    client = reverb.Client(address)
    process = run_collect(tmp_path, address)
    try:
        deadline = time.monotonic() + 60
        # 20 windows written and a second variable pull served (a pull is a
        # sample of the variable table).
        while client.server_info()[REPLAY_TABLE].current_size < 20 or client.server_info()[
                collector.VARIABLE_TABLE].rate_limiter_info.sample_stats.completed < 2:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the collector wrote or pulled too little in 60 s"
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    last = out.strip().splitlines()[-1]
    assert last.startswith("[alf_async collector] stopped (stop_event)"), out
    assert last.endswith("(learner train step 7)")
    pulls = int(last.split(" variable pulls")[0].rsplit(" ", 1)[1])
    assert pulls >= 2
    # Every window is 2 consecutive steps of one env: the first's next step
    # is the second's. Within an episode CartPole's Euler step moves the
    # cart and the pole by tau = 0.02 times their velocities, whatever the
    # action (a step of another env would not); after the episode's last
    # step comes the first of the next.
    windows = list(client.sample(REPLAY_TABLE, num_samples=40, emit_timesteps=False,
                                 unpack_as_table_signature=True))
    assert len(windows) == 40
    within = 0
    for sample in windows:
        data = tf.nest.map_structure(np.asarray, sample.data)
        assert data.observation.shape == (2, 4)
        assert data.next_step_type[0] == data.step_type[1], data
        if data.step_type[0] == StepType.LAST:
            assert data.step_type[1] == StepType.FIRST, data
            continue
        within += 1
        (x, x_dot, theta, theta_dot), (next_x, _, next_theta, _) = data.observation
        np.testing.assert_allclose([next_x, next_theta],
                                   [x + 0.02 * x_dot, theta + 0.02 * theta_dot], atol=1e-5)
    assert within > 0
    server.stop()


@pytest.mark.timeout(60)
def test_unreachable_server_is_retried_then_one_line_and_exit_1(tmp_path):
    import portpicker
    port = portpicker.pick_unused_port()
    process = run_collect(tmp_path, f"localhost:{port}", "collect.connect_deadline_secs = 3")
    out, err = process.communicate(timeout=50)
    assert process.returncode == 1, (out, err)
    retries = [line for line in out.splitlines() if "not reachable" in line]
    assert len(retries) >= 2 and "retrying in" in retries[0]
    errors = [line for line in err.strip().splitlines() if line.startswith("alf-async-collect")]
    assert errors == [errors[0]] and errors[0].startswith(
        f"alf-async-collect: error: no Reverb server at localhost:{port} after 3 s")


@pytest.mark.timeout(90)
def test_a_server_that_goes_away_ends_the_collector_with_one_line_and_exit_1(tmp_path):
    server, address = start_server(with_stats=True)
    client = reverb.Client(address)
    process = run_collect(tmp_path, address, "collect.connect_deadline_secs = 2")
    try:
        deadline = time.monotonic() + 60
        while client.server_info()[collector.STATS_TABLE].current_size < 1:  # a report came
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the collector reported nothing in 60 s"
            time.sleep(0.2)
        server.stop()
        stopped_at = time.monotonic()
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 1, (out, err)
    assert time.monotonic() - stopped_at < 20
    assert f"[alf_async collector] connected to {address}; collecting" in out.splitlines()
    assert [line for line in out.splitlines() if "answer" in line] == [
        f"[alf_async collector] {address} does not answer (outage 1); waiting up to 2 s"]
    errors = [line for line in err.splitlines() if line.startswith("alf-async-collect")]
    assert errors == [f"alf-async-collect: error: lost the learner's server at {address}: no "
                      f"answer for 2 s"]
    assert "Traceback" not in err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("unconfirmed_unrolls", [1, 2])
def test_paced_writes_wait_once_more_than_unconfirmed_unrolls_are_in_flight(
        unconfirmed_unrolls):
    """A queue of 3 items that nobody samples: its inserts wait once it is
    full, and the collector waits once more than `unconfirmed_unrolls`
    unrolls of a row are unconfirmed on top of them."""
    import threading

    import numpy as np

    from alf_async.distributed.reverb_replayer import RowWriters, unroll_table
    spec = {"step": tf.TensorSpec([], tf.int32)}
    server = reverb.Server([unroll_table(spec, 2, max_size=3)])
    address = f"localhost:{server.port}"
    client = reverb.Client(address)
    writers = RowWriters(client, 2, period=1)
    stop_event = threading.Event()
    paced = collector.PacedWrite(writers, 2, stop_event,
                                 collector.ServerWatch(client, address, 60.0),
                                 unconfirmed_unrolls)
    started, returned = [], []

    def write_unrolls():
        for u in range(8):  # unrolls of 2 steps of one row: 1 item, then 2 each
            started.append(u)
            paced({"step": np.arange(2 * u, 2 * u + 2, dtype=np.int32)[None]}, [0])
            returned.append(u)

    writer_thread = threading.Thread(target=write_unrolls)
    try:
        writer_thread.start()
        # 3 items fill the queue (unrolls 0 and 1); then each unroll adds 2
        # unconfirmed ones: unrolls 2 .. 1 + unconfirmed_unrolls pass.
        deadline = time.monotonic() + 30
        while len(started) < 3 + unconfirmed_unrolls or \
                len(returned) < 2 + unconfirmed_unrolls:
            assert time.monotonic() < deadline, (started, returned)
            time.sleep(0.05)
        time.sleep(1.0)  # and the next one waits: it does not return
        assert returned == list(range(2 + unconfirmed_unrolls))
        assert client.server_info()[REPLAY_TABLE].current_size == 3
    finally:
        stop_event.set()  # ends the wait; the rest of the unrolls pass without one
        writer_thread.join(10)
        writers.close()
        server.stop()
    assert not writer_thread.is_alive()
    assert returned == list(range(8))


@pytest.mark.timeout(60)
def test_a_bad_unconfirmed_unrolls_is_refused_before_connecting():
    import portpicker
    port = portpicker.pick_unused_port()  # nothing listens: it must not get that far
    for value in (0, True, 2.0):          # (alf-async-collect: exit 2 with this line)
        with pytest.raises(ValueError, match=rf"^collect.unconfirmed_unrolls must be an int "
                                             rf">= 1, got {value}\n"):
            collector.collect(f"localhost:{port}", None,
                              task=settings.Task(env_name="CartPole-v0",
                                                 agent_fn=agents.dqn_agent),
                              unconfirmed_unrolls=value, connect_deadline_secs=30.0)


@pytest.mark.timeout(60)
def test_a_pull_overlaps_collection_and_is_assigned_once_it_arrives():
    """An empty variable table makes a pull wait (as a slow link does):
    the iterations go on meanwhile, and the first one after the learner
    pushed assigns what was pushed."""
    from tf_agents.experimental.distributed import reverb_variable_container
    variables = {collector.POLICY_KEY: [tf.Variable([0.0, 0.0])],
                 collector.TRAIN_STEP_KEY: tf.Variable(0, dtype=tf.int64)}
    server = reverb.Server([collector.variable_table(variables)])
    address = f"localhost:{server.port}"
    container = reverb_variable_container.ReverbVariableContainer(
        address, table_names=[collector.VARIABLE_TABLE])
    hook = collector.VariablePullHook(container, variables, interval_secs=0.0,
                                      watch=collector.ServerWatch(reverb.Client(address),
                                                                  address, 60.0))
    start = time.monotonic()
    for _ in range(50):   # the first starts the pull; none waits for it
        hook.after_iteration(None, 0, 0)
    assert time.monotonic() - start < 1.0 and hook.pulls == 0
    assert variables[collector.POLICY_KEY][0].numpy().tolist() == [0.0, 0.0]
    pushed = {collector.POLICY_KEY: [tf.Variable([1.5, -2.0])],
              collector.TRAIN_STEP_KEY: tf.Variable(7, dtype=tf.int64)}
    container.push(pushed, collector.VARIABLE_TABLE)
    deadline = time.monotonic() + 30
    while hook.pulls == 0:
        assert time.monotonic() < deadline, "the pull never arrived"
        hook.after_iteration(None, 0, 0)
        time.sleep(0.01)
    assert hook.pulls == 1
    assert variables[collector.POLICY_KEY][0].numpy().tolist() == [1.5, -2.0]
    assert int(variables[collector.TRAIN_STEP_KEY].numpy()) == 7
    # The next iteration (interval 0) starts the next pull, which the table answers at once.
    hook.after_iteration(None, 0, 0)
    hook.end(None, "stop_event")
    assert hook.pulls == 2
    server.stop()
