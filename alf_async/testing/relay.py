"""A userspace TCP relay that makes a link slow, lossy or broken, for tests
and benchmarks between test hosts (netns.py) where the kernel has no `tc
netem` (the usual case here).

    python -m alf_async.testing.relay --listen 0.0.0.0:41234 --target 10.213.7.1:41234 \\
        --delay_ms 20 --loss 0.01

run inside the host that clients connect to (`TestHosts.popen`): every
connection accepted on --listen is relayed to --target, each direction on
its own, with

- `delay_ms`: each chunk read is written on that many ms later (one-way
  latency; order kept);
- `loss`: the probability that a chunk is held back `loss_delay_ms` more
  (default 200 ms, TCP's minimum retransmission timeout): what a lost
  segment costs a TCP stream, whose bytes are never lost, only late;
- `rate_kbps`: a bandwidth cap per direction (0: none);
- cuts: SIGUSR1 resets every open connection (RST) and refuses new ones
  until SIGUSR2 (a partition and its heal, as TCP sees them when the peer's
  host answers); `--flap_secs S` does that every S seconds by itself;
- `--impair_on_signal`: loss and flapping start at a SIGHUP and stop at the
  next one (delay and the rate cap always apply), so that a link can go
  bad and recover under connections that stay open.

It prints `relay listening on HOST:PORT` once it accepts, and on SIGINT or
SIGTERM closes everything and exits 0, printing its counts (connections
relayed and refused, cuts, bytes each way) as one JSON line.

Threads: the main thread accepts; each connection has one thread per
direction (reading, and writing what is due); signal handlers run on the
main thread and only set flags and close sockets.
"""

import argparse
import heapq
import json
import random
import signal
import socket
import struct
import sys
import threading
import time

CHUNK = 65536


class Link(object):
    """The relay's settings and its state (all threads)."""

    def __init__(self, delay_ms=0.0, loss=0.0, loss_delay_ms=200.0, rate_kbps=0.0, seed=0,
                 impaired=True):
        self.delay = delay_ms / 1000.0
        self.loss = loss
        self.loss_delay = loss_delay_ms / 1000.0
        self.rate = rate_kbps * 1000.0 / 8.0   # bytes/s, 0: no cap
        self.up = threading.Event()
        self.up.set()
        self.impaired = threading.Event()   # loss and flapping apply while set
        if impaired:
            self.impaired.set()
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self._sockets = set()
        self.counts = {"connections": 0, "refused": 0, "cuts": 0, "bytes_in": 0, "bytes_out": 0}

    def late(self):
        """Extra seconds a chunk waits (a lost segment's retransmission)."""
        if not self.impaired.is_set():
            return 0.0
        with self._lock:
            return self.loss_delay if self._random.random() < self.loss else 0.0

    def add(self, *socks):
        with self._lock:
            self._sockets.update(socks)

    def remove(self, *socks):
        with self._lock:
            self._sockets.difference_update(socks)

    def count(self, key, n=1):
        with self._lock:
            self.counts[key] += n

    def cut(self, counted=True):
        """Resets every open connection and refuses new ones until `heal`
        (`counted`: a cut of the link, not the relay's own exit)."""
        self.up.clear()
        with self._lock:
            socks, self._sockets = list(self._sockets), set()
            self.counts["cuts"] += int(counted)
        for s in socks:
            _reset(s)

    def heal(self):
        self.up.set()

    def toggle_impaired(self):
        if self.impaired.is_set():
            self.impaired.clear()
        else:
            self.impaired.set()


def _reset(sock):
    """Closes `sock` with a TCP RST (linger 0), as a broken link's peer sees it.
    The shutdown wakes a thread blocked reading it: until that read returns,
    the kernel keeps the socket open (close alone sends nothing)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RD)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def _pump(link, source, sink, key):
    """Reads `source`, writes to `sink` what is due (delay, loss, rate)."""
    due = []          # (time due, sequence, bytes)
    cond = threading.Condition()
    done = []
    seq = [0]

    def writer():
        sent_at = time.monotonic()
        while True:
            with cond:
                while not due and not done:
                    cond.wait(0.5)
                if not due and done:
                    break
                when, _, data = due[0]
                wait = when - time.monotonic()
                if wait > 0:
                    cond.wait(wait)
                    continue
                heapq.heappop(due)
            if link.rate:
                # The cap: this chunk may start once the previous ones' bytes have gone.
                sent_at = max(sent_at, time.monotonic()) + len(data) / link.rate
                time.sleep(max(0.0, sent_at - time.monotonic()))
            try:
                sink.sendall(data)
            except OSError:
                break
            link.count(key, len(data))
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    last = 0.0
    while True:
        try:
            data = source.recv(CHUNK)
        except OSError:
            data = b""
        if not data:
            break
        # Order kept: a chunk is never due before the one read before it.
        last = max(last, time.monotonic() + link.delay + link.late())
        with cond:
            seq[0] += 1
            heapq.heappush(due, (last, seq[0], data))
            cond.notify()
    with cond:
        done.append(True)
        cond.notify()
    thread.join()


def _relay(link, client, target):
    try:
        server = socket.create_connection(target, timeout=10)
        server.settimeout(None)
    except OSError:
        _reset(client)
        return
    for s in (client, server):
        # Each chunk goes on when due: Nagle's algorithm would hold small
        # ones for the peer's delayed ACK (gRPC sets TCP_NODELAY itself).
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    link.add(client, server)
    ups = threading.Thread(target=_pump, args=(link, client, server, "bytes_in"), daemon=True)
    ups.start()
    _pump(link, server, client, "bytes_out")
    ups.join()
    link.remove(client, server)
    for s in (client, server):
        try:
            s.close()
        except OSError:
            pass


def serve(listen, target, link, flap_secs=0.0, print_fn=print):
    """Accepts on `listen` and relays to `target` until `link.stopping`."""
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(listen)
    lsock.listen(128)
    lsock.settimeout(0.2)
    print_fn(f"relay listening on {listen[0]}:{lsock.getsockname()[1]}")
    next_flap = None    # while impaired: when the link flaps next (down first)
    while not link.stopping.is_set():
        if flap_secs and link.impaired.is_set():
            now = time.monotonic()
            if next_flap is None or now >= next_flap:
                if link.up.is_set():
                    link.cut()
                else:
                    link.heal()
                next_flap = (next_flap or now) + flap_secs
        elif next_flap is not None:  # the impairment ended: the link stays up
            next_flap = None
            link.heal()
        try:
            client, _ = lsock.accept()
        except socket.timeout:
            continue
        except OSError:
            break
        if not link.up.is_set():
            link.count("refused")
            _reset(client)
            continue
        link.count("connections")
        threading.Thread(target=_relay, args=(link, client, target), daemon=True).start()
    lsock.close()
    link.cut(counted=False)


def _address(text):
    host, port = text.rsplit(":", 1)
    return host, int(port)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--listen", type=_address, required=True, help="HOST:PORT")
    parser.add_argument("--target", type=_address, required=True, help="HOST:PORT")
    parser.add_argument("--delay_ms", type=float, default=0.0)
    parser.add_argument("--loss", type=float, default=0.0)
    parser.add_argument("--loss_delay_ms", type=float, default=200.0)
    parser.add_argument("--rate_kbps", type=float, default=0.0)
    parser.add_argument("--flap_secs", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--impair_on_signal", action="store_true",
                        help="loss and flapping only between a SIGHUP and the next")
    args = parser.parse_args(argv)
    if not 0.0 <= args.loss <= 1.0:
        parser.error(f"--loss must be a probability in [0, 1], got {args.loss}")
    link = Link(args.delay_ms, args.loss, args.loss_delay_ms, args.rate_kbps, args.seed,
                impaired=not args.impair_on_signal)
    signal.signal(signal.SIGHUP, lambda *_: link.toggle_impaired())
    signal.signal(signal.SIGUSR1, lambda *_: link.cut())
    signal.signal(signal.SIGUSR2, lambda *_: link.heal())
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: link.stopping.set())
    serve(args.listen, args.target, link, args.flap_secs,
          print_fn=lambda line: print(line, flush=True))
    print(json.dumps(link.counts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
