"""The checks of `trainer.train()`'s arguments, before anything is built:
`check_args` on the values, `check_unroll_agent` on what an agent that
trains on each batch of unrolls once cannot use. Each raises `ConfigError`
with one line naming the binding and what was expected."""

from alf_async import kernels
from alf_async.driver import layout as layout_lib
from alf_async.learning import replayers


class ConfigError(ValueError):
    """A bad `train()` argument, found before anything is built."""


class IncompatibleCheckpointError(ConfigError):
    """root_dir's checkpoint does not fit the configuration (found before any thread starts)."""


def check_args(**args):
    """Fails before anything is built on a bad value, naming the binding."""
    value = args["num_actor_queues"]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"train.num_actor_queues must be an int >= 0 (0: each env thread "
                          f"acts itself), got {value!r}")
    positive = ("num_envs", "env_batch_size", "actor_queue_cap",
                "unroll_length", "learn_queue_cap", "train_steps_per_iteration",
                "sample_batch_size", "summary_interval", "checkpoint_interval",
                "eval_interval")
    for name in positive:
        value = args[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"train.{name} must be an int >= 1, got {value!r}")
    for name in ("num_iterations", "num_env_steps", "initial_collect_steps",
                 "num_eval_episodes"):
        value = args[name]
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or
                                  value < 0):
            raise ConfigError(f"train.{name} must be None or an int >= 0, got {value!r}")
    value = args["batches_ahead"]
    if value is not None:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"train.batches_ahead must be None (collect whenever the learn "
                              f"queue has room) or an int >= 1, got {value!r}")
        if args["num_collectors"]:
            raise ConfigError("train.batches_ahead paces this process's env threads, and with "
                              "train.num_collectors > 0 it has none (the collectors feed "
                              "Reverb): leave it None")
        if args["layout"] is None and args["num_envs"] > value * args["learn_queue_cap"]:
            raise ConfigError(
                f"train.batches_ahead = {value} lets {value} x train.learn_queue_cap "
                f"{args['learn_queue_cap']} unrolls be collected at once, fewer than the "
                f"{args['num_envs']} env threads (train.num_envs): raise one of them")
    if args["num_iterations"] is None and args["num_env_steps"] is None:
        raise ConfigError("set train.num_iterations or train.num_env_steps (or both): "
                         "otherwise training never stops")
    for name in ("inter_op_threads", "intra_op_threads"):
        value = args[name]
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or
                                  value < 1):
            raise ConfigError(f"train.{name} must be None or an int >= 1, got {value!r}")
    for name in ("log_interval_secs", "layout_budget_secs"):
        value = args[name]
        if not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"train.{name} must be a number > 0, got {value!r}")
    if args["kernel_choice"] not in kernels.KERNEL_CHOICES:
        raise ConfigError(f"train.kernel_choice must be one of {kernels.KERNEL_CHOICES}, "
                          f"got {args['kernel_choice']!r}")
    if args["eval_env_kwargs"] is not None and not isinstance(args["eval_env_kwargs"], dict):
        raise ConfigError(f"train.eval_env_kwargs must be None or a dict of suites.load "
                          f"arguments, got {args['eval_env_kwargs']!r}")
    value = args["eval_epsilon"]
    if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                              or not 0 <= value <= 1):
        raise ConfigError(f"train.eval_epsilon must be None or a number in [0, 1], got {value!r}")
    if args["stop_at_eval_return"] is not None and args["num_eval_episodes"] in (0, None):
        raise ConfigError("train.stop_at_eval_return needs train.num_eval_episodes >= 1")
    for name in ("async_eval", "greedy_eval", "random_initial_collect"):
        if not isinstance(args[name], bool):
            raise ConfigError(f"train.{name} must be True or False, got {args[name]!r}")
    if not callable(args["agent_fn"]):
        raise ConfigError(f"train.agent_fn must be callable, got {args['agent_fn']!r}")
    value = args["num_collectors"]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"train.num_collectors must be an int >= 0, got {value!r}")
    value = args["layout"]
    if value not in (None, "auto"):
        try:
            layout_lib.parse_layout(value)
        except ValueError as e:
            raise ConfigError(f"train.layout must be None, 'auto' or a layout: {e}") from None
    if value is not None and args["num_collectors"]:
        raise ConfigError("train.layout arranges this process's environments; with "
                          "train.num_collectors > 0 the collectors step them: leave it None")
    if args["collector_launcher"] not in ("local", "ray", "none"):
        raise ConfigError(f"train.collector_launcher must be 'local', 'ray' or 'none', got "
                          f"{args['collector_launcher']!r}")


def check_unroll_agent(agent, replayer_fn, train_steps_per_iteration, random_initial_collect,
                        num_collectors=0, initial_collect_steps=0):
    """Refuses settings an agent that trains on each batch of unrolls once
    cannot use (a replay buffer, several train calls per batch, random
    initial actions, steps collected before training: with collectors their
    queue of unrolls would fill and stop them), before anything starts.
    With collectors the replayer reads the learner's Reverb queue of
    unrolls (`ReverbReplayer`)."""
    name = type(agent).__name__
    given = getattr(replayer_fn, "__name__", repr(replayer_fn))
    if num_collectors:
        from alf_async.distributed.reverb_replayer import ReverbReplayer  # pylint: disable=import-outside-toplevel
        if not (isinstance(replayer_fn, type) and issubclass(replayer_fn, ReverbReplayer)):
            raise ConfigError(f"{name} trains on each batch of unrolls once: with "
                              f"train.num_collectors > 0 set train.replayer_fn = "
                              f"@ReverbReplayer (it reads the learner's Reverb queue of "
                              f"unrolls; got {given})")
    elif not (isinstance(replayer_fn, type) and
              issubclass(replayer_fn, replayers.OneTimeReplayer)):
        raise ConfigError(f"{name} trains on each batch of unrolls once: set "
                          f"train.replayer_fn = @OneTimeReplayer (got {given}, a replay "
                          f"buffer)")
    if train_steps_per_iteration != 1:
        raise ConfigError(f"{name} trains on each batch of unrolls once: "
                          f"train.train_steps_per_iteration must be 1, got "
                          f"{train_steps_per_iteration} (PPO's passes over a batch are "
                          f"ppo_agent.num_epochs)")
    if random_initial_collect:
        raise ConfigError(f"{name} trains on what its own policy collects: "
                          f"train.random_initial_collect must be False")
    if initial_collect_steps:
        raise ConfigError(f"{name} trains on each batch of unrolls as it comes: "
                          f"train.initial_collect_steps must be 0, got {initial_collect_steps}")
