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


def missing_extra(error, needs, package, module, extra):
    """What to raise for `error`, a ModuleNotFoundError caught importing
    `module` for `needs`: a one-line ConfigError naming the extra to install
    when `module` itself is not installed; `error` itself when another module
    failed to import (a broken install keeps its own error).

    Args:
        error: the ModuleNotFoundError caught.
        needs: what needs the package, as the line names it.
        package: the package's name for people, e.g. "Ray".
        module: its top-level module, e.g. "ray".
        extra: the setup.py extra that installs it, e.g. "ray".

    Returns:
        The exception to raise (`raise missing_extra(...) from None`).
    """
    if error.name != module:
        return error
    return ConfigError(f"{needs} needs {package}, which is not installed: "
                       f"pip install -e '.[{extra}]'")
