"""Connection: one client connection of the policy server's HTTPFront, an
asyncio.Protocol that reads its requests, hands each complete one to the
front, writes its answer and closes the connection when it should.

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

Threads: the loop thread only.
"""

import asyncio
import logging

from alf_async.serving import http_wire

# The front's log (connections logged there before this module held them).
logger = logging.getLogger("alf_async.serving.http_front")

_READ_AHEAD = 256 << 10      # buffered bytes of pipelined requests before pausing reads


class Connection(asyncio.Protocol):
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
