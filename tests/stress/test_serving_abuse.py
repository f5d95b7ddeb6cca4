"""Serving under abuse, in reduced counts (ALF_ASYNC_STRESS_SCALE multiplies
them; tests/stress/reliability.py runs the full counts and prints the figures):
hypothesis-generated bad requests interleaved with good clients, and clients
that vanish mid-episode."""

import os

import pytest

from . import serving_abuse
from .serving_abuse import (MAX_BODY, RawRequest, ServedPolicy, fuzz_failures, fuzz_trial,
                            http_bytes, is_4xx, send_raw, vanishing_clients_trial,
                            vanishing_failures)

SCALE = float(os.environ.get("ALF_ASYNC_STRESS_SCALE", "1"))
pytestmark = [pytest.mark.stress]


@pytest.mark.timeout(120)
def test_every_bad_request_gets_a_4xx_while_good_clients_play():
    n = max(50, int(500 * SCALE))
    # The good clients join after the first 30%: 10% -> 30% measures the
    # server's growth under bad requests alone.
    r = fuzz_trial(n, num_good_clients=4, seed=2026, include_known_bugs=True, good_from=0.3)
    assert r["bad_total"] == n
    categories = set(r["statuses"])
    assert {"malformed_json", "truncated", "oversized", "wrong_types", "unknown_command",
            "unauthenticated", "wrong_path"} <= categories, categories
    assert fuzz_failures(r) == [], r
    assert all(done >= 3 for done in r["good_episodes"].values()), r["good_episodes"]
    assert len(r["good_episodes"]) == 4 and r["learner_batches"] > 0
    assert "good_start" in r["rss_mib"]


@pytest.mark.timeout(120)
def test_vanished_clients_free_their_slots_after_the_idle_timeout():
    n = max(6, int(12 * SCALE))
    v = vanishing_clients_trial(n, idle_timeout=0.5, num_envs=4)
    assert vanishing_failures(v, n) == [], v


# The request shapes that got a non-4xx answer before 283a0e2 (fixed there):
# regression tests.

@pytest.fixture
def served():
    s = ServedPolicy(num_envs=1, token=serving_abuse.TOKEN, max_body_bytes=MAX_BODY,
                     max_concurrent=4)
    yield s
    s.stop()


def _post(served, body, **kwargs):
    return send_raw(served.host, served.port,
                    RawRequest("x", http_bytes("POST", "/v1/command", body, **kwargs)))


@pytest.mark.timeout(60)
def test_a_huge_integer_reward_gets_a_400(served):
    # float(10**400) raised OverflowError: 500.
    body = b'{"command":"log_returns","episode_id":"nope","reward":1' + b"0" * 400 + b"}"
    assert _post(served, body) == 400


@pytest.mark.timeout(60)
def test_a_truncated_body_is_refused_even_if_its_start_is_a_valid_command(served):
    # The body was read without checking its length: the command was applied.
    body = b'{"command":"start_episode","episode_id":"truncated-1"}'
    request = RawRequest("x", http_bytes("POST", "/v1/command", body,
                                         content_length=len(body) + 10), "half_close")
    assert send_raw(served.host, served.port, request) == 400
    assert served.server.num_open_episodes == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method, version", [("PUT", "HTTP/1.1"), ("DELETE", "HTTP/1.1"),
                                             ("FOO", "HTTP/1.1"), ("POST", "HTTP/2.0")])
def test_wrong_methods_and_versions_get_a_4xx(served, method, version):
    # http.server's own 501 (method) and 505 (HTTP/2+, sent without a status line).
    request = RawRequest("x", http_bytes(method, "/v1/command", b"{}", version=version))
    status = send_raw(served.host, served.port, request)
    assert is_4xx(status), status
