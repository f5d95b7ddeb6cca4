"""How an env thread steps an environment is decided once, from its
capabilities, by `stepping_of`: each kind of environment gets the way the
driver's docs promise, and the documented `blocking_step = True` opt-in
counts as a BlockingStep."""

from tf_agents.environments import batched_py_environment, tf_py_environment, wrappers

from alf_async.driver import stepping
from alf_async.environments import SubprocessEnv, capabilities
from alf_async.testing.envs import BlockingCountingEnv, CountingEnv, CountingEnvConstructor


class GilFreeBatch(wrappers.PyEnvironmentBaseWrapper, capabilities.GilFreeStep):
    """A batch of CountingEnvs that declares its step releases the GIL."""


class BlockingBatch(wrappers.PyEnvironmentBaseWrapper, capabilities.BlockingStep):
    """A batch of CountingEnvs, stepped as one, that declares its step blocks."""


def counting_batch():
    return CountingEnvConstructor(batch_size=2)().pyenv


class AppliedCountingEnv(CountingEnv, capabilities.AppliedStep):
    """A CountingEnv that reports it applied what it was given."""

    def applied_step(self):
        return None, True


def tf_env_of(*envs, **kwargs):
    return tf_py_environment.TFPyEnvironment(
        batched_py_environment.BatchedPyEnvironment(list(envs), multithreading=False),
        **kwargs)


def test_in_process_python_steps_run_in_the_graph_with_the_step_token():
    decided = stepping.stepping_of(CountingEnvConstructor(batch_size=2)())
    assert decided.kind == stepping.GRAPH and decided.in_graph
    assert decided.takes_step_token and decided.py_env is not None
    assert decided.rows is None and not decided.blocks and not decided.reports_applied


def test_a_step_that_releases_the_gil_takes_no_step_token():
    tf_env = tf_py_environment.TFPyEnvironment(GilFreeBatch(counting_batch()))
    decided = stepping.stepping_of(tf_env)
    assert decided.kind == stepping.GRAPH and not decided.takes_step_token


def test_an_isolated_environment_is_stepped_by_tf_env_step():
    decided = stepping.stepping_of(tf_env_of(CountingEnv(), isolation=True))
    assert decided.kind == stepping.GRAPH and decided.py_env is None
    assert not decided.takes_step_token


def test_separate_blocking_rows_are_stepped_one_by_one():
    rows = [BlockingCountingEnv(env_index=i) for i in range(3)]
    decided = stepping.stepping_of(tf_env_of(*rows))
    assert decided.kind == stepping.ROWS and decided.rows == rows
    assert decided.blocks and decided.rows_one_by_one and not decided.takes_step_token


def test_a_blocking_batch_without_separate_rows_is_stepped_from_python():
    tf_env = tf_py_environment.TFPyEnvironment(BlockingBatch(counting_batch()))
    decided = stepping.stepping_of(tf_env)
    assert decided.kind == stepping.PYTHON and decided.blocks and decided.rows is None


def test_applied_step_environments_are_stepped_from_python():
    decided = stepping.stepping_of(tf_env_of(AppliedCountingEnv(), AppliedCountingEnv()))
    assert decided.kind == stepping.PYTHON and decided.reports_applied
    assert not decided.blocks and not decided.takes_step_token


def test_blocking_step_declared_on_a_class_or_an_instance_is_a_blocking_step():
    assert isinstance(BlockingCountingEnv(), capabilities.BlockingStep)   # on its class
    env = CountingEnv()
    assert not isinstance(env, capabilities.BlockingStep)
    env.blocking_step = True                                               # on the instance
    assert isinstance(env, capabilities.BlockingStep)
    # The declaration makes a BlockingStep only, not any of its subclasses.
    assert not isinstance(env, SubprocessEnv)


def test_a_stepping_is_not_changed_after_it_is_decided():
    decided = stepping.stepping_of(CountingEnvConstructor()())
    try:
        decided.kind = stepping.ROWS
    except AttributeError:
        pass
    assert decided.kind == stepping.GRAPH


def test_every_row_stepper_takes_the_row_stepper_role():
    from alf_async.driver.env_rows import RowWorkers
    from alf_async.environments.rows.envpool_rows import EnvPoolRows
    from alf_async.environments.rows.slot_stepper import SlotStepper
    from alf_async.environments.rows.subprocess_rows import SubprocessRows
    from alf_async.roles import RowStepper
    for stepper in (RowWorkers, SlotStepper, SubprocessRows, EnvPoolRows):
        assert issubclass(stepper, RowStepper), stepper
    assert issubclass(SubprocessEnv, capabilities.OffersRowStepper)
