"""The kernels TensorFlow runs on this CPU, chosen before TensorFlow is imported.

TensorFlow 2.15 runs convolutions and matmuls either with its Eigen kernels
or with oneDNN's, and reads which once, when it is imported
(`TF_ENABLE_ONEDNN_OPTS`). On Linux it turns oneDNN on by default only
where the CPU lists one of `TF_ONEDNN_DEFAULT_FLAGS` (AVX-512 VNNI or BF16,
AVX-VNNI, AMX: tensorflow/tsl/util's `DefaultOneDnnPolicy`); on the many
CPUs with AVX2 and no more (laptops, AMD EPYC before Zen 4, older Xeons) it
leaves it off, and a convolutional network trains on Eigen's slower kernels
(docs/results/collection.md, "Host kinds and kernels").

`choose` decides, from the CPU's flags, the user's environment and the
run's networks (`NETWORKS`, read from its gin files by `gin_settings`):

- oneDNN: what the user set in `TF_ENABLE_ONEDNN_OPTS` always wins;
  otherwise TensorFlow's default, except where TensorFlow leaves oneDNN
  off and the networks are convolutional or have dense layers of
  `WIDE_UNITS` units or more: oneDNN is turned on there, where it pays
  (on the AVX2 kind the Pong learners and SAC's 256-unit networks take
  less CPU with it). Narrower dense networks keep TensorFlow's default:
  DQN's and PPO's CartPole networks trained a little slower with oneDNN
  (`benchmarks/kernel_choice.py`; docs/results/collection.md, "Host kinds
  and kernels", has the rows).
- torsos of `torso_dtype_policy = 'auto'` compute in bfloat16 where the
  CPU has AVX-512 BF16 or AMX (`BF16_FLAGS`), else in float32.

`apply` writes the choice into this process's environment (children
inherit it), with its line, which `train()` prints once its run is
built (`start_line`; alf-async-collect prints its own). The
choice can be turned off (`Runtime.kernel_choice = 'off'`): TensorFlow's
defaults then stand and 'auto' torsos compute in float32.
`alf-async-train`, `alf-async-collect` and the benchmarks choose before
they import TensorFlow (`choose_for_gin`); a Python program does the same
by calling `apply(choose_for_gin(...))` before its first TensorFlow import.

Emulating another host kind (`ALF_ASYNC_HOST_KIND`, the benchmarks'
`--host_kind`): the choice sees only the flags that kind has, oneDNN is
capped at its instruction set (`ONEDNN_MAX_CPU_ISA`, which also caps the
oneDNN matmul TensorFlow's Eigen kernels call), and TensorFlow's default is
the emulated kind's. A host can emulate its own kind or one below it, not
one above (the instructions are not there).

Imports no TensorFlow (gin's parser only, for `choose_for_gin`).
"""

import ast
import collections
import os
import sys
import tokenize

from alf_async.errors import ConfigError

ONEDNN_VAR = "TF_ENABLE_ONEDNN_OPTS"
ISA_VAR = "ONEDNN_MAX_CPU_ISA"
HOST_KIND_VAR = "ALF_ASYNC_HOST_KIND"   # an emulated host kind (`emulated_flags`)
CHOICE_VAR = "ALF_ASYNC_KERNEL_CHOICE"  # 'off': TensorFlow's defaults, float32 'auto' torsos
# The variables `apply` set (a child process chooses again, not taking them for the user's).
CHOSEN_VAR = "ALF_ASYNC_KERNELS_SET"
# The choice's line, which `train()` prints once the run is built (`start_line`).
LINE_VAR = "ALF_ASYNC_KERNELS_LINE"

# TensorFlow 2.15 on Linux turns oneDNN on by default where the CPU has one of these.
TF_ONEDNN_DEFAULT_FLAGS = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8",
                           "amx_bf16")
# bfloat16 convolutions and matmuls run in hardware (oneDNN) with these; elsewhere emulated, slower.
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
KERNEL_CHOICES = ("auto", "off")
# What oneDNN is chosen for: 'convolutional' and 'wide' (a dense layer of at
# least WIDE_UNITS units) networks gain from it, 'narrow' ones lose.
NETWORKS = ("convolutional", "wide", "narrow")
WIDE_UNITS = 256
# The agent builders' source: their default layer sizes are read from it
# (`builder_widest_default`) without importing TensorFlow.
AGENTS_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "learning",
                             "agents.py")

# Host kinds, lowest first: the flags each one lacks (dropped when it is
# emulated) and oneDNN's instruction-set cap for it.
HOST_KINDS = ("avx2", "avx512", "avx512_bf16", "amx")
_LACKS = {
    "avx2": ("avx512", "amx", "avx_vnni"),
    "avx512": ("amx", "avx512_bf16", "avx512_fp16"),
    "avx512_bf16": ("amx",),
    "amx": (),
}
_ISA_CAP = {"avx2": "AVX2", "avx512": "AVX512_CORE", "avx512_bf16": "AVX512_CORE_BF16",
            "amx": None}


def real_flags(cpuinfo="/proc/cpuinfo"):
    """The CPU's flags (Linux's cpuinfo), an empty set where they cannot be read."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def host_kind(flags):
    """The host kind of a CPU with `flags`: 'amx', 'avx512_bf16', 'avx512' or
    'avx2' (AVX2 or less)."""
    if "amx_bf16" in flags or "amx_tile" in flags:
        return "amx"
    if "avx512_bf16" in flags:
        return "avx512_bf16"
    if "avx512f" in flags:
        return "avx512"
    return "avx2"


def emulated_flags(flags, kind):
    """`flags` without those host kind `kind` lacks. Raises ConfigError
    for an unknown kind or one above the CPU's own."""
    if kind not in HOST_KINDS:
        raise ConfigError(f"host kind {kind!r}: expected one of {HOST_KINDS}")
    own = host_kind(flags)
    if HOST_KINDS.index(kind) > HOST_KINDS.index(own):
        raise ConfigError(f"host kind {kind!r} cannot be emulated on this CPU, which is "
                                f"{own!r}: a host emulates its own kind or one below it "
                                f"({', '.join(HOST_KINDS[:HOST_KINDS.index(own) + 1])})")
    return frozenset(f for f in flags if not f.startswith(_LACKS[kind]))


def _flag_value(value):
    """True / False for a value TensorFlow reads as a bool ('1', 'true', '0',
    'false', any case), None for anything else (TensorFlow ignores it)."""
    value = value.strip().lower()
    return True if value in ("1", "true") else False if value in ("0", "false") else None


class KernelChoice(collections.namedtuple("KernelChoice", [
        "host_kind", "emulated", "choice", "onednn", "onednn_reason", "torso_dtype",
        "environ"])):
    """What `choose` decided.

    Attributes:
        host_kind: the kind the choice is for (the emulated one, if any).
        emulated: the kind emulated (`HOST_KIND_VAR`), or None; then
            `host_kind` is the CPU's own.
        choice: 'auto' or 'off' (`KERNEL_CHOICES`).
        onednn: whether TensorFlow will run oneDNN's kernels.
        onednn_reason: why, a few words for `line`.
        torso_dtype: what a torso of `torso_dtype_policy = 'auto'` computes
            in, 'bfloat16' or 'float32'.
        environ: the environment variables `apply` sets ({} if none).
    """

    __slots__ = ()

    def line(self, prefix="[alf_async]"):
        """The one line a start prints: `[alf_async] kernels: ...`."""
        kind = self.host_kind + (" host (emulated)" if self.emulated else " host")
        off = "; kernel choice off" if self.choice == "off" else ""
        return (f"{prefix} kernels: {kind}{off}; oneDNN {'on' if self.onednn else 'off'} "
                f"({self.onednn_reason}); 'auto' torsos compute in {self.torso_dtype}")


def choose(flags, environ, networks, choice="auto"):
    """The kernel choice for a run (pure: reads only its arguments).

    Args:
        flags: the CPU's flags (`real_flags`).
        environ: the environment the run starts with (os.environ): the
            user's `TF_ENABLE_ONEDNN_OPTS` and `ONEDNN_MAX_CPU_ISA` win, and
            `ALF_ASYNC_HOST_KIND` emulates a kind.
        networks: the run's networks, one of `NETWORKS`.
        choice: 'auto', or 'off' for TensorFlow's defaults and float32
            'auto' torsos.

    Returns:
        A `KernelChoice`.

    Raises:
        ConfigError: an unknown choice or host kind, or a kind this CPU
            cannot emulate.
    """
    if choice not in KERNEL_CHOICES:
        raise ConfigError(f"Runtime.kernel_choice must be one of {KERNEL_CHOICES}, "
                                f"got {choice!r}")
    if networks not in NETWORKS:
        raise ValueError(f"networks must be one of {NETWORKS}, got {networks!r}")
    emulated = environ.get(HOST_KIND_VAR) or None
    seen = emulated_flags(flags, emulated) if emulated else frozenset(flags)
    kind = host_kind(seen)
    tf_default = bool(seen & set(TF_ONEDNN_DEFAULT_FLAGS))
    # What TensorFlow itself would pick here: on an emulated kind, the real CPU's default.
    real_default = bool(set(flags) & set(TF_ONEDNN_DEFAULT_FLAGS))
    default_why = (f"TensorFlow's default with {sorted(seen & set(TF_ONEDNN_DEFAULT_FLAGS))[0]}"
                   if tf_default else "TensorFlow's default without AVX-512 VNNI, BF16 or AMX")
    ours = set(filter(None, environ.get(CHOSEN_VAR, "").split(",")))
    user = None if ONEDNN_VAR in ours else environ.get(ONEDNN_VAR)
    env = {}
    if user is not None:
        onednn = _flag_value(user)
        if onednn is None:
            onednn = real_default
            reason = f"{ONEDNN_VAR}={user!r} is not 0 or 1: TensorFlow's default"
        else:
            reason = f"{ONEDNN_VAR}={user}, yours"
    elif choice == "off":
        onednn, reason = tf_default, default_why
    elif tf_default:
        onednn, reason = True, default_why
    elif networks == "convolutional":
        onednn, reason = True, "convolutions train faster with it; TensorFlow leaves it off here"
    elif networks == "wide":
        onednn, reason = True, (f"dense layers of {WIDE_UNITS}+ units train faster with it; "
                                f"TensorFlow leaves it off here")
    else:
        onednn, reason = False, default_why + "; narrow dense networks train slower with it"
    if user is None and onednn != real_default:
        env[ONEDNN_VAR] = "1" if onednn else "0"
    if emulated and _ISA_CAP[emulated] and (ISA_VAR not in environ or ISA_VAR in ours):
        env[ISA_VAR] = _ISA_CAP[emulated]
    if choice == "off":
        env[CHOICE_VAR] = "off"
    if env:
        env[CHOSEN_VAR] = ",".join(sorted(env))
    torso = "bfloat16" if choice == "auto" and seen & set(BF16_FLAGS) else "float32"
    return KernelChoice(kind, emulated, choice, onednn, reason, torso, env)


def apply(kernel_choice, environ=None):
    """Writes `kernel_choice.environ` into `environ` (os.environ: this process
    and its children), removing what an earlier choice (a parent process's)
    set and this one does not, and its line (`start_line`). Raises
    RuntimeError if that changes a kernel setting once TensorFlow is
    imported in this process (it has read its kernels)."""
    environ = os.environ if environ is None else environ
    stale = set(filter(None, environ.get(CHOSEN_VAR, "").split(","))) | {CHOSEN_VAR}
    changes = dict(kernel_choice.environ)
    changes.update({k: None for k in stale - set(kernel_choice.environ) if k in environ})
    if (any(environ.get(k) != v for k, v in changes.items()) and environ is os.environ
            and "tensorflow" in sys.modules):
        raise RuntimeError("alf_async.kernels.apply: TensorFlow is already imported in this "
                           "process; choose the kernels before the first TensorFlow import")
    changes[LINE_VAR] = kernel_choice.line()
    for k, v in changes.items():
        if v is None:
            environ.pop(k)
        else:
            environ[k] = v


def start_line(environ=None):
    """The line of the choice `apply` wrote into `environ` (os.environ), or
    None if none was applied: what `train()` prints when its run starts."""
    return (os.environ if environ is None else environ).get(LINE_VAR)


def bf16_torsos(environ=None, cpuinfo="/proc/cpuinfo"):
    """True where a torso of `torso_dtype_policy = 'auto'` computes in
    bfloat16: the (emulated) CPU has AVX-512 BF16 or AMX and the kernel
    choice is not off."""
    environ = os.environ if environ is None else environ
    if environ.get(CHOICE_VAR) == "off":
        return False
    flags = real_flags(cpuinfo)
    kind = environ.get(HOST_KIND_VAR)
    if kind:
        flags = emulated_flags(flags, kind)
    return bool(flags & set(BF16_FLAGS))


def in_effect(environ=None, cpuinfo="/proc/cpuinfo"):
    """What this process's kernels are, as a JSON-able dict: the CPU's own kind,
    the emulated one, the kernel variables set, whether oneDNN runs, and
    what 'auto' torsos compute in (benchmarks record it with their host)."""
    environ = os.environ if environ is None else environ
    flags = real_flags(cpuinfo)
    kind = environ.get(HOST_KIND_VAR) or None
    seen = emulated_flags(flags, kind) if kind else flags
    value = environ.get(ONEDNN_VAR)
    onednn = _flag_value(value) if value is not None else None
    if onednn is None:
        onednn = bool(flags & set(TF_ONEDNN_DEFAULT_FLAGS))
    return dict(cpu_kind=host_kind(flags), emulated_kind=kind, host_kind=host_kind(seen),
                onednn=onednn, choice=environ.get(CHOICE_VAR, "auto"),
                variables={k: environ[k] for k in (ONEDNN_VAR, ISA_VAR, HOST_KIND_VAR,
                                                    CHOICE_VAR, CHOSEN_VAR) if k in environ},
                auto_torso_dtype="bfloat16" if bf16_torsos(environ, cpuinfo) else "float32")


# ---------------------------------------------------------------- the run's gin

class _Delegate(object):
    """gin's parser delegate: references and macros stand for themselves."""

    def configurable_reference(self, scoped_name, evaluate):
        return ("@", scoped_name, evaluate)

    def macro(self, name):
        return ("%", name)


def gin_settings(gin_files, gin_params=()):
    """(networks, choice) of a run's gin files and bindings, read without
    TensorFlow (gin's parser only; `include`s followed, later bindings win).

    networks (`NETWORKS`): 'convolutional' if a `conv_layer_params` is bound
    to something other than None (`ppo_agent`, `impala_agent`,
    `dqn_agent`); else 'wide' if the widest dense layer (the
    `*fc_layer_params` bound, or where none is, the `Task.agent_fn`
    builder's default, `builder_widest_default`) has `WIDE_UNITS` units or
    more; else 'narrow' (an agent builder of the user's own with no layer
    sizes bound counts as narrow). choice: the last `Runtime.kernel_choice`
    bound ('auto' if none). Errors of the files themselves are left to the
    full parse that follows.
    """
    from gin import config_parser  # pylint: disable=import-outside-toplevel  (pure Python)
    search = [os.path.dirname(os.path.abspath(p)) for p in gin_files]
    bound = {}   # (selector, arg_name) -> value, the last binding winning

    def statements(text):
        try:
            yield from config_parser.ConfigParser(text, _Delegate())
        except (SyntaxError, ValueError, tokenize.TokenError):
            return   # the full parse reports it, with its own one line

    def read(text, directory):
        for statement in statements(text):
            if isinstance(statement, config_parser.IncludeStatement):
                path = _find_include(statement.filename, [directory] + search)
                if path:
                    with open(path) as f:
                        read(f.read(), os.path.dirname(path))
            elif isinstance(statement, config_parser.BindingStatement):
                bound[(statement.selector, statement.arg_name)] = statement.value

    for path in gin_files:
        with open(path) as f:
            read(f.read(), os.path.dirname(os.path.abspath(path)))
    for param in gin_params:
        read(param, os.getcwd())
    choice = bound.get(("Runtime", "kernel_choice"), "auto")
    if any(arg == "conv_layer_params" and value is not None
           for (_, arg), value in bound.items()):
        return "convolutional", choice
    widths = [n for (_, arg), value in bound.items() if arg.endswith("fc_layer_params")
              and isinstance(value, (tuple, list)) for n in value if isinstance(n, int)]
    if not widths:
        agent_fn = bound.get(("Task", "agent_fn"))
        builder = agent_fn[1].split(".")[-1] if isinstance(agent_fn, tuple) else None
        widths = [builder_widest_default().get(builder, 0)]
    return ("wide" if max(widths) >= WIDE_UNITS else "narrow"), choice


def builder_widest_default(source_path=AGENTS_SOURCE):
    """{builder name: the widest dense layer among its `*fc_layer_params`
    defaults} of the agent builders in alf_async/learning/agents.py, read
    from its source with `ast` (the builders import TensorFlow)."""
    with open(source_path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    widest = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        args = node.args.args + node.args.kwonlyargs
        defaults = ([None] * (len(node.args.args) - len(node.args.defaults)) +
                    node.args.defaults + node.args.kw_defaults)
        widths = [n for arg, default in zip(args, defaults)
                  if arg.arg.endswith("fc_layer_params") and default is not None
                  for n in _literal_ints(default)]
        if widths:
            widest[node.name] = max(widths)
    return widest


def _literal_ints(node):
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return []
    return [n for n in value if isinstance(n, int)] if isinstance(value, (tuple, list)) else []


def _find_include(filename, directories):
    if os.path.isabs(filename):
        return filename if os.path.isfile(filename) else None
    for directory in directories:
        path = os.path.join(directory, filename)
        if os.path.isfile(path):
            return path
    return None


def choose_for_gin(gin_files, gin_params=(), environ=None, cpuinfo="/proc/cpuinfo"):
    """`choose` for the run the gin files and bindings describe, on this CPU
    and with this process's environment (`gin_settings`)."""
    networks, choice = gin_settings(gin_files, gin_params)
    return choose(real_flags(cpuinfo), os.environ if environ is None else environ,
                  networks, choice)
