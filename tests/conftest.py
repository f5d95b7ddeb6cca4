"""Shared fixtures and helpers: every test must leave no driver thread
behind; `signal_when_ready` interrupts a CLI run at a chosen line."""

import signal
import threading
import time

import pytest

DRIVER_THREAD_PREFIXES = ("env", "actor", "log", "queue_closer", "alf_async_warm_up",
                          "layout_watcher")


def driver_threads():
    return [t for t in threading.enumerate()
            if t.name.startswith(DRIVER_THREAD_PREFIXES) and t.is_alive()]


@pytest.fixture(autouse=True)
def no_driver_threads_left():
    yield
    left = driver_threads()
    assert not left, f"driver threads still alive after the test: {[t.name for t in left]}"


def signal_when_ready(proc, ready, sig=signal.SIGINT, ready_secs=90.0, exit_secs=20.0,
                      before_signal=None):
    """Reads `proc`'s output (a Popen with text stdout, stderr merged) until
    a line satisfies `ready(line)`, calls `before_signal()`, sends `sig` and
    waits for `proc` to exit; kills it if anything fails on the way.

    Returns:
        (the output after the ready line, seconds from the signal to the
        exit, what `before_signal` returned or None).
    """
    try:
        deadline = time.monotonic() + ready_secs
        for line in proc.stdout:
            if ready(line):
                break
            assert time.monotonic() < deadline, f"no ready line within {ready_secs} s"
        else:
            raise AssertionError(f"exited with {proc.wait()} before a ready line")
        before = before_signal() if before_signal is not None else None
        sent = time.monotonic()
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=exit_secs)
        return output, time.monotonic() - sent, before
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
