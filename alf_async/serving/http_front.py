"""HTTPFront: every HTTP/1.1 connection of the policy server, on one asyncio event loop.

    front = HTTPFront(host, port, handler, max_body_bytes=..., idle_timeout=75.0)
    front.serve()          # blocks: runs the event loop until stop()
    front.stop()           # any thread

The front owns the listening socket, an asyncio event loop (run by
`serve()` on the caller's thread) and one `_Connection` (an
asyncio.Protocol) per client connection. It parses each request and
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

What every connection does:
- Requests are handled one at a time, in order: pipelined requests wait in
  the buffer (an episode's calls must apply in the order a client sent
  them); each answer is one write.
- HTTP/1.1 keeps the connection alive unless the client sends
  `Connection: close`; HTTP/1.0 closes unless it sends `keep-alive`.
- A request the front refuses (bad request line or version, bad header,
  unknown method, no or bad Content-Length, chunked body, body over
  `max_body_bytes`) gets a 4xx with a JSON error body and the connection
  closes; a body over the limit is answered, then read and dropped (up to
  64 MiB) before the close, so that the client gets to read the answer
  instead of a reset. A body
  shorter than announced when the client half-closes gets 400: the start
  of a body is never handed on.
- A connection silent for `idle_timeout` seconds while no request of it is
  being answered is closed.

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

from alf_async.serving import http_wire

logger = logging.getLogger(__name__)

_READ_AHEAD = 256 << 10      # buffered bytes of pipelined requests before pausing reads


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
        server = await loop.create_server(lambda: _Connection(self), sock=self._sock,
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


class _Connection(asyncio.Protocol):
    """One client connection: its buffer, parser state and the request being answered.

    Threads: the loop thread only.
    """

    def __init__(self, front):
        self._front = front
        self._loop = front.loop
        self._transport = None
        self._peer = "-"
        self._buf = bytearray()
        self._heads = http_wire.HeadReader()
        self._head = None         # a parsed Request waiting for its body
        self._current = None      # the request being answered
        self._processing = False
        self._discard = 0         # bytes of a refused body still to drop
        self._eof = False
        self._closing = False
        self._write_paused = False
        self._read_paused = False
        self._last_active = 0.0
        self._idle_timer = None

    # ---------------------------------------------------- asyncio callbacks

    def connection_made(self, transport):
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self._peer = peer[0] if peer else "-"
        self._front.connection_made(self)
        if self._front.stopping:
            self._close()
            return
        self._last_active = self._loop.time()
        self._arm_idle_timer(self._front.idle_timeout)

    def data_received(self, data):
        self._last_active = self._loop.time()
        if self._discard:
            self._drop(len(data))
            return
        if self._closing:
            return
        self._buf += data
        if self._current is None:
            self._process()
        else:
            self._flow()

    def eof_received(self):
        self._eof = True
        if self._discard:
            self._close()
        elif self._current is None:
            self._process()
        return True   # keep the writing half open: the answer still goes out

    def pause_writing(self):
        self._write_paused = True

    def resume_writing(self):
        self._write_paused = False
        self._last_active = self._loop.time()
        if self._current is None:
            self._process()

    def connection_lost(self, exc):
        self._transport = None
        self._closing = True
        self._current = None   # a later answer is dropped
        self._head = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self._front.connection_lost(self)

    # ------------------------------------------------------------- requests

    def _process(self):
        """Takes the buffered requests, one at a time, while none is being answered."""
        if self._processing:
            return   # respond() inside the handler: the loop below goes on
        self._processing = True
        try:
            while self._current is None and not self._closing and not self._write_paused:
                try:
                    request = self._next_request()
                except http_wire.HTTPError as e:
                    self._refuse(e)
                    return
                if request is None:
                    if self._eof:
                        self._at_eof()
                    break
                request.connection = self
                self._current = request
                self._front.handle(request)
        finally:
            self._processing = False
        self._flow()

    def _next_request(self):
        """The next complete request in the buffer, or None; HTTPError if refused."""
        if self._head is None:
            head = self._heads.take(self._buf)
            if head is None:
                return None
            self._head = http_wire.parse_head(head, self._front.max_body)
            if self._head.expect_continue and len(self._buf) < self._head.length:
                self._transport.write(http_wire.CONTINUE)
        request = self._head
        if len(self._buf) < request.length:
            return None
        request.body = bytes(self._buf[:request.length])
        del self._buf[:request.length]
        self._head = None
        return request

    def _at_eof(self):
        """The client closed its half with no complete request left."""
        if self._head is not None:
            self._refuse(http_wire.HTTPError(
                400, f"the body ended after {len(self._buf)} of the {self._head.length} "
                     f"bytes its Content-Length announced"))
        elif self._buf.strip():
            self._refuse(http_wire.HTTPError(
                400, "the request ended before the blank line after its headers"))
        else:
            self._close()

    # -------------------------------------------------------------- answers

    def respond(self, request, status, body, content_type, headers, close):
        if request is not self._current:
            return
        self._current = None
        close = close or not request.keep_alive or self._front.stopping
        data = http_wire.response(status, body, content_type, headers, close,
                                  keep_alive=not close and request.minor == 0)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug('%s - "%s" %s -', self._peer, request.line, status)
        if self._transport is None:
            return
        self._last_active = self._loop.time()
        if self._idle_timer is None:
            self._arm_idle_timer(self._front.idle_timeout)
        self._transport.write(data)
        if close:
            self._close()
        elif not self._processing:
            self._process()

    def _refuse(self, error):
        """Answers a request the front refused and closes (after dropping its body)."""
        self._current = None
        self._head = None
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("%s - refused: %s %s", self._peer, error.status, error)
        if self._transport is not None:
            self._transport.write(http_wire.response(error.status, error.body(),
                                                     headers=error.headers, close=True))
        if self._read_paused and self._transport is not None:
            self._read_paused = False
            self._transport.resume_reading()
        if error.discard and not self._eof:
            self._discard = error.discard
            buffered = len(self._buf)
            self._buf = bytearray()
            self._drop(buffered)
        else:
            self._close()

    def _drop(self, n):
        self._discard = max(self._discard - n, 0)
        if not self._discard:
            self._close()

    def answer_stopped(self):
        """stop(): answers 503 to a request still waiting, and closes."""
        if self._current is not None:
            self._current.respond_error("ServerStoppedError",
                                        "the server stopped before answering this request",
                                        close=True)
        else:
            self._close()

    def close_if_idle(self):
        """stop(): closes at once unless a request waits for its answer."""
        if self._current is None:
            self._close()

    def abort(self):
        if self._transport is not None:
            self._transport.abort()

    def _close(self):
        if not self._closing and self._transport is not None:
            self._closing = True
            self._transport.close()   # after the buffered writes

    def _flow(self):
        """Pauses reading while a client's pipelined requests pile up unanswered."""
        if self._transport is None or self._closing:
            return
        blocked = self._current is not None or self._write_paused
        if blocked and len(self._buf) > _READ_AHEAD and not self._read_paused:
            self._read_paused = True
            self._transport.pause_reading()
        elif self._read_paused and not blocked:
            self._read_paused = False
            self._transport.resume_reading()

    def _arm_idle_timer(self, delay):
        if self._front.idle_timeout is not None:
            self._idle_timer = self._loop.call_later(delay, self._check_idle)

    def _check_idle(self):
        self._idle_timer = None
        if self._transport is None:
            return
        if self._current is not None and not self._write_paused:
            return   # being answered: respond() arms the timer again
        left = self._last_active + self._front.idle_timeout - self._loop.time()
        if left > 0:
            self._arm_idle_timer(left)
            return
        logger.debug("%s - closing a connection silent for %g s", self._peer,
                     self._front.idle_timeout)
        if self._write_paused or self._closing:
            self._transport.abort()   # the client reads nothing: no flush to wait for
        else:
            self._close()
