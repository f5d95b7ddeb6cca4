"""protocol_check_fix: TF's protocol checks give typing's answers, cheaply."""

import os
import subprocess
import sys
import typing

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import tensor_util
from tensorflow.python.types import core
from tensorflow.python.util import nest_util

from alf_async import driver  # noqa: F401  (importing the driver installs the fix)
from alf_async.tf215_py311_fixes import protocol_check_fix

pytestmark = pytest.mark.timeout(120)

PROTOCOLS = [tensor_util.IsTensorLike, core.TensorProtocol, nest_util.CustomNestProtocol]
TYPING_CHECK = type(typing.Protocol).__instancecheck__   # typing's own, unfixed


class AllMethods:
    def is_tensor_like(self):
        pass

    def __tf_tensor__(self, dtype=None, name=None):
        pass

    def __tf_flatten__(self):
        pass

    @classmethod
    def __tf_unflatten__(cls, metadata, components):
        pass


class MethodsBlockedWithNone:
    is_tensor_like = None
    __tf_tensor__ = None
    __tf_flatten__ = None


class Registered:
    pass


tensor_util.IsTensorLike.register(Registered)


def objects():
    with_instance_attrs = type("Plain", (), {})()
    with_instance_attrs.is_tensor_like = lambda: True
    with_instance_attrs.__tf_tensor__ = lambda *a: None
    return [np.zeros(3), np.float32(1), 1.0, 3, [1.0], (1,), {"a": 1}, "s", b"b", None,
            tf.constant(1.0), tf.Variable(1.0), tf.ragged.constant([[1]]),
            tf.sparse.from_dense([[1]]), tf.TensorSpec([]), AllMethods(),
            MethodsBlockedWithNone(), with_instance_attrs, Registered(), object()]


def test_installed_on_python_3_11_for_every_protocol():
    assert protocol_check_fix.applies() == (sys.version_info[:2] == (3, 11))
    if not protocol_check_fix.applies():
        pytest.skip("patches CPython 3.11 only")
    assert protocol_check_fix.install() is True
    for protocol in PROTOCOLS:
        assert type(protocol).__name__ == "_CachedMembersProtocolMeta", protocol


def test_every_answer_is_typings():
    checked = 0
    for protocol in PROTOCOLS:
        for obj in objects():
            assert isinstance(obj, protocol) == TYPING_CHECK(protocol, obj), (protocol, obj)
            checked += 1
    assert checked == 3 * 20
    # The answers themselves, for the protocol tf.is_tensor uses.
    answers = [tf.is_tensor(obj) for obj in objects()]
    assert answers == [False] * 10 + [True] * 4 + [False, True, False, True, True, False]


def test_classes_derived_from_a_fixed_protocol_keep_typings_check():
    class Derived(tensor_util.IsTensorLike):   # a plain class implementing it
        pass

    class Protocol2(tensor_util.IsTensorLike, typing.Protocol):
        def other(self):
            pass

    assert isinstance(Derived(), tensor_util.IsTensorLike)
    assert tf.is_tensor(Derived())
    assert not isinstance(AllMethods(), Derived)
    assert isinstance(Derived(), Derived)
    for obj in objects() + [Derived()]:
        assert isinstance(obj, Protocol2) == TYPING_CHECK(Protocol2, obj), obj


def test_can_be_turned_off():
    code = ("import typing; import alf_async; "
            "from tensorflow.python.framework import tensor_util as t; "
            "print(type(t.IsTensorLike) is type(typing.Protocol))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, ALF_ASYNC_PROTOCOL_CHECK_FIX="0"), timeout=100)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "True"
