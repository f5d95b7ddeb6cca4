"""The HTTP transport of a `PolicyClient`: one keep-alive connection per
client thread, plain (`PlainConnection`) or TLS (`HTTPSConnection`), each
with `round_trip(method, path, body, headers)` -> (status, headers, body,
will_close). Standard library only.
"""

import http.client
import socket


RETRYABLE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
              ConnectionAbortedError)


class PlainConnection(object):
    """One keep-alive HTTP/1.1 connection over a plain socket (http://).

    Not http.client: it builds headers one call each and parses the
    response's with the email package, several times this class's client
    CPU per request on loopback. A client process playing many episodes
    spends that on every step, on the same cores as the server (docs/design.md,
    "Why our own parts where a library exists"). It speaks what a
    PolicyServerEnv (or a proxy in front of it) answers: a status line,
    headers, and a body framed by Content-Length, chunked, or the close.
    https:// uses http.client (`HTTPSConnection`).

    Threads: one client thread (PolicyClient keeps one per thread).
    """

    def __init__(self, host, port, timeout):
        self._address = (host, port or 80)
        self._host_header = f"{host}:{port}" if port else host
        self._timeout = timeout
        self.sock = None
        self._buf = b""

    def close(self):
        if self.sock is not None:
            self.sock.close()
        self.sock = None
        self._buf = b""

    def round_trip(self, method, path, body, headers):
        """Sends one request; returns (status, headers, body, will_close)."""
        if self.sock is None:
            self.sock = socket.create_connection(self._address, self._timeout)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        body = body or b""
        head = "".join([f"{method} {path} HTTP/1.1\r\nHost: {self._host_header}\r\n"] +
                       [f"{k}: {v}\r\n" for k, v in headers.items()] +
                       [f"Content-Length: {len(body)}\r\n\r\n"])
        self.sock.sendall(head.encode("latin-1") + body)
        end = self._fill_until(b"\r\n\r\n")
        lines = self._buf[:end].decode("latin-1").split("\r\n")
        self._buf = self._buf[end + 4:]
        version, _, rest = lines[0].partition(" ")
        try:
            status = int(rest[:3])
        except ValueError:
            raise http.client.BadStatusLine(lines[0]) from None
        response_headers = _Headers()
        for line in lines[1:]:
            name, _, value = line.partition(":")
            response_headers[name.strip().lower()] = value.strip()
        connection = response_headers.get("connection", "").lower()
        will_close = connection == "close" or (version == "HTTP/1.0" and
                                               connection != "keep-alive")
        if response_headers.get("transfer-encoding", "").lower() == "chunked":
            data = self._read_chunked()
        elif "content-length" in response_headers:
            data = self._read_exactly(int(response_headers["content-length"]))
        elif status in (204, 304) or 100 <= status < 200:
            data = b""
        else:   # framed by the close
            data, will_close = self._read_to_close(), True
        return status, response_headers, data, will_close

    def _recv(self):
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise http.client.RemoteDisconnected("the server closed the connection")
        self._buf += chunk

    def _fill_until(self, marker):
        while True:
            end = self._buf.find(marker)
            if end >= 0:
                return end
            self._recv()

    def _read_exactly(self, n):
        while len(self._buf) < n:
            self._recv()
        data, self._buf = self._buf[:n], self._buf[n:]
        return data

    def _read_chunked(self):
        parts = []
        while True:
            end = self._fill_until(b"\r\n")
            size = int(self._buf[:end].split(b";")[0], 16)
            self._buf = self._buf[end + 2:]
            if size == 0:   # then trailer lines, up to an empty one
                while True:
                    end = self._fill_until(b"\r\n")
                    line, self._buf = self._buf[:end], self._buf[end + 2:]
                    if not line:
                        return b"".join(parts)
            parts.append(self._read_exactly(size))
            self._read_exactly(2)

    def _read_to_close(self):
        try:
            while True:
                self._recv()
        except http.client.RemoteDisconnected:
            data, self._buf = self._buf, b""
            return data


class _Headers(dict):
    """Response headers, names lowercased; `get` takes any case."""

    def get(self, name, default=None):
        return dict.get(self, name.lower(), default)


class HTTPSConnection(http.client.HTTPSConnection):

    def connect(self):
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def round_trip(self, method, path, body, headers):
        """Sends one request; returns (status, headers, body, will_close)."""
        self.request(method, path, body=body, headers=headers)
        response = self.getresponse()
        return response.status, response.headers, response.read(), response.will_close
