"""`train()`'s settings, grouped as the concepts they are.

Each group is a gin-configurable dataclass with documented fields, as RLlib's
AlgorithmConfig groups and acme's agent configs are. `train()` builds each
group it is not given from gin, so a .gin file binds the groups' fields:

    Task.env_name = 'CartPole-v0'
    Task.agent_fn = @dqn_agent
    Layout.env_threads = 2
    Layout.rows_per_env_thread = 16
    Schedule.num_env_steps = 100000
    Evaluation.interval = 1000

and a Python caller passes the groups it sets (`train(root_dir,
schedule=Schedule(num_iterations=10))`; the fields it leaves out are gin's).

| group | what it holds |
|---|---|
| `Task` | what runs: the environment, its suite, the agent, the replayer |
| `Layout` | env threads, rows per env thread, actor queues and their cap; or 'auto' |
| `Schedule` | unrolls and batches, limits, train steps, initial collect, pacing |
| `Evaluation` | how often and how the policy is evaluated; when the run is solved |
| `Outputs` | summaries, checkpoints, progress lines |
| `Runtime` | TensorFlow's thread pools, the seed, the kernels |
| `Collectors` | collector processes feeding the learner through Reverb |

Each group checks its own fields when it is built and raises `ConfigError`
naming the binding. A binding that moved from `train.*` is refused with one
line that names its new binding (`alf_async.bin.moved_bindings`).

Names: the driver's keyword arguments keep ALF's (`num_envs` for env
threads, `num_actor_queues`, `actor_queue_cap`, `learn_queue_cap`,
`unroll_length`); here an env thread is an env thread, a row one
environment of an env thread's batch, and a batch the rows' unrolls the
learner takes at once (`Layout.driver_args` maps one onto the other).
"""

import dataclasses

import gin

from alf_async import kernels
from alf_async.driver import layout as layout_lib
from alf_async.environments import suites
from alf_async.errors import ConfigError
from alf_async.learning import replayers

def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _int_at_least(binding, value, low):
    if not _is_int(value) or value < low:
        raise ConfigError(f"{binding} must be an int >= {low}, got {value!r}")


def _optional_int_at_least(binding, value, low, none_means=""):
    if value is not None and (not _is_int(value) or value < low):
        raise ConfigError(f"{binding} must be None{none_means} or an int >= {low}, "
                          f"got {value!r}")


def _positive_number(binding, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{binding} must be a number > 0, got {value!r}")


def _bool(binding, value):
    if not isinstance(value, bool):
        raise ConfigError(f"{binding} must be True or False, got {value!r}")


@gin.configurable
@dataclasses.dataclass
class Task:
    """What runs: the environment, the agent and the replayer.

    Args:
        env_name: the environment's name in `suite` ('CartPole-v0').
        agent_fn: callable(time_step_spec, action_spec, train_step_counter)
            -> TFAgent (`dqn_agent`, `sac_agent`, `ppo_agent`, `impala_agent`).
        suite: the environment suite (see `suites.load`).
        make_env_constructor: callable(suite, env_name, batch_size, seed) ->
            the driver's env constructor (`suites.make_env_constructor`,
            `make_subprocess_env_constructor`, `make_ray_env_constructor`,
            `make_serving_env_constructor`).
        replayer_fn: callable(data_spec, num_rows) -> replayer
            (`UniformReplayer`, `PixelReplayer`, `OneTimeReplayer`,
            `ReverbReplayer`). A replayer class that is a
            `roles.CheckpointedReplay` is also given checkpoint_dir=
            root_dir/replay; `OneTimeReplayer` is given its batch rows.
    """

    env_name: str = gin.REQUIRED
    agent_fn: object = gin.REQUIRED
    suite: str = "suite_gym"
    make_env_constructor: object = suites.make_env_constructor
    replayer_fn: object = replayers.UniformReplayer

    def __post_init__(self):
        if not callable(self.agent_fn):
            raise ConfigError(f"Task.agent_fn must be callable, got {self.agent_fn!r}")


@gin.configurable
@dataclasses.dataclass
class Layout:
    """How the environments' rows are laid out: the only place that names
    env threads and rows.

    `env_threads` env threads step `rows_per_env_thread` rows each (one
    batched environment per env thread); `actor_queues` actor threads batch
    the env threads' requests, each forward pass over up to
    `actor_queue_cap` env threads' (0 actor queues: each env thread acts
    itself, with no round trip). See docs/guides/choose-layout.md for which layout
    pays where.

    Args:
        env_threads: env threads of the driver.
        rows_per_env_thread: environments batched in each env thread's environment.
        actor_queues: actor threads; 0: each env thread acts itself.
        actor_queue_cap: at most this many env threads' requests per forward pass.
        choice: None: the fields above. 'auto': this run's environments and
            collect policy are measured for up to `auto_budget_secs` at its
            start in candidate layouts of the same env_threads x
            rows_per_env_thread rows (`alf_async.driver.layout.choose_layout`;
            child processes among them for suite_gym, suite_gymnasium and
            suite_atari with the default make_env_constructor); the fastest
            runs, one line names it, the operative config binds
            `Layout.choice` to it and a resumed run reuses it. Or a layout as
            that line names it ('2x8, 1 actor queue (cap 2), in process'),
            run as given. The learner's batch keeps its
            `Schedule.rows_per_batch` rows either way.
        auto_budget_secs: seconds `choice = 'auto'` measures for at most.
    """

    env_threads: int = 1
    rows_per_env_thread: int = 1
    actor_queues: int = 1
    actor_queue_cap: int = 1
    choice: str = None
    auto_budget_secs: float = 20.0

    def __post_init__(self):
        _int_at_least("Layout.env_threads", self.env_threads, 1)
        _int_at_least("Layout.rows_per_env_thread", self.rows_per_env_thread, 1)
        if not _is_int(self.actor_queues) or self.actor_queues < 0:
            raise ConfigError(f"Layout.actor_queues must be an int >= 0 (0: each env thread "
                              f"acts itself), got {self.actor_queues!r}")
        _int_at_least("Layout.actor_queue_cap", self.actor_queue_cap, 1)
        if self.choice not in (None, "auto"):
            try:
                layout_lib.parse_layout(self.choice)
            except ValueError as e:
                raise ConfigError(f"Layout.choice must be None, 'auto' or a layout: {e}") \
                    from None
        _positive_number("Layout.auto_budget_secs", self.auto_budget_secs)

    @property
    def rows(self):
        """Environment rows in all: env_threads x rows_per_env_thread."""
        return self.env_threads * self.rows_per_env_thread

    def batch_rows(self, schedule):
        """The rows of the learner's batch under `schedule` (its
        `rows_per_batch`, or one env thread's rows)."""
        return schedule.rows_per_batch or self.rows_per_env_thread

    def unrolls_per_batch(self, batch_rows, scope=""):
        """The env threads' unrolls a batch of `batch_rows` rows takes (the
        driver's learn_queue_cap).

        Raises:
            ConfigError: `batch_rows` is not a whole number of env threads'
                rows; `scope` prefixes the bindings named ('collect/').
        """
        if batch_rows % self.rows_per_env_thread:
            batch_binding = "collect.rows_per_batch" if scope else "Schedule.rows_per_batch"
            raise ConfigError(
                f"{batch_binding} {batch_rows} is not a whole number of env threads' rows "
                f"({scope}Layout.rows_per_env_thread {self.rows_per_env_thread}): make it a "
                f"multiple")
        return batch_rows // self.rows_per_env_thread

    def driver_args(self, schedule):
        """`AsyncOffPolicyDriver`'s layout arguments (ALF's names) for the
        learner batch of `schedule`."""
        return dict(num_envs=self.env_threads, num_actor_queues=self.actor_queues,
                    actor_queue_cap=self.actor_queue_cap,
                    learn_queue_cap=self.unrolls_per_batch(self.batch_rows(schedule)),
                    unroll_length=schedule.unroll_length,
                    batches_ahead=schedule.batches_ahead)

    def chosen(self, run_layout):
        """This Layout set to a driver layout `choice` gave
        (`alf_async.driver.layout.Layout`), with no choice left to make."""
        return dataclasses.replace(
            self, env_threads=run_layout.num_envs, rows_per_env_thread=run_layout.env_batch_size,
            actor_queues=run_layout.num_actor_queues, actor_queue_cap=run_layout.actor_queue_cap,
            choice=None)


@gin.configurable
@dataclasses.dataclass
class Schedule:
    """How collecting and training take turns, and when the run stops.

    An iteration takes one batch of `rows_per_batch` rows x `unroll_length`
    steps from the driver, then runs `train_steps_per_iteration` train steps.

    Args:
        num_iterations: stop after this many iterations in total (None: no limit).
        num_env_steps: stop once this many env steps were taken in total
            (None: no limit; one of the two must be set).
        unroll_length: steps per unroll of each row.
        rows_per_batch: rows in each learner batch; a multiple of
            `Layout.rows_per_env_thread` (whole env threads' unrolls). None:
            one env thread's rows.
        train_steps_per_iteration: agent.train calls per iteration.
        sample_batch_size: windows per train step (a replay buffer).
        initial_collect_steps: env steps collected before training starts.
        random_initial_collect: act uniformly at random until the first
            train step (`random_start.RandomStartPolicy`), as published SAC
            runs collect their initial steps; False: `agent.collect_policy`.
        batches_ahead: None: the env threads collect whenever the learn
            queue has room. k >= 1: they begin at most k batches the learner
            has not taken, capping the policy lag at k batches' train steps
            (`AsyncOffPolicyDriver`'s batches_ahead; docs/guides/training-runs.md).
    """

    num_iterations: int = None
    num_env_steps: int = None
    unroll_length: int = 8
    rows_per_batch: int = None
    train_steps_per_iteration: int = 1
    sample_batch_size: int = 64
    initial_collect_steps: int = 0
    random_initial_collect: bool = False
    batches_ahead: int = None

    def __post_init__(self):
        for name in ("num_iterations", "num_env_steps", "initial_collect_steps"):
            _optional_int_at_least(f"Schedule.{name}", getattr(self, name), 0)
        if self.num_iterations is None and self.num_env_steps is None:
            raise ConfigError("set Schedule.num_iterations or Schedule.num_env_steps (or "
                              "both): otherwise training never stops")
        _optional_int_at_least("Schedule.rows_per_batch", self.rows_per_batch, 1,
                               " (one env thread's rows)")
        for name in ("unroll_length", "train_steps_per_iteration", "sample_batch_size"):
            _int_at_least(f"Schedule.{name}", getattr(self, name), 1)
        _bool("Schedule.random_initial_collect", self.random_initial_collect)
        _optional_int_at_least("Schedule.batches_ahead", self.batches_ahead, 1,
                               " (collect whenever the learn queue has room)")
        self.initial_collect_steps = self.initial_collect_steps or 0


@gin.configurable
@dataclasses.dataclass
class Evaluation:
    """How the policy is evaluated, and when the run counts as solved.

    Args:
        episodes: episodes per evaluation (0: no evaluation).
        interval: evaluate every this many train steps.
        stop_at_return: stop once an evaluation's average return is >= this
            (None: never).
        greedy: evaluate tf-agents' `GreedyPolicy(agent.policy)` (the mode of
            the action distribution: SacAgent's `policy` samples); False
            evaluates `agent.policy` itself (greedy already for DQN).
        epsilon: if set, act uniformly at random with this probability
            around the evaluated policy, as published Atari evaluations do
            (0.001 in Dopamine, 0.05 in Mnih et al. 2015). None: never.
        env_kwargs: more keyword arguments of `suites.load` for the
            evaluation environments only (e.g. Mnih et al. 2015's 5-minute
            games: {'max_num_frames_per_episode': 18000}). None: the
            training environments' settings.
        in_background: evaluate on a thread of its own while the learner
            trains on (ALF's async_eval; `BackgroundEvaluationHook`), on a
            snapshot of the policy taken at each interval; False: on the
            learner's thread, training paused meanwhile.
    """

    episodes: int = 10
    interval: int = 1000
    stop_at_return: float = None
    greedy: bool = False
    epsilon: float = None
    env_kwargs: dict = None
    in_background: bool = False

    def __post_init__(self):
        _optional_int_at_least("Evaluation.episodes", self.episodes, 0)
        _int_at_least("Evaluation.interval", self.interval, 1)
        if self.stop_at_return is not None and not self.episodes:
            raise ConfigError("Evaluation.stop_at_return needs Evaluation.episodes >= 1")
        _bool("Evaluation.greedy", self.greedy)
        _bool("Evaluation.in_background", self.in_background)
        epsilon = self.epsilon
        if epsilon is not None and (isinstance(epsilon, bool) or
                                    not isinstance(epsilon, (int, float)) or
                                    not 0 <= epsilon <= 1):
            raise ConfigError(f"Evaluation.epsilon must be None or a number in [0, 1], "
                              f"got {epsilon!r}")
        if self.env_kwargs is not None and not isinstance(self.env_kwargs, dict):
            raise ConfigError(f"Evaluation.env_kwargs must be None or a dict of suites.load "
                              f"arguments, got {self.env_kwargs!r}")
        self.episodes = self.episodes or 0


@gin.configurable
@dataclasses.dataclass
class Outputs:
    """What the run writes besides the agent: summaries, checkpoints, progress lines.

    Args:
        summary_interval: write training summaries every this many train steps.
        checkpoint_interval: checkpoint every this many train steps (and at exit).
        log_interval_secs: seconds between progress lines.
    """

    summary_interval: int = 100
    checkpoint_interval: int = 10000
    log_interval_secs: float = 10.0

    def __post_init__(self):
        _int_at_least("Outputs.summary_interval", self.summary_interval, 1)
        _int_at_least("Outputs.checkpoint_interval", self.checkpoint_interval, 1)
        _positive_number("Outputs.log_interval_secs", self.log_interval_secs)


@gin.configurable
@dataclasses.dataclass
class Runtime:
    """The process the run lives in: TensorFlow's threads, the seed, the kernels.

    Args:
        inter_op_threads: TF's inter-op thread pool size (None: one per core);
            each graph-mode env thread's Python step and each actor thread
            hold one while they run.
        intra_op_threads: TF's intra-op thread pool size (None: TF's default).
        seed: seeds TF's global generator and the environments (None: unseeded).
        kernel_choice: 'auto' (the fastest kernels this CPU has, chosen for
            the run's networks) or 'off' (TensorFlow's defaults): see
            `alf_async.kernels`. TensorFlow reads its kernels when it is
            imported, so alf-async-train reads this binding from the gin
            files first; a Python program calls
            `kernels.apply(kernels.choose_for_gin(gin_files))` before its
            first TensorFlow import.
    """

    inter_op_threads: int = None
    intra_op_threads: int = None
    seed: int = None
    kernel_choice: str = "auto"

    def __post_init__(self):
        _optional_int_at_least("Runtime.inter_op_threads", self.inter_op_threads, 1)
        _optional_int_at_least("Runtime.intra_op_threads", self.intra_op_threads, 1)
        if self.kernel_choice not in kernels.KERNEL_CHOICES:
            raise ConfigError(f"Runtime.kernel_choice must be one of "
                              f"{kernels.KERNEL_CHOICES}, got {self.kernel_choice!r}")


@gin.configurable
@dataclasses.dataclass
class Collectors:
    """Collector processes that feed this learner through a Reverb server here.

    Args:
        count: collector processes (0: this process collects itself). With
            K > 0 this process only learns and evaluates (needs
            `Task.replayer_fn = @ReverbReplayer`; see
            alf_async.distributed.learner_role).
        launcher: how they start: 'local' (child processes), 'ray' (Ray
            actors) or 'none' (by hand, with alf-async-collect).
    """

    count: int = 0
    launcher: str = "local"

    def __post_init__(self):
        if not _is_int(self.count) or self.count < 0:
            raise ConfigError(f"Collectors.count must be an int >= 0, got {self.count!r}")
        if self.launcher not in ("local", "ray", "none"):
            raise ConfigError(f"Collectors.launcher must be 'local', 'ray' or 'none', got "
                              f"{self.launcher!r}")


def check_together(layout, schedule, collectors):
    """Refuses settings of different groups that cannot run together."""
    # A layout that 'auto' or a name gives is checked against the batch once
    # it is known (`driver.layout.check_layout`).
    unrolls = (layout.unrolls_per_batch(layout.batch_rows(schedule))
               if layout.choice is None else None)
    ahead = schedule.batches_ahead
    if ahead is not None:
        if collectors.count:
            raise ConfigError("Schedule.batches_ahead paces this process's env threads, and "
                              "with Collectors.count > 0 it has none (the collectors feed "
                              "Reverb): leave it None")
        if unrolls is not None and layout.env_threads > ahead * unrolls:
            raise ConfigError(
                f"Schedule.batches_ahead = {ahead} lets {ahead} batches of "
                f"{unrolls} env threads' unrolls be collected at once, fewer than the "
                f"{layout.env_threads} env threads (Layout.env_threads): raise one of them")
    if layout.choice is not None and collectors.count:
        raise ConfigError("Layout.choice arranges this process's environments; with "
                          "Collectors.count > 0 the collectors step them: leave it None")
