"""What the scripts in benchmarks/ share with the tests that check them.

The benchmarks measure and print; the pieces of them that tests check (the
host record's lines, the per-thread CPU split, the profiler's op groups,
the driver's graph ops per step, the learning curves and the wall-clock
report) live here, so that no test imports a benchmark and no benchmark
edits sys.path. Like the rest of alf_async.testing, nothing in the package
imports these, and they import nothing of alf_async above its environments.
"""
