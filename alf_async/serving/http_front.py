"""HTTPFront: every HTTP/1.1 connection of the policy server, on one asyncio event loop.

    front = HTTPFront(host, port, handler, max_body_bytes=..., idle_timeout=75.0)
    front.serve()          # blocks: runs the event loop until stop()
    front.stop()           # any thread

The front owns the listening socket, an asyncio event loop (run by
`serve()` on the caller's thread) and one `http_connection.Connection`
(an asyncio.Protocol) per client connection. It parses each request and
hands it, complete, to `handler(request)` on the loop thread; the handler
answers with `request.respond(...)` on the loop thread, at once or later
(`call_soon_threadsafe` brings an answer from another thread).

Why we parse HTTP by hand: http.server's parsing is tied to its blocking,
per-connection stream handler (readline on a thread per connection); with
many clients those threads fight for the GIL and cost several times the
server CPU per request of a Protocol on one thread with a minimal parser
(docs/design.md, "Why our own parts where a library exists"). We parse
only what the policy server needs: a request line,
header lines, and a body framed by Content-Length (chunked bodies get 411).
What each connection does (order, keep-alive, refusals, idle close) is
http_connection.py's.

Threads: `serve()` runs the loop on its caller's thread (the
PolicyServerEnv's run() thread); every protocol callback, the handler and
`Request.respond` run there. `stop()` and `call_soon_threadsafe()` may be
called from any thread; `close()` from any thread once `serve()` is not
running. stop(): the listening socket closes, idle connections close at
once, a connection waiting for its answer closes after it; `serve()`
returns once every connection is closed, at most `stop_grace` seconds
later (whatever still waits then has been answered 503).
"""

import asyncio
import logging
import socket
import threading

from alf_async.serving.http_connection import Connection

logger = logging.getLogger(__name__)


class HTTPFront(object):
    """The listening socket, the event loop and the connections; see the module docstring."""

    def __init__(self, host, port, handler, max_body_bytes, idle_timeout, poll_interval=0.25,
                 should_stop=None, stop_grace=None, backlog=128):
        """
        Args:
            host: the address to listen on (bound here: errors raise here).
            port: the port to listen on (0 picks a free one, see `address`).
            handler: `handler(request)`, called on the loop thread with
                each complete request; it answers with `request.respond`.
            max_body_bytes: larger bodies get 413.
            idle_timeout: seconds a connection may stay silent when none of
                its requests is being answered; None: no limit.
            poll_interval: how often the loop checks `should_stop()`.
            should_stop: a callable; True makes `serve()` stop (besides `stop()`).
            stop_grace: seconds `serve()` takes at most, once stopping, to
                close every connection: answers still pending after most of
                it get 503 (default poll_interval).
            backlog: the listening socket's backlog.
        """
        self.handler = handler
        self.max_body = int(max_body_bytes)
        self.idle_timeout = None if idle_timeout is None else float(idle_timeout)
        self._poll = float(poll_interval)
        self._should_stop = should_stop or (lambda: False)
        self._grace = self._poll if stop_grace is None else float(stop_grace)
        self._backlog = backlog
        self._lock = threading.Lock()
        self._loop = None
        self._stop_requested = False
        self._stop_future = None
        self.stopping = False          # loop thread: answers now close their connection
        self.connections = set()
        self._all_closed = None
        self._poll_handle = None
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(backlog)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self.address = sock.getsockname()[:2]

    # ------------------------------------------------------------ any thread

    def stop(self):
        """Makes `serve()` stop (see the module docstring); idempotent."""
        with self._lock:
            self._stop_requested = True
            loop = self._loop
        if loop is not None:
            self.call_soon_threadsafe(self._wake_stop, loop=loop)

    def call_soon_threadsafe(self, callback, *args, loop=None):
        """Runs callback(*args) on the loop thread; False if the loop is gone."""
        loop = loop or self._loop
        if loop is None:
            return False
        try:
            loop.call_soon_threadsafe(callback, *args)
            return True
        except RuntimeError:   # the loop is closed: serve() returned
            return False

    def close(self):
        """Closes the listening socket (serve() closes it itself when it returns)."""
        self._sock.close()

    # ----------------------------------------------------------- serve thread

    def serve(self):
        """Serves every connection until `stop()` or `should_stop()`; then closes them all."""
        loop = asyncio.new_event_loop()
        with self._lock:
            self._loop = loop
        try:
            loop.run_until_complete(self._serve(loop))
        finally:
            with self._lock:
                self._loop = None
            try:
                for conn in list(self.connections):
                    conn.abort()
                loop.run_until_complete(asyncio.sleep(0))   # their connection_lost
            finally:
                loop.close()
                self._sock.close()

    @property
    def loop(self):
        """The event loop while `serve()` runs (for the handler's timers)."""
        return self._loop

    async def _serve(self, loop):
        self._stop_future = loop.create_future()
        self._all_closed = asyncio.Event()
        server = await loop.create_server(lambda: Connection(self), sock=self._sock,
                                          backlog=self._backlog)
        self._poll_handle = loop.call_soon(self._check_stop, loop)
        try:
            await self._stop_future
        finally:
            self._poll_handle.cancel()
            server.close()   # closes the listening socket
            await self._close_connections()

    def _check_stop(self, loop):
        with self._lock:
            stop = self._stop_requested
        if stop or self._should_stop():
            self._wake_stop()
        else:
            self._poll_handle = loop.call_later(self._poll, self._check_stop, loop)

    def _wake_stop(self):
        if self._stop_future is not None and not self._stop_future.done():
            self._stop_future.set_result(None)

    async def _close_connections(self):
        """Closes every connection within `stop_grace` seconds (then serve() aborts the rest)."""
        self.stopping = True
        for conn in list(self.connections):
            conn.close_if_idle()
        # Most of the grace for the answers on their way (requests woken by
        # the stop answer at once), the rest for writing the 503s.
        await self._until_all_closed(0.75 * self._grace)
        for conn in list(self.connections):
            conn.answer_stopped()
        await self._until_all_closed(0.25 * self._grace)

    async def _until_all_closed(self, timeout):
        if self.connections:
            try:
                await asyncio.wait_for(self._all_closed.wait(), timeout)
            except asyncio.TimeoutError:
                pass

    def connection_made(self, conn):
        self.connections.add(conn)

    def connection_lost(self, conn):
        self.connections.discard(conn)
        if not self.connections and self.stopping:
            self._all_closed.set()

    def handle(self, request):
        """Hands a request to the handler; a handler that raises answers 500."""
        try:
            self.handler(request)
        except Exception:  # pylint: disable=broad-except
            logger.exception("handling %r failed", request.line)
            request.respond_error("InternalError", "the server failed; see its log")
