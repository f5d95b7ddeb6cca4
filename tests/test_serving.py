"""PolicyServerEnv + PolicyClient on loopback: remote and local inference, every
refused request (the server keeps serving), a vanished client, stop while blocked."""

import http.client
import json
import threading
import time
import urllib.parse

import numpy as np
import pytest

from alf_async import AsyncOffPolicyDriver
from alf_async.learning.learner import Learner
from alf_async.serving import PolicyClient, PolicyServerEnv, protocol
from test_external_env import (ACTION_SPEC, OBS_SPEC, ObsPolicy, no_external_env_threads_left,
                               numpy, policy_action)
from test_serving_http import Raw, post, server_threads

pytestmark = pytest.mark.timeout(60)
_ = no_external_env_threads_left   # autouse: no server thread (loop, workers) left


class Served(object):
    """A PolicyServerEnv, its driver, and a learner thread taking every batch."""

    def __init__(self, num_envs=1, unroll_length=4, learn=True, export=False, slots_per_env=1,
                 **server_kwargs):
        self.server = PolicyServerEnv(ACTION_SPEC, OBS_SPEC, **server_kwargs)
        self.policy = ObsPolicy(self.server.time_step_spec(), self.server.action_spec())
        if export:   # a second server: the export needs the policy first
            self.server.close()
            self.server = PolicyServerEnv(ACTION_SPEC, OBS_SPEC, policy=self.policy,
                                          **server_kwargs)
        self.batches = []
        try:
            self.driver = AsyncOffPolicyDriver(
                self.server.env_constructor(slots_per_env=slots_per_env), self.policy,
                num_envs=num_envs,
                unroll_length=unroll_length,
                exp_observers=[lambda exp, ids: self.batches.append(numpy(exp))],
                stop_grace_period_secs=1.0)
        except BaseException:
            self.server.close()
            raise
        # A learner without an agent: it takes every batch (for its observer).
        self.learner = Learner(None, self.driver)
        self.thread = threading.Thread(target=self.learner.run, name="learner", daemon=True)
        if learn:
            self.thread.start()   # starts the driver
        else:
            self.driver.start()   # nobody takes the batches

    def stop(self):
        self.learner.stop()
        if self.thread.is_alive():
            self.thread.join(5)
        self.server.close()
        assert server_threads() == []   # close() joined the loop thread and the workers


@pytest.fixture
def served(request):
    kwargs = getattr(request, "param", {})
    s = Served(**kwargs)
    yield s
    s.stop()


def raw(address, method, path, body=None, headers=None, content_length=True):
    parts = urllib.parse.urlsplit(address)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        if content_length:
            conn.request(method, path, body=body, headers=headers or {})
        else:
            conn.putrequest(method, path)
            conn.endheaders()
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    return response.status, json.loads(data) if data else None


def play(client, k, steps=3, get=True):
    eid = client.start_episode()
    actions = []
    for s in range(steps):
        if get:
            actions.append(client.get_action(eid, [k, s]))
        client.log_returns(eid, 1.0)
    client.end_episode(eid, [k, steps])
    return actions


@pytest.mark.parametrize("served", [
    dict(num_envs=2, token="s3cret", max_body_bytes=4096, max_concurrent=3),
    # The same two slots as rows of one env thread's environment.
    dict(num_envs=1, slots_per_env=2, token="s3cret", max_body_bytes=4096, max_concurrent=3),
], indirect=True)
def test_remote_clients_play_at_once_and_every_bad_request_gets_a_4xx(served):
    address = served.server.address
    assert address.startswith("http://127.0.0.1:")
    results = {}

    def client_thread(k):
        with PolicyClient(address, token="s3cret") as client:
            results[k] = [play(client, k) for _ in range(2)]

    threads = [threading.Thread(target=client_thread, args=(k,)) for k in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {k: [[policy_action(k, s) for s in range(3)]] * 2 for k in (1, 2)}

    good = PolicyClient(address, token="s3cret")
    eid = good.start_episode("still-serving")
    auth = {"Authorization": "Bearer s3cret", "Content-Type": "application/json"}

    def still_serving(s):
        assert good.get_action(eid, [5, s]) == policy_action(5, s)

    # 401 without or with a wrong token.
    for token in (None, "wrong"):
        with pytest.raises(protocol.UnauthorizedError, match="Bearer") as info:
            PolicyClient(address, token=token).start_episode()
        assert info.value.status == 401 and isinstance(info.value, PermissionError)
    still_serving(0)
    # Malformed JSON, unknown command, bad arguments: 400 with a JSON error.
    cases = [
        (b"{not json", "BadRequest", "malformed JSON body"),
        (b"[1, 2]", "BadRequest", "a command must be a JSON object"),
        (b'{"command": "rm -rf"}', "BadRequest", "unknown command 'rm -rf'"),
        (b'{"command": "get_action", "episode_id": "x"}', "BadRequest",
         "get_action: missing arguments ['observation']"),
        (b'{"command": "log_returns", "episode_id": "x", "reward": "1"}', "BadRequest",
         "log_returns: reward must be a number"),
        (b'{"command": "get_action", "episode_id": "x", "observation": [NaN, 1]}',
         "BadRequest", "malformed JSON body: NaN is not allowed"),
        (json.dumps({"command": "get_action", "episode_id": eid,
                     "observation": [1, 2, 3]}).encode(), "ValueError",
         "observation: expected shape (2,), got (3,)"),
        (json.dumps({"command": "log_action", "episode_id": eid, "observation": [1, 2],
                     "action": 5000}).encode(), "ValueError",
         "action: out of bounds: expected values in [0, 999], got 5000"),
        (json.dumps({"command": "get_action", "episode_id": "nope",
                     "observation": [1, 2]}).encode(), "ValueError",
         "episode 'nope' is unknown"),
    ]
    for body, type_name, message in cases:
        status, error = raw(address, "POST", protocol.COMMAND_PATH, body, auth)
        assert status == 400, body
        assert error["error"]["type"] == type_name and error["error"]["message"].startswith(
            message), error
    still_serving(1)
    # Oversized body (413), no Content-Length (411), unknown path (404).
    status, error = raw(address, "POST", protocol.COMMAND_PATH, b" " * 5000, auth)
    assert status == 413 and "5000 bytes is over the server's limit of 4096" in str(error)
    status, error = raw(address, "POST", protocol.COMMAND_PATH, content_length=False)
    assert status == 411 and error["error"]["type"] == "LengthRequired"
    status, error = raw(address, "POST", "/admin", b"{}", auth)
    assert status == 404
    still_serving(2)
    # The client raises what the local ExternalEnv would.
    with pytest.raises(ValueError, match=r"observation: expected shape \(2,\), got \(3,\)"):
        good.get_action(eid, [1, 2, 3])
    with pytest.raises(protocol.ServerValueError, match="episode 'nope' is unknown"):
        good.log_returns("nope", 1.0)
    with pytest.raises(protocol.BadRequestError, match="unknown command 'bogus'"):
        good.call("bogus")
    still_serving(3)
    good.end_episode(eid, [5, 4])
    with pytest.raises(ValueError, match="'still-serving' has already finished"):
        good.get_action(eid, [5, 5])
    # Too many open episodes: 429; the open ones are unaffected.
    open_ids = [good.start_episode() for _ in range(3)]
    with pytest.raises(protocol.TooManyEpisodesServerError,
                       match="3 episodes are open and max_concurrent is 3") as info:
        good.start_episode()
    assert info.value.status == 429
    assert good.get_action(open_ids[0], [6, 0]) == policy_action(6, 0)
    good.close()


@pytest.mark.parametrize("served", [dict(num_envs=1, episode_idle_timeout=0.5)],
                         indirect=True)
def test_a_vanished_clients_episode_is_closed_after_the_idle_timeout(served):
    vanished, other = PolicyClient(served.server.address), PolicyClient(served.server.address)
    gone = vanished.start_episode("gone")
    assert vanished.get_action(gone, [1, 0]) == policy_action(1, 0)
    # The only slot holds "gone": the other episode waits until it is closed.
    waiting = other.start_episode("waiting")
    start = time.monotonic()
    assert other.get_action(waiting, [2, 0]) == policy_action(2, 0)
    assert 0.3 < time.monotonic() - start < 5
    other.end_episode(waiting, [2, 1])
    with pytest.raises(protocol.ServerValueError,
                       match=r"episode 'gone' has already finished \(no call for 0.5 s "
                             r"\(episode_idle_timeout\)\)"):
        vanished.get_action(gone, [1, 1])
    vanished.close()
    other.close()


@pytest.mark.parametrize("served, stalls_after", [
    (dict(num_envs=1, learn=False), 8),
    # 2 slots of one env thread: the learn queue holds one learner batch (2
    # unrolls); the thread stalls shipping the next two.
    (dict(num_envs=1, slots_per_env=2, learn=False), 16),
], indirect=["served"])
def test_stopping_the_driver_answers_blocked_clients_and_closes_the_server(served, stalls_after):
    # unroll_length 4 and nobody learning: the slot stalls after two unrolls.
    client = PolicyClient(served.server.address)
    eid = client.start_episode()
    caught, started, done = [], [], []

    def blocked():
        try:
            for s in range(100):
                started.append(s)
                client.get_action(eid, [1, s])
                done.append(s)
        except Exception as e:  # pylint: disable=broad-except
            caught.append((e, time.monotonic()))

    t = threading.Thread(target=blocked)
    t.start()
    # Stalled: the client's next call is under way, its observation ended
    # the unroll the env thread cannot ship (the log thread counted it),
    # and the learn queue is full.
    env_steps = served.driver.get_metrics()[1]
    deadline = time.monotonic() + 20
    while not (len(started) > stalls_after and int(env_steps.result()) == stalls_after and
               served.driver.get_perf_stats()["learn_queue_size"] ==
               served.driver.queues.learn_queue.capacity):
        assert time.monotonic() < deadline and not caught, (started, done, caught)
        time.sleep(0.02)
    time.sleep(0.3)  # and stays so: the call under way does not return
    assert len(done) == stalls_after and len(started) == stalls_after + 1 and not caught
    assert int(env_steps.result()) == stalls_after
    served.driver.stop()
    stopped = time.monotonic()
    t.join(5)
    assert caught and isinstance(caught[0][0], protocol.ServerStoppedError)
    assert caught[0][0].status == 503 and caught[0][1] - stopped < 1.0
    served.server.join(5)
    assert not served.server.is_alive()
    with pytest.raises(ConnectionError):
        PolicyClient(served.server.address, timeout=2).start_episode()
    client.close()


class CountingClient(PolicyClient):
    """A PolicyClient that counts its HTTP requests (round trips)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.requests = 0

    def request(self, *args, **kwargs):
        self.requests += 1
        return super().request(*args, **kwargs)


def wait_for_batches(served, n, seconds=20):
    deadline = time.monotonic() + seconds
    while len(served.batches) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(served.batches) >= n


def test_get_action_with_a_reward_logs_it_and_acts_in_one_round_trip(served):
    client = CountingClient(served.server.address)
    for e in range(2):
        eid = client.start_episode()
        # A reward before the first action is refused as log_returns refuses
        # it, and nothing is queued: the episode starts cleanly after.
        with pytest.raises(protocol.ServerValueError, match="before its first action"):
            client.get_action(eid, [e, 0], reward=9.0)
        with pytest.raises(protocol.BadRequestError, match="reward must be a number"):
            client.call("get_action", episode_id=eid, observation=[e, 0], reward="x")
        assert client.get_action(eid, [e, 0]) == policy_action(e, 0)
        assert client.get_action(eid, [e, 1], reward=0.5) == policy_action(e, 1)
        assert client.get_action(eid, [e, 2], reward=1.5) == policy_action(e, 2)
        client.log_returns(eid, 3.0)
        client.end_episode(eid, [e, 3])
    # Per episode: start, two refusals, three get_action, log_returns, end.
    assert client.requests == 2 * 8
    wait_for_batches(served, 1)
    exp = served.batches[0]
    np.testing.assert_array_equal(exp.observation[0], [[0, 0], [0, 1], [0, 2], [0, 3]])
    np.testing.assert_array_equal(exp.step_type[0], [0, 1, 1, 2])
    np.testing.assert_array_equal(exp.reward[0], [0.5, 1.5, 3.0, 0.0])
    client.close()


def test_local_inference_takes_a_reward_with_get_action_too():
    served = Served(num_envs=1, export=True)
    try:
        client = PolicyClient(served.server.address, inference_mode="local",
                              report_max_events=1000, report_interval=60.0)
        eid = client.start_episode()
        actions = [int(client.get_action(eid, [1, 0]))]
        actions += [int(client.get_action(eid, [1, s], reward=s - 0.5)) for s in (1, 2)]
        client.log_returns(eid, 3.0)
        client.end_episode(eid, [1, 3])
        assert actions == [policy_action(1, s) for s in range(3)]
        play(client, 2)   # its first step completes episode 1's unroll
        client.flush()
        wait_for_batches(served, 1)
        exp = served.batches[0]
        np.testing.assert_array_equal(exp.observation[0], [[1, 0], [1, 1], [1, 2], [1, 3]])
        np.testing.assert_array_equal(exp.reward[0], [0.5, 1.5, 3.0, 0.0])
        client.close()
    finally:
        served.stop()


@pytest.mark.parametrize("served", [dict(num_envs=1, learn=False, max_concurrent=1,
                                         max_pending_steps=8, action_timeout=40.0)],
                         indirect=True)
def test_a_slow_learner_makes_fast_clients_wait_and_loses_nothing(served):
    """Back-pressure, not dropping: the queued steps stay bounded, clients
    block (start_episode beyond max_concurrent gets 429), and every step a
    client logged reaches the learner, in order, once it catches up."""
    server = served.server
    client = PolicyClient(server.address)
    eid = client.start_episode()
    done, caught, pending = [], [], []

    def fast_client():
        try:
            for s in range(40):
                client.log_action(eid, [0, s], 500 + s)
                done.append(s)
            client.end_episode(eid, [0, 40])
        except Exception as e:  # pylint: disable=broad-except
            caught.append(e)

    t = threading.Thread(target=fast_client)
    t.start()
    # Nobody learns: the learn queue holds one unroll and the slot's env
    # thread blocks on the second (steps 1-8 taken after the FIRST, step 0);
    # then 8 steps (max_pending_steps) queue and the 18th log_action blocks.
    deadline = time.monotonic() + 20
    while len(done) < 17 and time.monotonic() < deadline:
        time.sleep(0.02)
    for _ in range(10):
        time.sleep(0.05)
        pending.append(server.num_pending_steps)
        assert len(done) == 17 and not caught
    assert pending == [8] * 10
    with pytest.raises(protocol.TooManyEpisodesServerError) as info:
        PolicyClient(server.address).start_episode()
    assert info.value.status == 429
    # A slow learner: one batch at a time, with pauses; the queued steps
    # never exceed their bound while the client catches up.
    batches = []
    for _ in range(10):
        exp, _, _ = served.driver.get_training_exps()
        batches.append(numpy(exp))
        pending.append(server.num_pending_steps)
        time.sleep(0.05)
    t.join(20)
    assert not t.is_alive() and not caught and done == list(range(40))
    assert max(pending) == 8
    observations = np.concatenate([b.observation[0] for b in batches])
    np.testing.assert_array_equal(observations, [[0, s] for s in range(40)])
    np.testing.assert_array_equal(np.concatenate([b.action[0] for b in batches]),
                                  [500 + s for s in range(40)])
    client.close()


def test_one_connection_serves_every_request_of_a_client(served):
    """Keep-alive: the server leaves the connection open after each answer,
    errors included, and answers with a complete HTTP/1.1 response."""
    parts = urllib.parse.urlsplit(served.server.address)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        sockets, answers = [], []
        for command in ({"command": "start_episode", "episode_id": "ka"},
                        {"command": "get_action", "episode_id": "ka", "observation": [3, 0]},
                        {"command": "get_action", "episode_id": "nope", "observation": [3, 0]},
                        {"command": "get_action", "episode_id": "ka", "observation": [3, 1],
                         "reward": 1.0}):
            conn.request("POST", protocol.COMMAND_PATH, body=json.dumps(command),
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            answers.append((response.status, json.loads(response.read())))
            assert not response.will_close and response.version == 11
            assert response.getheader("Content-Type") == "application/json"
            assert response.getheader("Date", "").endswith(" GMT")
            sockets.append(conn.sock)
        assert all(sock is sockets[0] for sock in sockets)
        assert answers[0] == (200, {"episode_id": "ka"})
        assert answers[1] == (200, {"action": policy_action(3, 0)})
        assert answers[2][0] == 400 and answers[2][1]["error"]["type"] == "ValueError"
        assert answers[3] == (200, {"action": policy_action(3, 1)})
    finally:
        conn.close()


def test_local_inference_pulls_the_policy_and_reports_its_own_actions():
    served = Served(num_envs=1, export=True, weights_refresh_secs=0.0)
    try:
        client = PolicyClient(served.server.address, inference_mode="local",
                              update_interval=0.0, report_max_events=1000,
                              report_interval=60.0)
        first = [int(a) for a in play(client, 1)]
        assert first == [policy_action(1, s) for s in range(3)]
        served.policy.offset.assign(5)     # the learner changes the policy
        second = [int(a) for a in play(client, 2)]
        assert second == [policy_action(2, s, offset=5) for s in range(3)]
        assert client.policy_updates == 2
        assert not served.batches          # nothing reported yet: one batch at flush
        client.flush()
        deadline = time.monotonic() + 20
        while not served.batches and time.monotonic() < deadline:
            time.sleep(0.02)
        exp = served.batches[0]
        np.testing.assert_array_equal(exp.observation[0], [[1, 0], [1, 1], [1, 2], [1, 3]])
        # The learner sees the client's actions (offset 0), not the server
        # policy's (offset 5 by the time the steps arrived).
        np.testing.assert_array_equal(exp.action[0, :3], first)
        with pytest.raises(ValueError, match="'nope' is unknown"):
            client.get_action("nope", [1, 1])
        client.close()
    finally:
        served.stop()


@pytest.mark.parametrize("served", [dict(num_envs=1, token="s3cret")], indirect=True)
def test_a_wrong_http_method_gets_405_with_a_json_error(served):
    address = served.server.address
    auth = {"Authorization": "Bearer s3cret", "Content-Type": "application/json"}
    cases = [("PUT", protocol.COMMAND_PATH, b"{}", "method 'PUT' is not allowed: use GET or POST"),
             ("DELETE", "/anything", None, "method 'DELETE' is not allowed: use GET or POST"),
             ("GET", protocol.COMMAND_PATH, None,
              "GET /v1/command: commands are sent with POST"),
             ("POST", protocol.POLICY_MODEL_PATH, b"{}",
              "POST /v1/policy/model: the policy is fetched with GET")]
    for method, path, body, message in cases:
        status, error = raw(address, method, path, body, auth)
        assert status == 405, (method, path)
        assert error == {"error": {"type": "MethodNotAllowed", "message": message}}
    # The client raises the matching exception; the server keeps serving.
    client = PolicyClient(address, token="s3cret")
    status, _, body = client.request("PATCH", protocol.COMMAND_PATH, b"{}")
    error = protocol.exception_from_response(status, body)
    assert isinstance(error, protocol.MethodNotAllowedError) and error.status == 405
    assert play(client, 4, steps=1) == [policy_action(4, 0)]
    client.close()


def test_the_remote_client_and_the_episode_api_import_no_tensorflow():
    import os  # pylint: disable=import-outside-toplevel
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel
    code = ("import sys, alf_async.serving.client, alf_async.environments.external.episode_api; "
            "print(sorted(m for m in ('tensorflow', 'tf_agents') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=dict(os.environ), check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("served", [dict(num_envs=1, slots_per_env=16, max_concurrent=16)],
                         indirect=True)
def test_sixteen_clients_at_once_are_served_by_one_thread(served):
    """No thread per connection: while 16 clients' get_action calls are in
    flight, the server's only thread is its event loop's ("policy_server")."""
    n, steps = 16, 12
    ready = threading.Barrier(n + 1)
    playing = threading.Event()
    results, errors, seen = {}, [], set()

    def client(k):
        try:
            with PolicyClient(served.server.address) as c:
                eid = c.start_episode(f"c{k}")
                ready.wait(20)
                actions = [c.get_action(eid, [k, 0])]
                playing.set()
                actions += [c.get_action(eid, [k, s], reward=1.0) for s in range(1, steps)]
                results[k] = actions
                ready.wait(20)   # every client still connected while the threads are counted
                c.end_episode(eid, [k, steps])
        except Exception as e:  # pylint: disable=broad-except
            errors.append(e)
            ready.abort()

    threads = [threading.Thread(target=client, args=(k,), name=f"client_{k}") for k in range(n)]
    for t in threads:
        t.start()
    ready.wait(20)
    assert playing.wait(20)
    while any(t.is_alive() for t in threads) and len(results) < n and not errors:
        seen.update(server_threads())
        time.sleep(0.005)
    seen.update(server_threads())
    assert served.server.num_connections == n
    ready.wait(20)
    for t in threads:
        t.join(30)
    assert not errors
    assert seen == {"policy_server"}
    assert results == {k: [policy_action(k, s) for s in range(steps)] for k in range(n)}


def test_pipelined_commands_are_answered_in_order_on_one_connection(served):
    """Requests written at once on one keep-alive connection: each is applied
    and answered in order (an episode's steps must keep theirs)."""
    commands = [{"command": "start_episode", "episode_id": "pipe"},
                {"command": "get_action", "episode_id": "pipe", "observation": [7, 0]},
                {"command": "get_action", "episode_id": "pipe", "observation": [7, 1],
                 "reward": 0.5},
                {"command": "log_returns", "episode_id": "pipe", "reward": 1.5},
                {"command": "get_action", "episode_id": "pipe", "observation": [7, 2]},
                {"command": "end_episode", "episode_id": "pipe", "observation": [7, 3]},
                {"command": "get_action", "episode_id": "pipe", "observation": [7, 4]}]
    raw = Raw(served.server.address).send(b"".join(post(c) for c in commands))   # one write
    try:
        answers = [raw.response() for _ in commands]
        assert [(status, json.loads(body)) for status, _, body in answers[:6]] == [
            (200, {"episode_id": "pipe"}), (200, {"action": policy_action(7, 0)}),
            (200, {"action": policy_action(7, 1)}), (200, {}),
            (200, {"action": policy_action(7, 2)}), (200, {})]
        assert answers[6][0] == 400 and b"'pipe' has already finished" in answers[6][2]
    finally:
        raw.close()
    play(PolicyClient(served.server.address), 8)   # completes the episode's unroll
    wait_for_batches(served, 1)
    exp = served.batches[0]
    np.testing.assert_array_equal(exp.observation[0], [[7, 0], [7, 1], [7, 2], [7, 3]])
    np.testing.assert_array_equal(exp.reward[0], [0.5, 1.5, 0.0, 0.0])
