"""Makes `tf.is_tensor` of a numpy array cheap on CPython 3.11.

`tf.is_tensor(x)` is `isinstance(x, (NativeObject, Tensor, IsTensorLike))`,
and `IsTensorLike` is a runtime-checkable `typing.Protocol`. On CPython 3.11
every isinstance check against such a protocol that is not a plain subclass
hit recomputes the protocol's member names (`typing._get_protocol_attrs`
walks the MRO and filters every attribute), many times the cost of the
check with the names computed once. CPython 3.12 made these checks cheap
(gh-74690); the pinned stack is on 3.11.

It matters on the per-step path: tf-agents' time_step helpers call
`tf.is_tensor` on every Python environment step (`ts.transition`,
`should_reset`, ...), a large share of the CPU of a suite_gym CartPole
step (benchmarks/latency_bound.py's environments), on both sides of every
comparison, and again wherever a nest of numpy arrays is checked.

`install()` gives TF's runtime-checkable protocols that are hit per step
(`IsTensorLike`, `core.TensorProtocol`, `nest_util.CustomNestProtocol`) a
metaclass, a subclass of typing's, whose `__instancecheck__` is CPython
3.11's own with the member names computed once at install time (they are
fixed: the protocols are TF's, defined at import). Same answers for every
object (tests/test_protocol_check_fix.py compares them); the class objects
stay the same, so every tuple and registry holding them benefits. It
patches only CPython 3.11, whose `__instancecheck__` it reproduces. Set
ALF_ASYNC_PROTOCOL_CHECK_FIX=0 to keep typing's check (benchmarks compare
both).
"""

import abc
import functools
import os
import sys
import typing

# protocol class -> (callable members only, ((member name, is a method), ...)).
# Kept here, not on the class: typing counts every name in a protocol's
# __dict__ as a member.
_MEMBERS = {}
_MISSING = object()


def applies():
    """True on the Python whose protocol check this reproduces (3.11)."""
    return sys.version_info[:2] == (3, 11)


class _CachedMembersProtocolMeta(type(typing.Protocol)):
    """typing._ProtocolMeta with the protocol's member names computed once."""

    def __instancecheck__(cls, instance):
        members = _MEMBERS.get(cls)
        if members is None:   # a class derived from a fixed protocol: typing's check
            return super().__instancecheck__(instance)
        callable_only, names = members
        # CPython 3.11's typing._ProtocolMeta.__instancecheck__ for a
        # runtime-checkable protocol, with `names` for _get_protocol_attrs(cls).
        if callable_only and issubclass(instance.__class__, cls):
            return True
        for name, is_method in names:   # all(hasattr(...) and ...), without a generator
            value = getattr(instance, name, _MISSING)
            if value is _MISSING or (is_method and value is None):
                return abc.ABCMeta.__instancecheck__(cls, instance)
        return True


def _fix(protocol):
    """Gives one runtime-checkable protocol class the cached check."""
    if type(protocol) is not type(typing.Protocol) or not getattr(
            protocol, "_is_runtime_protocol", False):
        return False
    names = tuple((name, callable(getattr(protocol, name, None)))
                  for name in typing._get_protocol_attrs(protocol))  # pylint: disable=protected-access
    _MEMBERS[protocol] = (all(m for _, m in names), names)
    protocol.__class__ = _CachedMembersProtocolMeta
    return True


@functools.lru_cache(maxsize=None)   # once per process
def install():
    """Fixes TF's per-step protocols (once); returns whether it did."""
    if os.environ.get("ALF_ASYNC_PROTOCOL_CHECK_FIX", "1") == "0" or not applies():
        return False
    # pylint: disable=import-outside-toplevel
    from tensorflow.python.framework import tensor_util
    from tensorflow.python.types import core
    from tensorflow.python.util import nest_util
    fixed = [_fix(p) for p in (tensor_util.IsTensorLike, core.TensorProtocol,
                               nest_util.CustomNestProtocol)]
    return any(fixed)
