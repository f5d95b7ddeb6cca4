"""Workarounds for the pinned stack, TensorFlow 2.15 (with tf-agents 0.19) on
Python 3.11, in one place. Each says what it works around and when it
applies; none changes what the rest of alf_async computes.

- `eager_tensor_fix.py` (+ `_eager_tensor_fix.c`): frees what TF 2.15's
  EagerTensor leaks on CPython 3.11 (tensorflow/tensorflow#62551).
- `protocol_check_fix.py`: makes `tf.is_tensor` of a numpy array cheap on
  Python 3.11, where tf-agents calls it on every environment step.

Imports nothing else of alf_async.
"""
