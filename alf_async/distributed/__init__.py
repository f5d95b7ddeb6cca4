"""Collection and learning in separate processes, joined by Reverb.

The learner (`Collectors.count > 0`):
- `learner_role.py`: `build`, the learner role's pieces wired together.
- `learner_server.py`: its Reverb server (`LearnerServer`), the hook that
  pushes the policy's variables and the announcement of its address.
- `replay_feed.py`: `ReplayFeed`, the `roles.BatchSource` that takes the
  driver's place; `feed_health.py`: its health scalars.

A collector (`alf-async-collect`):
- `collector.py`: `collect` and `Collector`: a driver with local inference
  that writes unrolls to Reverb.
- `server_link.py`: reaching the learner's server, watching that it
  answers, and pulling the policy's variables from its variable table.
- `collector_stats.py`: the episode metrics it reports to the learner.

Both:
- `launcher.py`: local or Ray collectors, started, restarted within a budget,
  stopped.
- `reverb_replayer.py`: `ReverbReplayer` (one Reverb stream per environment
  row), the replay table and, for agents that train on unrolls (PPO,
  IMPALA), the queue of unrolls.

Uses `alf_async.learning` and the layers below it.
"""
