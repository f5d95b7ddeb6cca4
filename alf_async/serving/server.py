"""PolicyServerEnv: an ExternalEnv whose run() serves the policy over HTTP.

    server = PolicyServerEnv(action_spec, observation_spec, token="s3cret",
                             policy=agent.collect_policy)   # policy: for local inference
    driver = AsyncOffPolicyDriver(server.env_constructor(slots_per_env=K),  # K episodes at once
                                  agent.collect_policy, num_envs=1, exp_observers=[replayer])
    driver.start()                 # starts serving on server.address
    ...
    driver.stop()                  # stops serving too

The wire format is `alf_async.serving.protocol` (JSON only). Every request
is answered; refused ones get a 4xx (5xx when the server itself is stopped or
failed) with a JSON error, and the server goes on serving everyone else:
malformed JSON, unknown commands or arguments, observations or actions that
do not match the specs (400), no or a wrong token (401), an unknown path
(404), an HTTP method the path does not serve (405), no Content-Length
(411), a body over `max_body_bytes` (413, not read), too many open episodes
(429), no action in time (504).

Under load the server applies back-pressure, never drops (see
ExternalEnv's "Memory under load"): a learner slower than its clients makes
get_action/log_action (and `report`, whose events are log_actions) wait,
start_episode beyond `max_concurrent` gets 429, and what the server holds
stays below `max_concurrent * max_pending_steps` queued steps. Connection
threads are one per open connection (clients keep theirs alive).

A client that disappears mid-episode does not block the driver: its episode
is closed after `episode_idle_timeout` seconds without a request (see
ExternalEnv) and its slot serves other episodes.

Threads
-------
`run()` (the ExternalEnv thread, started with the driver) accepts
connections; each connection gets a daemon thread ("policy_server_conn")
that serves its keep-alive requests one after another and blocks in
get_action / end_episode / log_action as ExternalEnv does. `stop()` (called
by `driver.stop()`, or directly) wakes every blocked request (it answers
503), makes `run()` return within `poll_interval`, closes every open
connection, and `run()` then joins the connection threads and closes the
listening socket. `close()` stops and joins: nothing is left behind.

Security: binds 127.0.0.1 by default. Bind another interface only with a
token and behind TLS termination: the token travels in clear HTTP. The
policy export (local inference) is a SavedModel that clients load and run:
clients must trust the server, never the other way round.
"""

import email.utils
import hashlib
import hmac
import http
import http.server
import io
import logging
import os
import shutil
import socket
import tarfile
import tempfile
import threading
import time
import weakref

from alf_async.environments.external_env import (ExternalEnv, ExternalEnvFinished,
                                                 ExternalEnvStoppedError,
                                                 TooManyEpisodesError)
from alf_async.serving import protocol

logger = logging.getLogger(__name__)

_MAX_DISCARD_BYTES = 64 << 20


class PolicyServerEnv(ExternalEnv):
    """An ExternalEnv serving start_episode/get_action/... as JSON over HTTP."""

    def __init__(self, action_spec, observation_spec, host="127.0.0.1", port=0,
                 max_concurrent=100, token=None, policy=None, action_timeout=60.0,
                 episode_idle_timeout=60.0, max_body_bytes=protocol.DEFAULT_MAX_BODY_BYTES,
                 connection_idle_timeout=75.0, weights_refresh_secs=1.0, poll_interval=0.25,
                 name="policy_server", **external_env_kwargs):
        """
        Args:
            action_spec, observation_spec: array spec nests (or gym spaces).
            host: interface to bind; loopback by default.
            port: TCP port; 0 picks a free one (see `address`).
            max_concurrent: most open episodes (see ExternalEnv).
            token: if set, requests need `Authorization: Bearer <token>`.
            policy: a TFPolicy to export for `inference_mode="local"` clients
                (e.g. the driver's collect policy); None: no export (404).
                Saved once here (tf-agents PolicySaver, on this thread); its
                variables are re-read at most every `weights_refresh_secs`.
            action_timeout: see ExternalEnv.
            episode_idle_timeout: seconds without a request after which an
                episode is closed (a vanished client); None: never.
            max_body_bytes: larger request bodies get 413 (the body is read
                and dropped, up to 64 MiB, and the connection closed).
            connection_idle_timeout: seconds a keep-alive connection may
                stay silent before the server closes it.
            weights_refresh_secs: how stale the exported weights may be.
            poll_interval: how often `run()` checks for stop.
            name: the ExternalEnv thread's name.
            **external_env_kwargs: more ExternalEnv arguments.
        """
        super().__init__(action_spec, observation_spec, max_concurrent=max_concurrent,
                         action_timeout=action_timeout,
                         episode_idle_timeout=episode_idle_timeout, name=name,
                         **external_env_kwargs)
        self._token = token
        self._max_body = int(max_body_bytes)
        self._poll = float(poll_interval)
        self._export = _PolicyExport(policy, weights_refresh_secs) if policy is not None else None
        handler = type("_BoundHandler", (_Handler,), {"timeout": connection_idle_timeout})
        try:
            self._httpd = _HTTPServer((host, port), handler, self)
        except BaseException:
            if self._export is not None:
                self._export.close()
            raise
        bound_host, bound_port = self._httpd.server_address[:2]
        self.address = f"http://{bound_host}:{bound_port}"

    # ------------------------------------------------------------- serving

    def run(self):
        """Serves requests until `stop()`; then closes every connection."""
        self._httpd.timeout = self._poll
        try:
            while not self.stopped:
                self._httpd.handle_request()   # one accept, or a timeout after poll_interval
        finally:
            self._httpd.close_all()
            if self._export is not None:
                self._export.close()

    def on_stop(self):
        # run() sees `stopped` within poll_interval; blocked requests were
        # woken by ExternalEnv.stop(). Connections idle in keep-alive reads
        # are closed here so that their threads end now.
        self._httpd.shutdown_connections()

    def close(self, timeout=10.0):
        """Stops serving and joins every thread; idempotent."""
        self.stop(reason="close() was called")
        self.join(timeout)
        if not self.run_started:   # run() never ran: close the socket here
            self._httpd.close_all()
        if self._export is not None:
            self._export.close()

    # ------------------------------------------------------------ commands

    def authorized(self, header):
        if self._token is None:
            return True
        expected = f"Bearer {self._token}".encode()
        return header is not None and hmac.compare_digest(header.encode(), expected)

    def dispatch(self, command, args):
        """Runs one parsed command (on a connection thread); returns the response object.

        An episode method's arguments are its keyword arguments (the protocol
        checked their names against episode_api.METHODS).
        """
        if command == "report":
            return {"applied": self._report(args["events"])}
        return protocol.result_of(command, getattr(self, command)(**args))

    def _report(self, events):
        parsed = []
        for i, event in enumerate(events):
            try:
                parsed.append(protocol.parse_command(event, allowed=protocol.REPORTABLE))
            except protocol.ProtocolError as e:
                raise protocol.ProtocolError(e.type_name, f"report event {i}: {e}") from None
        for i, (command, args) in enumerate(parsed):
            try:
                self.dispatch(command, args)
            except (ValueError, TypeError) as e:
                raise ValueError(f"report event {i} ({command}; events before it were "
                                 f"applied): {e}") from None
        return len(parsed)

    def policy_model(self):
        return self._export.model() if self._export is not None else None

    def policy_weights(self):
        return self._export.weights() if self._export is not None else None


def error_type_of(exc):
    """(type name, message) for an exception raised while serving a command."""
    if isinstance(exc, protocol.ProtocolError):
        return exc.type_name, str(exc)
    if isinstance(exc, TooManyEpisodesError):
        return "TooManyEpisodesError", str(exc)
    if isinstance(exc, (ValueError, TypeError)):
        return "ValueError", str(exc)
    if isinstance(exc, TimeoutError):
        return "TimeoutError", str(exc)
    if isinstance(exc, (ExternalEnvStoppedError, ExternalEnvFinished)):
        return "ServerStoppedError", str(exc)
    return "InternalError", f"the server failed ({type(exc).__name__}); see its log"


class _HTTPServer(http.server.HTTPServer):
    """An HTTPServer with one daemon thread per connection, all tracked.

    Threads: `handle_request()` runs on the ExternalEnv thread; the
    connection threads on their own; `shutdown_connections()` and
    `close_all()` on any thread.
    """

    allow_reuse_address = True
    # Many clients may connect at once (socketserver's default backlog is 5).
    request_queue_size = 128

    def __init__(self, address, handler, env):
        self.env = env
        self._conn_lock = threading.Lock()
        self._connections = {}   # thread -> socket
        self._busy = set()       # threads inside a request
        self.closed = False
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        thread = threading.Thread(target=self._serve_connection,
                                  args=(request, client_address),
                                  name="policy_server_conn", daemon=True)
        with self._conn_lock:
            if self.closed:
                self.shutdown_request(request)
                return
            self._connections[thread] = request
        thread.start()

    def set_busy(self, busy):
        """Called by a connection thread around each request it serves."""
        with self._conn_lock:
            if busy:
                self._busy.add(threading.current_thread())
            else:
                self._busy.discard(threading.current_thread())

    def _serve_connection(self, request, client_address):
        try:
            self.finish_request(request, client_address)
        except Exception:  # pylint: disable=broad-except
            if not self.env.stopped:
                logger.debug("connection from %s failed", client_address, exc_info=True)
        finally:
            self.shutdown_request(request)
            with self._conn_lock:
                self._connections.pop(threading.current_thread(), None)
                self._busy.discard(threading.current_thread())

    def shutdown_connections(self):
        """Shuts down every connection waiting for its next request.

        Connections inside a request answer it first (a stopped ExternalEnv
        answers at once) and then close.
        """
        with self._conn_lock:
            self.closed = True
            sockets = [s for t, s in self._connections.items() if t not in self._busy]
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close_all(self, timeout=5.0):
        """Closes the connections, joins their threads, closes the listening socket."""
        self.shutdown_connections()
        deadline = time.monotonic() + timeout
        with self._conn_lock:
            threads = list(self._connections)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    """One connection's requests (keep-alive); runs on its connection thread."""

    protocol_version = "HTTP/1.1"
    server_version = "alf_async-policy-server/1"
    # Headers and body are two writes: without TCP_NODELAY, Nagle's algorithm
    # and the client's delayed ACK add ~40 ms to every response.
    disable_nagle_algorithm = True

    def send_error(self, code, message=None, explain=None):
        """http.server's own refusals, as 4xx with a JSON error body like every
        other: it answers 501 to a method we do not serve and 505 to an HTTP
        version other than 1.x; both are the client's request at fault, so
        405 and 400. The connection then closes (the request was not read).

        A request line it could not parse leaves the request's version at
        HTTP/0.9, whose responses have no status line; the error is sent
        with one (HTTP/1.1) all the same, so that its status is readable.
        """
        del explain
        if self.request_version == "HTTP/0.9":
            self.request_version = self.protocol_version
        if code == 501:
            self._method_not_allowed(f"method {self.command!r} is not allowed: use GET or POST")
            return
        if code == 505:
            code = 400
            message = f"HTTP version not supported: {message or ''} (use HTTP/1.1)"
        type_name = protocol.type_of_status(code)
        self.close_connection = True
        self._send(code, protocol.error_body(type_name, message or f"HTTP error {code}"))

    def log_message(self, format, *args):  # pylint: disable=redefined-builtin
        logger.debug("%s - " + format, self.address_string(), *args)

    # ------------------------------------------------------------ routes

    def do_POST(self):
        self.server.set_busy(True)
        try:
            self._post()
        finally:
            self.server.set_busy(False)

    def do_GET(self):
        self.server.set_busy(True)
        try:
            self._get()
        finally:
            self.server.set_busy(False)

    def _post(self):
        env = self.server.env
        body = self._read_body(env)
        if body is None:
            return
        if self.path in (protocol.POLICY_MODEL_PATH, protocol.POLICY_WEIGHTS_PATH):
            return self._method_not_allowed(f"POST {self.path}: the policy is fetched with GET")
        if self.path != protocol.COMMAND_PATH:
            return self._error("NotFound", f"no such path {self.path!r}; POST commands to "
                               f"{protocol.COMMAND_PATH}")
        if not env.authorized(self.headers.get("Authorization")):
            return self._unauthorized()
        try:
            command, args = protocol.parse_command(protocol.decode_json(body))
            result = env.dispatch(command, args)
        except Exception as e:  # pylint: disable=broad-except
            type_name, message = error_type_of(e)
            if type_name == "InternalError":
                logger.exception("command failed")
            return self._error(type_name, message)
        self._send(200, protocol.encode(result))

    def _get(self):
        env = self.server.env
        if self.path == protocol.COMMAND_PATH:
            return self._method_not_allowed(f"GET {self.path}: commands are sent with POST")
        if self.path not in (protocol.POLICY_MODEL_PATH, protocol.POLICY_WEIGHTS_PATH):
            return self._error("NotFound", f"no such path {self.path!r}", body_unread=True)
        if not env.authorized(self.headers.get("Authorization")):
            return self._unauthorized()
        try:
            if self.path == protocol.POLICY_MODEL_PATH:
                blob = env.policy_model()
                etag = None
            else:
                export = env.policy_weights()
                etag, blob = export if export is not None else (None, None)
        except Exception:  # pylint: disable=broad-except
            logger.exception("exporting the policy failed")
            return self._error("InternalError", "exporting the policy failed; see the "
                               "server's log")
        if blob is None:
            return self._error("NotFound", "this server exports no policy: construct "
                               "PolicyServerEnv(..., policy=...) for local inference")
        if etag is not None and self.headers.get("If-None-Match") == etag:
            return self._send(304, b"", etag=etag)
        self._send(200, blob, content_type="application/gzip", etag=etag)

    # ----------------------------------------------------------- helpers

    def _read_body(self, env):
        """The request body, or None after answering a request whose body is refused."""
        if self.headers.get("Transfer-Encoding"):
            self._error("LengthRequired", "chunked bodies are not accepted: send "
                        "Content-Length", body_unread=True)
            return None
        length = self.headers.get("Content-Length")
        if length is None:
            self._error("LengthRequired", "a Content-Length header is required",
                        body_unread=True)
            return None
        try:
            length = int(length)
            if length < 0:
                raise ValueError
        except ValueError:
            self._error("BadRequest", f"bad Content-Length {length!r}", body_unread=True)
            return None
        if length > env._max_body:
            self._error("RequestTooLarge", f"request body of {length} bytes is over the "
                        f"server's limit of {env._max_body}", body_unread=True)
            self._discard(min(length, _MAX_DISCARD_BYTES))
            return None
        body = self.rfile.read(length)
        if len(body) != length:
            # The client closed (or half-closed) before sending what it
            # announced: never apply the start of a body.
            self._error("BadRequest", f"the body ended after {len(body)} of the "
                        f"{length} bytes its Content-Length announced", body_unread=True)
            return None
        return body

    def _discard(self, length):
        """Reads (and drops) a refused body, so that the client gets to read our
        answer instead of a connection reset; the connection then closes."""
        try:
            while length > 0:
                chunk = self.rfile.read(min(length, 1 << 16))
                if not chunk:
                    return
                length -= len(chunk)
        except OSError:
            pass

    def _method_not_allowed(self, message):
        self._error("MethodNotAllowed", message, body_unread=True,
                    headers={"Allow": "GET, POST"})

    def _unauthorized(self):
        self._error("Unauthorized", "missing or wrong 'Authorization: Bearer <token>'",
                    body_unread=True, headers={"WWW-Authenticate": "Bearer"})

    def _error(self, type_name, message, body_unread=False, headers=None):
        if body_unread:
            # The unread body would be parsed as the next request: close.
            self.close_connection = True
        self._send(protocol.status_of(type_name), protocol.error_body(type_name, message),
                   headers=headers)

    def _send(self, status, body, content_type=protocol.CONTENT_TYPE, etag=None, headers=None):
        """Writes the whole response -- status line, headers, body -- in one
        send: http.server's send_response/end_headers and a separate body
        write are two sends, i.e. two packets and two wake-ups of the client
        per response, and format the Date header each time."""
        if self.server.closed:
            self.close_connection = True
        if logger.isEnabledFor(logging.DEBUG):
            self.log_request(status)
        lines = [f"{self.protocol_version} {status} {_REASONS.get(status, '')}\r\n"
                 f"Server: {self.server_version}\r\nDate: {_http_date()}\r\n"]
        if status != 304:
            lines.append(f"Content-Type: {content_type}\r\n")
        lines.append(f"Content-Length: {len(body)}\r\n")
        if etag is not None:
            lines.append(f"ETag: {etag}\r\n")
        for k, v in (headers or {}).items():
            lines.append(f"{k}: {v}\r\n")
        if self.close_connection:
            lines.append("Connection: close\r\n")
        lines.append("\r\n")
        try:
            self.wfile.write("".join(lines).encode("latin-1") + body)
        except OSError:   # the client went away
            self.close_connection = True


_REASONS = {status.value: status.phrase for status in http.HTTPStatus}
_date_cache = [0, ""]   # (second, its Date header value); a stale read is harmless


def _http_date():
    """The Date header value, formatted at most once a second."""
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[1] = email.utils.formatdate(now, usegmt=True)
        _date_cache[0] = now
    return _date_cache[1]


class _PolicyExport(object):
    """A policy as a SavedModel tarball, plus its current weights on demand.

    Threads: built on the server's constructing thread (PolicySaver traces
    the policy there); `model()`/`weights()` are called by connection
    threads (serialised by a lock); `close()` by any thread.
    """

    def __init__(self, policy, refresh_secs):
        from tf_agents.policies import policy_saver  # pylint: disable=import-outside-toplevel
        self._refresh = float(refresh_secs)
        self._dir = tempfile.mkdtemp(prefix="alf_async_policy_")
        # Removed by close(), or at garbage collection / exit if never closed.
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._dir, ignore_errors=True)
        self._lock = threading.Lock()
        try:
            self._saver = policy_saver.PolicySaver(policy, batch_size=None)
            model_dir = os.path.join(self._dir, "model")
            self._saver.save(model_dir)
            self._model = _tar_gz(model_dir)
        except BaseException:
            self.close()
            raise
        self._weights = None
        self._weights_time = float("-inf")

    def model(self):
        return self._model

    def weights(self):
        """(etag, tar.gz bytes) of a variables checkpoint at most refresh_secs old."""
        with self._lock:
            if time.monotonic() - self._weights_time >= self._refresh:
                ckpt_dir = tempfile.mkdtemp(dir=self._dir)
                try:
                    self._saver.save_checkpoint(ckpt_dir)
                    self._weights = (_digest(ckpt_dir), _tar_gz(ckpt_dir))
                finally:
                    shutil.rmtree(ckpt_dir, ignore_errors=True)
                self._weights_time = time.monotonic()
            return self._weights

    def close(self):
        self._cleanup()


def _tar_gz(directory):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(directory, arcname=".")
    return buf.getvalue()


def _digest(directory):
    """An ETag from the files' names and contents (tar bytes carry mtimes)."""
    h = hashlib.sha256()
    for root, _, files in sorted(os.walk(directory)):
        for name in sorted(files):
            path = os.path.join(root, name)
            h.update(os.path.relpath(path, directory).encode() + b"\0")
            with open(path, "rb") as f:
                h.update(f.read())
    return '"' + h.hexdigest()[:32] + '"'
