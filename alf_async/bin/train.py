"""alf-async-train: gin files and bindings -> `alf_async.trainer.train()`.

    alf-async-train --root_dir runs/dqn_cartpole --gin_file gin_configs/dqn_cartpole.gin \
        [--gin_file more.gin] [--gin_param 'train.num_iterations=100']
    python -m alf_async.bin.train ...   (the same)

Configuration errors (a missing gin file, an unknown configurable or
parameter, a value gin cannot parse or `train()` refuses) end the program at
once, before any thread starts, with one line on stderr naming the file or
binding, and exit code 2.

SIGINT / SIGTERM: the loop stops at the end of its iteration, stops the
driver, writes a checkpoint and exits 0; a second signal interrupts at once
(KeyboardInterrupt, no checkpoint). An error in any thread exits non-zero
with the original error after every thread was stopped.
"""

import argparse
import contextlib
import signal
import sys
import threading

import gin

# Imported before parsing so every configurable the gin files name is
# registered (trainer imports the tf-agents agents and networks).
from alf_async import replayers  # noqa: F401  (registers OneTimeReplayer, UniformReplayer)
from alf_async import trainer
from alf_async.environments import suites  # noqa: F401  (registers load, make_env_constructor)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="alf-async-train",
        description="Asynchronous off-policy training with tf-agents, configured by gin.")
    parser.add_argument("--root_dir", required=True,
                        help="run directory: checkpoints, summaries, operative config; "
                             "running again on it resumes")
    parser.add_argument("--gin_file", action="append", default=[],
                        help="a gin config file (repeatable; later files override earlier)")
    parser.add_argument("--gin_param", action="append", default=[],
                        help="a gin binding, e.g. 'train.num_iterations=100' (repeatable; "
                             "applied after the files)")
    return parser


_one_line = trainer.one_line


def parse_gin(gin_files, gin_params):
    """Parses the files then the bindings; raises ValueError with one line on any error."""
    try:
        gin.parse_config_files_and_bindings(gin_files, gin_params, finalize_config=False)
    except (OSError, IOError) as e:
        raise ValueError(f"gin file not found or unreadable: {_one_line(e)}") from None
    except (ValueError, SyntaxError, TypeError, KeyError) as e:
        raise ValueError(f"bad gin configuration: {_one_line(e)}") from None


@contextlib.contextmanager
def stop_on_signals(stop_event, signals=(signal.SIGINT, signal.SIGTERM)):
    """Sets `stop_event` on the first of `signals`; a second one raises KeyboardInterrupt.

    Handlers can only be installed from the main thread; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        del frame
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
            signal.signal(s, h)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        parse_gin(args.gin_file, args.gin_param)
    except ValueError as e:
        parser.error(str(e))
    stop_event = threading.Event()
    with stop_on_signals(stop_event):
        try:
            trainer.train(root_dir=args.root_dir, stop_event=stop_event)
        except trainer.ConfigError as e:
            parser.error(_one_line(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
