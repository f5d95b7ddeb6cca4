"""The trials live in benchmarks/ (benchmarks/reliability.py runs them at
full counts); the stress tests import them from there."""

import os
import sys

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)
