"""OfflineEnv: logged episodes reach the learner with their logged actions, exactly."""

import numpy as np
import pytest

from alf_async.environments import ExternalEnvFinished
from alf_async.environments.external.offline import (EpisodeLogWriter, LogFormatError, OfflineEnv,
                                                     read_episodes)
from test_external_env import (ACTION_SPEC, OBS_SPEC, learn_all, make_driver,
                               metric_results, no_external_env_threads_left, policy_action)

pytestmark = pytest.mark.timeout(60)
_ = no_external_env_threads_left   # autouse: no feeder or env thread left

A, B, C = 1, 2, 3   # observation[0] of each logged episode


def logged_action(e, s):
    return 500 + 10 * e + s


def write_log(path):
    """Episodes A and B interleaved and terminated (terminal observation [e, 9]);
    C cut short after 3 steps (no done)."""
    with EpisodeLogWriter(path) as log:
        for s in range(3):
            for e in (A, B):
                log.write_step(f"ep{e}", np.array([e, s], np.int32), logged_action(e, s),
                               reward=0.25 * (s + 1), done=s == 2,
                               next_observation=[e, 9] if s == 2 else None)
        for s in range(3):
            log.write_step(f"ep{C}", [C, s], logged_action(C, s), reward=1.0, done=False)


def test_read_episodes_groups_interleaved_lines_in_completion_order(tmp_path):
    path = str(tmp_path / "log.jsonl")
    write_log(path)
    episodes = [(eid, len(steps), terminated) for eid, steps, terminated in
                read_episodes([path])]
    assert episodes == [("ep1", 3, True), ("ep2", 3, True), ("ep3", 3, False)]
    _, steps, _ = next(read_episodes([path]))
    assert [where.rsplit(":", 1)[1] for where, _ in steps] == ["1", "3", "5"]


def test_logged_episodes_reach_the_learner_with_the_logged_actions(tmp_path):
    path = str(tmp_path / "log.jsonl")
    write_log(path)
    ext = OfflineEnv([path], ACTION_SPEC, OBS_SPEC, num_epochs=2, num_workers=1)
    driver, batches = learn_all(ext)
    # 2 epochs x 3 episodes of 4 transitions each; the last one's boundary never comes.
    assert len(batches) == 5
    assert (ext.episodes_fed, ext.steps_fed) == (6, 18)
    for k, exp in enumerate(batches):
        e = (A, B, C)[k % 3]
        if e != C:
            np.testing.assert_array_equal(exp.observation[0], [[e, 0], [e, 1], [e, 2], [e, 9]])
            np.testing.assert_array_equal(exp.step_type[0], [0, 1, 1, 2])
            np.testing.assert_array_equal(exp.reward[0], [0.25, 0.5, 0.75, 0])
            np.testing.assert_array_equal(exp.discount[0], [1, 1, 0, 1])
            # Logged actions; the policy's only on the boundary, which no loss uses.
            np.testing.assert_array_equal(
                exp.action[0], [logged_action(e, 0), logged_action(e, 1),
                                logged_action(e, 2), policy_action(e, 9)])
        else:
            # Cut short: its last transition (outcome unknown) and the made-up
            # end (repeating [C, 2]) are inert boundaries; [C, 2] stays, as
            # the next observation of the transition from [C, 1], the made-up
            # end's is blanked.
            np.testing.assert_array_equal(exp.observation[0], [[C, 0], [C, 1], [C, 2], [0, 0]])
            np.testing.assert_array_equal(exp.step_type[0], [0, 1, 2, 2])
            np.testing.assert_array_equal(exp.next_step_type[0], [1, 1, 0, 0])
            np.testing.assert_array_equal(exp.reward[0], [1, 1, 0, 0])
            np.testing.assert_array_equal(exp.discount[0], [1, 1, 1, 1])
            np.testing.assert_array_equal(exp.action[0], [logged_action(C, 0),
                                                          logged_action(C, 1), 0, 0])
    # C ends as a truncation, counted like any episode.
    assert metric_results(driver)["NumberOfEpisodes"] == 5
    assert metric_results(driver)["EnvironmentSteps"] == 15


@pytest.mark.parametrize("bad_line, message", [
    ("{not json\n", r"log\.jsonl:2: not a JSON object"),
    ('{"episode_id": "x", "observation": [1], "action": 1, "reward": 0, "done": true}\n',
     r"log\.jsonl:2: observation: expected shape \(2,\), got \(1,\)"),
    ('{"episode_id": "x", "observation": [1, 1], "action": 1, "reward": 0}\n',
     r"log\.jsonl:2: missing fields \['done'\]"),
])
def test_a_bad_log_line_stops_the_driver_naming_file_and_line(tmp_path, bad_line, message):
    path = tmp_path / "log.jsonl"
    path.write_text('{"episode_id": "ok", "observation": [1, 1], "action": 1, "reward": 0, '
                    '"done": true}\n' + bad_line)
    ext = OfflineEnv([str(path)], ACTION_SPEC, OBS_SPEC, num_workers=1)
    driver = make_driver(ext)
    driver.start()
    try:
        with pytest.raises(LogFormatError, match=message):
            for _ in range(10):
                driver.get_training_exps()
    finally:
        driver.stop()
        ext.join(5)
    assert not isinstance(LogFormatError("x"), ExternalEnvFinished)


def test_logs_load_straight_into_a_replayer_as_the_driver_would_give_them(tmp_path):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tf_agents.specs import tensor_spec  # pylint: disable=import-outside-toplevel
    from tf_agents.trajectories import trajectory  # pylint: disable=import-outside-toplevel
    from alf_async.environments.external.offline import load_into_replayer  # pylint: disable=import-outside-toplevel
    from alf_async.learning.replayers import UniformReplayer  # pylint: disable=import-outside-toplevel
    path = str(tmp_path / "log.jsonl")
    write_log(path)
    data_spec = trajectory.Trajectory(
        step_type=tf.TensorSpec((), tf.int32), observation=tensor_spec.from_spec(OBS_SPEC),
        action=tensor_spec.from_spec(ACTION_SPEC), policy_info=(),
        next_step_type=tf.TensorSpec((), tf.int32), reward=tf.TensorSpec((), tf.float32),
        discount=tf.TensorSpec((), tf.float32))
    replayer = UniformReplayer(data_spec, num_rows=2, capacity_per_row=16)
    stats = load_into_replayer([path], replayer, data_spec, num_rows=2, chunk_steps=3)
    # A and B: 3 steps + the boundary each; C cut short: its 3 steps, the last inert.
    assert stats == (3, 9, 11)
    assert replayer.num_frames() == 11 and replayer.can_sample(2)
    # What each row receives, in order (chunks of at most 3 steps of one row).
    rows = {0: [], 1: []}

    def record(exp, env_ids):
        assert exp.step_type.shape[0] == 1 and exp.step_type.shape[1] <= 3
        rows[int(env_ids[0])].append(tf.nest.map_structure(lambda t: t.numpy()[0], exp))

    load_into_replayer([path], record, data_spec, num_rows=2, chunk_steps=3)
    row0, row1 = (tf.nest.map_structure(lambda *x: np.concatenate(x), *rows[r]) for r in (0, 1))
    # A, then C on row 0 (the row with fewer steps); B on row 1.
    np.testing.assert_array_equal(row0.observation,
                                  [[A, 0], [A, 1], [A, 2], [A, 9], [C, 0], [C, 1], [C, 2]])
    np.testing.assert_array_equal(row0.step_type, [0, 1, 1, 2, 0, 1, 2])
    np.testing.assert_array_equal(row0.next_step_type, [1, 1, 2, 0, 1, 1, 0])
    np.testing.assert_array_equal(row0.reward, [0.25, 0.5, 0.75, 0, 1, 1, 0])
    np.testing.assert_array_equal(row0.discount, [1, 1, 0, 1, 1, 1, 1])
    np.testing.assert_array_equal(row0.action, [
        logged_action(A, 0), logged_action(A, 1), logged_action(A, 2), 0,
        logged_action(C, 0), logged_action(C, 1), 0])
    np.testing.assert_array_equal(row1.observation, [[B, 0], [B, 1], [B, 2], [B, 9]])
    np.testing.assert_array_equal(row1.step_type, [0, 1, 1, 2])


def test_a_bad_step_in_a_loaded_log_names_file_and_line(tmp_path):
    from alf_async.environments.external.offline import load_into_replayer  # pylint: disable=import-outside-toplevel
    from tf_agents.specs import tensor_spec  # pylint: disable=import-outside-toplevel
    from tf_agents.trajectories import trajectory  # pylint: disable=import-outside-toplevel
    path = tmp_path / "log.jsonl"
    path.write_text('{"episode_id": "x", "observation": [1, 1], "action": 1, "reward": 0, '
                    '"done": false}\n{"episode_id": "x", "observation": [1, 1], '
                    '"action": 5000, "reward": 0, "done": true}\n')
    data_spec = trajectory.Trajectory(
        step_type=None, observation=tensor_spec.from_spec(OBS_SPEC),
        action=tensor_spec.from_spec(ACTION_SPEC), policy_info=(), next_step_type=None,
        reward=None, discount=None)
    with pytest.raises(LogFormatError, match=r"log\.jsonl:2: action: out of bounds"):
        load_into_replayer([str(path)], lambda exp, ids: None, data_spec, num_rows=1)
