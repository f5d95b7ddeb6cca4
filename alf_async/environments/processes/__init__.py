"""Environments whose work happens in another process: each is stepped by
the driver's process as a tf-agents environment, and is `Restartable`.

- `subprocess_env`: `SubprocessEnv`, one environment (or several) in a
  child process (its public API and closing);
  `subprocess_calls`: how its calls reach the child and come back, and
  the restart when the child dies.
- `subprocess_batched`: creating many in parallel, several SubprocessEnvs as
  one batched environment, and `subprocess_env_constructor`, the driver's
  env constructor over them.
- `subprocess_protocol`: the wire protocol and the parent's handle of a
  child; `subprocess_child`: the child process;
  `shared_slots`: the shared memory a step's action and time step travel in.
- `ray_env`: environments in Ray actors.
- `recovery`: the crash recovery both share (restart budget, truncation).
- `env_index`: which environment a constructor running in a worker builds.
"""
