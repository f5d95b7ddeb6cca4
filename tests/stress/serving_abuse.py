"""Serving under abuse: the PolicyServerEnv fuzzed with bad requests while
well-behaved clients play, and clients that vanish mid-episode.

tests/stress/test_serving_abuse.py runs the trials in reduced counts;
reliability.py (`print_full_figures(args)`) and this script, alone, at full
counts, printing the figures (benchmarks/serving_abuse.py runs this script):

    python tests/stress/serving_abuse.py [--abuse_bad_requests 10000] [--abuse_vanishing 100]

Needs hypothesis (pip install -e '.[test]').

- `fuzz_trial(num_bad_requests, num_good_clients, seed)`: a server with a
  token, `max_body_bytes=4096` and a driver whose learner takes every batch;
  `num_good_clients` PolicyClients play whole episodes (checking every
  action) while one thread sends `num_bad_requests` raw requests generated
  by hypothesis: malformed JSON, truncated bodies (Content-Length larger
  than what is sent, then a half-close, or an abort), oversized bodies,
  wrong JSON types and shapes, unknown commands, missing or wrong
  Authorization, wrong methods and paths, malformed HTTP. Every answer's
  status is counted per category; the server process's RSS and thread
  count (/proc/self/status: the server runs in this process) are sampled
  after a warm-up and at the end.
- `vanishing_clients_trial(num_clients, idle_timeout)`: clients that start
  an episode and disappear (after start, after an answered get_action, or
  with a get_action in flight); how long until every episode is closed and
  the capacity (max_concurrent) and the driver's slots serve new episodes.

Bad requests never use a live episode id and never carry a request the
server could accept (`_acceptable` filters those out), so any 2xx is a bug.
Requests of the shapes in FORMER_BUG_CATEGORIES got a non-4xx answer before
commit 283a0e2 (see their comments); `include_known_bugs=False` leaves them
out (to measure an older server strictly on the rest).
"""

import collections
import http.client
import json
import math
import re
import socket
import threading
import time

import numpy as np

OBS_LOW, OBS_HIGH = 0, 1000
MAX_BODY = 4096
TOKEN = "s3cret"

# Shapes the server answered with a non-4xx before commit 283a0e2 (fixed
# there; tests/stress/test_serving_abuse.py keeps regression tests):
# - "huge_reward": log_returns whose reward is a JSON integer over ~1.8e308
#   (309..4300 digits): float(reward) raised OverflowError -> 500.
# - "truncated_valid": a body shorter than its Content-Length whose received
#   part is a whole valid command (client half-closes): it was applied -> 200.
# - "bad_method": PUT/DELETE/PATCH/OPTIONS/...: http.server answered 501.
# - "bad_version": an HTTP/2.0+ request line: http.server answered 505.
# The list stays so that a server without those fixes can still be measured
# (include_known_bugs=False leaves these shapes out); KNOWN_BUG_CATEGORIES
# is what print_full_figures does not count as failures.
FORMER_BUG_CATEGORIES = ("huge_reward", "truncated_valid", "bad_method", "bad_version")
KNOWN_BUG_CATEGORIES = ()


# ---------------------------------------------------------------- process


def proc_status():
    """(RSS in MiB, OS thread count) of this process, from /proc/self/status."""
    rss, threads = float("nan"), -1
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) / 1024.0
                elif line.startswith("Threads:"):
                    threads = int(line.split()[1])
    except OSError:
        pass
    return rss, threads


def server_threads():
    """Python threads of PolicyServerEnv (its event loop and its workers)."""
    return [t.name for t in threading.enumerate()
            if t.name.startswith("policy_server") and t.is_alive()]


def open_connections(served):
    """Connections the server holds open (one event loop serves them all;
    an older server had a "policy_server_conn" thread per connection)."""
    return len(served.server._front.connections)   # pylint: disable=protected-access


def _left_behind():
    """Server threads and ExternalEnv slots still alive/open (after stop)."""
    from alf_async.environments.external import external_env
    wait_for(lambda: not server_threads(), 5.0)
    return server_threads() + [f"slot {s.index}" for s in external_env.open_slots()]


def wait_for(predicate, timeout, interval=0.02):
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


# --------------------------------------------------------------- the server


def _specs():
    from tf_agents.specs import array_spec
    obs = array_spec.BoundedArraySpec((2,), np.int32, OBS_LOW, OBS_HIGH, name="observation")
    act = array_spec.BoundedArraySpec((), np.int32, 0, 999, name="action")
    return act, obs


def policy_action(e, s):
    """What _ObsPolicy does for observation [e, s]."""
    return (10 * e + s) % 1000


def _obs_policy(time_step_spec, action_spec):
    import tensorflow as tf
    from tf_agents.policies import tf_policy
    from tf_agents.trajectories import policy_step

    class _ObsPolicy(tf_policy.TFPolicy):
        """action = (10 * obs[0] + obs[1]) % 1000."""

        def _action(self, time_step, policy_state, seed):
            obs = time_step.observation
            action = tf.math.floormod(obs[..., 0] * 10 + obs[..., 1], 1000)
            return policy_step.PolicyStep(action, policy_state, ())

        def _distribution(self, time_step, policy_state):
            raise NotImplementedError

    return _ObsPolicy(time_step_spec, action_spec)


class ServedPolicy(object):
    """A PolicyServerEnv on loopback, its driver, and a learner thread that
    takes every batch (so slots never stall). `stop()` leaves nothing."""

    def __init__(self, num_envs, unroll_length=4, **server_kwargs):
        from alf_async import AsyncOffPolicyDriver
        from alf_async.learning.learner import Learner
        from alf_async.serving import PolicyServerEnv
        action_spec, obs_spec = _specs()
        self.server = PolicyServerEnv(action_spec, obs_spec, host="127.0.0.1", **server_kwargs)
        self.policy = _obs_policy(self.server.time_step_spec(), self.server.action_spec())
        self.batches = 0
        try:
            self.driver = AsyncOffPolicyDriver(
                self.server.env_constructor(), self.policy, num_envs=num_envs,
                unroll_length=unroll_length, actor_queue_cap=1,
                exp_observers=[self._count], stop_grace_period_secs=1.0)
        except BaseException:
            self.server.close()
            raise
        # A learner without an agent: it takes every batch (for the count).
        self.learner = Learner(None, self.driver)
        self.thread = threading.Thread(target=self.learner.run, name="abuse_learner",
                                       daemon=True)
        self.thread.start()  # starts the driver (and the server's loop)
        host, port = self.server.address[len("http://"):].rsplit(":", 1)
        self.host, self.port = host, int(port)

    def _count(self, exp, env_ids):
        self.batches += 1

    def stop(self):
        self.learner.stop()
        self.thread.join(10)
        self.server.close()


# ------------------------------------------------------------ raw requests


class RawRequest(object):
    """One request as bytes on a fresh connection.

    mode: "normal" (send everything, read the answer), "half_close" (send,
    shut down our write side, read the answer), "abort" (send, close: no
    answer to read), "early_answer" (send the head and part of the body,
    read the answer without sending the rest: for bodies over the limit).
    """

    __slots__ = ("category", "data", "mode")

    def __init__(self, category, data, mode="normal"):
        self.category = category
        self.data = data
        self.mode = mode


def http_bytes(method, path, body=b"", headers=(), content_length="auto",
               version="HTTP/1.1", token=TOKEN):
    lines = [f"{method} {path} {version}".encode("latin-1"), b"Host: 127.0.0.1"]
    if token is not None:
        lines.append(b"Authorization: Bearer " + token.encode("latin-1"))
    if content_length == "auto":
        content_length = len(body)
    if content_length is not None:
        lines.append(b"Content-Length: " + str(content_length).encode("latin-1"))
    lines.append(b"Content-Type: application/json")
    lines.extend(headers)
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def send_raw(host, port, request, timeout=10.0):
    """Sends one RawRequest; returns its status, "timeout", "reset", or None (abort)."""
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.sendall(request.data)
        except (BrokenPipeError, ConnectionResetError):
            pass   # the server may answer (413) and close before reading it all
        if request.mode == "abort":
            return None
        if request.mode == "half_close":
            sock.shutdown(socket.SHUT_WR)
        try:
            head = sock.recv(8, socket.MSG_PEEK)
        except socket.timeout:
            return "timeout"
        except ConnectionResetError:
            return "reset"
        if head and not b"HTTP/".startswith(head[:5]):
            # An http.server-based server answered some bad request lines HTTP/0.9-style:
            # the error page without a status line; its code is in the page.
            return _http09_status(sock)
        method = request.data.split(b" ", 1)[0].decode("latin-1")
        response = http.client.HTTPResponse(sock, method=method)
        try:
            response.begin()
            try:
                response.read()
            except http.client.IncompleteRead:
                return f"incomplete:{response.status}"
        except socket.timeout:
            return "timeout"
        except (ConnectionResetError, http.client.RemoteDisconnected, BrokenPipeError):
            return "reset"
        except http.client.BadStatusLine:
            return "bad_status_line"
        finally:
            response.close()
        return response.status
    finally:
        sock.close()


def _http09_status(sock):
    data = b""
    try:
        while len(data) < 1 << 16:
            chunk = sock.recv(1 << 14)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    m = re.search(rb"Error code: (\d{3})", data)
    return f"http09:{m.group(1).decode()}" if m else "bad_status_line"


def is_4xx(status):
    """A 4xx answer (an int status, or a 4xx error page sent HTTP/0.9-style)."""
    if isinstance(status, int):
        return 400 <= status < 500
    return isinstance(status, str) and status.startswith("http09:4")


# ------------------------------------------------------ request strategies


def _normalized(path):
    """The path http.server serves for `path` (it folds a leading '//' into '/')."""
    return "/" + path.lstrip("/") if path.startswith("//") else path


def _acceptable(body):
    """True if `body` might be accepted by the server (so it is no bad request)."""
    from alf_async.serving import protocol
    try:
        command, args = protocol.parse_command(protocol.decode_json(body))
    except Exception:  # pylint: disable=broad-except
        return False
    if command == "start_episode":
        return True
    if command == "report":
        events = args["events"]
        return not events or any(isinstance(e, dict) and e.get("command") == "start_episode"
                                 for e in events)
    return False   # every other command names an episode id nobody started


def strategies():
    """{category: hypothesis strategy of RawRequest}."""
    from hypothesis import strategies as st

    text = st.text(max_size=12)
    ids = st.text(min_size=1, max_size=16).map(lambda s: "fuzz-" + s)   # never a live id
    scalars = (st.none() | st.booleans() | st.integers() |
               st.floats(allow_nan=False, allow_infinity=False) | text)
    json_values = st.recursive(scalars, lambda c: st.lists(c, max_size=4) |
                               st.dictionaries(text, c, max_size=3), max_leaves=6)
    good_obs = st.lists(st.integers(OBS_LOW, OBS_HIGH), min_size=2, max_size=2)
    bad_obs = st.one_of(
        st.lists(st.integers(OBS_LOW, OBS_HIGH), max_size=5).filter(lambda v: len(v) != 2),
        st.lists(st.integers(), min_size=2, max_size=2).filter(
            lambda v: not all(OBS_LOW <= x <= OBS_HIGH for x in v)),
        st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=2, max_size=2),
        st.lists(st.lists(st.integers(0, 9), max_size=3), max_size=3),
        st.integers(0, 6).map(lambda d: [[1, 2]] if d == 0 else
                              json.loads("[" * (d * 10) + "1" + "]" * (d * 10))),
        json_values)
    obs = good_obs | bad_obs
    reward = st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                       st.integers(-10**6, 10**6), json_values)
    valid_args = {
        "episode_id": ids, "observation": obs, "action": st.integers(-5, 1005) | json_values,
        "reward": reward, "info": st.none() | st.dictionaries(text, scalars, max_size=3) |
        json_values, "training_enabled": st.booleans() | json_values,
    }

    @st.composite
    def command_object(draw, commands=None):
        from alf_async.serving import protocol
        names = list(commands or protocol.COMMANDS)
        command = draw(st.sampled_from(names))
        required, optional = protocol.COMMANDS.get(command, ((), ()))
        args = {}
        for name in required:
            if draw(st.integers(0, 9)) > 0:   # sometimes missing
                args[name] = draw(valid_args.get(name, json_values))
        for name in optional:
            if draw(st.booleans()):
                args[name] = draw(valid_args.get(name, json_values) if name != "episode_id"
                                  else (json_values | ids))
        if command == "report":
            args["events"] = draw(st.lists(command_object(
                ["log_action", "log_returns", "end_episode", "get_action"]), max_size=3) |
                json_values)
        if draw(st.integers(0, 7)) == 0:   # an unknown argument
            args[draw(text.filter(lambda k: k not in required + optional + ("command",)))] = \
                draw(json_values)
        obj = dict(args, command=command)
        if draw(st.integers(0, 9)) == 0:   # the command itself mistyped
            obj["command"] = draw(json_values)
        return obj

    def body(obj):
        return json.dumps(obj, separators=(",", ":")).encode()

    def post(b, **kw):
        return http_bytes("POST", "/v1/command", b, **kw)

    cmd_bodies = command_object().map(body).filter(lambda b: len(b) <= MAX_BODY)

    malformed = st.one_of(
        st.binary(max_size=300),
        cmd_bodies.flatmap(lambda b: st.integers(0, max(0, len(b) - 1)).map(lambda n: b[:n])),
        cmd_bodies.map(lambda b: b + b"}x"),
        st.sampled_from([b"NaN", b"[Infinity]", b'{"command":"log_returns","episode_id":"x",'
                         b'"reward":-Infinity}', b"\xff\xfe{}", b"{'command': 'x'}",
                         b"[" * 3000, b'{"a":' * 800 + b"1" + b"}" * 800, b"", b"\x00" * 10]),
        st.text(max_size=100).map(lambda s: s.encode("utf-8", "surrogatepass")),
    ).filter(lambda b: len(b) <= MAX_BODY and not _acceptable(b))

    wrong_types = st.one_of(cmd_bodies, json_values.map(body),
                            st.lists(command_object(), min_size=1, max_size=2).map(body)
                            ).filter(lambda b: len(b) <= MAX_BODY and not _acceptable(b))

    unknown = st.one_of(
        text.filter(lambda s: s not in ("start_episode", "get_action", "log_action",
                                        "log_returns", "end_episode", "report")),
        st.sampled_from(["", "START_EPISODE", "rm -rf /", "__init__", "dispatch",
                         "get_action ", "policy_model", "_report", "stop", "close"]),
        json_values.filter(lambda v: not isinstance(v, str))
    ).flatmap(lambda c: st.dictionaries(text, json_values, max_size=3).map(
        lambda d: dict(d, command=c))).map(body).filter(
        lambda b: len(b) <= MAX_BODY and not _acceptable(b))

    # Content-Length larger than what is sent (whatever was sent is no
    # whole valid command), then a half-close (answer expected) or an abort.
    truncated = st.tuples(malformed | wrong_types, st.integers(1, 2000),
                          st.sampled_from(["half_close", "half_close", "abort"])).filter(
        lambda t: len(t[0]) + t[1] <= MAX_BODY).map(
        lambda t: RawRequest("truncated", post(t[0], content_length=len(t[0]) + t[1]), t[2]))

    valid_start = st.builds(lambda i, te: {"command": "start_episode", "episode_id": i,
                                           "training_enabled": te},
                            ids.map(lambda i: "t" + i), st.booleans())   # "tfuzz-...": own ids
    truncated_valid = st.tuples(valid_start.map(body), st.integers(1, 500)).map(
        lambda t: RawRequest("truncated_valid", post(t[0], content_length=len(t[0]) + t[1]),
                             "half_close"))

    oversized = st.one_of(
        st.integers(MAX_BODY + 1, MAX_BODY * 16).map(
            lambda n: RawRequest("oversized", post(b" " * n))),
        st.integers(MAX_BODY + 1, 10**15).map(
            lambda n: RawRequest("oversized", post(b"{" * 100, content_length=n),
                                 "early_answer")))

    bad_length = st.one_of(
        st.sampled_from(["-1", "abc", "1e3", "0x10", "", "1 2", "9" * 5000, "+-3"]),
        text.filter(lambda s: not s.strip().isdigit() and s.isprintable()
                    and s.isascii() and ":" not in s)).map(
        lambda v: RawRequest("bad_length", post(b"{}", content_length=v)))
    no_length = st.tuples(st.binary(max_size=50), st.sampled_from(["/v1/command", "/x"])).map(
        lambda t: RawRequest("no_length", post(t[0], content_length=None).replace(
            b"/v1/command", t[1].encode(), 1)))

    any_cmd = valid_start.map(body) | cmd_bodies
    bad_tokens = st.one_of(
        st.none(), st.sampled_from(["", "s3cre", "S3CRET", "s3cret2", "Bearer", "bearer s3cret"]),
        st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=20)
    ).filter(lambda t: t is None or t.strip() != TOKEN)
    unauthenticated = st.one_of(
        st.tuples(any_cmd, bad_tokens).map(
            lambda t: RawRequest("unauthenticated", post(t[0], token=t[1]))),
        st.tuples(st.sampled_from(["/v1/policy/model", "/v1/policy/weights"]), bad_tokens).map(
            lambda t: RawRequest("unauthenticated", http_bytes("GET", t[0], content_length=None,
                                                               token=t[1]))),
        st.tuples(any_cmd, st.sampled_from(["Basic czNjcmV0", "Token s3cret",
                                            "Bearer  s3cret", "Bearers3cret"])).map(
            lambda t: RawRequest("unauthenticated", http_bytes(
                "POST", "/v1/command", t[0], token=None,
                headers=[b"Authorization: " + t[1].encode()]))))

    paths = st.one_of(
        st.sampled_from(["/", "/v1", "/v1/command/", "/v1/commands", "/V1/COMMAND",
                         "/v1/command?x=1", "/../v1/command", "//v1/command", "/admin",
                         "/v1/policy", "/v1/policy/model/"]),
        st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126),
                max_size=30).map(lambda s: "/" + s))
    wrong_path = st.one_of(
        st.tuples(paths.filter(lambda p: _normalized(p) != "/v1/command"), any_cmd).map(
            lambda t: RawRequest("wrong_path", post(t[1]).replace(b"/v1/command", t[0].encode(),
                                                                   1))),
        paths.filter(lambda p: _normalized(p) not in ("/v1/policy/model",
                                                      "/v1/policy/weights")).map(
            lambda p: RawRequest("wrong_path", http_bytes("GET", p, content_length=None))),
        # An authorized GET of the policy: this server exports none (404).
        st.sampled_from(["/v1/policy/model", "/v1/policy/weights"]).map(
            lambda p: RawRequest("wrong_path", http_bytes("GET", p, content_length=None))))
    bad_method = (st.sampled_from(["PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "TRACE",
                                   "CONNECT", "post", "Get"]) |
                  st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_", min_size=1, max_size=12
                          ).filter(lambda m: m not in ("GET", "POST"))).map(
        lambda m: RawRequest("bad_method", http_bytes(m, "/v1/command", b"{}")))
    bad_http = st.one_of(
        # (A blank request line is no request: http.server closes without an answer.)
        st.binary(min_size=1, max_size=200).filter(
            lambda b: b"\n" not in b[:-1] and b.decode("latin-1").split()).map(
            lambda b: b.rstrip(b"\r\n") + b"\r\n\r\n"),
        st.sampled_from([b"POST /v1/command HTTP/1.1 extra\r\n\r\n",
                         b"POST /v1/command HTTP/x.y\r\n\r\n",
                         b"POST\r\n\r\n", b"POST /v1/command HTTP/1.1\r\nno colon here\r\n\r\n",
                         b"POST /v1/command HTTP/1.1\r\n" + b"X-A: b\r\n" * 120 + b"\r\n",
                         b"POST /v1/command HTTP/1.1\r\nX-Long: " + b"a" * 70000 + b"\r\n\r\n",
                         b"POST /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",
                         b"POST /v1/command HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"2\r\n{}\r\n0\r\n\r\n"])).map(lambda b: RawRequest("bad_http", b))
    bad_version = st.tuples(st.integers(2, 99), st.integers(0, 99)).map(
        lambda t: "HTTP/%d.%d" % t).map(
        lambda v: RawRequest("bad_version", http_bytes("POST", "/v1/command", b"{}", version=v)))

    huge = st.integers(309, 4000).map(lambda n: int("9" * n))
    huge_reward = st.tuples(ids, huge).map(lambda t: RawRequest("huge_reward", post(
        ('{"command":"log_returns","episode_id":%s,"reward":%d}' % (json.dumps(t[0]), t[1])
         ).encode()))).filter(lambda r: len(r.data) < MAX_BODY + 200)

    def posted(category):
        return lambda b: RawRequest(category, post(b))

    return collections.OrderedDict([
        ("malformed_json", malformed.map(posted("malformed_json"))),
        ("truncated", truncated),
        ("oversized", oversized),
        ("bad_length", bad_length),
        ("no_length", no_length),
        ("wrong_types", wrong_types.map(posted("wrong_types"))),
        ("unknown_command", unknown.map(posted("unknown_command"))),
        ("unauthenticated", unauthenticated),
        ("wrong_path", wrong_path),
        ("bad_http", bad_http),
        ("truncated_valid", truncated_valid),
        ("huge_reward", huge_reward),
        ("bad_method", bad_method),
        ("bad_version", bad_version),
    ])


# Relative weights of the categories in a fuzz run.
WEIGHTS = {"malformed_json": 3, "truncated": 2, "oversized": 1, "bad_length": 1, "no_length": 1,
           "wrong_types": 5, "unknown_command": 2, "unauthenticated": 2, "wrong_path": 1,
           "bad_http": 1, "truncated_valid": 1, "huge_reward": 1, "bad_method": 1,
           "bad_version": 1}


def bad_requests(num, seed, include_known_bugs=True, batch=1000):
    """Yields `num` RawRequests drawn by hypothesis from the categories in WEIGHTS.

    Per batch of `batch`, the categories' counts are drawn (numpy, seeded)
    in proportion to WEIGHTS; each category's requests come from one seeded
    @given run (max_examples = its count; re-run with the next seed if
    hypothesis ran out of distinct examples); the batch is shuffled.
    """
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    strats = strategies()
    names = [n for n in WEIGHTS if include_known_bugs or n not in FORMER_BUG_CATEGORIES]
    p = np.array([WEIGHTS[n] for n in names], float)
    rng = np.random.default_rng(seed)
    made = 0
    round_ = 0

    def draw(strategy, want):
        nonlocal round_
        out = []
        while len(out) < want:
            round_ += 1

            @hseed(seed * 100_003 + round_)
            @settings(max_examples=want - len(out), database=None, deadline=None,
                      phases=[Phase.generate], suppress_health_check=list(HealthCheck))
            @given(strategy)
            def collect(request):
                if len(out) < want:
                    out.append(request)

            collect()
        return out

    while made < num:
        want = min(batch, num - made)
        counts = rng.multinomial(want, p / p.sum())
        out = []
        for name, count in zip(names, counts):
            if count:
                out.extend(draw(strats[name], int(count)))
        order = rng.permutation(len(out))
        made += len(out)
        yield from (out[i] for i in order)


# --------------------------------------------------------------- the trials


def _good_client(address, k, stop, results, min_episodes, rng_seed):
    from alf_async.serving import PolicyClient
    rng = np.random.default_rng(rng_seed)
    done, errors = 0, []
    client = PolicyClient(address, token=TOKEN, timeout=30.0)
    try:
        e = 0
        while not stop.is_set() or done < min_episodes:
            e += 1
            episode = (100 * k + e % 50) % (OBS_HIGH + 1)
            try:
                eid = client.start_episode()
                for s in range(int(rng.integers(1, 6))):
                    action = client.get_action(eid, [episode, s])
                    if int(action) != policy_action(episode, s):
                        errors.append(f"client {k}: action {action} for [{episode}, {s}]")
                    client.log_returns(eid, 1.0)
                client.end_episode(eid, [episode, 999])
                done += 1
            except Exception as ex:  # pylint: disable=broad-except
                errors.append(f"client {k}: {type(ex).__name__}: {ex}")
                if len(errors) > 20:
                    break
    finally:
        client.close()
        results[k] = (done, errors)


def _end_leaked(host, port, request):
    """Ends an episode that a truncated start_episode opened (not acted: forgotten)."""
    body = request.data.split(b"\r\n\r\n", 1)[1]
    eid = json.loads(body)["episode_id"]
    _raw_json(host, port, {"command": "end_episode", "episode_id": eid,
                           "observation": [0, 0]}, token=TOKEN)


def _fuzz_worker(host, port, num, seed, include_known_bugs, request_timeout, progress, conn):
    """The bad-request sender, in a child process (so that the server's RSS
    and thread count are its own): sends `num` requests, returns figures."""
    statuses = collections.defaultdict(collections.Counter)
    non_4xx, non_4xx_count, sent = [], 0, 0
    start = time.monotonic()
    try:
        for request in bad_requests(num, seed, include_known_bugs):
            try:
                status = send_raw(host, port, request, timeout=request_timeout)
            except OSError as e:
                status = f"connect_error:{type(e).__name__}"
            sent += 1
            if request.category == "truncated_valid" and status == 200:
                _end_leaked(host, port, request)   # (known bug) keep the capacity free
            statuses[request.category]["aborted" if status is None else status] += 1
            if status is not None and not is_4xx(status):
                non_4xx_count += 1
                if len(non_4xx) < 50:
                    non_4xx.append((request.category, status, request.data[:160]))
            progress.value = sent
        error = None
    except Exception as e:  # pylint: disable=broad-except
        error = f"{type(e).__name__}: {e}"
    conn.send({"statuses": {c: dict(v) for c, v in statuses.items()}, "bad_total": sent,
               "non_4xx": non_4xx, "non_4xx_count": non_4xx_count, "fuzzer_error": error,
               "requests_per_sec": sent / max(time.monotonic() - start, 1e-9)})
    conn.close()


def fuzz_trial(num_bad_requests, num_good_clients, seed=0, include_known_bugs=True,
               min_episodes=3, warmup_fraction=0.1, good_from=0.0, request_timeout=10.0,
               timeout=None):
    """Bad requests interleaved with well-behaved clients; returns a dict of figures.

    The server, its driver and the good clients (threads) run in this
    process; the bad requests are generated and sent by a spawned child
    process, so that this process's RSS and OS thread count are the
    server's (plus the good clients' threads, which end before "end").

    Keys: statuses ({category: {status: count}}; "aborted": no answer
    expected; "http09:<code>": the error page http.server sends without a
    status line to a request line it cannot parse), bad_total, non_4xx (at
    most 50 (category, status, request head) of the answers that were no
    4xx), non_4xx_count, fuzzer_error, good_episodes ({client: completed}),
    good_errors, good_clients_alive, rss_mib / threads (dicts: start,
    warm (after warmup_fraction of the bad requests), max_after_warmup,
    end (after the clients stopped); with good_from > warmup_fraction also
    good_start: the good clients start once good_from of the bad requests
    are sent, so that warm -> good_start is the growth under bad requests
    alone), open_connections_end, server_alive,
    left_after_stop, learner_batches, seconds, requests_per_sec.
    """
    import multiprocessing
    served = ServedPolicy(num_envs=num_good_clients, token=TOKEN, max_body_bytes=MAX_BODY,
                          max_concurrent=max(8, 2 * num_good_clients),
                          episode_idle_timeout=30.0, connection_idle_timeout=15.0)
    stop = threading.Event()
    results = {}
    rss, threads = {}, {}
    start = time.monotonic()
    clients, child = [], None
    timeout = timeout or 120.0 + 0.1 * num_bad_requests
    figures = {"fuzzer_error": "no result from the fuzzer process"}
    try:
        rss["start"], threads["start"] = proc_status()
        clients = [threading.Thread(target=_good_client, name=f"abuse_good_{k}",
                                    args=(served.server.address, k, stop, results, min_episodes,
                                          seed * 100 + k), daemon=True)
                   for k in range(num_good_clients)]
        if good_from <= 0:
            for t in clients:
                t.start()
        ctx = multiprocessing.get_context("spawn")
        progress = ctx.Value("i", 0, lock=False)
        receiver, sender = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_fuzz_worker, name="abuse_fuzzer", daemon=True,
                            args=(served.host, served.port, num_bad_requests, seed,
                                  include_known_bugs, request_timeout, progress, sender))
        child.start()
        sender.close()
        warm_at = max(1, int(num_bad_requests * warmup_fraction))
        rss_max, threads_max = 0.0, 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # Sample before looking for the results: a fast child may finish
            # between two polls, and the warm-up sample must not be missed.
            if progress.value >= warm_at:
                r, th = proc_status()
                if "warm" not in rss:
                    rss["warm"], threads["warm"] = r, th
                rss_max, threads_max = max(rss_max, r), max(threads_max, th)
            if good_from > 0 and progress.value >= good_from * num_bad_requests and \
                    "good_start" not in rss:
                rss["good_start"], threads["good_start"] = proc_status()
                for t in clients:
                    t.start()
            if receiver.poll(0.25):
                try:
                    figures = receiver.recv()
                except EOFError:
                    pass
                break
            if not child.is_alive() and not receiver.poll(0):
                break
        # A short fuzz can end within one poll: sample now what was not sampled.
        if "warm" not in rss:
            rss["warm"], threads["warm"] = proc_status()
        if good_from > 0 and "good_start" not in rss:
            rss["good_start"], threads["good_start"] = proc_status()
        stop.set()
        for t in clients:
            if t.ident is None:
                t.start()   # (the fuzzer ended early) so that every client ran
            t.join(60)
        # Connections close when their client closes; give them a moment.
        wait_for(lambda: not open_connections(served), 5.0)
        rss["end"], threads["end"] = proc_status()
        rss.setdefault("warm", float("nan"))
        threads.setdefault("warm", -1)
        rss["max_after_warmup"] = max(rss_max, rss["end"])
        threads["max_after_warmup"] = max(threads_max, threads["end"])
        conn_left = open_connections(served)
        alive = served.server.is_alive()
    finally:
        stop.set()
        if child is not None:
            child.join(5)
            if child.is_alive():
                child.kill()   # our own child, by its handle
                child.join(5)
        served.stop()
    figures.setdefault("statuses", {})
    figures.setdefault("bad_total", 0)
    figures.setdefault("non_4xx", [])
    figures.setdefault("non_4xx_count", 0)
    figures.setdefault("requests_per_sec", 0.0)
    figures.update({
        "left_after_stop": _left_behind(),
        "good_episodes": {k: v[0] for k, v in results.items()},
        "good_errors": [e for v in results.values() for e in v[1]],
        "good_clients_alive": [t.name for t in clients if t.is_alive()],
        "rss_mib": rss,
        "threads": threads,
        "open_connections_end": conn_left,
        "server_alive": alive,
        "learner_batches": served.batches,
        "seconds": time.monotonic() - start,
    })
    return figures


def _raw_json(host, port, obj, read=True, timeout=60.0, token=None):
    """POSTs one command on a fresh connection; (status, decoded body) or None if not read."""
    body = json.dumps(obj).encode()
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        sock.sendall(http_bytes("POST", "/v1/command", body, token=token))
        if not read:
            return None
        response = http.client.HTTPResponse(sock)
        response.begin()
        data = response.read()
        return response.status, json.loads(data) if data else None
    finally:
        sock.close()   # vanish: no end_episode, the connection just closes


def vanishing_clients_trial(num_clients, idle_timeout, num_envs=4, max_workers=None,
                            freed_timeout=None):
    """`num_clients` clients start an episode and vanish; returns a dict of figures.

    Client i vanishes (closes its connection, never calls end_episode) in
    mode i % 3: 0 "started" (after start_episode), 1 "acted" (after an
    answered get_action), 2 "in_flight" (with a get_action sent and not
    read). max_concurrent is num_clients: until their episodes are closed
    nobody else can start one. Then the server is probed (start_episode +
    end_episode, which also triggers the reaping of idle unbound episodes)
    until no episode is open; then `num_clients` new episodes must start at
    once (the capacity is free) and 2 * num_envs whole episodes must be
    played through the driver's slots.

    Keys: vanished, modes, vanish_secs (until every client was gone),
    freed_secs (from the last vanish until no episode was open), bound_secs
    (the expected bound: (ceil(acting / num_envs) + 1) * idle_timeout + 1),
    closed_idle (vanished episodes whose id now says "episode_idle_timeout"),
    closed_other, restarted (new episodes started at once), played (whole
    episodes played after), errors, open_connections_end, open_episodes_end.
    """
    from alf_async.serving import PolicyClient
    served = ServedPolicy(num_envs=num_envs, max_concurrent=num_clients,
                          episode_idle_timeout=idle_timeout, connection_idle_timeout=30.0,
                          action_timeout=120.0)
    host, port = served.host, served.port
    errors, ids = [], [None] * num_clients
    modes = ["started", "acted", "in_flight"]
    acting = sum(1 for i in range(num_clients) if i % 3 != 0)
    bound = (math.ceil(acting / num_envs) + 1) * idle_timeout + 1.0
    freed_timeout = freed_timeout or bound + 30.0
    figures = {"vanished": 0, "modes": collections.Counter(modes[i % 3]
                                                            for i in range(num_clients))}
    try:
        def vanish(i):
            try:
                status, reply = _raw_json(host, port, {"command": "start_episode",
                                                       "episode_id": f"gone-{i}"})
                if status != 200:
                    errors.append(f"start {i}: {status} {reply}")
                    return
                ids[i] = reply["episode_id"]
                if i % 3 == 1:
                    status, reply = _raw_json(host, port, {"command": "get_action",
                                                           "episode_id": ids[i],
                                                           "observation": [i, 0]})
                    if status != 200 or reply["action"] != policy_action(i, 0):
                        errors.append(f"get_action {i}: {status} {reply}")
                elif i % 3 == 2:
                    _raw_json(host, port, {"command": "get_action", "episode_id": ids[i],
                                           "observation": [i, 0]}, read=False)
            except Exception as e:  # pylint: disable=broad-except
                errors.append(f"client {i}: {type(e).__name__}: {e}")

        t0 = time.monotonic()
        pending = list(range(num_clients))
        workers = max_workers or min(num_clients, 32)
        lock = threading.Lock()

        def worker():
            while True:
                with lock:
                    if not pending:
                        return
                    i = pending.pop(0)
                vanish(i)

        threads = [threading.Thread(target=worker, name=f"abuse_vanish_{w}", daemon=True)
                   for w in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(freed_timeout)
        t_gone = time.monotonic()
        figures["vanish_secs"] = t_gone - t0
        figures["vanished"] = sum(1 for x in ids if x is not None)

        probe = PolicyClient(served.server.address, timeout=30.0)
        k = [0]

        def freed():
            k[0] += 1
            try:
                eid = probe.start_episode(f"probe-{k[0]}")
                probe.end_episode(eid, [0, 0])   # no action: forgotten at once
            except Exception:  # pylint: disable=broad-except
                pass   # 429 while the capacity is held
            return served.server.num_open_episodes == 0

        ok = wait_for(freed, freed_timeout, interval=0.05)
        figures["freed_secs"] = time.monotonic() - t_gone if ok else float("inf")
        figures["bound_secs"] = bound
        idle, other = 0, []
        for eid in ids:
            if eid is None:
                continue
            try:
                probe.log_returns(eid, 1.0)
                other.append(f"{eid}: still open")
            except ValueError as e:
                if "episode_idle_timeout" in str(e):
                    idle += 1
                else:
                    other.append(f"{eid}: {e}")
        figures["closed_idle"], figures["closed_other"] = idle, other
        # The capacity is free: num_clients new episodes start at once.
        fresh = []
        try:
            for j in range(num_clients):
                fresh.append(probe.start_episode(f"fresh-{j}"))
        except Exception as e:  # pylint: disable=broad-except
            errors.append(f"fresh start {len(fresh)}: {type(e).__name__}: {e}")
        figures["restarted"] = len(fresh)
        for eid in fresh:
            probe.end_episode(eid, [0, 0])
        # The driver's slots serve new episodes: 2 * num_envs whole ones at once.
        played = []

        def play(j):
            try:
                with PolicyClient(served.server.address, timeout=60.0) as c:
                    eid = c.start_episode()
                    for s in range(3):
                        if c.get_action(eid, [j, s]) != policy_action(j, s):
                            errors.append(f"play {j}: wrong action")
                    c.end_episode(eid, [j, 3])
                    played.append(j)
            except Exception as e:  # pylint: disable=broad-except
                errors.append(f"play {j}: {type(e).__name__}: {e}")

        players = [threading.Thread(target=play, args=(j,), name=f"abuse_play_{j}", daemon=True)
                   for j in range(2 * num_envs)]
        for t in players:
            t.start()
        for t in players:
            t.join(60)
        figures["played"] = len(played)
        probe.close()
        wait_for(lambda: not open_connections(served), 5.0)
        figures["open_connections_end"] = open_connections(served)
        figures["open_episodes_end"] = served.server.num_open_episodes
    finally:
        served.stop()
    figures["left_after_stop"] = _left_behind()
    figures["errors"] = errors
    figures["modes"] = dict(figures["modes"])
    return figures


# ------------------------------------------------------------- full figures

# "Flat": after the warm-up (the first 10% of the bad requests), the process
# grows by at most RSS_GROWTH_MIB and THREADS_GROWTH OS threads by the end,
# and no connection is left open once the clients are gone.
RSS_GROWTH_MIB = 32.0
THREADS_GROWTH = 4
# Under bad requests alone (warm -> good_start, when measured).
RSS_GROWTH_BAD_ONLY_MIB = 4.0


def fuzz_failures(r, strict_categories=None):
    """Human-readable failures of a fuzz_trial result (empty: all good)."""
    bad = []
    for category, status, head in r["non_4xx"]:
        if strict_categories is None or category in strict_categories:
            bad.append(f"{category}: got {status} for {head!r}")
    if r["fuzzer_error"]:
        bad.append(f"fuzzer: {r['fuzzer_error']}")
    if r["good_errors"]:
        bad.append(f"good clients failed: {r['good_errors'][:5]}")
    if r["good_clients_alive"]:
        bad.append(f"good clients hung: {r['good_clients_alive']}")
    if r["rss_mib"]["end"] - r["rss_mib"]["warm"] > RSS_GROWTH_MIB:
        bad.append(f"RSS grew {r['rss_mib']['warm']:.1f} -> {r['rss_mib']['end']:.1f} MiB")
    if "good_start" in r["rss_mib"] and \
            r["rss_mib"]["good_start"] - r["rss_mib"]["warm"] > RSS_GROWTH_BAD_ONLY_MIB:
        bad.append(f"RSS grew {r['rss_mib']['warm']:.1f} -> {r['rss_mib']['good_start']:.1f} "
                   f"MiB under bad requests alone")
    if r["threads"]["end"] - r["threads"]["warm"] > THREADS_GROWTH:
        bad.append(f"threads grew {r['threads']['warm']} -> {r['threads']['end']}")
    if r["open_connections_end"]:
        bad.append(f"{r['open_connections_end']} connections left open")
    if not r["server_alive"]:
        bad.append("the server thread died")
    if r["left_after_stop"]:
        bad.append(f"left after stop: {r['left_after_stop']}")
    return bad


def print_full_figures(args):
    """Runs and prints both trials at full counts; returns a list of failures.

    args (an argparse.Namespace, see `add_arguments`): abuse_bad_requests
    (10000), abuse_good_clients (4), abuse_vanishing (100), abuse_idle_timeout
    (0.5), abuse_good_from (0.0), abuse_known_bugs (True: include
    FORMER_BUG_CATEGORIES), seed. A count of 0
    skips that trial. Failures of KNOWN_BUG_CATEGORIES are printed, not returned.
    """
    failures = []
    if args.abuse_bad_requests > 0:
        failures += _print_fuzz(args)
    if args.abuse_vanishing > 0:
        failures += _print_vanishing(args)
    return failures


def _print_fuzz(args):
    r = fuzz_trial(args.abuse_bad_requests, args.abuse_good_clients, seed=args.seed,
                   include_known_bugs=args.abuse_known_bugs, good_from=args.abuse_good_from)
    print(f"\nServing under abuse: {r['bad_total']} bad requests (hypothesis, seed "
          f"{args.seed}) interleaved with {args.abuse_good_clients} good clients, "
          f"{r['seconds']:.0f} s ({r['requests_per_sec']:.0f} bad requests/s)")
    totals = collections.Counter()
    for category in sorted(r["statuses"]):
        counts = r["statuses"][category]
        totals.update(counts)
        known = (" (known bug)" if category in KNOWN_BUG_CATEGORIES else
                 " (no 4xx before 283a0e2)" if category in FORMER_BUG_CATEGORIES else "")
        print(f"  {category:16s} {sum(counts.values()):6d}  " + ", ".join(
            f"{s}: {n}" for s, n in sorted(counts.items(), key=lambda kv: str(kv[0]))) + known)
    print(f"  {'all':16s} {r['bad_total']:6d}  " + ", ".join(
        f"{s}: {n}" for s, n in sorted(totals.items(), key=lambda kv: str(kv[0]))))
    print(f"  not a 4xx (aborted excluded): {r['non_4xx_count']}")
    for category, status, head in r["non_4xx"][:8]:
        print(f"    {category}: {status} <- {head[:100]!r}")
    print(f"  good episodes completed: {r['good_episodes']}, errors: {len(r['good_errors'])}")
    if "good_start" in r["rss_mib"]:
        print(f"  bad requests alone (the first {args.abuse_good_from:.0%}): RSS MiB after "
              f"warm-up {r['rss_mib']['warm']:.1f} -> {r['rss_mib']['good_start']:.1f} (flat: "
              f"<= {RSS_GROWTH_BAD_ONLY_MIB:g}), OS threads {r['threads']['warm']} -> "
              f"{r['threads']['good_start']}")
    print(f"  RSS MiB: start {r['rss_mib']['start']:.1f}, after warm-up "
          f"{r['rss_mib']['warm']:.1f}, max {r['rss_mib']['max_after_warmup']:.1f}, end "
          f"{r['rss_mib']['end']:.1f} (flat: end - warm-up <= {RSS_GROWTH_MIB:g})")
    print(f"  OS threads: start {r['threads']['start']}, after warm-up {r['threads']['warm']}, "
          f"max {r['threads']['max_after_warmup']}, end {r['threads']['end']} (flat: "
          f"end - warm-up <= {THREADS_GROWTH}); connections left open "
          f"{r['open_connections_end']}")
    strict = [c for c in WEIGHTS if c not in KNOWN_BUG_CATEGORIES]
    return fuzz_failures(r, strict_categories=strict)


def _print_vanishing(args):
    v = vanishing_clients_trial(args.abuse_vanishing, args.abuse_idle_timeout)
    print(f"\nVanishing clients: {v['vanished']} episodes started and abandoned "
          f"({v['modes']}), episode_idle_timeout {args.abuse_idle_timeout:g} s, 4 slots")
    print(f"  all gone after {v['vanish_secs']:.1f} s; every episode closed "
          f"{v['freed_secs']:.2f} s later (bound {v['bound_secs']:.1f} s); closed as idle: "
          f"{v['closed_idle']}, otherwise: {len(v['closed_other'])}")
    print(f"  then {v['restarted']}/{args.abuse_vanishing} new episodes started at once, "
          f"{v['played']}/8 whole episodes played; connections left open "
          f"{v['open_connections_end']}, errors {len(v['errors'])}")
    return vanishing_failures(v, args.abuse_vanishing)


def vanishing_failures(v, num_clients, num_envs=4):
    bad = []
    if v["vanished"] != num_clients or v["errors"]:
        bad.append(f"vanishing: {v['vanished']}/{num_clients} started, errors {v['errors'][:5]}")
    if v["freed_secs"] > v["bound_secs"]:
        bad.append(f"vanishing: freed after {v['freed_secs']:.1f} s > {v['bound_secs']:.1f} s")
    if v["closed_idle"] != num_clients or v["closed_other"]:
        bad.append(f"vanishing: {v['closed_idle']} closed as idle; {v['closed_other'][:3]}")
    if v["restarted"] != num_clients or v["played"] != 2 * num_envs:
        bad.append(f"vanishing: restarted {v['restarted']}, played {v['played']}")
    if v["left_after_stop"]:
        bad.append(f"vanishing: left after stop: {v['left_after_stop']}")
    if v["open_connections_end"] or v["open_episodes_end"]:
        bad.append(f"vanishing: {v['open_connections_end']} connections open, "
                   f"{v['open_episodes_end']} episodes left")
    return bad


def add_arguments(parser):
    """The flags print_full_figures reads."""
    parser.add_argument("--abuse_bad_requests", type=int, default=10_000)
    parser.add_argument("--abuse_good_clients", type=int, default=4)
    parser.add_argument("--abuse_vanishing", type=int, default=100)
    parser.add_argument("--abuse_idle_timeout", type=float, default=0.5)
    parser.add_argument("--abuse_good_from", type=float, default=0.0,
                        help="the good clients start once this fraction of the bad "
                        "requests is sent (0: from the start)")
    parser.add_argument("--abuse_skip_former_bugs", dest="abuse_known_bugs",
                        action="store_false", help="leave out the request shapes of "
                        "FORMER_BUG_CATEGORIES (for a server before 283a0e2)")


if __name__ == "__main__":
    import argparse
    _parser = argparse.ArgumentParser(description="Serving under abuse, full counts")
    add_arguments(_parser)
    _parser.add_argument("--seed", type=int, default=0)
    _failures = print_full_figures(_parser.parse_args())
    print(f"\n{len(_failures)} failures")
    for _f in _failures:
        print("  ", _f)
    raise SystemExit(1 if _failures else 0)
