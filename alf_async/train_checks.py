"""What an agent that trains on each batch of unrolls once cannot use,
checked once the agent is built and before anything starts
(`check_unroll_agent`). The settings' own checks live with them
(`alf_async.settings`); each raises `ConfigError` with one line naming the
binding and what was expected."""

from alf_async.errors import ConfigError, IncompatibleCheckpointError  # noqa: F401 (re-exported)
from alf_async.learning import replayers


def check_unroll_agent(agent, replayer_fn, schedule, collectors):
    """Refuses settings an agent that trains on each batch of unrolls once
    cannot use (a replay buffer, several train calls per batch, random
    initial actions, steps collected before training: with collectors their
    queue of unrolls would fill and stop them), before anything starts.
    With collectors the replayer reads the learner's Reverb queue of
    unrolls (`ReverbReplayer`).

    Args:
        agent: the built agent.
        replayer_fn: `Task.replayer_fn`.
        schedule: the run's `settings.Schedule`.
        collectors: the run's `settings.Collectors`.
    """
    name = type(agent).__name__
    given = getattr(replayer_fn, "__name__", repr(replayer_fn))
    if collectors.count:
        from alf_async.distributed.reverb_replayer import ReverbReplayer  # pylint: disable=import-outside-toplevel
        if not (isinstance(replayer_fn, type) and issubclass(replayer_fn, ReverbReplayer)):
            raise ConfigError(f"{name} trains on each batch of unrolls once: with "
                              f"Collectors.count > 0 set Task.replayer_fn = "
                              f"@ReverbReplayer (it reads the learner's Reverb queue of "
                              f"unrolls; got {given})")
    elif not (isinstance(replayer_fn, type) and
              issubclass(replayer_fn, replayers.OneTimeReplayer)):
        raise ConfigError(f"{name} trains on each batch of unrolls once: set "
                          f"Task.replayer_fn = @OneTimeReplayer (got {given}, a replay "
                          f"buffer)")
    if schedule.train_steps_per_iteration != 1:
        raise ConfigError(f"{name} trains on each batch of unrolls once: "
                          f"Schedule.train_steps_per_iteration must be 1, got "
                          f"{schedule.train_steps_per_iteration} (PPO's passes over a batch "
                          f"are ppo_agent.num_epochs)")
    if schedule.random_initial_collect:
        raise ConfigError(f"{name} trains on what its own policy collects: "
                          f"Schedule.random_initial_collect must be False")
    if schedule.initial_collect_steps:
        raise ConfigError(f"{name} trains on each batch of unrolls as it comes: "
                          f"Schedule.initial_collect_steps must be 0, got "
                          f"{schedule.initial_collect_steps}")
