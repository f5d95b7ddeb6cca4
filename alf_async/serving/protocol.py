"""The JSON wire format shared by PolicyServerEnv and PolicyClient.

Everything on the wire is JSON (never pickle: the server must not execute
anything a client sends). This module needs only the standard library and
numpy, so a remote-inference client does not import TensorFlow.

Requests
--------
``POST /v1/command`` with ``Content-Type: application/json`` and a
``Content-Length`` of at most the server's ``max_body_bytes``; the body is one
JSON object ``{"command": <name>, <argument>: <value>, ...}``:

==============  ==========================================  =====================
command         arguments                                   200 response body
==============  ==========================================  =====================
start_episode   episode_id (str|null), training_enabled     {"episode_id": str}
get_action      episode_id, observation, reward (number:    {"action": nest}
                log_returns of the last action, then act)
log_action      episode_id, observation, action             {}
log_returns     episode_id, reward (number), info (object)  {}
end_episode     episode_id, observation                     {}
report          events: [command object, ...] (no get_action {"applied": n}
                or report inside), applied in order
==============  ==========================================  =====================

Observations and actions are nests of JSON numbers (nested lists for arrays,
objects for dict specs, lists for tuple specs); the server checks them
against its specs. NaN and Infinity are refused.

``GET /v1/policy/model`` returns the policy as a gzipped tar of a tf-agents
PolicySaver SavedModel; ``GET /v1/policy/weights`` a gzipped tar of its
latest variables checkpoint, with an ``ETag`` (send it back in
``If-None-Match`` to get ``304 Not Modified`` when nothing changed). Both are
404 when the server exports no policy.

With a token, every request needs ``Authorization: Bearer <token>``.

Errors
------
Any refused request (a wrong HTTP method included: 405) gets a 4xx/5xx
status and the body
``{"error": {"type": <name>, "message": <text>}}``; the client raises the
matching exception class below (each a PolicyServerError, and also the
built-in type the local ExternalEnv would raise).
"""

import json

import numpy as np

from alf_async.environments.external import episode_api

COMMAND_PATH = "/v1/command"
POLICY_MODEL_PATH = "/v1/policy/model"
POLICY_WEIGHTS_PATH = "/v1/policy/weights"
CONTENT_TYPE = "application/json"
DEFAULT_MAX_BODY_BYTES = 1 << 20
MAX_REPORT_EVENTS = 10_000

# command -> (required arguments, optional arguments): the episode methods
# (episode_api.METHODS, their one definition) and `report`.
COMMANDS = dict({name: (m.required, m.optional) for name, m in episode_api.METHODS.items()},
                report=(("events",), ()))
REPORTABLE = ("start_episode", "log_action", "log_returns", "end_episode")


def result_of(command, value):
    """The 200 response object of an episode method that returned `value`."""
    key = episode_api.METHODS[command].result
    return {} if key is None else {key: value}


# ----------------------------------------------------------------- errors


class PolicyServerError(RuntimeError):
    """A request the server refused (client side), with its HTTP status."""

    type_name = "PolicyServerError"

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class BadRequestError(PolicyServerError, ValueError):
    """400: malformed JSON, unknown command, missing or mistyped arguments."""
    type_name = "BadRequest"


class ServerValueError(PolicyServerError, ValueError):
    """400: what ExternalEnv raises ValueError for (ids, specs, rewards)."""
    type_name = "ValueError"


class UnauthorizedError(PolicyServerError, PermissionError):
    """401: missing or wrong bearer token."""
    type_name = "Unauthorized"


class NotFoundError(PolicyServerError, LookupError):
    """404: unknown path, or no policy exported."""
    type_name = "NotFound"


class MethodNotAllowedError(PolicyServerError, ValueError):
    """405: an HTTP method the path does not serve (commands are POSTed, the
    policy is fetched with GET)."""
    type_name = "MethodNotAllowed"


class LengthRequiredError(PolicyServerError, ValueError):
    """411: no Content-Length."""
    type_name = "LengthRequired"


class RequestTooLargeError(PolicyServerError, ValueError):
    """413: a body over the server's max_body_bytes."""
    type_name = "RequestTooLarge"


class TooManyEpisodesServerError(PolicyServerError):
    """429: the server has max_concurrent episodes open."""
    type_name = "TooManyEpisodesError"


class ServerInternalError(PolicyServerError):
    """500: the server failed (its log has the details)."""
    type_name = "InternalError"


class ServerStoppedError(PolicyServerError):
    """503: the server's ExternalEnv is stopped (or its data finished)."""
    type_name = "ServerStoppedError"


class ServerTimeoutError(PolicyServerError, TimeoutError):
    """504: no action within the server's action_timeout (the episode was closed)."""
    type_name = "TimeoutError"


_ERRORS = {cls.type_name: (status, cls) for status, cls in [
    (400, BadRequestError), (400, ServerValueError), (401, UnauthorizedError),
    (404, NotFoundError), (405, MethodNotAllowedError), (411, LengthRequiredError), (413, RequestTooLargeError),
    (429, TooManyEpisodesServerError), (500, ServerInternalError),
    (503, ServerStoppedError), (504, ServerTimeoutError)]}


class ProtocolError(Exception):
    """Server side: a request refused before it reaches the ExternalEnv."""

    def __init__(self, type_name, message):
        super().__init__(message)
        self.type_name = type_name
        self.status = _ERRORS[type_name][0]


def status_of(type_name):
    return _ERRORS[type_name][0]


def type_of_status(status):
    """The error type name of an HTTP error status ("BadRequest" for an
    unknown 4xx, "InternalError" for an unknown 5xx)."""
    for type_name, (code, _) in _ERRORS.items():
        if code == status and type_name != "ValueError":
            return type_name
    return "InternalError" if status >= 500 else "BadRequest"


def error_body(type_name, message):
    return encode({"error": {"type": type_name, "message": str(message)}})


def exception_from_response(status, body):
    """The exception a client raises for a non-2xx response."""
    type_name, message = None, None
    try:
        error = json.loads(body.decode("utf-8"))["error"]
        type_name, message = str(error["type"]), str(error["message"])
    except (ValueError, KeyError, TypeError, AttributeError):
        message = body[:200].decode("utf-8", "replace") or f"HTTP status {status}"
    cls = _ERRORS.get(type_name, (None, PolicyServerError))[1]
    return cls(f"{message} (HTTP {status})", status=status)


# --------------------------------------------------------------- encoding


def _to_json(value):
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _refuse_constant(name):
    raise ValueError(f"{name} is not allowed")


def encode(obj):
    """JSON bytes of `obj` (numpy arrays and scalars become lists/numbers)."""
    return json.dumps(obj, default=_to_json, allow_nan=False, separators=(",", ":")).encode()


def encode_command(command, **args):
    return encode(dict(args, command=command))


def decode_json(body):
    """Parses JSON bytes; ProtocolError("BadRequest") for anything malformed."""
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ProtocolError("BadRequest", f"malformed JSON body: {e}") from None


def parse_command(obj, allowed=None):
    """Checks one command object; returns (command, args).

    Args:
        obj: the decoded JSON.
        allowed: command names accepted here (default: all).

    Raises:
        ProtocolError: not an object, unknown command, missing, unknown or
            mistyped arguments.
    """
    allowed = COMMANDS if allowed is None else allowed
    if not isinstance(obj, dict):
        raise ProtocolError("BadRequest", f"a command must be a JSON object, got "
                            f"{type(obj).__name__}")
    command = obj.get("command")
    if not isinstance(command, str) or command not in allowed:
        raise ProtocolError("BadRequest", f"unknown command {command!r}; expected one of "
                            f"{sorted(allowed)}")
    required, optional = COMMANDS[command]
    args = {k: v for k, v in obj.items() if k != "command"}
    missing = [k for k in required if k not in args]
    unknown = [k for k in args if k not in required and k not in optional]
    if missing or unknown:
        raise ProtocolError("BadRequest", f"{command}: missing arguments {missing}, unknown "
                            f"arguments {unknown}; expects {list(required)} and optionally "
                            f"{list(optional)}")
    _check_types(command, args)
    return command, args


def _check_types(command, args):
    def bad(name, expected):
        raise ProtocolError("BadRequest", f"{command}: {name} must be {expected}, got "
                            f"{type(args[name]).__name__}")

    if "episode_id" in args and not isinstance(args["episode_id"], str):
        if not (command == "start_episode" and args["episode_id"] is None):
            bad("episode_id", "a string")
    if "training_enabled" in args and not isinstance(args["training_enabled"], bool):
        bad("training_enabled", "true or false")
    if "reward" in args and (isinstance(args["reward"], bool) or
                             not isinstance(args["reward"], (int, float))):
        bad("reward", "a number")
    if args.get("info") is not None and not isinstance(args["info"], dict):
        bad("info", "an object or null")
    if command == "report":
        events = args["events"]
        if not isinstance(events, list):
            bad("events", "a list")
        if len(events) > MAX_REPORT_EVENTS:
            raise ProtocolError("BadRequest", f"report: at most {MAX_REPORT_EVENTS} events, "
                                f"got {len(events)}")
