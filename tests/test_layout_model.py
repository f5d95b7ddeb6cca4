"""The cost model that orders the layouts choose_layout measures: the
candidates it builds, how it ranks them and the order they are measured in,
on profiles whose numbers are given."""

import pytest

from alf_async.driver import layout_model
from alf_async.driver.layout_model import Layout, Profile, measuring_order, predicted_rate

pytestmark = pytest.mark.timeout(60)


def test_an_envpool_profile_adds_receive_sizes_and_no_processes():
    profile = layout_model.Profile(step_secs=2e-4, step_cpu_secs=2e-4, step_gil_secs=1e-5,
                                 rows_stepped=True, receives=True,
                                 inference_secs={1: 1e-3, 2: 1e-3, 4: 1.2e-3, 8: 1.5e-3},
                                 cores=2)
    ranked = layout_model.candidates(profile, 8, processes=True, max_threads=2)
    assert sorted(ranked) == sorted(
        [Layout(1, 8, q, 1, False, r) for q in (0, 1) for r in (2, 4, 8)] +
        [Layout(2, 4, q, {0: 1, 1: 2, 2: 1}[q], False, r)
         for q in (0, 1, 2) for r in (1, 2, 4)])


def test_every_split_of_the_rows_is_a_candidate_and_each_thread_count_comes_early():
    profile = layout_model.Profile(step_secs=1e-3, step_cpu_secs=1e-5, step_gil_secs=1e-5,
                                 rows_stepped=False, receives=False,
                                 inference_secs={1: 1e-3, 2: 1e-3, 4: 1.2e-3, 8: 1.5e-3,
                                                 12: 2e-3}, cores=2)
    ranked = layout_model.candidates(profile, 12)
    # Splits into at most 4 threads per core: 1, 2, 3, 4, 6 env threads;
    # acting themselves, or one or two actor threads (never more than env
    # threads), each taking every waiting request.
    assert sorted(ranked) == sorted(
        [Layout(e, 12 // e, 0, 1, False) for e in (1, 2, 3, 4, 6)] +
        [Layout(e, 12 // e, 1, e, False) for e in (1, 2, 3, 4, 6)] +
        [Layout(e, 12 // e, 2, -(-e // 2), False) for e in (2, 3, 4, 6)])
    assert len({layout.num_envs for layout in ranked[:5]}) == 5
    firsts = ranked[:5]
    assert [layout_model.predicted_rate(profile, l) for l in firsts] == sorted(
        [layout_model.predicted_rate(profile, l) for l in firsts], reverse=True)
    # Steps that wait 1 ms and are stepped one after another: more threads
    # overlap more waits, so the model ranks the most threads first.
    assert ranked[0].num_envs == 6


def test_two_in_process_splits_come_first_then_child_processes_take_turns():
    # Children are predicted faster here (a step's CPU runs beside the
    # GIL), yet the first two candidates are in process; then the places
    # alternate.
    profile = layout_model.Profile(step_secs=2e-3, step_cpu_secs=2e-3, step_gil_secs=2e-3,
                                 rows_stepped=False, receives=False,
                                 inference_secs={1: 1e-3, 2: 1e-3, 4: 1.2e-3}, cores=2)
    ranked = layout_model.candidates(profile, 4, processes=True)
    best = max(ranked, key=lambda l: layout_model.predicted_rate(profile, l))
    assert best.processes
    assert [l.processes for l in ranked[:6]] == [False, False, True, False, True, True]
    # 1, 2 and 4 env threads, each place's best first.
    assert {l.num_envs for l in ranked[:6] if not l.processes} == {1, 2, 4}
    assert {l.num_envs for l in ranked[:6] if l.processes} == {1, 2, 4}


def _flat_profile(step_secs, forward_secs):
    """A Python environment whose step is all CPU under the GIL, and a
    policy whose forward pass takes `forward_secs` at any batch size."""
    return Profile(step_secs=step_secs, step_cpu_secs=step_secs, step_gil_secs=step_secs,
                   rows_stepped=False, receives=False,
                   inference_secs={1: forward_secs, 64: forward_secs}, cores=2)


def test_an_actor_takes_the_requests_that_came_while_its_last_pass_ran():
    # A round of 8 rows steps in 8 x (100 + 8 + 60) us = 1.344 ms.
    quick = _flat_profile(100e-6, 5e-3)         # stepping shorter than a 5 ms pass
    slow = _flat_profile(100e-6, 0.5e-3)        # stepping longer than a 0.5 ms pass
    # Two env threads on one actor take turns: one request a pass.
    assert layout_model.requests_per_forward(quick, Layout(2, 8, 1, 2, False)) == 1.0
    # Four, or eight: two halves, each stepping while the other's pass runs.
    assert layout_model.requests_per_forward(quick, Layout(4, 8, 1, 4, False)) == 2.0
    assert layout_model.requests_per_forward(quick, Layout(8, 8, 1, 8, False)) == 4.0
    # Eight threads on two actors: four each, two a pass.
    assert layout_model.requests_per_forward(quick, Layout(8, 8, 2, 4, False)) == 2.0
    # Stepping the longer: n F / (T + F) = 8 x 0.5 / 1.844 requests, or 1
    # at least.
    assert layout_model.requests_per_forward(slow, Layout(8, 8, 1, 8, False)) == pytest.approx(
        8 * 0.5 / 1.844)
    assert layout_model.requests_per_forward(slow, Layout(2, 8, 1, 2, False)) == 1.0
    # Never more than the cap.
    assert layout_model.requests_per_forward(quick, Layout(8, 8, 1, 3, False)) == 3.0


def test_the_rate_is_a_soft_minimum_of_the_limits_and_two_actors_serve_two_threads_at_once():
    quick = _flat_profile(100e-6, 5e-3)
    one, two = Layout(2, 8, 1, 2, False), Layout(2, 8, 2, 1, False)
    limits = layout_model.rate_limits(quick, one)
    assert limits == pytest.approx({
        "rounds": 16 / (1.344e-3 + 5e-3),            # each thread: its steps, then a pass
        "gil": 1 / 168e-6,
        "cores": 2 / (168e-6 + 5e-3 / 8),
        "actors": 8 / 5e-3,                          # one request of 8 rows a pass
    })
    assert predicted_rate(quick, one) == pytest.approx(
        sum(v ** -4 for v in limits.values()) ** -0.25)
    assert predicted_rate(quick, one) < min(limits.values())
    # Two actors: the same rounds, GIL and cores, twice the passes at once.
    assert layout_model.rate_limits(quick, two)["actors"] == pytest.approx(2 * 8 / 5e-3)
    assert predicted_rate(quick, two) > predicted_rate(quick, one)


def test_env_threads_that_act_themselves_pay_less_per_request_and_pass_side_by_side():
    quick = _flat_profile(100e-6, 5e-3)
    own = Layout(2, 8, 0, 1, False)
    python = 100e-6 + 8e-6 + 270e-6 / 8           # no round trip to an actor
    assert layout_model.requests_per_forward(quick, own) == 1.0
    assert layout_model.rate_limits(quick, own) == pytest.approx({
        "rounds": 16 / (8 * python + 5e-3),
        "gil": 1 / python,
        "cores": 2 / (python + 5e-3 / 8),
        "actors": 2 * 8 / 5e-3,                      # each thread its own pass
    })
    # Rows stepped one by one act from Python: a traced call costs more
    # than the round trip to a graph actor.
    rows = quick._replace(rows_stepped=True)
    assert layout_model.rate_limits(rows, own)["gil"] == pytest.approx(
        1 / (100e-6 + 8e-6 + 700e-6 / 8))
    assert layout_model.rate_limits(rows, own)["gil"] < layout_model.rate_limits(
        rows, Layout(2, 8, 1, 2, False))["gil"]
    # So do rows in child processes, whatever the in-process profile.
    assert layout_model.rate_limits(quick, Layout(2, 8, 0, 1, True))["gil"] == pytest.approx(
        1 / (layout_model.PROCESS_STEP_SECS + 8e-6 + 700e-6 / 8))


def test_variants_of_the_fastest_split_are_measured_in_turns_with_the_ranking():
    a1, a2 = Layout(2, 8, 1, 2, False), Layout(2, 8, 2, 1, False)
    b1, b2 = Layout(4, 4, 1, 4, False), Layout(4, 4, 2, 2, False)
    c1 = Layout(1, 16, 1, 1, False)
    d1 = Layout(8, 2, 1, 8, False)
    ranked = [a1, b1, c1, d1, a2, b2]
    rates = []
    order = []
    speeds = {a1: 100.0, b1: 120.0, c1: 90.0, d1: 80.0, a2: 110.0, b2: 130.0}
    for layout in measuring_order(ranked, rates):
        order.append(layout)
        rates.append((layout, speeds[layout]))
    # Two as ranked; then b1's variant (b1 is the fastest measured); the
    # next ranked; then a variant of the fastest (b2 now, which has none
    # left: the next ranked); the rest.
    assert order == [a1, b1, b2, c1, d1, a2]
    # Nothing measured (every candidate skipped): the ranking's order.
    assert list(measuring_order(ranked, [])) == ranked
