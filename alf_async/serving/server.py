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
import hmac

from alf_async.environments.external.external_env import ExternalEnv
from alf_async.serving import http_front, protocol
from alf_async.serving.policy_export import PolicyExport
from alf_async.serving.routes import Routes

_SPARE_WORKERS = 2                 # workers beyond one per episode: policy exports


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
        self._export = PolicyExport(policy, weights_refresh_secs) if policy is not None else None
        # Threads start on demand: one per call blocked at once, at most one
        # per open episode plus the exports.
        self._workers = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_concurrent + _SPARE_WORKERS, thread_name_prefix="policy_server_worker")
        routes = Routes(self, self._workers)
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
