"""Ops in the driver's traced graphs, per env step (benchmarks/driver_cost.py's
cost account; the tests of acting env threads and GIL-free steps read it)."""

import statistics


def graph_ops(concrete_function):
    """{function name: node count} of a traced concrete function's graph
    and the functions in its library (while bodies and conditions)."""
    graph_def = concrete_function.graph.as_graph_def()
    counts = {"": len(graph_def.node)}
    for f in graph_def.library.function:
        counts[f.signature.name] = len(f.node_def)
    return counts


def body_ops(concrete_function):
    """Nodes in the while loop bodies of `concrete_function` (the loop the
    driver's threads run until their queues close)."""
    return sum(n for name, n in graph_ops(concrete_function).items() if "body" in name)


def graph_ops_per_step(driver):
    """The driver's graph ops per env step (row step), read from its traced
    graphs before it starts: {'env_thread': per step of an env thread's
    graph loop, 'actor': per pass of an actor / the rows of a full request,
    'total', 'queue_ops_per_step': the queue ops among the env thread's}.
    Counts only env threads that run the graph loop."""
    B, T = driver.env_batch_size, driver._unroll_length   # pylint: disable=protected-access
    env_ops, queue_ops = [], []
    for t in driver._env_threads:   # pylint: disable=protected-access
        loop = t._graph_loop   # pylint: disable=protected-access
        if loop is None:
            continue
        env_ops.append(body_ops(loop) / (T * B))
        graph_def = loop.graph.as_graph_def()
        queue_ops.append(sum(1 for f in graph_def.library.function if "body" in f.signature.name
                             for n in f.node_def if n.op.startswith("Queue")) / T)
    actor = [body_ops(a._loop) / B for a in driver._actor_threads]   # pylint: disable=protected-access
    env = statistics.mean(env_ops) if env_ops else 0.0
    act = statistics.mean(actor) if actor else 0.0
    return dict(env_thread=env, actor=act, total=env + act,
                queue_ops_per_step=statistics.mean(queue_ops) if queue_ops else 0.0)
