"""PolicyClient: the ExternalEnv episode methods, spoken to a PolicyServerEnv.

    client = PolicyClient("http://127.0.0.1:8900", token="s3cret")
    eid = client.start_episode()
    action = client.get_action(eid, obs)
    while ...:
        action = client.get_action(eid, obs, reward=reward)   # one round trip per step
    client.log_returns(eid, reward)
    client.end_episode(eid, obs)

`get_action(eid, obs, reward=r)` is `log_returns(eid, r)` then
`get_action(eid, obs)` in one request (RLlib's PolicyClient has only the
two separate calls, which this keeps: code written for it runs unchanged).

inference_mode="remote" (default): every call is one HTTP request; the
server's policy acts (get_action blocks until it did). Needs only the
standard library and numpy (TensorFlow is not imported).

inference_mode="local": the client downloads the server's policy (a
tf-agents SavedModel, see `PolicyServerEnv(policy=...)`), acts with it
locally, and reports its experience in batches (`report` commands of
start_episode / log_action / log_returns / end_episode, in order): on the
server the actions arrive as `log_action`, i.e. off-policy steps whose
recorded action is the one the client took. The weights are refreshed every
`update_interval` seconds (checked on get_action; an unchanged policy costs
one 304 response). Reports go out when `report_max_events` events are
buffered or `report_interval` seconds have passed since the last one (checked
on each call), on `flush()` and on `close()`. A report refused by the server
(e.g. an observation of the wrong shape) raises from the call that sent it;
that report's events after the faulty one are lost. Keep `report_interval`
well below the server's `episode_idle_timeout`. Requires TensorFlow and
tf-agents; trusts the server (it runs the server's SavedModel).

Errors: a refused request raises `protocol.PolicyServerError` subclasses that
are also the built-in type the local ExternalEnv raises (ValueError for
unknown or finished ids and spec mismatches, TimeoutError, ...);
`ConnectionError` when the server cannot be reached.

Threads: a PolicyClient may be used from several threads at once (each gets
its own keep-alive connection; in local mode, inference and weight updates
are serialised by a lock, and reports are sent in order). It starts no
threads. Calls block for their HTTP request (at most `timeout` seconds).
"""

import http.client
import io
import logging
import os
import shutil
import socket
import tarfile
import tempfile
import threading
import time
import urllib.parse
import uuid
import weakref

import numpy as np

from alf_async.environments.external import episode_api
from alf_async.serving import protocol

logger = logging.getLogger(__name__)

_RETRYABLE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
              ConnectionAbortedError)


class PolicyClient(object):
    """Client of a PolicyServerEnv; see the module docstring."""

    def __init__(self, address, token=None, inference_mode="remote", update_interval=10.0,
                 report_interval=1.0, report_max_events=256,
                 max_body_bytes=protocol.DEFAULT_MAX_BODY_BYTES, timeout=90.0):
        """
        Args:
            address: the server's address, e.g. `server.address`
                ("http://127.0.0.1:8900"); https:// also works.
            token: the server's bearer token, if it has one.
            inference_mode: "remote" or "local".
            update_interval: (local) seconds between policy weight refreshes.
            report_interval: (local) most seconds experience stays buffered
                (checked on each call).
            report_max_events: (local) events that trigger a report.
            max_body_bytes: (local) reports larger than this are split (keep
                it at most the server's max_body_bytes).
            timeout: seconds an HTTP request may take; keep it above the
                server's action_timeout.
        """
        if inference_mode not in ("remote", "local"):
            raise ValueError(f"inference_mode must be 'remote' or 'local', got "
                             f"{inference_mode!r}")
        parts = urllib.parse.urlsplit(address)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"address must look like http://host:port, got {address!r}")
        self.address = address
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = parts.port
        self._headers = {"Content-Type": protocol.CONTENT_TYPE}
        if token is not None:
            self._headers["Authorization"] = f"Bearer {token}"
        self._timeout = timeout
        self._mode = inference_mode
        self._tls = threading.local()
        self._conn_lock = threading.Lock()
        self._connections = []
        self._closed = False
        if inference_mode == "local":
            self._local = _LocalInference(self, update_interval, report_interval,
                                          report_max_events, max_body_bytes)

    @property
    def inference_mode(self):
        return self._mode

    @property
    def policy_updates(self):
        """(local) Weight refreshes so far that changed the policy; 0 when remote."""
        return self._local.policy_updates if self._mode == "local" else 0

    # ------------------------------------------------------ episode methods

    def start_episode(self, episode_id=None, training_enabled=True):
        """Opens an episode; returns its id (see ExternalEnv.start_episode)."""
        if self._mode == "local":
            return self._local.start_episode(episode_id, training_enabled)
        return self.call("start_episode", episode_id=episode_id,
                         training_enabled=bool(training_enabled))["episode_id"]

    def get_action(self, episode_id, observation, reward=None):
        """The policy's action for `observation`.

        Args:
            episode_id: as ExternalEnv.get_action.
            observation: as ExternalEnv.get_action.
            reward: if not None, first `log_returns(episode_id, reward)` in
                the same request (one round trip per step instead of two).

        Returns:
            Remote: the action as decoded JSON (a number, or nested lists and
                objects following the action spec). Local: numpy arrays.
        """
        if self._mode == "local":
            if reward is not None:
                self._local.log_returns(episode_id, reward, None)
            return self._local.get_action(episode_id, observation)
        if reward is None:
            return self.call("get_action", episode_id=episode_id,
                             observation=observation)["action"]
        return self.call("get_action", episode_id=episode_id, observation=observation,
                         reward=float(reward))["action"]

    def log_action(self, episode_id, observation, action):
        """Records an off-policy step (see ExternalEnv.log_action)."""
        if self._mode == "local":
            return self._local.log_action(episode_id, observation, action)
        self.call("log_action", episode_id=episode_id, observation=observation, action=action)

    def log_returns(self, episode_id, reward, info=None):
        """Adds a reward to the last action's return (see ExternalEnv.log_returns)."""
        if self._mode == "local":
            return self._local.log_returns(episode_id, reward, info)
        args = {"info": info} if info is not None else {}
        self.call("log_returns", episode_id=episode_id, reward=float(reward), **args)

    def end_episode(self, episode_id, observation):
        """Closes the episode with its last observation (see ExternalEnv.end_episode)."""
        if self._mode == "local":
            return self._local.end_episode(episode_id, observation)
        self.call("end_episode", episode_id=episode_id, observation=observation)

    def flush(self):
        """(local) Reports the buffered experience now."""
        if self._mode == "local":
            self._local.report()

    def close(self):
        """Reports what is buffered (local), closes connections. Idempotent."""
        if self._closed:
            return
        try:
            if self._mode == "local":
                self._local.close()
        finally:
            self._closed = True
            with self._conn_lock:
                connections, self._connections = self._connections, []
            for conn in connections:
                conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    # ---------------------------------------------------------------- HTTP

    def call(self, command, **args):
        """Sends one command; returns the decoded response object or raises."""
        status, _, body = self.request("POST", protocol.COMMAND_PATH,
                                       protocol.encode_command(command, **args))
        if status != 200:
            raise protocol.exception_from_response(status, body)
        return protocol.decode_json(body)

    def request(self, method, path, body=None, headers=None):
        """One HTTP request on this thread's keep-alive connection.

        Returns:
            (status, response headers, body bytes).

        Raises:
            ConnectionError: the server cannot be reached (a connection the
                server closed while idle is retried once).
            TimeoutError: no response within `timeout`.
        """
        if self._closed:
            raise RuntimeError("the PolicyClient is closed")
        all_headers = dict(self._headers, **(headers or {}))
        for attempt in range(2):
            conn = self._connection()
            reused = conn.sock is not None
            try:
                status, response_headers, data, will_close = conn.round_trip(
                    method, path, body, all_headers)
                if will_close:
                    conn.close()
                return status, response_headers, data
            except _RETRYABLE as e:
                conn.close()
                if attempt == 0 and reused:
                    continue
                raise ConnectionError(f"policy server {self.address}: {e!r}") from e
            except socket.timeout as e:
                conn.close()
                raise TimeoutError(f"policy server {self.address}: no response within "
                                   f"{self._timeout} s") from e
            except OSError as e:
                conn.close()
                raise ConnectionError(f"policy server {self.address}: {e!r}") from e
        raise AssertionError("unreachable")

    def _connection(self):
        conn = getattr(self._tls, "conn", None)
        if conn is None:
            cls = _HTTPSConnection if self._scheme == "https" else _PlainConnection
            conn = cls(self._host, self._port, timeout=self._timeout)
            self._tls.conn = conn
            with self._conn_lock:
                self._connections.append(conn)
        return conn


class _PlainConnection(object):
    """One keep-alive HTTP/1.1 connection over a plain socket (http://).

    Not http.client: it builds headers one call each and parses the
    response's with the email package, several times this class's client
    CPU per request on loopback. A client process playing many episodes
    spends that on every step, on the same cores as the server (docs/design.md,
    "Why our own parts where a library exists"). It speaks what a
    PolicyServerEnv (or a proxy in front of it) answers: a status line,
    headers, and a body framed by Content-Length, chunked, or the close.
    https:// uses http.client (`_HTTPSConnection`).

    Threads: one client thread (PolicyClient keeps one per thread).
    """

    def __init__(self, host, port, timeout):
        self._address = (host, port or 80)
        self._host_header = f"{host}:{port}" if port else host
        self._timeout = timeout
        self.sock = None
        self._buf = b""

    def close(self):
        if self.sock is not None:
            self.sock.close()
        self.sock = None
        self._buf = b""

    def round_trip(self, method, path, body, headers):
        """Sends one request; returns (status, headers, body, will_close)."""
        if self.sock is None:
            self.sock = socket.create_connection(self._address, self._timeout)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        body = body or b""
        head = "".join([f"{method} {path} HTTP/1.1\r\nHost: {self._host_header}\r\n"] +
                       [f"{k}: {v}\r\n" for k, v in headers.items()] +
                       [f"Content-Length: {len(body)}\r\n\r\n"])
        self.sock.sendall(head.encode("latin-1") + body)
        end = self._fill_until(b"\r\n\r\n")
        lines = self._buf[:end].decode("latin-1").split("\r\n")
        self._buf = self._buf[end + 4:]
        version, _, rest = lines[0].partition(" ")
        try:
            status = int(rest[:3])
        except ValueError:
            raise http.client.BadStatusLine(lines[0]) from None
        response_headers = _Headers()
        for line in lines[1:]:
            name, _, value = line.partition(":")
            response_headers[name.strip().lower()] = value.strip()
        connection = response_headers.get("connection", "").lower()
        will_close = connection == "close" or (version == "HTTP/1.0" and
                                               connection != "keep-alive")
        if response_headers.get("transfer-encoding", "").lower() == "chunked":
            data = self._read_chunked()
        elif "content-length" in response_headers:
            data = self._read_exactly(int(response_headers["content-length"]))
        elif status in (204, 304) or 100 <= status < 200:
            data = b""
        else:   # framed by the close
            data, will_close = self._read_to_close(), True
        return status, response_headers, data, will_close

    def _recv(self):
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise http.client.RemoteDisconnected("the server closed the connection")
        self._buf += chunk

    def _fill_until(self, marker):
        while True:
            end = self._buf.find(marker)
            if end >= 0:
                return end
            self._recv()

    def _read_exactly(self, n):
        while len(self._buf) < n:
            self._recv()
        data, self._buf = self._buf[:n], self._buf[n:]
        return data

    def _read_chunked(self):
        parts = []
        while True:
            end = self._fill_until(b"\r\n")
            size = int(self._buf[:end].split(b";")[0], 16)
            self._buf = self._buf[end + 2:]
            if size == 0:   # then trailer lines, up to an empty one
                while True:
                    end = self._fill_until(b"\r\n")
                    line, self._buf = self._buf[:end], self._buf[end + 2:]
                    if not line:
                        return b"".join(parts)
            parts.append(self._read_exactly(size))
            self._read_exactly(2)

    def _read_to_close(self):
        try:
            while True:
                self._recv()
        except http.client.RemoteDisconnected:
            data, self._buf = self._buf, b""
            return data


class _Headers(dict):
    """Response headers, names lowercased; `get` takes any case."""

    def get(self, name, default=None):
        return dict.get(self, name.lower(), default)


class _HTTPSConnection(http.client.HTTPSConnection):

    def connect(self):
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def round_trip(self, method, path, body, headers):
        """Sends one request; returns (status, headers, body, will_close)."""
        self.request(method, path, body=body, headers=headers)
        response = self.getresponse()
        return response.status, response.headers, response.read(), response.will_close


class _LocalEpisode(object):
    __slots__ = ("first", "policy_state", "reward")

    def __init__(self):
        self.first = True
        self.policy_state = None
        self.reward = 0.0


class _LocalInference(object):
    """The local-inference half of a PolicyClient (policy copy + report buffer).

    Threads: any client thread; `_policy_lock` serialises inference and
    weight updates, `_report_lock` keeps reports in order, `_lock` guards
    the buffer and the episodes.
    """

    def __init__(self, client, update_interval, report_interval, report_max_events,
                 max_body_bytes):
        self._client = client
        self._update_interval = float(update_interval)
        self._report_interval = float(report_interval)
        self._report_max = int(report_max_events)
        self._max_body = int(max_body_bytes)
        self._lock = threading.Lock()
        self._policy_lock = threading.Lock()
        self._report_lock = threading.Lock()
        self._events = []
        self._last_report = time.monotonic()
        self._episodes = {}
        self._finished = set()
        self._policy = None
        self._obs_spec = None
        self._time_step_spec = None
        self._etag = None
        self._last_update = float("-inf")
        self._dir = None
        self.policy_updates = 0   # weight refreshes that changed the policy

    # ------------------------------------------------------------ episodes

    def start_episode(self, episode_id, training_enabled):
        if episode_api.check_episode_id(episode_id, allow_none=True) is None:
            episode_id = uuid.uuid4().hex
        with self._lock:
            if episode_id in self._episodes:
                raise ValueError(f"episode {episode_id!r} is already started")
            if episode_id in self._finished:
                raise ValueError(f"episode {episode_id!r} has already finished")
            self._episodes[episode_id] = _LocalEpisode()
            self._events.append({"command": "start_episode", "episode_id": episode_id,
                                 "training_enabled": bool(training_enabled)})
        self._maybe_report()
        return episode_id

    def get_action(self, episode_id, observation):
        from tf_agents.trajectories import time_step as ts  # pylint: disable=import-outside-toplevel
        self._ensure_policy()
        with self._lock:
            ep = self._episode(episode_id)
        obs = episode_api.check_nest(observation, self._obs_spec, "observation")
        spec = self._time_step_spec
        time_step = ts.TimeStep(
            step_type=np.asarray(ts.StepType.FIRST if ep.first else ts.StepType.MID,
                                 spec.step_type.dtype),
            reward=np.asarray(ep.reward, spec.reward.dtype),
            discount=np.asarray(1.0, spec.discount.dtype),
            observation=obs)
        with self._policy_lock:
            if ep.policy_state is None:
                ep.policy_state = self._policy.get_initial_state(batch_size=1)
            step = self._policy.action(time_step, ep.policy_state)
        ep.policy_state = step.state
        self._log(episode_id, ep, obs, step.action)
        self._maybe_report()
        return step.action

    def log_action(self, episode_id, observation, action):
        with self._lock:
            ep = self._episode(episode_id)
        self._log(episode_id, ep, observation, action)
        self._maybe_report()

    def log_returns(self, episode_id, reward, info):
        reward = episode_api.check_reward(reward)
        with self._lock:
            ep = self._episode(episode_id)
            if ep.first:
                raise ValueError(f"log_returns for episode {episode_id!r} before its first "
                                 f"action: a reward belongs to the action before it")
            ep.reward += reward
            event = {"command": "log_returns", "episode_id": episode_id, "reward": reward}
            if info is not None:
                event["info"] = info
            self._events.append(event)
        self._maybe_report()

    def end_episode(self, episode_id, observation):
        with self._lock:
            self._episode(episode_id)
            del self._episodes[episode_id]
            self._finished.add(episode_id)
            self._events.append({"command": "end_episode", "episode_id": episode_id,
                                 "observation": episode_api.to_json(observation)})
        self._maybe_report()

    def _episode(self, episode_id):
        ep = self._episodes.get(episode_id)
        if ep is None:
            if episode_id in self._finished:
                raise ValueError(f"episode {episode_id!r} has already finished")
            raise ValueError(f"episode {episode_id!r} is unknown: call start_episode() first")
        return ep

    def _log(self, episode_id, ep, observation, action):
        with self._lock:
            ep.first = False
            ep.reward = 0.0
            self._events.append({"command": "log_action", "episode_id": episode_id,
                                 "observation": episode_api.to_json(observation),
                                 "action": episode_api.to_json(action)})

    # ------------------------------------------------------------- reports

    def _maybe_report(self):
        with self._lock:
            due = (len(self._events) >= self._report_max or
                   time.monotonic() - self._last_report >= self._report_interval)
        if due:
            self.report()

    def report(self):
        with self._report_lock:
            with self._lock:
                events, self._events = self._events, []
                self._last_report = time.monotonic()
            if events:
                self._send(events)

    def _send(self, events):
        body = protocol.encode_command("report", events=events)
        if len(body) > self._max_body and len(events) > 1:
            half = len(events) // 2
            self._send(events[:half])
            self._send(events[half:])
            return
        self._client.call("report", events=events)

    # -------------------------------------------------------------- policy

    def _ensure_policy(self):
        with self._policy_lock:
            if self._policy is None:
                self._load_model()
            if time.monotonic() - self._last_update >= self._update_interval:
                self._update_weights()

    def _load_model(self):
        # pylint: disable=import-outside-toplevel
        from tf_agents.policies import py_tf_eager_policy
        from tf_agents.specs import tensor_spec
        blob = self._get(protocol.POLICY_MODEL_PATH)[1]
        self._dir = tempfile.mkdtemp(prefix="alf_async_client_policy_")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._dir, ignore_errors=True)
        model_dir = os.path.join(self._dir, "model")
        _extract(blob, model_dir)
        self._policy = py_tf_eager_policy.SavedModelPyTFEagerPolicy(
            model_dir, load_specs_from_pbtxt=True, use_tf_function=True)
        self._time_step_spec = tensor_spec.to_nest_array_spec(self._policy.time_step_spec)
        self._obs_spec = self._time_step_spec.observation

    def _update_weights(self):
        self._last_update = time.monotonic()
        headers = {"If-None-Match": self._etag} if self._etag else {}
        etag, blob = self._get(protocol.POLICY_WEIGHTS_PATH, headers)
        if blob is None:   # 304: unchanged
            return
        ckpt_dir = tempfile.mkdtemp(dir=self._dir)
        try:
            _extract(blob, ckpt_dir)
            self._policy.update_from_checkpoint(ckpt_dir)
        finally:
            shutil.rmtree(ckpt_dir, ignore_errors=True)
        self._etag = etag
        self.policy_updates += 1

    def _get(self, path, headers=None):
        status, response_headers, body = self._client.request("GET", path, headers=headers)
        if status == 304:
            return response_headers.get("ETag"), None
        if status != 200:
            raise protocol.exception_from_response(status, body)
        return response_headers.get("ETag"), body

    def close(self):
        try:
            self.report()
        finally:
            if self._dir is not None:
                self._cleanup()


def _extract(blob, directory):
    """Extracts a tar.gz from the server, refusing links and paths outside `directory`."""
    os.makedirs(directory, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        tar.extractall(directory, filter="data")
