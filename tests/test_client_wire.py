"""PolicyClient's plain-socket HTTP/1.1 connection against scripted servers:
every framing a server or a proxy in front of it may answer with, keep-alive
reuse, and the retry when the server closed an idle connection."""

import socket
import threading

import pytest

from alf_async.serving.client import PolicyClient

pytestmark = pytest.mark.timeout(30)


class ScriptedServer(object):
    """Accepts connections; answers each request (read up to its body) with
    the next scripted reply: (bytes to send, close the connection after)."""

    def __init__(self, replies):
        self._replies = list(replies)
        self.requests = []      # (connection number, request bytes)
        self.connections = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while self._replies:
            conn, _ = self._sock.accept()
            self.connections += 1
            with conn:
                buf = b""
                while self._replies:
                    while b"\r\n\r\n" not in buf:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        buf += chunk
                    if b"\r\n\r\n" not in buf:
                        break   # the client closed
                    head, _, buf = buf.partition(b"\r\n\r\n")
                    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                    while len(buf) < length:
                        buf += conn.recv(65536)
                    self.requests.append((self.connections, head + b"\r\n\r\n" + buf[:length]))
                    buf = buf[length:]
                    reply, close = self._replies.pop(0)
                    conn.sendall(reply)
                    if close:
                        break
        self._sock.close()

    def join(self):
        self._thread.join(10)
        assert not self._thread.is_alive()


def test_content_length_chunked_and_close_framed_answers():
    server = ScriptedServer([
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nETag: \"abc\"\r\n\r\nhello", False),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
         b"3\r\nfoo\r\n4;ext=1\r\nbar!\r\n0\r\nX-Trailer: 1\r\n\r\n", False),
        (b"HTTP/1.1 304 Not Modified\r\nETag: \"abc\"\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the close", True),
    ])
    with PolicyClient(server.address, token="t") as client:
        status, headers, body = client.request("POST", "/a", b'{"x": 1}')
        assert (status, body, headers.get("ETag"), headers.get("etag")) == (
            200, b"hello", '"abc"', '"abc"')
        assert client.request("GET", "/b")[::2] == (200, b"foobar!")
        assert client.request("GET", "/c", headers={"If-None-Match": '"abc"'})[::2] == (304, b"")
        assert client.request("GET", "/d")[::2] == (200, b"until the close")
    server.join()
    # One keep-alive connection for all four; the request carried our headers.
    assert server.connections == 1 and [c for c, _ in server.requests] == [1, 1, 1, 1]
    first = server.requests[0][1]
    assert first.startswith(b"POST /a HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"Authorization: Bearer t\r\n" in first and first.endswith(b'\r\n\r\n{"x": 1}')
    assert b"If-None-Match: \"abc\"\r\n" in server.requests[2][1]


def test_a_connection_the_server_closed_while_idle_is_retried_once():
    server = ScriptedServer([
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", True),   # then closes: idle close
        (b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n{\"a\":1}", False),
    ])
    with PolicyClient(server.address) as client:
        assert client.call("start_episode") == {}
        assert client.call("get_action", episode_id="e", observation=[0]) == {"a": 1}
    server.join()
    assert server.connections == 2


def test_no_server_is_a_connection_error():
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with PolicyClient(f"http://127.0.0.1:{port}") as client:
        with pytest.raises(ConnectionError, match=r"^policy server http://127\.0\.0\.1:\d+: "):
            client.call("start_episode")
