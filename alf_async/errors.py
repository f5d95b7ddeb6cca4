"""The configuration errors every layer raises: one class, one line each.

A `ConfigError` is found before anything is built or started; its message is
one line that names the binding and says what was expected. The CLI prints
it and exits 2 with no traceback. This module imports nothing of alf_async,
so the kernel choice made before TensorFlow is imported raises it too.
"""


class ConfigError(ValueError):
    """A bad setting, found before anything is built: one line naming the binding."""


class IncompatibleCheckpointError(ConfigError):
    """root_dir's checkpoint does not fit the configuration (found before any thread starts)."""
