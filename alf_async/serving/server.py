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
do not match the specs, a bad request line, HTTP version or Content-Length,
a body shorter than announced (400), no or a wrong token (401), an unknown
path (404), an HTTP method the path does not serve (405), no Content-Length
or a chunked body (411), a body over `max_body_bytes` (413, read and
dropped), too many open episodes (429), no action in time (504). The HTTP
side (parsing, keep-alive, idle connections) is http_front.py's.

Under load the server applies back-pressure, never drops (see
ExternalEnv's "Memory under load"): a learner slower than its clients makes
get_action/log_action (and `report`, whose events are log_actions) wait,
start_episode beyond `max_concurrent` gets 429, and what the server holds
stays below `max_concurrent * max_pending_steps` queued steps. A waiting
request costs a pending answer on the event loop, not a thread (except the
worker of a call waiting for back-pressure, see Threads).

A client that disappears mid-episode does not block the driver: its episode
is closed after `episode_idle_timeout` seconds without a request (see
ExternalEnv) and its slot serves other episodes.

Threads
-------
`run()` (the ExternalEnv thread, started with the driver) runs one asyncio
event loop (http_front.HTTPFront) that serves every connection: it reads,
parses and answers all requests; there is no thread per connection.
- get_action queues its step with `get_action_async` and returns to the
  loop; the loop answers when the slot's action arrives (handed over by
  `call_soon_threadsafe`) or when the timer it armed at the deadline
  closes the episode (504). When the episode already has
  `max_pending_steps` steps queued, the call waits on a worker instead.
- log_action, end_episode and report (which may wait for back-pressure or
  for the slot) and the policy export (TF work) run on a bounded pool of
  worker threads ("policy_server_worker_N", at most max_concurrent + 2,
  started on demand); the loop answers when they return.
- start_episode and log_returns never block: they run on the loop.
`stop()` (called by `driver.stop()`, or directly; any thread) wakes every
waiting request, so each answers 503 at once; idle connections close at
once, the others after their answer. `run()` then closes the listening
socket and every connection (a request still unanswered after about
`poll_interval` gets 503), joins the workers (one exporting the policy
finishes its TF work first) and returns: within `poll_interval` unless an
export was running. `close()` stops and joins: nothing is left behind.

Security: binds 127.0.0.1 by default. Bind another interface only with a
token and behind TLS termination: the token travels in clear HTTP. The
policy export (local inference) is a SavedModel that clients load and run:
clients must trust the server, never the other way round.
"""

import concurrent.futures
import functools
import hashlib
import hmac
import io
import logging
import os
import shutil
import tarfile
import tempfile
import threading
import time
import weakref

from alf_async.environments.external.external_env import (ExternalEnv, ExternalEnvFinished,
                                                          ExternalEnvStoppedError,
                                                          TooManyEpisodesError)
from alf_async.serving import http_front, http_wire, protocol

logger = logging.getLogger(__name__)

_SPARE_WORKERS = 2                 # workers beyond one per episode: policy exports
_LOOP_BODY_BYTES = 64 << 10        # larger bodies are decoded on a worker, not the loop
_NEVER_BLOCK = ("start_episode", "log_returns")
_POLICY_PATHS = (protocol.POLICY_MODEL_PATH, protocol.POLICY_WEIGHTS_PATH)


class PolicyServerEnv(ExternalEnv):
    """An ExternalEnv serving start_episode/get_action/... as JSON over HTTP."""

    def __init__(self, action_spec, observation_spec, host="127.0.0.1", port=0,
                 max_concurrent=100, token=None, policy=None, action_timeout=60.0,
                 episode_idle_timeout=60.0, max_body_bytes=protocol.DEFAULT_MAX_BODY_BYTES,
                 connection_idle_timeout=75.0, weights_refresh_secs=1.0, poll_interval=0.25,
                 name="policy_server", **external_env_kwargs):
        """
        Args:
            action_spec: an array spec nest (or a gym space).
            observation_spec: an array spec nest (or a gym space).
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
                stay silent before the server closes it (None: never).
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
        self._export = _PolicyExport(policy, weights_refresh_secs) if policy is not None else None
        # Threads start on demand: one per call blocked at once, at most one
        # per open episode plus the exports.
        self._workers = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_concurrent + _SPARE_WORKERS, thread_name_prefix="policy_server_worker")
        routes = _Routes(self, self._workers)
        try:
            self._front = http_front.HTTPFront(
                host, port, routes, max_body_bytes=max_body_bytes,
                idle_timeout=connection_idle_timeout, poll_interval=poll_interval,
                should_stop=lambda: self.stopped)
        except BaseException:
            self._workers.shutdown()
            if self._export is not None:
                self._export.close()
            raise
        routes.front = self._front
        bound_host, bound_port = self._front.address
        self.address = f"http://{bound_host}:{bound_port}"

    @property
    def num_connections(self):
        """Open client connections (a snapshot; any thread may read it)."""
        return len(self._front.connections)

    # ------------------------------------------------------------- serving

    def run(self):
        """Serves requests until `stop()`; then closes every connection and joins the workers."""
        try:
            self._front.serve()
        finally:
            # Stopped: every worker's call was woken. (If serve() failed, the
            # stop that follows wakes them, and close() joins them.)
            self._workers.shutdown(wait=self.stopped, cancel_futures=True)
            if self._export is not None and self.stopped:
                self._export.close()

    def on_stop(self):
        # Waiting requests were woken by ExternalEnv.stop() (their answers
        # are on their way to the loop); requests queued for a worker are
        # cancelled (503); the loop closes the connections and returns.
        self._front.stop()
        self._workers.shutdown(wait=False, cancel_futures=True)

    def close(self, timeout=10.0):
        """Stops serving and joins every thread; idempotent."""
        self.stop(reason="close() was called")
        self.join(timeout)
        if not self.run_started:   # run() never ran: close the socket here
            self._front.close()
        self._workers.shutdown(wait=True, cancel_futures=True)
        if self._export is not None:
            self._export.close()

    # ------------------------------------------------------------ commands

    def authorized(self, header):
        if self._token is None:
            return True
        expected = f"Bearer {self._token}".encode()
        return header is not None and hmac.compare_digest(header.encode(), expected)

    def dispatch(self, command, args):
        """Runs one parsed command; returns the response object.

        Called on the event loop thread for commands that never block
        (start_episode, log_returns), on a worker for the others. An episode
        method's arguments are its keyword arguments (the protocol checked
        their names against episode_api.METHODS).
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


# ----------------------------------------------------------------- routes


class _Routes(object):
    """Answers each request the HTTPFront hands over: paths, token, commands.

    Threads: `__call__` and every answer run on the event loop thread;
    `_on_worker`'s work on a worker thread; `_ActionWait.completed` on
    whichever thread completes a get_action. Nothing here blocks the loop.
    """

    def __init__(self, env, workers):
        self._env = env
        self._workers = workers
        self.front = None   # set once the front exists (it needs us first)

    def __call__(self, request):
        if request.method == "POST":
            self._post(request)
        else:
            self._get(request)

    def _post(self, req):
        if req.path in _POLICY_PATHS:
            return _method_not_allowed(req, f"POST {req.path}: the policy is fetched with GET")
        if req.path != protocol.COMMAND_PATH:
            return req.respond_error("NotFound", f"no such path {req.path!r}; POST commands "
                                                 f"to {protocol.COMMAND_PATH}")
        if not self._env.authorized(req.headers.get("authorization")):
            return _unauthorized(req)
        if len(req.body) > _LOOP_BODY_BYTES:   # decoding it would hold up every connection
            return self._on_worker(req, functools.partial(self._parse_and_run, req.body),
                                   _answer_json)
        try:
            command, args = protocol.parse_command(protocol.decode_json(req.body))
        except Exception as e:  # pylint: disable=broad-except
            return _answer_error(req, e)
        if command == "get_action":
            return self._get_action(req, args)
        if command in _NEVER_BLOCK:
            try:
                result = self._env.dispatch(command, args)
            except Exception as e:  # pylint: disable=broad-except
                return _answer_error(req, e)
            return _answer_json(req, result)
        self._on_worker(req, functools.partial(self._env.dispatch, command, args), _answer_json)

    def _parse_and_run(self, body):   # on a worker
        command, args = protocol.parse_command(protocol.decode_json(body))
        return self._env.dispatch(command, args)

    def _get_action(self, req, args):
        wait = _ActionWait(self.front, req)
        try:
            pending = self._env.get_action_async(args["episode_id"], args["observation"],
                                                 wait.completed, reward=args.get("reward"))
        except Exception as e:  # pylint: disable=broad-except
            return _answer_error(req, e)
        if pending is None:   # back-pressure: the blocking call waits on a worker
            return self._on_worker(
                req, functools.partial(self._env.dispatch, "get_action", args), _answer_json)
        wait.arm(pending)

    def _get(self, req):
        if req.path == protocol.COMMAND_PATH:
            return _method_not_allowed(req, f"GET {req.path}: commands are sent with POST")
        if req.path not in _POLICY_PATHS:
            return req.respond_error("NotFound", f"no such path {req.path!r}", close=True)
        if not self._env.authorized(req.headers.get("authorization")):
            return _unauthorized(req)
        if req.path == protocol.POLICY_MODEL_PATH:
            work = lambda: (None, self._env.policy_model())
        else:
            work = lambda: self._env.policy_weights() or (None, None)
        self._on_worker(req, work, _answer_policy, fail=_export_failed)

    def _on_worker(self, req, work, answer, fail=None):
        """Runs work() on a worker; then answer(req, result) or fail(req, exc) on the loop."""
        try:
            future = self._workers.submit(work)
        except RuntimeError:   # the pool is shut down: the server is stopping
            return req.respond_error("ServerStoppedError", "the server is stopping")
        future.add_done_callback(lambda f: self.front.call_soon_threadsafe(
            _worker_done, req, f, answer, fail or _answer_error))


class _ActionWait(object):
    """One get_action in flight with no thread waiting for it.

    Threads: `completed` is called by the ExternalEnv (under its lock, any
    thread) and hands over to the loop; everything else runs on the loop.
    """
    __slots__ = ("_front", "_request", "_pending", "_timer")

    def __init__(self, front, request):
        self._front = front
        self._request = request
        self._pending = None
        self._timer = None

    def arm(self, pending):
        self._pending = pending
        self._timer = self._front.loop.call_at(pending.deadline, self._expire)

    def _expire(self):   # the deadline: TimeoutError (or a close/stop seen first)
        self._timer = None
        left = self._pending.expire()
        if left is not None:   # the timer fired early
            self._timer = self._front.loop.call_later(left, self._expire)

    def completed(self, action, error):
        self._front.call_soon_threadsafe(self._answer, action, error)

    def _answer(self, action, error):
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if error is not None:
            return _answer_error(self._request, error)
        _answer_json(self._request, protocol.result_of("get_action", action))


def _worker_done(req, future, answer, fail):
    if future.cancelled():
        return req.respond_error("ServerStoppedError", "the server stopped before running "
                                                       "this request")
    error = future.exception()
    if error is not None:
        return fail(req, error)
    answer(req, future.result())


def _answer_json(req, result):
    req.respond(200, protocol.encode(result))


def _answer_error(req, exc):
    type_name, message = error_type_of(exc)
    if type_name == "InternalError":
        logger.error("command failed", exc_info=exc)
    req.respond_error(type_name, message)


def _answer_policy(req, export):
    etag, blob = export
    if blob is None:
        return req.respond_error("NotFound", "this server exports no policy: construct "
                                             "PolicyServerEnv(..., policy=...) for local inference")
    if etag is not None and req.headers.get("if-none-match") == etag:
        return req.respond(304, b"", headers={"ETag": etag})
    req.respond(200, blob, content_type="application/gzip",
                headers=None if etag is None else {"ETag": etag})


def _export_failed(req, exc):
    logger.error("exporting the policy failed", exc_info=exc)
    req.respond_error("InternalError", "exporting the policy failed; see the server's log")


def _method_not_allowed(req, message):
    req.respond_error("MethodNotAllowed", message, headers=http_wire.ALLOW, close=True)


def _unauthorized(req):
    req.respond_error("Unauthorized", "missing or wrong 'Authorization: Bearer <token>'",
                      headers={"WWW-Authenticate": "Bearer"}, close=True)


class _PolicyExport(object):
    """A policy as a SavedModel tarball, plus its current weights on demand.

    Threads: built on the server's constructing thread (PolicySaver traces
    the policy there); `model()`/`weights()` are called by worker
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
