"""What JAX's transformations nested inside a trace frame allow a variable: where a ref is
read, and which assignments are refused (with the messages that say why). A frame here is
any `statevar._tracing.frames.Frame` (its trace and its while-loop reads); nothing here keeps state.
"""

from __future__ import annotations

from typing import Any

from .._errors import TraceContextError
from . import jax_internals as _jax_internals

# What JAX traces a function for when it runs it at most once per step (a loop's body and
# cond_fun run many times, a custom_vjp function's may run again for its gradient).
RUN_ONCE = frozenset(("cond", "switch", "jit", "checkpoint / remat"))


def traces_below(frame: Any) -> list[Any]:
    """The traces between the current one (first) and ``frame``'s own (excluded)."""
    traces, trace = [], _jax_internals.current_trace()
    while trace is not None and trace is not frame._trace:
        traces.append(trace)
        trace = _jax_internals.enclosing_trace(trace)
    return traces


def enclosing_vmap() -> Any | None:
    """The innermost `jax.vmap` trace the current trace runs under, or None."""
    trace = _jax_internals.current_trace()
    while trace is not None:
        if _jax_internals.is_batching(trace):
            return trace
        trace = _jax_internals.enclosing_trace(trace)
    return None


def cannot_carry_refs(trace: Any) -> bool:
    """Whether a ref is read outside ``trace`` rather than in it: under `jax.vmap` (where
    JAX cannot carry a ref into a cond, switch or while loop) and in
    `jax.lax.custom_linear_solve` (under ``jax.scipy.sparse.linalg.cg``)."""
    transformation = _jax_internals.transformation_of(trace) or ""
    return _jax_internals.is_batching(trace) or transformation.startswith("custom_linear_solve")


def read_level(frame: Any) -> Any | None:
    """The trace to read a ref at: the parent of the outermost transformation between the
    current trace and ``frame``'s that cannot carry a ref's effects, or None (read here).

    No variable can be assigned under such a transformation (`check_nested_write` refuses
    it), so its value just outside is its value everywhere inside.
    """
    level = None
    for trace in traces_below(frame):  # innermost first: the last found is the outermost
        if cannot_carry_refs(trace):
            level = _jax_internals.enclosing_trace(trace)
    return level


def check_ref_read(frame: Any, var: Any) -> None:
    for trace in traces_below(frame):
        traced_for = _jax_internals.transformation_of(trace)
        if traced_for == "custom_jvp fun":
            raise custom_jvp_error(var, "read")
        if traced_for == "while_cond":
            frame._while_reads.append((_jax_internals.enclosing_trace(trace), var))


def check_nested_write(
    frame: Any, var: Any, operation: str, has_ref: bool, differentiating: bool
) -> None:
    traces = traces_below(frame)
    differentiating = differentiating or any(map(_jax_internals.is_differentiating, traces))
    for trace in traces:
        if _jax_internals.is_batching(trace):
            raise TraceContextError(
                f"Cannot {operation} Variable '{var.name}' inside jax.vmap: a variable holds "
                "one value, not one per batch element. Return the new values from the "
                "vmapped function and assign (a reduction of) them outside it."
            )
        traced_for = _jax_internals.transformation_of(trace)
        if traced_for == "custom_jvp fun":
            raise custom_jvp_error(var, operation)
        if (traced_for or "").startswith("custom_linear_solve"):
            raise TraceContextError(
                f"Cannot {operation} Variable '{var.name}' inside jax.lax.custom_linear_solve "
                "(which jax.scipy.sparse.linalg solvers use): its functions run an unknown "
                "number of times. Assign outside the solve (they may still read variables)."
            )
        if traced_for == "checkpoint / remat" and differentiating:
            raise TraceContextError(
                f"Cannot {operation} Variable '{var.name}' inside jax.checkpoint while "
                "differentiating: the checkpointed function runs again to recompute its "
                "values for the gradient, so the assignment would apply twice. Assign outside "
                "the checkpointed function (it may still read variables)."
            )
        if traced_for == "while_body" and has_ref:
            parent = _jax_internals.enclosing_trace(trace)
            if any(p is parent and v is var for p, v in frame._while_reads):
                raise TraceContextError(
                    f"Cannot {operation} Variable '{var.name}' in the body of a "
                    "jax.lax.while_loop whose cond_fun reads it: the cond_fun would see the "
                    "value from before the loop, not the body's updates. Carry the value in "
                    "the loop state (init_val) and assign it after the loop."
                )


def custom_jvp_error(var: Any, operation: str) -> TraceContextError:
    return TraceContextError(
        f"Cannot {operation} Variable '{var.name}' inside a jax.custom_jvp function: it is "
        "assigned under a JAX transformation elsewhere in this step, so it lives in a "
        "jax.Ref, which custom_jvp cannot carry. Read the value outside and pass it to the "
        "function as an argument."
        if operation == "read"
        else f"Cannot {operation} Variable '{var.name}' inside a jax.custom_jvp function, "
        "which cannot carry a variable's update. Return the new value from the function and "
        "assign it outside."
    )
