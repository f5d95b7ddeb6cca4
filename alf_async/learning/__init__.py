"""What trains on the driver's output.

- `learner.py`: `Learner`, the run_async training loop (start the driver,
  `run_async()`, replay, train, hooks, stop on every exit path), and `Hook`.
- `hooks.py`: the hooks `train()` uses (summaries, evaluation, checkpoints,
  progress lines).
- `replayers.py`: the replayers from one import path: the `Replayer`
  interface (`replayer_base.py`), `OneTimeReplayer`
  (`one_time_replayer.py`), `UniformReplayer` (`uniform_replayer.py`: one
  ring per environment row).
- `agents.py`: the agent builders gin configs name (`dqn_agent`,
  `sac_agent`, `ppo_agent`, `impala_agent`); `builder_parts.py`: what they
  share (argument checks, torso dtype, pixel scaling, optimizers built
  ahead of the first trace).
- `evaluation.py`: greedy evaluation; `warm_up.py`: tracing the train step
  while the driver collects; `random_start.py`: uniform random actions
  before training starts.

Uses only `alf_async.driver` and the layers below it.
"""

from alf_async._lazy import lazy_exports

_EXPORTS = {
    "Learner": "learner",
    "LearnerCounters": "learner",
    "Hook": "learner",
    "Replayer": "replayer_base",
    "OneTimeReplayer": "one_time_replayer",
    "UniformReplayer": "uniform_replayer",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
