"""ExternalEnv: exact experience on tiny scripted episodes, every error, timeouts, stop.

The scripted episodes have 3 actions and an end, i.e. exactly 4 transitions
(FIRST, MID, MID, LAST->FIRST boundary); with one slot and unroll_length 4,
learner batch k is episode k, and the last episode's unroll never completes
(its boundary needs a next episode), so every count below is exact.
"""

import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.policies import tf_policy
from tf_agents.specs import array_spec
from tf_agents.trajectories import policy_step

from alf_async import AsyncOffPolicyDriver
from alf_async.environments.external import external_env
from alf_async.driver.metrics import by_name
from alf_async.environments import (ExternalEnv, ExternalEnvFinished, ExternalEnvStoppedError,
                                   TooManyEpisodesError)
from alf_async.environments.external.external_env import specs_from_gym

pytestmark = pytest.mark.timeout(60)

OBS_SPEC = array_spec.BoundedArraySpec((2,), np.int32, 0, 1000, name="observation")
ACTION_SPEC = array_spec.BoundedArraySpec((), np.int32, 0, 999, name="action")
OUR_THREADS = ("external_env", "policy_server", "offline")
SMALL_ACTION_SPEC = array_spec.BoundedArraySpec((), np.int32, 0, 3)
DICT_OBS_SPEC = {"pos": array_spec.BoundedArraySpec((2,), np.float32, -1, 1),
                 "count": array_spec.ArraySpec((), np.int32)}


@pytest.fixture(autouse=True)
def no_external_env_threads_left():
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = [t.name for t in threading.enumerate() if t.name.startswith(OUR_THREADS)]
        if not left:
            break
        time.sleep(0.05)
    assert not left, f"threads still alive after the test: {left}"
    assert not external_env.open_slots(), "slots left open (not closed by driver.stop())"


def policy_action(e, s, offset=0):
    """What ObsPolicy does for observation [e, s]."""
    return (10 * e + s + offset) % 1000


class ObsPolicy(tf_policy.TFPolicy):
    """action = (10 * obs[0] + obs[1] + offset) % 1000; `offset` is a variable."""

    def __init__(self, time_step_spec, action_spec):
        self.offset = tf.Variable(0, dtype=tf.int32, name="offset")
        super().__init__(time_step_spec, action_spec)

    def _variables(self):
        return [self.offset]

    def _action(self, time_step, policy_state, seed):
        obs = time_step.observation
        action = tf.math.floormod(obs[..., 0] * 10 + obs[..., 1] + self.offset, 1000)
        return policy_step.PolicyStep(action, policy_state, ())

    def _distribution(self, time_step, policy_state):
        raise NotImplementedError


class ScriptedEnv(ExternalEnv):
    """Plays `episodes` in run(): each a function(env, episode_index) of episode calls."""

    def __init__(self, episodes, hold=False, **kwargs):
        kwargs.setdefault("action_timeout", 30.0)
        super().__init__(ACTION_SPEC, OBS_SPEC, **kwargs)
        self._episodes = episodes
        self._hold = hold
        self.actions = []   # what get_action returned, in order

    def run(self):
        for e, play in enumerate(self._episodes):
            play(self, e)
        if self._hold:   # other threads play: run() must not end the data
            self.wait_stopped()


def three_steps(logged=(), training_enabled=True, rewards=(0.5, 1.5, (1.0, 2.0))):
    """An episode [e, 0] .. [e, 3]; steps in `logged` use log_action (900 + 10e + s)."""

    def play(env, e):
        eid = env.start_episode(f"ep{e}", training_enabled=training_enabled)
        for s in range(3):
            if s in logged:
                env.log_action(eid, [e, s], 900 + 10 * e + s)
            else:
                env.actions.append(int(env.get_action(eid, np.array([e, s]))))
            r = rewards[s]
            for part in (r if isinstance(r, tuple) else (r,)):
                env.log_returns(eid, part)
        env.end_episode(eid, [e, 3])

    return play


def make_driver(ext, policy=None, num_envs=1, unroll_length=4, slots_per_env=1, **kwargs):
    policy = policy or ObsPolicy(ext.time_step_spec(), ext.action_spec())
    kwargs.setdefault("stop_grace_period_secs", 1.0)
    return AsyncOffPolicyDriver(ext.env_constructor(slots_per_env=slots_per_env), policy,
                                num_envs=num_envs, unroll_length=unroll_length, **kwargs)


def numpy(nest):
    return tf.nest.map_structure(lambda t: np.asarray(t), nest)


def learn_all(ext, max_batches=50, **driver_kwargs):
    """Runs a driver over `ext` and takes its learner batches
    (`get_training_exps()`, nothing else wired) until ext's data ends.

    Returns (driver, learner batches).
    """
    driver = make_driver(ext, **driver_kwargs)
    driver.start()
    batches = []
    try:
        with pytest.raises(ExternalEnvFinished):
            for _ in range(max_batches):
                exp, _, _ = driver.get_training_exps()
                batches.append(numpy(exp))
    finally:
        driver.stop()
        ext.join(5)
    return driver, batches


def metric_results(driver):
    """{name: value} of the driver's metrics."""
    return {name: m.result().numpy() for name, m in by_name(driver.get_metrics()).items()}


def run_scripted(episodes, observers=(), **ext_kwargs):
    ext = ScriptedEnv(episodes, **ext_kwargs)
    seen = []   # what the log thread's observers (and the metrics) got
    driver, batches = learn_all(ext, observers=[lambda t: seen.append(numpy(t))] +
                                list(observers))
    return ext, batches, seen, metric_results(driver)


# ----------------------------------------------------------- with a driver


def test_logged_actions_not_the_policys_reach_the_learner_exactly():
    ext, batches, seen, metrics = run_scripted([three_steps(logged=(1,)) for _ in range(4)])
    assert len(batches) == 3   # episode 3's boundary never comes
    for e, exp in enumerate(batches):
        np.testing.assert_array_equal(exp.observation[0], [[e, 0], [e, 1], [e, 2], [e, 3]])
        np.testing.assert_array_equal(exp.step_type[0], [0, 1, 1, 2])
        np.testing.assert_array_equal(exp.next_step_type[0], [1, 1, 2, 0])
        np.testing.assert_array_equal(exp.reward[0], [0.5, 1.5, 3.0, 0.0])  # 1 + 2 add up
        np.testing.assert_array_equal(exp.discount[0], [1, 1, 0, 1])
        # The logged action, not the policy's, at step 1.
        np.testing.assert_array_equal(
            exp.action[0], [policy_action(e, 0), 900 + 10 * e + 1, policy_action(e, 2),
                            policy_action(e, 3)])
    # The log thread's trajectories hold the logged actions too.
    assert [u.action[0].tolist() for u in seen[:3]] == [b.action[0].tolist() for b in batches]
    # get_action returned the policy's actions to the client.
    assert ext.actions == [policy_action(e, s) for e in range(4) for s in (0, 2)]
    assert metrics == dict(NumberOfEpisodes=3, EnvironmentSteps=9, AverageReturn=5.0,
                           AverageEpisodeLength=3.0)


def test_training_disabled_episodes_are_counted_but_never_reach_the_learner():
    ext, batches, seen, metrics = run_scripted(
        [three_steps(training_enabled=e % 2 == 0) for e in range(5)])
    assert len(batches) == 4
    learned = np.concatenate([exp.observation[0] for exp in batches])
    assert set(learned[:, 0].tolist()) == {0, 2}   # episodes 1 and 3: nothing but zeros
    for e in (1, 3):
        exp = batches[e]
        np.testing.assert_array_equal(exp.observation[0], np.zeros((4, 2)))
        np.testing.assert_array_equal(exp.step_type[0], [2, 2, 2, 2])   # inert boundaries
        np.testing.assert_array_equal(exp.next_step_type[0], [0, 0, 0, 0])
        np.testing.assert_array_equal(exp.reward[0], [0, 0, 0, 0])
        np.testing.assert_array_equal(exp.discount[0], [1, 1, 1, 1])
        np.testing.assert_array_equal(exp.action[0], [0, 0, 0, 0])
    for e in (0, 2):
        np.testing.assert_array_equal(batches[e].observation[0], [[e, s] for s in range(4)])
        np.testing.assert_array_equal(batches[e].step_type[0], [0, 1, 1, 2])
        np.testing.assert_array_equal(batches[e].reward[0], [0.5, 1.5, 3.0, 0.0])
    # Acted on, and counted: the log thread's observers and the metrics saw
    # all four episodes as they happened.
    assert sorted({int(u.observation[0, 0, 0]) for u in seen}) == [0, 1, 2, 3]
    np.testing.assert_array_equal(seen[1].observation[0], [[1, s] for s in range(4)])
    np.testing.assert_array_equal(seen[1].step_type[0], [0, 1, 1, 2])
    assert ext.actions == [policy_action(e, s) for e in range(5) for s in (0, 1, 2)]
    assert metrics == dict(NumberOfEpisodes=4, EnvironmentSteps=12, AverageReturn=5.0,
                           AverageEpisodeLength=3.0)


@pytest.mark.parametrize("slots_per_env", [1, 3])   # 3: rows of one env (test_batched_slots)
def test_exception_in_run_stops_the_driver_and_is_raised_in_the_learner(slots_per_env):

    def fail(env, e):
        raise KeyError("boom in run()")

    ext = ScriptedEnv([three_steps(), three_steps(), fail])
    driver = make_driver(ext, slots_per_env=slots_per_env)
    driver.start()
    try:
        with pytest.raises(KeyError, match="boom in run"):
            for _ in range(10):
                driver.get_training_exps()
    finally:
        driver.stop()
        ext.join(5)
    with pytest.raises(ExternalEnvStoppedError):   # and the env is stopped for everyone
        ext.start_episode()


class BlockedClients(object):
    """Client threads "a", "b" (get_action) and "c" (log_action) playing one
    episode each of up to 100 steps against `ext`, counting their calls."""

    def __init__(self, ext):
        self.ext = ext
        self.errors, self.calls, self.threads = {}, {"a": 0, "b": 0, "c": 0}, []

    def start(self, name):
        self.threads.append(threading.Thread(target=self._client, args=(name, name == "c")))
        self.threads[-1].start()

    def _client(self, name, logged):
        try:
            eid = self.ext.start_episode(name)
            for s in range(100):
                if logged:
                    self.ext.log_action(eid, [1, s], 3)
                else:
                    self.ext.get_action(eid, [0, s])
                self.calls[name] += 1
        except Exception as e:  # pylint: disable=broad-except
            self.errors[name] = (e, time.monotonic())

    def wait_for(self, name, calls, seconds=20):
        deadline = time.monotonic() + seconds
        while self.calls[name] < calls and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop_driver_and_check_every_call_woke(self, driver):
        start = time.monotonic()
        driver.stop()
        stopped = time.monotonic()
        for t in self.threads:
            t.join(5)
        assert stopped - start < 2.0
        assert sorted(self.errors) == ["a", "b", "c"]
        for e, when in self.errors.values():
            assert isinstance(e, ExternalEnvStoppedError)
            assert "the driver closed its environments" in str(e)
            assert when - stopped < 0.5
        self.ext.join(5)


def test_stopping_the_driver_wakes_every_blocked_call():
    """A learner that never consumes stalls the slot: clients block in get_action
    (bound episode), get_action (waiting for a slot) and log_action (queue full)."""
    ext = ScriptedEnv([], hold=True, max_pending_steps=2)
    driver = make_driver(ext, unroll_length=2)
    clients = BlockedClients(ext)
    driver.start()
    clients.start("a")
    clients.wait_for("a", 4)   # two unrolls of 2: one in the learn queue, one blocked
    clients.start("b")
    clients.start("c")
    time.sleep(0.5)
    assert clients.calls == {"a": 4, "b": 0, "c": 2} and not clients.errors
    clients.stop_driver_and_check_every_call_woke(driver)


# --------------------------------------------------------- without a driver


class IdleEnv(ExternalEnv):

    def __init__(self, **kwargs):
        super().__init__(ACTION_SPEC, OBS_SPEC, **kwargs)


def test_episode_id_errors_name_the_id():
    ext = IdleEnv()
    assert ext.start_episode("a") == "a"
    generated = ext.start_episode()
    assert isinstance(generated, str) and len(generated) == 32
    with pytest.raises(ValueError, match=r"^episode 'a' is already started$"):
        ext.start_episode("a")
    with pytest.raises(ValueError, match=r"^episode 'zz' is unknown: call start_episode\(\) "):
        ext.get_action("zz", [0, 0])
    for call in (lambda: ext.log_action("zz", [0, 0], 1), lambda: ext.log_returns("zz", 1.0),
                 lambda: ext.end_episode("zz", [0, 0])):
        with pytest.raises(ValueError, match="'zz' is unknown"):
            call()
    ext.end_episode("a", [0, 0])   # no action: finished, no experience
    with pytest.raises(ValueError, match=r"^episode 'a' has already finished \(ended before "):
        ext.get_action("a", [0, 0])
    with pytest.raises(ValueError, match=r"episode 'a' has already finished .* cannot be reused"):
        ext.start_episode("a")
    with pytest.raises(TypeError, match="episode_id must be a str"):
        ext.start_episode(7)
    ext.stop()


def test_max_concurrent_refuses_and_leaves_open_episodes_alone():
    ext = IdleEnv(max_concurrent=2)
    a, b = ext.start_episode("a"), ext.start_episode("b")
    ext.log_action(a, [1, 1], 5)
    with pytest.raises(TooManyEpisodesError,
                       match=r"cannot start episode 'c': 2 episodes are open and "
                             r"max_concurrent is 2"):
        ext.start_episode("c")
    assert ext.num_open_episodes == 2
    ext.log_returns(a, 1.0)                  # both still usable
    ext.log_action(b, [2, 2], 6)
    ext.stop()


@pytest.mark.parametrize("observation, message", [
    ({"pos": [0, 0, 0], "count": 1}, "observation['pos']: expected shape (2,), got (3,)"),
    ({"pos": [0.5, 2.0], "count": 1},
     "observation['pos']: out of bounds: expected values in [-1.0, 1.0], got 2.0 at index (1,)"),
    ({"pos": [0.5, float("nan")], "count": 1}, "observation['pos']: out of bounds"),
    ({"pos": [0, 0], "count": 1.5},
     "observation['count']: expected dtype int32, got float64 (which does not convert"),
    ({"pos": [0, 0], "count": "x"}, "observation['count']: expected dtype int32, got <U1"),
    ({"pos": [0, 0]}, "observation: expected a dict with keys ['count', 'pos'], got ['pos']"),
    ([0, 0], "observation: expected a dict with keys ['count', 'pos'], got list"),
    ({"pos": [[0], [0, 1]], "count": 1}, "observation['pos']: expected an array of shape (2,)"),
])
def test_observations_that_do_not_match_the_spec_are_refused_and_not_queued(observation,
                                                                          message):
    ext = ExternalEnv(SMALL_ACTION_SPEC, DICT_OBS_SPEC)
    eid = ext.start_episode()
    for call in (lambda: ext.get_action(eid, observation),
                 lambda: ext.log_action(eid, observation, 1),
                 lambda: ext.end_episode(eid, observation)):
        with pytest.raises(ValueError) as info:
            call()
        assert str(info.value).startswith(message), str(info.value)
    # Nothing was queued: the episode still has no action.
    with pytest.raises(ValueError, match="before its first action"):
        ext.log_returns(eid, 1.0)
    ext.stop()


def test_actions_and_rewards_that_do_not_match_are_refused():
    ext = IdleEnv()
    eid = ext.start_episode()
    with pytest.raises(ValueError, match=r"^action: out of bounds: expected values in "
                                         r"\[0, 999\], got 1000 at index \(\)$"):
        ext.log_action(eid, [0, 0], 1000)
    with pytest.raises(ValueError, match=r"^action: expected shape \(\), got \(2,\)$"):
        ext.log_action(eid, [0, 0], [1, 2])
    with pytest.raises(ValueError, match=r"^action: expected dtype int32, got float64"):
        ext.log_action(eid, [0, 0], 1.5)
    with pytest.raises(ValueError, match=r"^observation: values 0\.\.5000000000 do not fit"):
        ext.log_action(eid, [0, 5_000_000_000], 1)
    with pytest.raises(ValueError, match="before its first action"):
        ext.log_returns(eid, 1.0)
    ext.log_action(eid, [0, 0], 1)
    with pytest.raises(ValueError, match=r"^reward: expected a finite number, got inf$"):
        ext.log_returns(eid, float("inf"))
    with pytest.raises(ValueError, match=r"^reward: expected a number, got 'x'"):
        ext.log_returns(eid, "x")
    ext.stop()


def test_get_action_times_out_and_closes_the_episode():
    ext = IdleEnv(action_timeout=0.2)   # no driver: nobody ever acts
    eid = ext.start_episode("slow")
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"get_action for episode 'slow': no answer within "
                                           r"the timeout .*; the episode was closed"):
        ext.get_action(eid, [0, 0])
    assert 0.2 <= time.monotonic() - start < 1.5
    with pytest.raises(ValueError, match=r"episode 'slow' has already finished \(get_action "
                                         r"got no answer within its timeout\)"):
        ext.get_action(eid, [0, 1])
    other = ext.start_episode()
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        ext.get_action(other, [0, 0], timeout=0.05)   # per call
    assert time.monotonic() - start < 1.0
    assert ext.num_open_episodes == 0
    ext.stop()


def test_stop_wakes_calls_blocked_without_a_driver():
    ext = IdleEnv()
    eid = ext.start_episode()
    caught = []

    def blocked():
        try:
            ext.get_action(eid, [0, 0])
        except ExternalEnvStoppedError as e:
            caught.append((e, time.monotonic()))

    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.2)
    stopped = time.monotonic()
    ext.stop()
    t.join(5)
    assert caught and caught[0][1] - stopped < 0.5
    assert "stop() was called" in str(caught[0][0])
    with pytest.raises(ExternalEnvStoppedError):
        ext.start_episode()


def test_more_waiting_slots_than_tf_inter_op_threads_do_not_deadlock():
    # Six slots, one client playing its episodes one after another: five slots
    # always wait. Stepped inside the graph, each waiting slot held one of TF's
    # inter-op threads (2 on a 2-core machine) and the driver deadlocked; the
    # driver now steps blocking_step environments off that pool.
    ext = ScriptedEnv([three_steps() for _ in range(7)])
    driver, batches = learn_all(ext, max_batches=100, num_envs=6, unroll_length=1)
    # unroll_length 1: each episode's 3 in-episode transitions complete on
    # their own (a boundary waits for the next episode on the same slot).
    learned = [exp.observation[0, 0].tolist() for exp in batches
               if exp.step_type[0, 0] != 2]
    assert sorted(learned) == [[e, s] for e in range(7) for s in range(3)]
    assert metric_results(driver)["NumberOfEpisodes"] == 7
    assert metric_results(driver)["EnvironmentSteps"] == 21


def test_the_named_import_path():
    from alf_async.environments import ExternalEnv as Named  # pylint: disable=import-outside-toplevel
    assert Named is ExternalEnv

def test_gym_spaces_convert_to_specs():
    import gym  # pylint: disable=import-outside-toplevel
    action_spec, observation_spec = specs_from_gym(
        gym.spaces.Discrete(3), gym.spaces.Box(-1.0, 1.0, (4,), np.float32))
    assert (action_spec.dtype, action_spec.shape, int(action_spec.maximum)) == (np.int64, (), 2)
    assert observation_spec.shape == (4,) and observation_spec.dtype == np.float32
    ext = ExternalEnv(gym.spaces.Discrete(3), gym.spaces.Box(-1.0, 1.0, (4,), np.float32))
    assert ext.action_array_spec == action_spec
    ext.stop()
