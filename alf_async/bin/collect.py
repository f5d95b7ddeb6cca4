"""alf-async-collect: one collector process writing to a learner's Reverb server.

    alf-async-collect --replay_address HOST:PORT --gin_file gin_configs/F.gin \
        [--gin_param 'collect/Layout.env_threads=4'] [--verbose]
    python -m alf_async.bin.collect ...   (the same)

Builds `alf_async.distributed.collector.collect` from the gin files (the learner's
config: the collector runs its `Task`, with whatever `collect/Task.*` binds
over it, and the env threads and rows `collect/Layout.*` binds) and collects until SIGINT /
SIGTERM (exit 0 at the end of the iteration); once it reached the server
and built its driver it prints `[alf_async collector] connected to
ADDRESS; collecting`. A server that cannot be
reached is retried with backoff, one line per attempt; after
`collect.connect_deadline_secs` the collector exits 1 with one line
(`alf-async-collect: error: ...`), and so it does when the server stops
answering for that long once collecting (the learner stopped).
Configuration errors exit 2.
"""

import argparse
import ctypes
import os
import signal
import sys
import threading

from alf_async.bin import moved_bindings
from alf_async import quiet
from alf_async.bin.train import (ConfigError, check_gin_files, choose_kernels, say_on_stderr,
                                  stop_on_signals)

PROG = "alf-async-collect"
EXIT_UNREACHABLE = 1
EXIT_CONFIG_ERROR = 2


def build_parser():
    parser = argparse.ArgumentParser(prog=PROG, description=(
        "One collector: acts with local inference, writes unrolls to the learner's "
        "Reverb server, pulls the policy's variables from it."))
    parser.add_argument("--replay_address", required=True,
                        help="HOST:PORT of the learner's Reverb server (the learner prints "
                             "it and writes it to ROOT_DIR/replay_address)")
    parser.add_argument("--gin_file", action="append", default=[],
                        help="a gin config file (repeatable)")
    parser.add_argument("--gin_param", action="append", default=[],
                        help="a gin binding (repeatable; after the files)")
    parser.add_argument("--verbose", action="store_true", help="show third-party output")
    return parser


def _error(message, code):
    say_on_stderr(f"{PROG}: error: {message}")
    return code


def die_with_parent():
    """When started by a learner (ALF_ASYNC_PARENT_PID, distributed/launcher.py):
    ask Linux for SIGKILL once the learner's thread that started us ends, and
    exit if it already has (our parent is then no longer that pid)."""
    parent = os.environ.get("ALF_ASYNC_PARENT_PID")
    if not parent or not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != int(parent):
        sys.exit(EXIT_UNREACHABLE)


def main(argv=None):
    args = build_parser().parse_args(argv)
    die_with_parent()
    try:
        check_gin_files(args.gin_file)
    except ConfigError as e:
        return _error(e, EXIT_CONFIG_ERROR)
    try:
        kernel_choice = choose_kernels(args.gin_file, args.gin_param)
    except ConfigError as e:
        return _error(e, EXIT_CONFIG_ERROR)
    quiet.quiet(verbose=args.verbose)
    import gin  # pylint: disable=import-outside-toplevel
    from alf_async.distributed import collector  # pylint: disable=import-outside-toplevel
    from alf_async.learning import replayers  # pylint: disable=import-outside-toplevel
    from alf_async.environments import suites  # pylint: disable=import-outside-toplevel
    from alf_async.trainer import one_line  # pylint: disable=import-outside-toplevel
    del replayers, suites  # imported for their gin registrations only
    try:
        # Unknown configurables of the learner's file (train, LearnerServer, ...) are
        # the learner's.
        gin.parse_config_files_and_bindings(args.gin_file, args.gin_param,
                                            skip_unknown=True)
    except Exception as e:  # pylint: disable=broad-except  (any parse error is the config's)
        return _error(moved_bindings.moved_binding_error(str(e)) or one_line(e),
                      EXIT_CONFIG_ERROR)
    print(kernel_choice.line("[alf_async collector]"), flush=True)
    stop_event, ended = threading.Event(), threading.Event()
    with stop_on_signals(stop_event, ended):
        try:
            built = collector.collect(args.replay_address, stop_event,
                                      print_fn=lambda line: print(line, flush=True))
        except collector.UnreachableError as e:
            return _error(str(e), EXIT_UNREACHABLE)
        except ValueError as e:  # the config does not fit (bad values, the learner's table)
            return _error(one_line(e), EXIT_CONFIG_ERROR)
        print(f"[alf_async collector] connected to {args.replay_address}; collecting",
              flush=True)
        try:
            stopped_by = built.run()
        except collector.UnreachableError as e:  # the learner went away
            return _error(str(e), EXIT_UNREACHABLE)
        ended.set()   # signals from here to the exit are ignored (stop_on_signals)
    print(f"[alf_async collector] stopped ({stopped_by}) after {built.learner.env_steps} env "
          f"steps, {built.pull_hook.pulls} variable pulls (learner train step "
          f"{int(built.train_step.numpy())})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
