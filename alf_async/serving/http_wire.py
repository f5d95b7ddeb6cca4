"""The HTTP/1.1 the policy server speaks: request heads in, whole responses out.

A minimal hand-written parser (see http_front.py for why not http.server's):
a request line `METHOD /path HTTP/1.x`, header lines, and a body framed by
Content-Length only. `HeadReader` finds a request's head in a connection's
buffer, `parse_head` turns it into a `Request` (or refuses it with an
`HTTPError`, whose status and message the front answers with), and
`response` builds the bytes of a whole answer, written at once.

Limits, as http.server's: a request line over 64 KiB gets 414, a header
line over 64 KiB or more than 100 header lines 431 (and a head over 1 MiB).
Unknown methods get 405, HTTP versions other than 1.x and malformed request
lines (HTTP/0.9-style ones included) 400, answered with a status line like
every other answer; chunked bodies (Transfer-Encoding) and a POST without
Content-Length 411, a Content-Length that is no plain decimal 400, a body
over the limit 413.

Threads: pure functions and per-connection objects; the front's loop thread.
"""

import email.utils
import http
import time

from alf_async.serving import protocol

SERVER_NAME = "alf_async-policy-server/1"
METHODS = ("GET", "POST")
ALLOW = {"Allow": ", ".join(METHODS)}
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
MAX_DISCARD = 64 << 20      # most bytes of a refused body read and dropped
_MAX_LINE = 65536           # as http.server: a longer request line 414, header line 431
_MAX_HEADERS = 100          # as http.server: more header lines 431
_MAX_HEAD = 1 << 20         # a head (request line and headers) over 1 MiB: 431


class HTTPError(Exception):
    """A request refused before it reaches the handler; the connection
    closes after the answer."""

    def __init__(self, status, message, headers=None, discard=0):
        super().__init__(message)
        self.status = status
        self.headers = headers
        self.discard = discard   # body bytes to read and drop before closing

    def body(self):
        """The JSON error body of the answer."""
        return protocol.error_body(protocol.type_of_status(self.status), self)


class Request(object):
    """One parsed request; answered once, with `respond` (loop thread only)."""
    __slots__ = ("method", "path", "minor", "headers", "body", "keep_alive", "line",
                 "length", "expect_continue", "connection")

    def __init__(self, method, path, minor, headers, keep_alive, line, length,
                 expect_continue):
        self.method = method
        self.path = path
        self.minor = minor          # HTTP/1.<minor>
        self.headers = headers      # lower-cased name -> value (the first of duplicates)
        self.body = None            # bytes, once read
        self.keep_alive = keep_alive
        self.line = line            # the request line, for the log
        self.length = length        # of the body
        self.expect_continue = expect_continue
        self.connection = None      # the front's connection that answers it

    def respond(self, status, body, content_type=protocol.CONTENT_TYPE, headers=None,
                close=False):
        """Writes the answer (loop thread). An answer to a request already
        answered (by stop) or whose connection is gone is dropped."""
        self.connection.respond(self, status, body, content_type, headers, close)

    def respond_error(self, type_name, message, headers=None, close=False):
        """Answers with the protocol's JSON error body and the type's status."""
        self.respond(protocol.status_of(type_name), protocol.error_body(type_name, message),
                     headers=headers, close=close)


class HeadReader(object):
    """Finds request heads in one connection's buffer, scanning each byte once
    (a client may send a byte at a time)."""

    def __init__(self):
        self._scan = 0         # bytes of the buffer already scanned
        self._lines = 0        # line ends among them
        self._line_start = 0   # where the last, incomplete, line starts

    def take(self, buf):
        """Removes the next head from the bytearray `buf` and returns its
        bytes (request line and header lines, each ended by CRLF or LF) once
        the blank line after it is there (`buf` then starts with the body);
        None before. Raises HTTPError for what can never become a head."""
        if self._scan == 0:   # blank lines before a request line are ignored (RFC 9112 2.2)
            skip = 0
            while skip < len(buf) and buf[skip] in b"\r\n":
                skip += 1
            if skip:
                del buf[:skip]
        start = max(self._scan - 2, 0)
        crlf = buf.find(b"\n\r\n", start)
        lf = buf.find(b"\n\n", start, crlf + 2 if crlf >= 0 else len(buf))
        if crlf >= 0 or lf >= 0:
            end, skip = (lf + 1, 2) if lf >= 0 and (crlf < 0 or lf < crlf) else (crlf + 1, 3)
            head = bytes(buf[:end])
            del buf[:end - 1 + skip]
            self._scan = self._lines = self._line_start = 0
            return head
        if len(buf) > _MAX_HEAD:
            raise HTTPError(431, f"the request's head is over {_MAX_HEAD} bytes")
        new_lines = buf.count(b"\n", self._scan)
        if new_lines:
            self._lines += new_lines
            self._line_start = buf.rfind(b"\n", self._scan) + 1
        self._scan = len(buf)
        if len(buf) - self._line_start > _MAX_LINE + 1:
            if self._lines == 0:
                raise HTTPError(414, f"the request line is over {_MAX_LINE} bytes")
            raise HTTPError(431, f"a header line is over {_MAX_LINE} bytes")
        if self._lines > _MAX_HEADERS + 1:
            raise HTTPError(431, f"more than {_MAX_HEADERS} header lines")
        return None


def parse_head(head, max_body):
    """A Request (without its body) from a head's bytes; HTTPError if refused.

    The checks run in http.server's order: request line and version, header
    lines, method, then the body's framing.
    """
    lines = head.split(b"\n")
    lines.pop()   # after the last line end
    if len(lines[0]) > _MAX_LINE + 1:
        raise HTTPError(414, f"the request line is over {_MAX_LINE} bytes")
    line = lines[0].rstrip(b"\r").decode("latin-1")
    words = line.split()
    if len(words) != 3:
        raise HTTPError(400, f"bad request line {line!r:.200}: expected "
                             f"'METHOD /path HTTP/1.1'")
    method, path, version = words
    minor = _minor_version(version)
    if len(lines) > _MAX_HEADERS + 1:
        raise HTTPError(431, f"more than {_MAX_HEADERS} header lines")
    headers = {}
    for raw in lines[1:]:
        if len(raw) > _MAX_LINE + 1:
            raise HTTPError(431, f"a header line is over {_MAX_LINE} bytes")
        raw = raw.rstrip(b"\r")
        name, sep, value = raw.partition(b":")
        if not sep or not name or name != name.strip():   # also refuses obs-fold lines
            raise HTTPError(400, f"bad header line {raw[:100].decode('latin-1')!r}")
        name = name.decode("latin-1").lower()
        value = value.strip().decode("latin-1")
        if name not in headers:
            headers[name] = value
        elif name == "content-length" and headers[name] != value:
            raise HTTPError(400, "conflicting Content-Length headers")
    if method not in METHODS:
        raise HTTPError(405, f"method {method!r} is not allowed: use GET or POST",
                        headers=ALLOW)
    length = _body_length(method, headers, max_body)
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    keep_alive = "close" not in tokens if minor >= 1 else "keep-alive" in tokens
    if path.startswith("//"):   # as http.server: '//x' is '/x'
        path = "/" + path.lstrip("/")
    expect = minor >= 1 and headers.get("expect", "").lower() == "100-continue"
    return Request(method, path, minor, headers, keep_alive, line, length, expect)


def _minor_version(version):
    """The minor version of an HTTP/1.x version string; HTTPError otherwise."""
    number = version[5:] if version.startswith("HTTP/") else ""
    parts = number.split(".")
    if len(parts) != 2 or not all(p.isascii() and p.isdigit() and len(p) <= 10 for p in parts):
        raise HTTPError(400, f"bad request version {version!r:.100}")
    if int(parts[0]) != 1:
        raise HTTPError(400, f"HTTP version not supported: {version} (use HTTP/1.1)")
    return int(parts[1])


def _body_length(method, headers, max_body):
    """The body's length from its framing headers; HTTPError if refused."""
    if "transfer-encoding" in headers:
        raise HTTPError(411, "chunked bodies are not accepted: send Content-Length")
    value = headers.get("content-length")
    if value is None:
        if method == "POST":
            raise HTTPError(411, "a Content-Length header is required")
        return 0
    if not (value.isascii() and value.isdigit()) or len(value) > 30:
        raise HTTPError(400, f"bad Content-Length {value!r:.100}")
    length = int(value)
    if length > max_body:
        raise HTTPError(413, f"request body of {length} bytes is over the server's limit "
                             f"of {max_body}", discard=min(length, MAX_DISCARD))
    return length


# ---------------------------------------------------------------- answers

_REASONS = {status.value: status.phrase for status in http.HTTPStatus}
_date_cache = [0, ""]   # (second, its Date header value); a stale read is harmless


def http_date():
    """The Date header value, formatted at most once a second."""
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[1] = email.utils.formatdate(now, usegmt=True)
        _date_cache[0] = now
    return _date_cache[1]


def response(status, body, content_type=protocol.CONTENT_TYPE, headers=None, close=False,
             keep_alive=False):
    """The bytes of a whole answer (status line, headers, body), for one write.

    `close` adds `Connection: close`; `keep_alive` adds `Connection:
    keep-alive` (for an HTTP/1.0 client that asked for it).
    """
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\nServer: {SERVER_NAME}\r\n"
             f"Date: {http_date()}\r\n"]
    if status != 304:
        lines.append(f"Content-Type: {content_type}\r\n")
    lines.append(f"Content-Length: {len(body)}\r\n")
    for k, v in (headers or {}).items():
        lines.append(f"{k}: {v}\r\n")
    if close:
        lines.append("Connection: close\r\n")
    elif keep_alive:
        lines.append("Connection: keep-alive\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1") + body
