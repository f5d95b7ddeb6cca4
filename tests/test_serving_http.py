"""The policy server's HTTP side over raw sockets (http_front.py, http_wire.py):
refusals with a status line and a JSON body, 413 bodies dropped, half-closes,
keep-alive rules, idle connections, 504 without a thread waiting, and stop
while many requests wait -- all on one event loop thread."""

import json
import socket
import threading
import time
import urllib.parse

import pytest

from alf_async.serving import PolicyClient, PolicyServerEnv, protocol
from test_external_env import ACTION_SPEC, OBS_SPEC, no_external_env_threads_left

pytestmark = pytest.mark.timeout(60)
_ = no_external_env_threads_left   # autouse: no server thread left (within 5 s)


def server_threads():
    return sorted(t.name for t in threading.enumerate()
                  if t.name.startswith("policy_server") and t.is_alive())


@pytest.fixture
def server(request):
    """A PolicyServerEnv serving without a driver (nobody acts: get_action waits)."""
    kwargs = dict(max_body_bytes=4096, action_timeout=30.0)
    kwargs.update(getattr(request, "param", {}))
    s = PolicyServerEnv(ACTION_SPEC, OBS_SPEC, **kwargs)
    s.start()
    yield s
    s.close()
    assert server_threads() == []   # close() joined them all, at once


class Raw(object):
    """A client socket that sends raw bytes and reads whole responses."""

    def __init__(self, address, timeout=10.0):
        parts = urllib.parse.urlsplit(address)
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout)
        self.buf = b""

    def send(self, data):
        self.sock.sendall(data)
        return self

    def _fill(self):
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise EOFError
        self.buf += chunk

    def response(self):
        """(status, {lower-cased header: value}, body bytes) of the next response."""
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        version, status, _ = lines[0].split(" ", 2)
        assert version == "HTTP/1.1"
        headers = dict((k.lower(), v.strip()) for k, v in
                       (line.split(":", 1) for line in lines[1:]))
        length = int(headers["content-length"])
        while len(self.buf) < length:
            self._fill()
        body, self.buf = self.buf[:length], self.buf[length:]
        return int(status), headers, body

    def closed_by_server(self, timeout=2.0):
        """True if the server closes the connection (EOF, not a reset) within `timeout`."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except socket.timeout:
            return False

    def close(self):
        self.sock.close()


def post(body, version="HTTP/1.1", headers=()):
    body = body if isinstance(body, bytes) else json.dumps(body).encode()
    lines = [f"POST /v1/command {version}", "Host: x", f"Content-Length: {len(body)}"]
    lines += list(headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def error_of(body):
    error = json.loads(body)["error"]
    return error["type"], error["message"]


POST_HEAD = b"POST /v1/command HTTP/1.1\r\nHost: x\r\n"


@pytest.mark.parametrize("data, status, message", [
    (b"GARBAGE\r\n\r\n", 400, "bad request line 'GARBAGE'"),
    # HTTP/0.9-style: answered with a status line like every other answer.
    (b"GET /v1/policy/model\r\n\r\n", 400, "bad request line 'GET /v1/policy/model'"),
    (b"POST /v1/command HTTP/1.1 extra\r\n\r\n", 400, "bad request line"),
    (b"POST /v1/command HTTP/x.y\r\n\r\n", 400, "bad request version 'HTTP/x.y'"),
    (b"POST /v1/command HTTP/2.0\r\nContent-Length: 2\r\n\r\n{}", 400,
     "HTTP version not supported: HTTP/2.0 (use HTTP/1.1)"),
    (POST_HEAD + b"no colon here\r\n\r\n", 400, "bad header line 'no colon here'"),
    (POST_HEAD + b" folded: x\r\nContent-Length: 2\r\n\r\n{}", 400,
     "bad header line ' folded: x'"),
    (b"FOO /v1/command HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", 405,
     "method 'FOO' is not allowed: use GET or POST"),
    (b"HEAD /v1/policy/model HTTP/1.1\r\n\r\n", 405,
     "method 'HEAD' is not allowed: use GET or POST"),
    (POST_HEAD + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 411,
     "chunked bodies are not accepted: send Content-Length"),
    (POST_HEAD + b"\r\n", 411, "a Content-Length header is required"),
    (POST_HEAD + b"Content-Length: 1e3\r\n\r\n", 400, "bad Content-Length '1e3'"),
    (POST_HEAD + b"Content-Length: -1\r\n\r\n", 400, "bad Content-Length '-1'"),
    (POST_HEAD + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400,
     "conflicting Content-Length headers"),
    (b"POST /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n", 414, "the request line is over 65536"),
    (POST_HEAD + b"X-A: b\r\n" * 120 + b"\r\n", 431, "more than 100 header lines"),
    (POST_HEAD + b"X-Long: " + b"a" * 70000 + b"\r\n\r\n", 431, "a header line is over 65536"),
])
def test_a_refused_request_gets_a_json_4xx_with_a_status_line_and_closes(server, data, status,
                                                                          message):
    raw = Raw(server.address).send(data)
    got, headers, body = raw.response()
    assert got == status
    assert error_of(body) == (protocol.type_of_status(status), error_of(body)[1])
    assert error_of(body)[1].startswith(message), error_of(body)
    assert headers["connection"] == "close" and headers["content-type"] == "application/json"
    if status == 405:
        assert headers["allow"] == "GET, POST"
    assert raw.closed_by_server()
    raw.close()
    # The server goes on serving.
    ok = Raw(server.address).send(post({"command": "start_episode", "episode_id": "next"}))
    assert ok.response()[0] == 200
    ok.close()


def test_an_oversized_body_is_answered_413_read_and_dropped_then_closed(server):
    raw = Raw(server.address)
    raw.send(POST_HEAD + b"Content-Length: 300000\r\n\r\n" + b" " * 300000)
    status, headers, body = raw.response()
    assert status == 413 and headers["connection"] == "close"
    assert error_of(body) == ("RequestTooLarge", "request body of 300000 bytes is over the "
                                                 "server's limit of 4096")
    assert raw.closed_by_server()   # EOF, no reset: the body was read
    raw.close()


def test_a_body_cut_short_by_a_half_close_is_refused_and_never_applied(server):
    body = json.dumps({"command": "start_episode", "episode_id": "cut"}).encode()
    raw = Raw(server.address)
    raw.send(POST_HEAD + b"Content-Length: %d\r\n\r\n" % (len(body) + 10) + body)
    raw.sock.shutdown(socket.SHUT_WR)
    status, _, answer = raw.response()
    assert status == 400 and error_of(answer) == (
        "BadRequest", f"the body ended after {len(body)} of the {len(body) + 10} bytes its "
                      f"Content-Length announced")
    assert raw.closed_by_server() and server.num_open_episodes == 0
    raw.close()
    # A whole request, then a half-close: answered, then closed.
    raw = Raw(server.address).send(post({"command": "start_episode", "episode_id": "whole"}))
    raw.sock.shutdown(socket.SHUT_WR)
    assert raw.response()[:1] == (200,) and raw.closed_by_server()
    assert server.num_open_episodes == 1
    raw.close()


def test_keep_alive_rules_of_http_1_1_and_1_0(server):
    start = {"command": "start_episode"}
    # HTTP/1.1: kept alive by default.
    raw = Raw(server.address)
    for _ in range(3):
        status, headers, _ = raw.send(post(start)).response()
        assert status == 200 and "connection" not in headers
        assert headers["server"] == "alf_async-policy-server/1"
        assert headers["date"].endswith(" GMT")
    # ... until the client says close.
    status, headers, _ = raw.send(post(start, headers=["Connection: close"])).response()
    assert status == 200 and headers["connection"] == "close" and raw.closed_by_server()
    raw.close()
    # HTTP/1.0 closes unless the client asks for keep-alive.
    raw = Raw(server.address)
    status, headers, _ = raw.send(post(start, version="HTTP/1.0")).response()
    assert status == 200 and headers["connection"] == "close" and raw.closed_by_server()
    raw.close()
    raw = Raw(server.address)
    for _ in range(2):
        status, headers, _ = raw.send(post(start, version="HTTP/1.0",
                                           headers=["Connection: keep-alive"])).response()
        assert status == 200 and headers["connection"] == "keep-alive"
    raw.close()


def test_pipelined_requests_are_answered_in_order_on_one_connection(server):
    requests = [
        {"command": "start_episode", "episode_id": "p"},
        {"command": "log_returns", "episode_id": "p", "reward": 1.0},   # before any action
        b"{not json",
        {"command": "start_episode", "episode_id": "q"},
        {"command": "start_episode", "episode_id": "p"},
        {"command": "log_returns", "episode_id": "gone", "reward": 1.0},
    ]
    raw = Raw(server.address).send(b"".join(post(r) for r in requests))   # one write
    answers = [raw.response() for _ in requests]
    assert [(s, json.loads(b)) for s, _, b in answers[:1] + answers[3:4]] == [
        (200, {"episode_id": "p"}), (200, {"episode_id": "q"})]
    assert [(s, error_of(b)[0]) for s, _, b in (answers[1], answers[2], answers[4],
                                                 answers[5])] == [
        (400, "ValueError"), (400, "BadRequest"), (400, "ValueError"), (400, "ValueError")]
    assert error_of(answers[4][2])[1] == "episode 'p' is already started"
    assert not raw.closed_by_server(0.2)   # still open
    raw.close()


@pytest.mark.parametrize("server", [dict(action_timeout=1.0, connection_idle_timeout=0.3)],
                         indirect=True)
def test_a_waiting_get_action_answers_504_at_its_deadline_and_closes_the_episode(server):
    raw = Raw(server.address)
    assert raw.send(post({"command": "start_episode", "episode_id": "slow"})).response()[0] == 200
    start = time.monotonic()
    raw.send(post({"command": "get_action", "episode_id": "slow", "observation": [0, 0]}))
    time.sleep(0.5)   # past the connection idle timeout: a waiting request keeps it open
    assert server_threads() == ["policy_server"]   # no thread waits for the action
    status, headers, body = raw.response()
    assert 1.0 <= time.monotonic() - start < 3.0
    assert status == 504 and "connection" not in headers
    assert error_of(body) == (
        "TimeoutError", "get_action for episode 'slow': no answer within the timeout (is the "
                        "driver running and its learner consuming experience? are there enough "
                        "slots, num_envs, for the episodes in flight?); the episode was closed")
    assert server.num_open_episodes == 0
    status, _, body = raw.send(post({"command": "get_action", "episode_id": "slow",
                                     "observation": [0, 1]})).response()
    assert status == 400 and error_of(body) == (
        "ValueError", "episode 'slow' has already finished (get_action got no answer within "
                      "its timeout)")
    # Now idle: closed after connection_idle_timeout.
    idle_from = time.monotonic()
    assert raw.closed_by_server(timeout=5.0)
    assert 0.25 <= time.monotonic() - idle_from < 2.0
    raw.close()


@pytest.mark.parametrize("server", [dict(max_concurrent=40, connection_idle_timeout=0.3)],
                         indirect=True)
def test_idle_and_half_sent_connections_are_closed_after_the_idle_timeout(server):
    idle = Raw(server.address)
    half = Raw(server.address).send(POST_HEAD + b"Content-Length: 10\r\n\r\n{")
    start = time.monotonic()
    assert idle.closed_by_server(5.0) and half.closed_by_server(5.0)
    assert 0.25 <= time.monotonic() - start < 2.0
    idle.close()
    half.close()


@pytest.mark.parametrize("server", [dict(max_concurrent=40, poll_interval=0.25)], indirect=True)
def test_stop_answers_every_waiting_get_action_503_at_once_and_leaves_no_thread(server):
    n = 32
    started = threading.Barrier(n + 1)
    outcomes = [None] * n

    def client(k):
        with PolicyClient(server.address, timeout=20) as c:
            eid = c.start_episode(f"e{k}")
            started.wait(10)
            try:
                c.get_action(eid, [k, 0])
            except Exception as e:  # pylint: disable=broad-except
                outcomes[k] = (e, time.monotonic())

    threads = [threading.Thread(target=client, args=(k,), name=f"client_{k}") for k in range(n)]
    for t in threads:
        t.start()
    started.wait(10)
    idle = Raw(server.address)
    assert idle.send(post({"command": "start_episode"})).response()[0] == 200
    deadline = time.monotonic() + 10
    while server.num_pending_steps < n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.num_pending_steps == n
    # n requests wait, over n + 1 connections: one thread serves them all.
    assert server_threads() == ["policy_server"]
    stopped = time.monotonic()
    server.stop()
    for t in threads:
        t.join(5)
    assert all(isinstance(e, protocol.ServerStoppedError) and e.status == 503 and
               "the ExternalEnv is stopped (stop() was called)" in str(e)
               for e, _ in outcomes), outcomes
    assert max(when for _, when in outcomes) - stopped < 1.0
    assert idle.closed_by_server(1.0)
    server.join(1.0)   # run() returns within poll_interval
    assert not server.is_alive() and time.monotonic() - stopped < 1.5
    idle.close()


@pytest.mark.parametrize("server", [dict(max_pending_steps=2, action_timeout=0.5)],
                         indirect=True)
def test_a_get_action_held_by_back_pressure_waits_on_a_worker(server):
    """With max_pending_steps steps queued, get_action cannot queue without
    waiting: the blocking call waits on a worker thread (here until its
    timeout: nobody takes steps), the loop goes on serving."""
    raw = Raw(server.address)
    assert raw.send(post({"command": "start_episode", "episode_id": "bp"})).response()[0] == 200
    for s in range(2):
        status, _, _ = raw.send(post({"command": "log_action", "episode_id": "bp",
                                      "observation": [0, s], "action": s})).response()
        assert status == 200
    assert server.num_pending_steps == 2
    raw.send(post({"command": "get_action", "episode_id": "bp", "observation": [0, 2]}))
    time.sleep(0.2)
    names = server_threads()   # log_action ran on workers too: one or two by now
    assert names[0] == "policy_server" and 2 <= len(names) <= 3
    assert all(name.startswith("policy_server_worker_") for name in names[1:])
    other = Raw(server.address)   # the loop still serves
    assert other.send(post({"command": "start_episode"})).response()[0] == 200
    status, _, body = raw.response()
    assert status == 504 and error_of(body)[1].startswith(
        "get_action for episode 'bp': no answer within the timeout")
    assert server.num_pending_steps == 0   # the episode was closed: its steps dropped
    raw.close()
    other.close()
