"""Lazy package exports: `__getattr__` that imports a name's module on first use,
so that importing a package (e.g. in a SubprocessEnv child, or a serving
client without TensorFlow) pays only for what is used."""

import importlib


def lazy_exports(package, exports):
    """Returns a module `__getattr__` for `package` serving `exports`
    ({name: submodule})."""

    def __getattr__(name):
        if name in exports:
            return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
