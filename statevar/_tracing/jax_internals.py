"""statevar's one boundary with JAX's private and unstable surface.

Every use of JAX that no public API offers lives here, and nowhere else in the package
(``tests/test_import_graph.py`` pins it): the trace stack of `jax.extend.core`, the kinds and
purposes of traces, the parent of a trace, the Python frames of JAX's tracing functions, and
the C++ attribute a concrete array says its commitment by.
Each function says what it is for, which public API would replace it, and the JAX versions
it is tested on (``.ci/run`` runs the suite on the oldest and the newest supported JAX:
0.10.2 and 0.12). A JAX release that renames what a function reads makes it answer
conservatively where it can (see `traced_functions`), so statevar stays correct and only
loses speed.

``jax.core.Tracer`` and ``jax.Array.committed`` are public and used everywhere else.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

# `jax.extend` is JAX's surface for libraries built on its internals: stable in name, not in
# behaviour (tested on jax 0.10.2, 0.11.2 and 0.12.0.1). No public API exposes the trace stack.
from jax.extend import core as _core


def current_trace() -> Any:
    """The innermost trace JAX is tracing at (its eval trace outside any transformation).

    For: walking the transformations nested inside a statevar trace frame. Public
    replacement: none (flax nnx reads the same stack). Tested on jax 0.10.2 to 0.12.0.1.
    """
    return _core.find_top_trace(())


def trace_state() -> Any:
    """An opaque value that differs inside every nested transformation and is equal at the
    same trace level.

    For: telling whether a variable is read or written at a trace frame's own level.
    Public replacement: none (flax nnx uses the same function for the same purpose).
    """
    return _core.get_opaque_trace_state()


def tracing_at(trace: Any) -> AbstractContextManager[Any]:
    """A context in which JAX records operations at ``trace`` (an enclosing level).

    For: making or reading a variable's `jax.Ref` at the level of the frame that owns it.
    Public replacement: none.
    """
    return _core.set_current_trace(trace)


def enclosing_trace(trace: Any) -> Any | None:
    """The trace ``trace`` is nested in, or None (an eval trace, or a JAX that renamed
    the field: then no enclosing transformation is seen, as outside any).

    For: walking from the innermost trace out to a frame's. Public replacement: none.
    Tested on jax 0.10.2 to 0.12.0.1 (``Trace.parent_trace``).
    """
    return getattr(trace, "parent_trace", None)


def transformation_of(trace: Any) -> str | None:
    """What JAX traces ``trace``'s function for (``"cond"``, ``"while_body"``,
    ``"checkpoint / remat"``, ``"custom_jvp fun"``, ...), or None for a trace that is not a
    function's (differentiation, batching).

    For: refusing assignments JAX cannot carry out (in a custom_jvp function, a while loop
    whose cond_fun reads the variable) and knowing which functions run once. Public
    replacement: none. Tested on jax 0.10.2 to 0.12.0.1 (``DynamicJaxprTrace.frame
    .debug_info.traced_for``).
    """
    debug_info = getattr(getattr(trace, "frame", None), "debug_info", None)
    return getattr(debug_info, "traced_for", None)


def is_escaped_tracer(tracer: Any) -> bool:
    """Whether ``tracer`` belongs to no trace running here: one kept by a side effect
    (appended to a list inside ``jax.jit``, say) after its transformation finished.

    For: naming the variable an escaped tracer is assigned to, where JAX would refuse it only
    once the step's trace ends, naming none. Public replacement: none (JAX raises
    `jax.errors.UnexpectedTracerError` later). Tested on jax 0.10.2 to 0.12.0.1
    (``Tracer._trace``); a JAX without the field leaves it to JAX's own error.
    """
    own = getattr(tracer, "_trace", None)
    if own is None:
        return False
    trace = current_trace()
    while trace is not None:
        if trace is own:
            return False
        trace = enclosing_trace(trace)
    return True


# The trace classes of differentiation and batching, by name (`jax.interpreters.ad.JVPTrace`
# and `jax.interpreters.batching.BatchTrace` are not public API). Tested on jax 0.10.2 to
# 0.12.0.1.
_DIFFERENTIATING_TRACES = frozenset({"JVPTrace", "LinearizeTrace"})
_BATCHING_TRACES = frozenset({"BatchTrace"})


def is_differentiating(trace: Any) -> bool:
    """Whether ``trace`` differentiates (`jax.grad`, `jax.jvp`, `jax.linearize`).

    For: refusing an assignment in `jax.checkpoint` while differentiating. Public
    replacement: none.
    """
    return type(trace).__name__ in _DIFFERENTIATING_TRACES


def is_batching(trace: Any) -> bool:
    """Whether ``trace`` batches (`jax.vmap`). Public replacement: none."""
    return type(trace).__name__ in _BATCHING_TRACES


def is_cached_kind(trace: Any) -> bool:
    """Whether JAX caches what ``trace`` traces by function (every trace that is not a
    differentiation or a batching one: those run their function each time).

    For: knowing whether a function read a variable's value into a cached trace.
    """
    return not (is_differentiating(trace) or is_batching(trace))


# The Python functions through which JAX traces a function to a jaxpr, caching the trace by
# that function, which they hold in their local ``fun``: ``trace_to_jaxpr`` in jax 0.10.2,
# the ``trace_to_jaxpr_nocache`` its cache wraps in jax 0.11.2 and 0.12.0.1. Public
# replacement: none (JAX does not tell which functions it has cached traces of).
TRACING_FUNCTION_NAMES = frozenset({"trace_to_jaxpr", "trace_to_jaxpr_nocache"})


def traced_functions(since: Any) -> list[Any]:
    """The functions JAX is tracing (caching their traces by function), found on the Python
    stack between the caller and the Python frame ``since``.

    For: knowing which cached traces closed over a variable's value. Where JAX's tracing
    functions are not found (a renamed one), fewer functions than cached traces come back,
    and the caller counts the closure as unknown and alive: always correct, only slower
    (see `statevar._tracing.frames._Generation`).
    """
    functions = []
    python_frame = sys._getframe(1)
    while python_frame is not None and python_frame is not since:
        code = python_frame.f_code
        if code.co_name in TRACING_FUNCTION_NAMES and "jax" in code.co_filename:
            function = python_frame.f_locals.get("fun")
            if function is not None:
                functions.append(function)
        python_frame = python_frame.f_back
    return functions


def jaxpr_as_fun(closed_jaxpr: Any) -> Callable[..., list[Any]]:
    """A function evaluating ``closed_jaxpr`` (``jax.jit(f).trace().jaxpr``).

    For: running a traced initial value under a sharding found from its traced shape,
    without calling the user's function again. Public replacement: none (``jax.core
    .jaxpr_as_fun`` is deprecated). Tested on jax 0.10.2 to 0.12.0.1.
    """
    return _core.jaxpr_as_fun(closed_jaxpr)


def _commitment_attribute() -> str:
    """``"_committed"`` if JAX's concrete array reads its commitment without running Python
    (a property of its C++ type), else ``"committed"``."""
    try:
        from jax._src.array import ArrayImpl
    except ImportError:
        return "committed"
    getter = getattr(getattr(ArrayImpl, "_committed", None), "fget", None)
    return "_committed" if getter is not None and not hasattr(getter, "__code__") else "committed"


# The attribute a concrete array says whether it is committed to its devices by: read by
# ``getattr(argument, COMMITTED_ATTRIBUTE, False)`` for every argument of a warm compiled
# call whose variables are placed nowhere. ``jax.Array.committed`` is a Python property
# returning JAX's C++ ``_committed``: a Python call for each argument. Public replacement:
# ``committed``, used if a JAX release drops ``_committed``. Tested on jax 0.10.2 to 0.12.0.1.
COMMITTED_ATTRIBUTE = _commitment_attribute()
