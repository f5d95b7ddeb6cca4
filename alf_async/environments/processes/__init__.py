"""Environments whose work happens in another process: each is stepped by
the driver's process as a tf-agents environment, and is `Restartable`.

- `subprocess_env`: `SubprocessEnv`, one environment in a child process
  (its public API; creating many in parallel and closing them);
  `subprocess_calls`: how its calls reach the child and come back, and
  the restart when the child dies.
- `subprocess_batched`: several SubprocessEnvs as one batched environment,
  and `subprocess_env_constructor`, the driver's env constructor over them.
- `subprocess_protocol`: the child process and the wire protocol.
- `ray_env`: environments in Ray actors.
- `recovery`: the crash recovery both share (restart budget, truncation).
- `env_index`: which environment a constructor running in a worker builds.
"""
