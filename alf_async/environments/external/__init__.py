"""External environments: the environment runs its own loop and asks the
policy for actions (inverted control, as in RLlib's ExternalEnv).

- `external_env`: `ExternalEnv`, the episode API users call, and
  `external_slots`: the slot environments the driver steps.
- `episodes`: `EpisodeTable`, the one owner of the episodes and slots;
  `episode_waits`: how its client calls wait; `episode_slots`: the half
  the slots call; `episode_records`: the records it keeps.
- `episode_api`: the episode API's one definition (TF-free: the policy
  server and its client use it too).
- `offline`: logged episodes replayed through an ExternalEnv.

Importing this package imports nothing else: `episode_api` stays TF-free.
"""
