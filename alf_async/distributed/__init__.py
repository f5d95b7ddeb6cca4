"""Collection and learning in separate processes, joined by Reverb.

- `learner_role.py`: the learner of a distributed run (`Collectors.count
  > 0`): its Reverb server, the replay feed, the policy variables it pushes.
- `collector.py`: a collector (`alf-async-collect`): a driver with local
  inference that writes unrolls to Reverb and pulls the policy's variables.
- `launcher.py`: local or Ray collectors, started, restarted within a budget,
  stopped.
- `reverb_replayer.py`: `ReverbReplayer` (one Reverb stream per environment
  row), the replay table and, for agents that train on unrolls (PPO,
  IMPALA), the queue of unrolls.

Uses `alf_async.learning` and the layers below it.
"""
