"""The settings groups refuse what cannot run, with one line naming the binding."""

import pytest

from alf_async.errors import ConfigError
from alf_async.settings import Collectors, Layout, Schedule, check_together

pytestmark = pytest.mark.timeout(60)


def test_a_batch_takes_whole_env_threads_unrolls():
    layout = Layout(env_threads=2, rows_per_env_thread=4)
    assert layout.unrolls_per_batch(8) == 2
    assert layout.driver_args(Schedule(num_iterations=1, rows_per_batch=8))["learn_queue_cap"] == 2
    assert layout.driver_args(Schedule(num_iterations=1))["learn_queue_cap"] == 1  # one thread's
    with pytest.raises(ConfigError) as raised:
        check_together(layout, Schedule(num_iterations=1, rows_per_batch=6), Collectors())
    assert str(raised.value) == ("Schedule.rows_per_batch 6 is not a whole number of env "
                                 "threads' rows (Layout.rows_per_env_thread 4): make it a "
                                 "multiple")
    with pytest.raises(ConfigError) as raised:
        layout.unrolls_per_batch(6, scope="collect/")
    assert str(raised.value) == ("collect.rows_per_batch 6 is not a whole number of env "
                                 "threads' rows (collect/Layout.rows_per_env_thread 4): make "
                                 "it a multiple")


def test_a_layout_to_choose_is_checked_against_the_batch_once_chosen():
    # 'auto' may pick env threads of 2 rows: a batch of 6 rows fits those.
    check_together(Layout(rows_per_env_thread=4, choice="auto"),
                   Schedule(num_iterations=1, rows_per_batch=6), Collectors())


def test_pacing_that_leaves_an_env_thread_idle_is_refused():
    with pytest.raises(ConfigError) as raised:
        check_together(Layout(env_threads=3, rows_per_env_thread=2),
                       Schedule(num_iterations=1, rows_per_batch=4, batches_ahead=1),
                       Collectors())
    assert str(raised.value) == ("Schedule.batches_ahead = 1 lets 1 batches of 2 env threads' "
                                 "unrolls be collected at once, fewer than the 3 env threads "
                                 "(Layout.env_threads): raise one of them")
    check_together(Layout(env_threads=3, rows_per_env_thread=2),
                   Schedule(num_iterations=1, rows_per_batch=4, batches_ahead=2), Collectors())


def test_collectors_refuse_what_arranges_this_process_env_threads():
    with pytest.raises(ConfigError, match=r"^Schedule.batches_ahead paces this process's "):
        check_together(Layout(), Schedule(num_iterations=1, batches_ahead=1), Collectors(count=2))
    with pytest.raises(ConfigError, match=r"^Layout.choice arranges this process's "):
        check_together(Layout(choice="auto"), Schedule(num_iterations=1), Collectors(count=2))


@pytest.mark.parametrize("make, line", [
    (lambda: Schedule(), "set Schedule.num_iterations or Schedule.num_env_steps (or both): "
                         "otherwise training never stops"),
    (lambda: Schedule(num_iterations=1, rows_per_batch=0),
     "Schedule.rows_per_batch must be None (one env thread's rows) or an int >= 1, got 0"),
    (lambda: Layout(actor_queues=-1),
     "Layout.actor_queues must be an int >= 0 (0: each env thread acts itself), got -1"),
    (lambda: Collectors(launcher="k8s"),
     "Collectors.launcher must be 'local', 'ray' or 'none', got 'k8s'"),
])
def test_a_bad_field_is_refused_with_one_line(make, line):
    with pytest.raises(ConfigError) as raised:
        make()
    assert str(raised.value).splitlines()[0] == line


def test_a_chosen_layout_keeps_nothing_gin_bound_of_the_choice():
    run_layout = type("RunLayout", (), dict(num_envs=4, env_batch_size=2, num_actor_queues=2,
                                            actor_queue_cap=2))
    layout = Layout(env_threads=1, rows_per_env_thread=8, choice="auto", auto_budget_secs=5.0)
    assert layout.chosen(run_layout) == Layout(env_threads=4, rows_per_env_thread=2,
                                               actor_queues=2, actor_queue_cap=2,
                                               auto_budget_secs=5.0)
