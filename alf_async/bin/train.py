"""alf-async-train: gin files and bindings -> `alf_async.trainer.train()`.

    alf-async-train --root_dir runs/dqn_cartpole --gin_file gin_configs/dqn_cartpole.gin \
        [--gin_file more.gin] [--gin_param 'Schedule.num_iterations=100'] [--verbose]
    python -m alf_async.bin.train ...   (the same)

`--help` answers without importing TensorFlow and lists every field of the
settings groups (`alf_async.settings`) with its default.

Configuration errors end the program before any thread starts, with one
line on stderr (`alf-async-train: error: ...`) naming the file or binding,
and exit code 2: no `--gin_file`, a missing gin file, a `--root_dir` that is
a file or cannot be written (checked before TensorFlow is imported), an
unknown configurable or parameter, a value gin cannot parse or `train()` or
an agent builder refuses, gin files that leave `Task.env_name` or
`Task.agent_fn` unbound, a checkpoint in `--root_dir` this config cannot
resume. A run that is already finished (its limit reached, or solved)
says so and exits 0 without starting anything.

Output: third-party start-up noise (TensorFlow's banner, gym's notices,
deprecation warnings) is silenced unless `--verbose` (see alf_async.quiet).

SIGINT / SIGTERM once training started (train() is running, on a thread of
its own so that the main thread can take signals): the loop stops at the
end of its iteration (at once if it is waiting for experience, as a serving
job without clients does), stops the driver, writes a checkpoint and
exits 0; a second signal interrupts at once (no checkpoint at exit, exit
130), except that a checkpoint being written gets `WRITE_GRACE_SECS` to
finish, and what it wrote is removed if it does not (the previous
checkpoint stays the latest). Once train() has returned (the run stopped
by itself or on a signal, and its checkpoint is written), signals are
ignored until the process has exited: a run that ends by itself exits 0
with its checkpoint, Ctrl-C or not. Ctrl-C before training (imports, gin
parsing) prints one line and exits 130. An error in any thread exits non-zero with
the original error after every thread was stopped.

With `Collectors.count > 0` (gin_configs/*_distributed.gin) the run is
a learner that starts its collectors (alf_async.distributed.learner_role): it
prints the address they use and writes it to ROOT_DIR/replay_address, and a
first signal stops the collectors too, before the checkpoint.
"""

import argparse
import contextlib
import logging
import os
import signal
import sys
import tempfile
import threading

from alf_async import kernels, quiet
from alf_async.errors import ConfigError
from alf_async.bin import moved_bindings, train_help

PROG = "alf-async-train"
EXIT_CONFIG_ERROR = 2
EXIT_INTERRUPTED = 130
INTERRUPTED_BEFORE = f"{PROG}: interrupted before training started; nothing was written"
INTERRUPTED_DURING = (f"{PROG}: interrupted again while stopping: no checkpoint at exit "
                      f"(the latest one in ROOT_DIR/train is kept)")
# A second signal while the checkpoint at exit is being written waits this
# long for it, then removes what it wrote so far.
WRITE_GRACE_SECS = 10.0
WRITE_FINISHED = (f"{PROG}: interrupted again while stopping: the checkpoint being written "
                  f"was finished first (in ROOT_DIR/train)")
WRITE_REMOVED = (f"{PROG}: interrupted again while stopping: the checkpoint being written did "
                 f"not finish within {WRITE_GRACE_SECS:g} s and was removed (the latest one "
                 f"in ROOT_DIR/train is kept)")
# Bindings every run needs; an overlay gin file alone leaves them unbound.
REQUIRED_BINDINGS = ("Task.env_name", "Task.agent_fn")


def build_parser():
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Asynchronous off-policy training with tf-agents, configured by gin.",
        epilog=train_help.epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root_dir", required=True,
                        help="run directory: checkpoints, summaries, operative config; "
                             "running again on it resumes")
    parser.add_argument("--gin_file", action="append", default=[],
                        help="a gin config file (at least one; repeatable, later files "
                             "override earlier)")
    parser.add_argument("--gin_param", action="append", default=[],
                        help="a gin binding, e.g. 'Schedule.num_iterations=100' (repeatable; "
                             "applied after the files)")
    parser.add_argument("--verbose", action="store_true",
                        help="show third-party output (TensorFlow's banner, gym's notices, "
                             "deprecation warnings)")
    return parser


def check_gin_files(gin_files):
    """Raises ConfigError unless there is at least one gin file and each is readable."""
    if not gin_files:
        raise ConfigError("no --gin_file: give at least one, e.g. "
                          "--gin_file gin_configs/dqn_cartpole.gin")
    for path in gin_files:
        if not os.path.isfile(path):
            raise ConfigError(f"gin file not found: {path}")
        if not os.access(path, os.R_OK):
            raise ConfigError(f"gin file not readable: {path}")


def check_root_dir(root_dir):
    """Raises ConfigError unless `root_dir` is, or can be created as, a writable directory.

    Nothing is created: an existing directory (or, for a new one, its
    nearest existing parent) must take a file.
    """
    path = os.path.abspath(os.path.expanduser(root_dir))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"--root_dir {root_dir} is a file, not a directory")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ConfigError(f"--root_dir {root_dir} cannot be created: {existing} is a file")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        what = "is not writable" if existing == path else (
            f"cannot be created: {existing} is not writable")
        raise ConfigError(f"--root_dir {root_dir} {what} ({e.strerror})") from None


def choose_kernels(gin_files, gin_params):
    """Chooses TensorFlow's kernels for the run (`alf_async.kernels`) before
    TensorFlow is imported and writes the choice into the environment;
    returns it. Raises ConfigError for a `Runtime.kernel_choice` or an
    `ALF_ASYNC_HOST_KIND` that cannot apply."""
    choice = kernels.choose_for_gin(gin_files, gin_params)
    kernels.apply(choice)
    return choice


def _drop_gin_path_misses(record):
    """A logging filter: False for gin's "Path not found" lookups (see parse_gin)."""
    return not (record.pathname.endswith(os.path.join("gin", "resource_reader.py")) and
                str(record.msg).startswith("Path not found"))


def parse_gin(gin_files, gin_params):
    """Parses the files, then each binding; raises ConfigError with one line on any error.

    Each gin file's directory joins gin's search path, so an overlay's
    `include 'dqn_cartpole.gin'` finds its base beside it, and the end of
    Python's import path, so a gin file's `import my_env` finds my_env.py
    beside it (the console script's own directory is the venv's bin/, not
    the working directory; appended, so it shadows no installed module).
    """
    import gin  # pylint: disable=import-outside-toplevel
    from alf_async.trainer import one_line  # pylint: disable=import-outside-toplevel
    for path in gin_files:
        directory = os.path.dirname(os.path.abspath(path))
        if directory not in gin.config._LOCATION_PREFIXES:  # pylint: disable=protected-access
            gin.add_config_file_search_path(directory)
        if directory not in sys.path:
            sys.path.append(directory)
    # gin tries an include under every search path in turn and logs "Path not
    # found" at ERROR for each miss, even when a later one has the file; a file
    # that is really missing raises below, with its own one line.
    root_logger = logging.getLogger()
    root_logger.addFilter(_drop_gin_path_misses)
    try:
        for path in gin_files:
            try:
                gin.parse_config_file(path)
            except Exception as e:  # pylint: disable=broad-except  (any parse error is the config's)
                raise ConfigError(f"gin file {path}: {_gin_error(e, one_line)}") from None
    finally:
        root_logger.removeFilter(_drop_gin_path_misses)
    for param in gin_params:
        try:
            gin.parse_config(param)
        except Exception as e:  # pylint: disable=broad-except
            raise ConfigError(f"--gin_param {param!r}: {_gin_error(e, one_line)}") from None
    unbound = [name for name in REQUIRED_BINDINGS if not _is_bound(gin, name)]
    if unbound:
        raise ConfigError(
            f"{' and '.join(unbound)} not bound by {', '.join(gin_files)}: an overlay gin file "
            f"needs its base first (or an `include` of it), e.g. "
            f"--gin_file gin_configs/dqn_cartpole.gin")


# What alf_async.distributed registers with gin only when dm-reverb imports.
REVERB_CONFIGURABLES = ("ReverbReplayer", "replay_table", "unroll_table", "collect",
                        "launch_collectors", "LearnerServer", "VariablePushHook")


def _with_reverb_hint(message, reverb_missing):
    """`message`, saying which extra to install when it is gin's "No
    configurable matching" for a name that only dm-reverb's import registers."""
    if reverb_missing is None or not any(f"No configurable matching '{name}'" in message
                                         for name in REVERB_CONFIGURABLES):
        return message
    return (f"{message} (it needs dm-reverb, which did not import: "
            f"{type(reverb_missing).__name__}: {reverb_missing}; pip install -e '.[reverb]')")


def _gin_error(error, one_line):
    """gin's parse error on one line, without Python's "malformed node" part;
    a binding that moved from `train.*` is named with its new binding."""
    moved = moved_bindings.moved_binding_error(str(error))
    if moved is not None:
        return moved
    text = " | ".join(part for part in one_line(error).split(" | ")
                      if not part.startswith("malformed node or string"))
    if "Failed to parse token" in text:
        text += " (a string value needs quotes)"
    return text


def _is_bound(gin, name):
    try:
        gin.query_parameter(name)
    except ValueError:
        return False
    return True


@contextlib.contextmanager
def interrupt_after_start_up():
    """Ctrl-C (SIGINT) during the imports and gin parsing: remembered, then
    raised as KeyboardInterrupt once the current step is done; a second one
    raises at once.

    Why not Python's own handler: twice in full test runs (never alone) a
    Ctrl-C during the imports was lost and the run went on and trained
    (exit 0 instead of 130). Python raises KeyboardInterrupt wherever the
    main thread is, and one raised inside a finalizer (`__del__`, a weakref
    callback, which the garbage collector runs at any allocation of
    TensorFlow's and Reverb's imports) is swallowed: the likeliest cause,
    not proven. A flag checked between steps loses nothing. Handlers can only be installed from the main thread; elsewhere
    this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    interrupted = []

    def handler(signum, frame):
        del signum, frame
        interrupted.append(True)
        if len(interrupted) > 1:
            raise KeyboardInterrupt("second SIGINT during start-up")

    def check():
        if interrupted:
            raise KeyboardInterrupt("SIGINT during start-up")

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield check
        check()
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def stop_on_signals(stop_event, ended, signals=(signal.SIGINT, signal.SIGTERM)):
    """Sets `stop_event` on the first of `signals`; a second one raises
    KeyboardInterrupt. Once `ended` is set (train() returned: its outcome and
    checkpoint are decided) they are ignored, up to the process's exit.

    Ignored, not restored: TensorFlow's teardown at exit takes seconds, and
    at exit Python puts back the default action of a signal it handles, so a
    Ctrl-C then ended a finished run with the signal's own status (-2)
    instead of 0. An ignored signal stays ignored through the exit.

    Handlers can only be installed from the main thread; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        del frame
        if ended.is_set():
            return
        if stop_event.is_set():
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}")
        print(f"[alf_async] {signal.Signals(signum).name}: stopping, then writing a "
              f"checkpoint (send it again to abort without one)", flush=True)
        stop_event.set()

    previous = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, signal.SIG_IGN if ended.is_set() else h)


def say_on_stderr(line):
    """Writes `line` and its newline to stderr in one write.

    print() writes the text and the newline in two, and stderr passes each
    straight to the file: a line another thread printed in between (the
    trainer's last lines, on the same pipe) lands inside ours.
    """
    sys.stderr.write(f"{line}\n")
    sys.stderr.flush()


def _error(message):
    say_on_stderr(f"{PROG}: error: {message}")
    return EXIT_CONFIG_ERROR


def main(argv=None):
    """Runs the CLI; returns the exit code (argparse exits 2 itself on bad flags)."""
    args = build_parser().parse_args(argv)  # --help and bad flags exit here, without TF
    training = threading.Event()
    try:
        return _run(args, training)
    except KeyboardInterrupt:
        message = INTERRUPTED_BEFORE
        if training.is_set():
            message = _abandon_checkpoint_write().replace("ROOT_DIR", args.root_dir)
        say_on_stderr(message)
        return EXIT_INTERRUPTED


def _abandon_checkpoint_write():
    """After a second signal: lets a checkpoint write in progress finish
    within `WRITE_GRACE_SECS`, else removes its files; returns what to say."""
    from alf_async.learning import checkpoint_files  # pylint: disable=import-outside-toplevel
    try:
        finished, removed = checkpoint_files.WRITES.finish_or_remove(WRITE_GRACE_SECS)
    except KeyboardInterrupt:  # a third signal: wait no longer
        finished, removed = checkpoint_files.WRITES.finish_or_remove(0)
    if removed:
        return WRITE_REMOVED
    return WRITE_FINISHED if finished else INTERRUPTED_DURING


def _run(args, training):
    try:
        check_gin_files(args.gin_file)
        check_root_dir(args.root_dir)
    except ConfigError as e:
        return _error(e)
    try:
        # train() prints the choice's line once the run is built (kernels.start_line).
        choose_kernels(args.gin_file, args.gin_param)
    except ConfigError as e:
        return _error(e)
    quiet.quiet(verbose=args.verbose)
    with interrupt_after_start_up() as check_interrupted:
        # Imported only now: --help and the checks above need no TensorFlow.
        # They register every configurable the gin files name.
        from alf_async.learning import replayers  # pylint: disable=import-outside-toplevel
        from alf_async import trainer  # pylint: disable=import-outside-toplevel
        from alf_async.environments import suites  # pylint: disable=import-outside-toplevel
        del replayers, suites  # imported for their gin registrations only
        check_interrupted()
        try:  # registers ReverbReplayer, replay_table and the learner role's knobs
            # (collect.*, LearnerServer.*, launch_collectors.*, VariablePushHook.*) with
            # gin, when dm-reverb is installed
            from alf_async.distributed import reverb_replayer  # pylint: disable=import-outside-toplevel
            from alf_async.distributed import learner_role  # pylint: disable=import-outside-toplevel
            del reverb_replayer, learner_role
            reverb_missing = None
        except ImportError as e:
            reverb_missing = e
        check_interrupted()
        try:
            parse_gin(args.gin_file, args.gin_param)
        except ConfigError as e:
            return _error(_with_reverb_hint(str(e), reverb_missing))
    stop_event, ended = threading.Event(), threading.Event()
    with stop_on_signals(stop_event, ended):
        training.set()
        try:
            _train_off_main_thread(trainer, args.root_dir, stop_event, ended)
        except trainer.ConfigError as e:
            return _error(trainer.one_line(e))
    return 0


def _train_off_main_thread(trainer, root_dir, stop_event, ended):
    """Runs `trainer.train()` on a daemon thread, sets `ended` once it
    returned or raised; raises its error again here.

    Python runs signal handlers only on the main thread, and only between
    bytecodes: a learner blocked in TensorFlow waiting for experience (a
    serving job without clients) would never see SIGINT. So the main thread
    only waits here; a first signal sets `stop_event` (train() then stops
    its learner), a second raises KeyboardInterrupt here, and the daemon
    threads end with the process (no checkpoint at exit).
    """
    outcome = []

    def target():
        try:
            trainer.train(root_dir=root_dir, stop_event=stop_event)
        except BaseException as e:  # pylint: disable=broad-except  (raised again below)
            outcome.append(e)
        finally:
            ended.set()

    thread = threading.Thread(target=target, name="trainer", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.2)
    if outcome:
        raise outcome[0]


if __name__ == "__main__":
    sys.exit(main())
