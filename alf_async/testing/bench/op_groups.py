"""The learner's profiled ops grouped by kind (benchmarks/learner_ops.py)."""

GROUPS = ("convolutions", "matmuls", "optimizer", "casts", "the rest")
OPTIMIZER_SCOPES = ("Adam/", "RMSprop/", "clip_by_global_norm/")


def group(event_name):
    """The group of a profiler event named 'scope/.../op_name:OpType'."""
    name, _, op_type = event_name.rpartition(":")
    if "Conv" in op_type:
        return "convolutions"
    if "MatMul" in op_type:
        return "matmuls"
    if op_type.startswith("ResourceApply") or any(
            name.startswith(s) or f"/{s}" in name for s in OPTIMIZER_SCOPES):
        return "optimizer"
    if op_type == "Cast":
        return "casts"
    return "the rest"
