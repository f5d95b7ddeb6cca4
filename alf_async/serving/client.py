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

import logging
import socket
import threading
import urllib.parse

from alf_async.serving import protocol
from alf_async.serving.client_transport import RETRYABLE, HTTPSConnection, PlainConnection
from alf_async.serving.local_inference import LocalInference

logger = logging.getLogger(__name__)


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
            self._local = LocalInference(self, update_interval, report_interval,
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
            except RETRYABLE as e:
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
            cls = HTTPSConnection if self._scheme == "https" else PlainConnection
            conn = cls(self._host, self._port, timeout=self._timeout)
            self._tls.conn = conn
            with self._conn_lock:
                self._connections.append(conn)
        return conn
