"""alf_async.testing.relay, on loopback: bytes relayed intact and in order,
each direction late by its delay, connections reset on a cut and refused
until the heal, its counts on exit."""

import json
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytestmark = pytest.mark.timeout(60)


def echo_server():
    """A loopback server echoing every connection; returns (port, stop)."""
    lsock = socket.create_server(("127.0.0.1", 0))
    lsock.settimeout(0.2)
    stop = threading.Event()

    def echo(conn):
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                conn.sendall(data)

    def accept():
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except socket.timeout:
                continue
            threading.Thread(target=echo, args=(conn,), daemon=True).start()
        lsock.close()
    threading.Thread(target=accept, daemon=True).start()
    return lsock.getsockname()[1], stop


def start_relay(target_port, *flags):
    proc = subprocess.Popen(
        [sys.executable, "-m", "alf_async.testing.relay", "--listen", "127.0.0.1:0",
         "--target", f"127.0.0.1:{target_port}"] + list(flags),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("relay listening on 127.0.0.1:"), (line, proc.stderr.read())
    return proc, int(line.rsplit(":", 1)[1])


def round_trip(sock, payload):
    start = time.monotonic()
    sock.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = sock.recv(65536)
        assert chunk, "connection closed"
        got += chunk
    return got, time.monotonic() - start


def finish(proc):
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("flags, at_least", [
    (["--delay_ms", "50"], 0.1),                              # 50 ms there and 50 back
    (["--loss", "1", "--loss_delay_ms", "100"], 0.2),          # every chunk "lost" once
    (["--rate_kbps", "8000"], 0.25),         # 256 KiB at 1 MB/s (the two ways overlap)
])
def test_bytes_arrive_intact_in_order_and_late_as_the_link_says(flags, at_least):
    port, stop = echo_server()
    proc, relay_port = start_relay(port, *flags)
    try:
        with socket.create_connection(("127.0.0.1", relay_port), timeout=10) as sock:
            payload = bytes(range(256)) * 1024          # 256 KiB, several chunks
            got, secs = round_trip(sock, payload)
            assert got == payload
            assert secs >= at_least, secs
    finally:
        counts = finish(proc)
        stop.set()
    assert counts == {"connections": 1, "refused": 0, "cuts": 0, "bytes_in": len(payload),
                      "bytes_out": len(payload)}


def test_a_cut_resets_open_connections_and_refuses_new_ones_until_the_heal():
    port, stop = echo_server()
    proc, relay_port = start_relay(port)
    try:
        sock = socket.create_connection(("127.0.0.1", relay_port), timeout=10)
        assert round_trip(sock, b"before")[0] == b"before"
        proc.send_signal(signal.SIGUSR1)
        with pytest.raises(OSError):
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:   # reset: the next read or write fails
                sock.sendall(b"x")
                if not sock.recv(1):
                    raise ConnectionResetError("closed")
                time.sleep(0.05)
        sock.close()
        # Refused while cut: accepted, then reset at once.
        with pytest.raises(OSError):
            with socket.create_connection(("127.0.0.1", relay_port), timeout=10) as refused:
                refused.sendall(b"x")
                if not refused.recv(1):
                    raise ConnectionResetError("closed")
        proc.send_signal(signal.SIGUSR2)
        time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", relay_port), timeout=10) as healed:
            assert round_trip(healed, b"after")[0] == b"after"
    finally:
        counts = finish(proc)
        stop.set()
    assert counts["connections"] == 2 and counts["refused"] == 1 and counts["cuts"] == 1


def test_a_loss_outside_0_1_is_refused_with_one_line():
    done = subprocess.run([sys.executable, "-m", "alf_async.testing.relay", "--listen",
                           "127.0.0.1:0", "--target", "127.0.0.1:1", "--loss", "5"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith(
        "error: --loss must be a probability in [0, 1], got 5.0")


def test_loss_and_flapping_apply_only_between_two_sighups_with_impair_on_signal():
    port, stop = echo_server()
    proc, relay_port = start_relay(port, "--impair_on_signal", "--loss", "1",
                                   "--loss_delay_ms", "300", "--flap_secs", "2")
    try:
        sock = socket.create_connection(("127.0.0.1", relay_port), timeout=10)
        time.sleep(2.2)   # longer than a flap: none happens, no chunk is held back
        got, secs = round_trip(sock, b"clean")
        assert got == b"clean" and secs < 0.3, secs
        proc.send_signal(signal.SIGHUP)   # impaired: down at once (the open one reset),
        impaired = time.monotonic()       # up 2 s later, down again 2 s after that
        with pytest.raises(OSError):
            while time.monotonic() < impaired + 1.5:
                sock.sendall(b"x")
                if not sock.recv(1):
                    raise ConnectionResetError("closed")
                time.sleep(0.05)
        sock.close()
        time.sleep(impaired + 2.3 - time.monotonic())
        with socket.create_connection(("127.0.0.1", relay_port), timeout=10) as lossy:
            got, secs = round_trip(lossy, b"lossy")   # every chunk lost once each way
            assert got == b"lossy" and secs >= 0.6, secs
        assert time.monotonic() < impaired + 3.8
        proc.send_signal(signal.SIGHUP)   # healthy again, and up for good
        time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", relay_port), timeout=10) as healed:
            got, secs = round_trip(healed, b"after")
            assert got == b"after" and secs < 0.3, secs
            time.sleep(impaired + 4.5 - time.monotonic())   # past the next flap's time
            assert round_trip(healed, b"still")[0] == b"still"
    finally:
        counts = finish(proc)
        stop.set()
    assert counts["cuts"] == 1, counts
