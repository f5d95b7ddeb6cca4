"""Unroll agents (PPO) fed by collectors through a Reverb queue of unrolls:
RowWriters with a period write items of T + 1 steps that share one step,
the queue serves each item once in FIFO order and holds inserts while it is
full, the learner CLI trains with collectors and reports the policy lag, a
collector's SIGKILL does not stall it, SIGINT stops everything; settings
that cannot work exit 2 with one line."""

import os
import re
import signal
import subprocess
import sys
import time

import gin
import numpy as np
import pytest
import tensorflow as tf

reverb = pytest.importorskip("reverb")
psutil = pytest.importorskip("psutil")

from alf_async.distributed import learner_role  # noqa: E402
from alf_async.distributed.reverb_replayer import (REPLAY_TABLE, ReverbReplayer,  # noqa: E402
                                                   RowWriters, unroll_table)
from cli_runs import lines_before_progress  # noqa: E402  (tests/ is on sys.path)
from test_distributed import ENV, GIN, PROGRESS, REPO, Learner, _gone  # noqa: E402
from test_trainer import read_scalars  # noqa: E402

pytestmark = pytest.mark.timeout(120)

PPO_GIN = os.path.join(GIN, "ppo_cartpole_distributed.gin")
SPEC = {"env": tf.TensorSpec([], tf.int32), "step": tf.TensorSpec([], tf.int32)}
# Tiny and quick: 2 epochs x 2 minibatches = 4 train steps per batch of
# 2 rows = 2 items of unroll_length 8 + 1 steps.
TINY = [
    "ppo_agent.actor_fc_layer_params = (16,)",
    "ppo_agent.value_fc_layer_params = (16,)",
    "ppo_agent.num_epochs = 2",
    "ppo_agent.num_minibatches = 2",
    "Schedule.unroll_length = 8",
    "Layout.rows_per_env_thread = 2",
    "Schedule.rows_per_batch = 2",
    "unroll_table.max_size = 8",
    "collect/Layout.rows_per_env_thread = 2",
    "collect.unroll_length = 4",
    "collect.variable_update_interval = 0.5",
    "VariablePushHook.interval_secs = 0.25",
    "Evaluation.episodes = 0",
    "Evaluation.stop_at_return = None",
    "Outputs.summary_interval = 4",
    "Outputs.log_interval_secs = 0.5",
]
STEPS_PER_BATCH = 4


@pytest.fixture(autouse=True)
def _clear_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def unroll(env_ids, first_steps, T):
    """exp [N, T]: env = the row's env id, step = that env's step counter."""
    steps = np.asarray(first_steps)[:, None] + np.arange(T)[None, :]
    env = np.broadcast_to(np.asarray(env_ids)[:, None], steps.shape)
    return {"env": env.astype(np.int32), "step": steps.astype(np.int32)}


def drain(client, count):
    """`count` items of the queue, in the order it serves them: (env, steps)."""
    return [(int(s.data["env"][0]), [int(x) for x in s.data["step"]])
            for s in client.sample(REPLAY_TABLE, num_samples=count, emit_timesteps=False,
                                   unpack_as_table_signature=True)]


def wait_for_completed_samples(client, count, timeout=10.0):
    """Waits until the table served `count` samples in all (the dataset
    fetches ahead in the background); returns its info."""
    deadline = time.monotonic() + timeout
    while True:
        info = client.server_info()[REPLAY_TABLE]
        if info.rate_limiter_info.sample_stats.completed >= count:
            return info
        assert time.monotonic() < deadline, info.rate_limiter_info
        time.sleep(0.02)


def test_row_writers_with_period_T_write_items_of_T_plus_1_sharing_one_step():
    server = reverb.Server([unroll_table(SPEC, 4, max_size=100)])
    client = reverb.Client(f"localhost:{server.port}")
    writers = RowWriters(client, 4, period=3)
    try:
        # Rows of any envs, in any order, an env twice in one batch (in order),
        # unrolls of 5 steps cut across the items' boundaries.
        writers.write(unroll([0, 1], [0, 0], 5), [0, 1])
        writers.write(unroll([1, 0, 0], [5, 5, 10], 5), [1, 0, 0])
        writers.write(unroll([1], [10], 2), [1])
        writers.flush(timeout_ms=5000)
        # env 0: 15 steps, env 1: 12 -> an item once 4 are held, then every 3.
        assert client.server_info()[REPLAY_TABLE].current_size == 4 + 3
        items = drain(client, 7)
    finally:
        writers.close()
        server.stop()
    by_env = {}
    for env, steps in items:  # each row's items in its order (FIFO)
        by_env.setdefault(env, []).append(steps)
    assert by_env == {0: [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9], [9, 10, 11, 12]],
                      1: [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]}


def test_the_queue_serves_each_item_once_in_order_and_holds_inserts_while_full():
    spec = {"step": tf.TensorSpec([], tf.int32)}
    server = reverb.Server([unroll_table(spec, 2, max_size=3)])
    address = f"localhost:{server.port}"
    client = reverb.Client(address)
    writers = RowWriters(client, 2, period=1)
    replayer = ReverbReplayer(spec, sequence_length=2, server_address=address,
                              sample_batch_size=2)
    try:
        assert replayer.is_queue and replayer.max_in_flight_samples == 1
        writers.write({"step": np.arange(6, dtype=np.int32)[None]}, [0])  # 5 items
        # The queue holds 3: the 4th insert waits (the writer does not).
        with pytest.raises(reverb.errors.DeadlineExceededError):
            writers.flush(timeout_ms=1000)
        info = client.server_info()[REPLAY_TABLE]
        assert info.current_size == 3 and info.rate_limiter_info.insert_stats.completed == 3
        # A sample is 2 items whatever the learner asks, FIFO; the dataset
        # takes exactly 1 more ahead, which lets the waiting inserts in.
        first = replayer.sample(64)
        assert first["step"].numpy().tolist() == [[0, 1], [1, 2]]
        writers.flush(timeout_ms=5000)
        info = wait_for_completed_samples(client, 3)
        assert info.rate_limiter_info.sample_stats.completed == 3
        assert info.rate_limiter_info.insert_stats.completed == 5
        assert info.current_size == 2
        second = replayer.sample(64)
        assert second["step"].numpy().tolist() == [[2, 3], [3, 4]]
        info = wait_for_completed_samples(client, 5)
        # Each item served once: 5 inserted, 5 sampled, none left.
        assert info.rate_limiter_info.sample_stats.completed == 5
        assert info.current_size == 0
    finally:
        replayer.close()
        writers.close()
        server.stop()


def PpoLearner(root_dir, *params):  # pylint: disable=invalid-name  (a Learner's factory)
    """test_distributed's learner CLI process on ppo_cartpole_distributed.gin."""
    return Learner(root_dir, *params, gin_file=PPO_GIN, base=TINY)


def test_ppo_learner_trains_from_collectors_reports_the_lag_survives_sigkill_and_stops(
        tmp_path):
    learner = PpoLearner(tmp_path)
    started = []
    try:
        announced = learner.wait_for(
            lambda l: re.match(r"\[alf_async\] collectors connect to \S+:(\d+) \(written", l),
            60, "address line")
        learner.wait_for(lambda l: (m := PROGRESS.match(l)) and int(m.group(1)) > 0 and
                         "| policy lag " in l, 60, "training")
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
        table = reverb.Client(f"localhost:{announced.group(1)}").server_info()[REPLAY_TABLE]
        assert (table.max_times_sampled, table.max_size) == (1, 8)
        assert tf.nest.flatten(table.signature)[0].shape[0] == 8 + 1

        os.kill(pids[0], signal.SIGKILL)
        restarted = learner.wait_for(
            lambda l: re.match(rf"\[alf_async\] collector 0 \(pid {pids[0]}\) died \(signal "
                               rf"SIGKILL\); restarted as pid (\d+) \(restart 1\)$", l),
            10, "restart line")
        new_pid = int(restarted.group(1))
        started.append(new_pid)
        assert new_pid in learner.collector_pids()
        step_at_kill = learner.train_step()
        # The other collector's unrolls keep the learner training meanwhile.
        learner.wait_for(lambda l: (m := PROGRESS.match(l)) and
                         int(m.group(1)) >= step_at_kill + 5 * STEPS_PER_BATCH, 30,
                         "training after the kill")

        learner.process.send_signal(signal.SIGINT)
        learner.finish(60)
        assert learner.process.returncode == 0, learner.err[-30:]
        assert not [line for line in learner.err if "Traceback" in line]
        assert all(_gone(pid) for pid in started)
        stopped = re.match(r"\[alf_async\] stopped \(stop_event\) at iteration (\d+), train "
                           r"step (\d+), env steps \d+; checkpoint in ", learner.lines[-1])
        assert stopped, learner.lines[-5:]
        # Every iteration trained on one batch: epochs x minibatches train steps.
        iterations, train_step = int(stopped.group(1)), int(stopped.group(2))
        assert train_step == STEPS_PER_BATCH * iterations
        steps = [int(m.group(1)) for m in map(PROGRESS.match, learner.lines) if m]
        assert all(s % STEPS_PER_BATCH == 0 for s in steps)
        scalars = read_scalars(str(tmp_path / "train"))
        lags = [v for _, v in scalars["Learner/policy_lag"]]
        most = [v for _, v in scalars["Learner/policy_lag_max"]]
        assert lags and len(lags) == len(most)
        assert all(0 <= a <= b for a, b in zip(lags, most))
        assert all(float(b).is_integer() for b in most)
        # Stamped with the train steps the collectors pulled, not 0: the
        # last batch's oldest step was acted after training began.
        last_step, last_most = scalars["Learner/policy_lag_max"][-1]
        assert last_most < last_step
        assert "Losses/policy_gradient_loss" in scalars and "Losses/entropy" not in scalars
        assert scalars["Collectors/restarts"][-1][1] == 1.0
        # The queue is not checkpointed: nothing in root_dir/replay.
        replay = tmp_path / "replay"
        assert not [d for d in (os.listdir(replay) if os.path.isdir(replay) else [])
                    if os.path.exists(replay / d / "DONE")]
    finally:
        learner.kill()
        for pid in started:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_an_unroll_agent_with_collectors_and_no_reverb_replayer_exits_2_with_one_line(
        tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "alf_async.bin.train", "--root_dir", str(tmp_path),
         "--gin_file", PPO_GIN, "--gin_param", "Task.replayer_fn = @OneTimeReplayer"],
        capture_output=True, text=True, timeout=100, env=ENV, cwd=REPO)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        "alf-async-train: error: MinibatchPPOClipAgent trains on each batch of unrolls once: "
        "with Collectors.count > 0 set Task.replayer_fn = @ReverbReplayer (it reads the "
        "learner's Reverb queue of unrolls; got OneTimeReplayer)"]
    assert proc.stdout == ""
    assert not os.path.exists(tmp_path / "collectors")


def test_a_queue_that_cannot_hold_a_batch_is_a_config_error_before_any_collector(tmp_path):
    from alf_async import trainer
    from alf_async.bin.train import parse_gin
    from alf_async.distributed import learner_role
    del learner_role  # registers its knobs
    parse_gin([PPO_GIN], ["ppo_agent.actor_fc_layer_params = (16,)",
                          "ppo_agent.value_fc_layer_params = (16,)",
                          "unroll_table.max_size = 16"])
    with pytest.raises(trainer.ConfigError) as raised:
        trainer.train(str(tmp_path), print_fn=lambda line: None)
    assert trainer.one_line(raised.value) == (
        "unroll_table.max_size 16 is too small for one batch: the learner waits for 17 items "
        "(Schedule.rows_per_batch + "
        "ReverbReplayer.max_in_flight_samples_per_worker); set unroll_table.max_size >= 17")
    assert not os.path.exists(tmp_path / "replay_address")
    assert not os.path.exists(tmp_path / "collectors")


def test_ppo_distributed_config_parses_for_both_roles():
    from alf_async.bin import train as train_cli
    from alf_async.distributed import learner_role  # registers its knobs
    del learner_role
    train_cli.parse_gin([PPO_GIN], [])
    assert gin.query_parameter("Collectors.count") == 2
    assert gin.query_parameter("Task.replayer_fn").configurable.name == "ReverbReplayer"
    assert gin.query_parameter("Task.agent_fn").configurable.name == "ppo_agent"
    # The same rows per batch as ppo_cartpole.gin's 16 envs.
    assert gin.query_parameter("Schedule.rows_per_batch") == 16
    gin.clear_config()
    # The collector's way (alf-async-collect): the learner's train.* skipped.
    gin.parse_config_files_and_bindings([PPO_GIN], [], skip_unknown=True)
    assert gin.query_parameter("collect/Task.agent_fn").configurable.name == "ppo_agent"
    assert gin.query_parameter("collect/Layout.rows_per_env_thread") == 8
