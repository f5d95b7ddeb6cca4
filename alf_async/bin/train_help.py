"""The `train.*` bindings for `alf-async-train --help`, read without TensorFlow.

`train()`'s parameters, defaults and one-line descriptions are parsed from
alf_async/trainer.py's source (its signature and the Args section of its
docstring), so `--help` answers without importing TensorFlow and cannot
drift from the real signature (tests/test_cli_help.py checks both against
`inspect.signature(trainer.train)`).
"""

import ast
import os
import re

TRAINER_SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "trainer.py")

# train() parameters that are not gin bindings of a run.
NOT_BINDINGS = ("root_dir", "stop_event", "print_fn")


def train_bindings(source_path=TRAINER_SOURCE):
    """[(name, default, first sentence of its description)] of `train()`.

    Defaults are source text; a required binding's is 'REQUIRED', a
    callable's is its gin reference ('@UniformReplayer').
    """
    with open(source_path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    function = next(node for node in tree.body
                    if isinstance(node, ast.FunctionDef) and node.name == "train")
    args = function.args.args
    defaults = [None] * (len(args) - len(function.args.defaults)) + function.args.defaults
    descriptions = _arg_descriptions(ast.get_docstring(function) or "")
    rows = []
    for arg, default in zip(args, defaults):
        if arg.arg in NOT_BINDINGS or default is None:
            continue
        text = ast.unparse(default)
        if text == "gin.REQUIRED":
            text = "REQUIRED"
        elif isinstance(default, (ast.Name, ast.Attribute)):
            text = "@" + text.split(".")[-1]  # a configurable, as gin names it
        rows.append((arg.arg, text, descriptions.get(arg.arg, "")))
    return rows


def _arg_descriptions(docstring):
    """{name: its description up to the first period} from a Google-style
    docstring's Args section."""
    section = docstring.split("Args:", 1)[-1].split("Returns:", 1)[0]
    descriptions = {}
    for m in re.finditer(r"^ {4}(\w+): (.*(?:\n {8,}.*)*)", section, re.MULTILINE):
        text = " ".join(m.group(2).split())
        descriptions[m.group(1)] = re.split(r"(?<=[^.]\.) ", text, maxsplit=1)[0]
    return descriptions


def epilog():
    """The --help text after the flags: the train.* bindings and their defaults."""
    rows = train_bindings()
    lines = ["train.* bindings (--gin_param 'train.NAME = VALUE' or in a gin file), "
             "with their defaults:", ""]
    for name, default, description in rows:
        lines.append(f"  train.{name} = {default}")
        lines.append(f"      {description}")
    lines += ["",
              "Configs: gin_configs/dqn_cartpole.gin (the main job), sac_pendulum.gin; "
              "*_subprocess.gin, *_ray.gin and *_gymnasium.gin include their base; "
              "*_distributed.gin run a learner and its collector processes (Reverb).",
              "Resuming: the same command on the same --root_dir resumes; a finished "
              "or solved run says so and exits 0."]
    return "\n".join(lines)
