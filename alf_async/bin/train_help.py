"""The settings' bindings for `alf-async-train --help`, read without TensorFlow.

The settings groups' fields, defaults and one-line descriptions are parsed
from alf_async/settings.py's source (each gin-configurable dataclass's
fields and the Args section of its docstring), so `--help`
answers without importing TensorFlow and cannot drift from the real
signatures (tests/test_cli.py checks both against `inspect.signature`).
"""

import ast
import os
import re

SETTINGS_SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "settings.py")
# The groups, in the order --help lists them.
GROUPS = ("Task", "Layout", "Schedule", "Evaluation", "Outputs", "Runtime", "Collectors")


def setting_bindings(source_path=SETTINGS_SOURCE):
    """[(group, field, default, first sentence of its description)] of the
    settings groups.

    Defaults are source text; a required binding's is 'REQUIRED', a
    callable's is its gin reference ('@UniformReplayer').
    """
    with open(source_path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    rows = []
    for group in GROUPS:
        fields = [node for node in classes[group].body if isinstance(node, ast.AnnAssign)]
        descriptions = _arg_descriptions(ast.get_docstring(classes[group]) or "")
        for field in fields:
            text = ast.unparse(field.value)
            if text == "gin.REQUIRED":
                text = "REQUIRED"
            elif isinstance(field.value, (ast.Name, ast.Attribute)):
                text = "@" + text.split(".")[-1]  # a configurable, as gin names it
            rows.append((group, field.target.id, text, descriptions.get(field.target.id, "")))
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
    """The --help text after the flags: the settings' bindings and their defaults."""
    lines = ["Settings (--gin_param 'Group.NAME = VALUE' or in a gin file), with their "
             "defaults:"]
    group = None
    for name, field, default, description in setting_bindings():
        if name != group:
            group = name
            lines.append("")
        lines.append(f"  {name}.{field} = {default}")
        lines.append(f"      {description}")
    lines += ["",
              "Configs: gin_configs/dqn_cartpole.gin (the main job), sac_pendulum.gin; "
              "*_subprocess.gin, *_ray.gin and *_gymnasium.gin include their base; "
              "*_distributed.gin run a learner and its collector processes (Reverb).",
              "Resuming: the same command on the same --root_dir resumes; a finished "
              "or solved run says so and exits 0."]
    return "\n".join(lines)
