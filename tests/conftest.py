"""Shared fixtures: every test must leave no driver thread behind."""

import threading

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
