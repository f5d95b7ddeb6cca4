"""The trainer's smoke run on every environment variant reaches the learner:
gymnasium environments and environments in child processes (issues 5-7;
Ray actors: test_quiet_start's dqn_cartpole_ray.gin run, from the CLI).
Each run trains (global step > 0, finite loss) and the variant's gin file
parses on top of its base config."""

import os

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import gin  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from alf_async import trainer  # noqa: E402
from alf_async import settings
from alf_async.environments import suites  # noqa: E402
from alf_async.environments.processes.env_index import building_env, current_env_index  # noqa: E402
from test_trainer import read_scalars  # noqa: E402

GIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gin_configs")


@pytest.fixture(autouse=True)
def _clear_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def smoke_run(tmp_path, bindings):
    gin.parse_config_files_and_bindings([os.path.join(GIN, "smoke.gin")], bindings)
    losses = []
    result = trainer.train(str(tmp_path), schedule=settings.Schedule(num_iterations=12),
                           print_fn=losses.append)
    assert result.global_step > 0 and result.env_steps == 12 * 8
    return result


@pytest.mark.timeout(120)
def test_gymnasium_environment_reaches_the_learner(tmp_path):
    smoke_run(tmp_path, ["Task.suite = 'suite_gymnasium'", "Task.env_name = 'CartPole-v1'"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("suite, env_name", [("suite_gym", "CartPole-v0"),
                                             ("suite_gymnasium", "CartPole-v1")])
def test_subprocess_environments_reach_the_learner(tmp_path, suite, env_name):
    smoke_run(tmp_path, ["Task.make_env_constructor = @make_subprocess_env_constructor",
                         f"Task.suite = '{suite}'", f"Task.env_name = '{env_name}'"])
    # Their restart count is a training summary (0 here: nothing crashed).
    restarts = read_scalars(str(tmp_path / "train"))["Env/restarts"]
    assert restarts and all(value == 0 for _, value in restarts)


@pytest.mark.parametrize("base, variant", [
    ("dqn_cartpole.gin", "dqn_cartpole_subprocess.gin"),
    ("sac_pendulum.gin", "sac_pendulum_subprocess.gin"),
    ("dqn_cartpole.gin", "dqn_cartpole_ray.gin"),
    ("dqn_cartpole.gin", "dqn_cartpole_gymnasium.gin"),
    ("sac_pendulum.gin", "sac_pendulum_gymnasium.gin"),
])
def test_variant_configs_parse_on_their_base(base, variant):
    gin.add_config_file_search_path(GIN)  # each variant includes its base (as alf-async-train finds it)
    gin.parse_config_files_and_bindings([os.path.join(GIN, base), os.path.join(GIN, variant)], [])


def test_single_env_seeds_follow_the_env_index():
    def reset_built_as(index):
        with building_env(index):
            return suites.make_single_env("suite_gymnasium", "CartPole-v1", seed=10).reset()

    a, b, c = reset_built_as(3), reset_built_as(4), reset_built_as(3)
    assert current_env_index() is None
    np.testing.assert_array_equal(a.observation, c.observation)
    assert not np.array_equal(a.observation, b.observation)
    assert a.observation.shape == (4,) and int(a.step_type) == 0
