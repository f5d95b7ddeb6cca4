"""Policy serving: an HTTP server that is an ExternalEnv, and its client.

- `PolicyServerEnv` (server.py): an ExternalEnv whose run() serves the
  episode methods as JSON over HTTP (and, for local inference, the policy).
  routes.py: what it answers to each request; policy_export.py: the
  policy it exports for local inference.
- `PolicyClient` (client.py): the same five methods, remote or local
  inference. Importing it does not import TensorFlow.
  client_transport.py: its HTTP connections; local_inference.py: its
  local-inference half.
- protocol.py: the JSON wire format both share, and the client's exceptions.
- http_front.py: the server's one asyncio event loop; http_connection.py:
  each of its connections; http_wire.py: the HTTP/1.1 it parses and answers.
- job.py: `make_serving_env_constructor`, a training job that serves its policy.

Names are imported lazily, so that a remote client pays only for the client.
"""

from alf_async._lazy import lazy_exports

_EXPORTS = {
    "PolicyServerEnv": "server",
    "PolicyClient": "client",
    "PolicyServerError": "protocol",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
