"""What a PolicyServerEnv answers to each request its HTTPFront hands over:
the path, the token, then the command, run on the event loop when it never
blocks, as a pending get_action the loop answers when the action comes,
or on a worker thread; and the JSON answer or error of each.

Threads: everything runs on the event loop thread except the work handed
to a worker and `_ActionWait.completed` (see `Routes`). Nothing here
blocks the loop.
"""

import functools
import logging

from alf_async.environments.external.external_env import (ExternalEnvFinished,
                                                          ExternalEnvStoppedError,
                                                          TooManyEpisodesError)
from alf_async.serving import http_wire, protocol

# The server's log (these errors were logged by server.py before routes.py held them).
logger = logging.getLogger("alf_async.serving.server")

_LOOP_BODY_BYTES = 64 << 10        # larger bodies are decoded on a worker, not the loop
_NEVER_BLOCK = ("start_episode", "log_returns")
_POLICY_PATHS = (protocol.POLICY_MODEL_PATH, protocol.POLICY_WEIGHTS_PATH)


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


class Routes(object):
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
