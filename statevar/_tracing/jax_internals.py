"""statevar's one boundary with JAX's private and unstable surface.

Every use of JAX that no public API offers lives here, and nowhere else in the package
(``tests/test_import_graph.py`` pins it): the trace stack of `jax.extend.core`, the kinds and
purposes of traces, the parent of a trace, the Python frames of JAX's tracing functions, the
C++ attribute a concrete array says its commitment by, and the reach probe (two primitives
of statevar's own, which `statevar.grad` learns what its loss reaches by). Public API that
moves between the supported releases lives here too: recognizing a one-device sharding,
whose class jax 0.12.1 deprecates naming.
Each function says what it is for, which public API would replace it, and the JAX versions
it is tested on (``.ci/run`` runs the suite on the oldest and the newest supported JAX:
0.10.2 and 0.12.1). A JAX release that renames what a function reads makes it answer
conservatively where it can (see `traced_functions`), so statevar stays correct and only
loses speed.

``jax.core.Tracer`` and ``jax.Array.committed`` are public and used everywhere else.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from jax import sharding as _sharding

# `jax.extend` and `jax.interpreters` are JAX's surface for libraries built on its internals:
# stable in name, not in behaviour (tested on jax 0.10.2, 0.11.2, 0.12.0.1 and 0.12.1). No
# public API exposes the trace stack or defines a primitive.
from jax.extend import core as _core
from jax.interpreters import ad as _ad
from jax.interpreters import batching as _batching
from jax.interpreters import mlir as _mlir

try:  # the table of linearization rules (see `LINEARIZATION_PROTOCOL`)
    from jax._src.interpreters import ad as _ad_module
except ImportError:  # pragma: no cover (every JAX the suite runs on has it)
    _ad_module = None
_ad_internals: Any = _ad_module


def current_trace() -> Any:
    """The innermost trace JAX is tracing at (its eval trace outside any transformation).

    For: walking the transformations nested inside a statevar trace frame. Public
    replacement: none (flax nnx reads the same stack). Tested on jax 0.10.2 to 0.12.1.
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
    Tested on jax 0.10.2 to 0.12.1 (``Trace.parent_trace``).
    """
    return getattr(trace, "parent_trace", None)


def transformation_of(trace: Any) -> str | None:
    """What JAX traces ``trace``'s function for (``"cond"``, ``"while_body"``,
    ``"checkpoint / remat"``, ``"custom_jvp fun"``, ...), or None for a trace that is not a
    function's (differentiation, batching).

    For: refusing assignments JAX cannot carry out (in a custom_jvp function, a while loop
    whose cond_fun reads the variable) and knowing which functions run once. Public
    replacement: none. Tested on jax 0.10.2 to 0.12.1 (``DynamicJaxprTrace.frame
    .debug_info.traced_for``).
    """
    debug_info = getattr(getattr(trace, "frame", None), "debug_info", None)
    return getattr(debug_info, "traced_for", None)


def is_escaped_tracer(tracer: Any) -> bool:
    """Whether ``tracer`` belongs to no trace running here: one kept by a side effect
    (appended to a list inside ``jax.jit``, say) after its transformation finished.

    For: naming the variable an escaped tracer is assigned to, where JAX would refuse it only
    once the step's trace ends, naming none. Public replacement: none (JAX raises
    `jax.errors.UnexpectedTracerError` later). Tested on jax 0.10.2 to 0.12.1
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
# 0.12.1.
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
# the ``trace_to_jaxpr_nocache`` its cache wraps in jax 0.11.2, 0.12.0.1 and 0.12.1. Public
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
    .jaxpr_as_fun`` is deprecated). Tested on jax 0.10.2 to 0.12.1.
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
# ``committed``, used if a JAX release drops ``_committed``. Tested on jax 0.10.2 to 0.12.1.
COMMITTED_ATTRIBUTE = _commitment_attribute()


# ------------------------------------------------------------------------- one-device shardings


# JAX 0.12.1's test of a one-device sharding; None before it.
_is_single_device_sharding = getattr(_sharding, "is_single_device_sharding", None)


def is_single_device(sharding: Any) -> bool:
    """Whether ``sharding`` places an array whole on one device, as
    ``jax.sharding.make_single_device_sharding`` makes it. JAX 0.12.1's
    ``is_single_device_sharding`` replaces the ``isinstance`` check of
    ``SingleDeviceSharding``, whose name it deprecates; before it, the class is public and
    undeprecated (jax 0.10.2 to 0.12.0)."""
    if _is_single_device_sharding is not None:
        return _is_single_device_sharding(sharding)
    return isinstance(sharding, _sharding.SingleDeviceSharding)


# ------------------------------------------------------------------------------ reach probe


def reach_probe(primals: Sequence[Any], on_reached: Callable[[list[bool]], None]) -> list[Any]:
    """Returns ``primals`` unchanged, marked so that the backward pass of the differentiation
    they are traced for calls ``on_reached`` with, for each of them, whether the loss reached
    it with a cotangent (JAX gives a symbolic zero to one it does not reach differentiably:
    unread, read through ``stop_gradient`` or only for an auxiliary output). The backward pass
    makes at most one call: none, or one with every flag False, when the loss reaches none.

    For: learning, in each call of `statevar.grad`, which variables its loss reached (the
    others get None, as ``tf.GradientTape`` gives). Made of two primitives of statevar's own,
    an identity and its linear part, whose transpose calls ``on_reached``: eagerly, binding a
    primitive costs a fraction of a `jax.custom_vjp` call (about 0.6 ms each on jax 0.10.2 and
    0.12, most of it JAX's Python work: debug info, signature inspection, the forward
    function's trace). ``on_reached`` is a parameter of the equations: a new one each call, so
    nested calls record apart, and no compiled cache keys on it (eagerly, neither primitive
    compiles: both run in Python). Public replacement: `jax.custom_vjp` with
    ``symbolic_zeros=True``, at about three times the eager cost. Tested on jax 0.10.2 to
    0.12.0.1.
    """
    if not primals:
        return []  # nothing to learn, and JAX would bind the probe outside differentiation
    return _PROBE.bind(*primals, on_reached=on_reached)


def _identity(*values: Any, on_reached: Callable) -> list[Any]:
    return list(values)


def _batch_identity(primitive: Any) -> Callable:
    def batch(values: Sequence[Any], dimensions: Sequence[Any], **params: Any) -> tuple:
        return primitive.bind(*values, **params), list(dimensions)

    return batch


def _define_identity(name: str) -> Any:
    """A primitive returning its operands, in every JAX interpreter: evaluation, abstract
    evaluation, batching and lowering."""
    primitive = _core.Primitive(name)
    primitive.multiple_results = True
    primitive.def_impl(_identity)
    primitive.def_abstract_eval(_identity)
    _batching.primitive_batchers[primitive] = _batch_identity(primitive)
    _mlir.register_lowering(primitive, lambda ctx, *values, on_reached: list(values))
    return primitive


_PROBE = _define_identity("statevar_reach_probe")
# The probe's tangent map: linear, and the identity; its transpose reports which cotangents
# are not symbolic zeros.
_PROBE_LINEAR = _define_identity("statevar_reach_probe_linear")


def _probe_tangents(tangents: Sequence[Any], on_reached: Callable) -> list[Any]:
    """The probe's tangent map, the same in its JVP rule and its linearization rule."""
    instantiated = [_ad.instantiate_zeros(tangent) for tangent in tangents]
    return _PROBE_LINEAR.bind(*instantiated, on_reached=on_reached)


def _probe_jvp(primals: Sequence[Any], tangents: Sequence[Any], *, on_reached: Callable) -> tuple:
    return list(primals), _probe_tangents(tangents, on_reached)


def _probe_transpose(cotangents: Sequence[Any], *_: Any, on_reached: Callable) -> list[Any]:
    on_reached([not isinstance(cotangent, _ad.Zero) for cotangent in cotangents])
    return list(cotangents)


# The linear part has no JVP rule: it lives only in the linear jaxpr of statevar.grad's own
# backward pass, which transposes it (a JAX that differentiated it would say so, by name).
_ad.primitive_jvps[_PROBE] = _probe_jvp
_ad.primitive_transposes[_PROBE_LINEAR] = _probe_transpose


def _linearization_protocol() -> int | None:
    """How JAX's direct linearization calls a primitive's linearization rule, as the
    installed JAX's ``LinearizeTrace.process_primitive`` unpacks it: ``4`` (``primal_out,
    tangent_nzs_out, residuals, linearized``: jax 0.10 and 0.11.0), ``5`` (with the
    structured residuals: jax 0.11.2 and 0.12), or None for a JAX that does neither."""
    try:
        names = _ad_internals.LinearizeTrace.process_primitive.__code__.co_varnames
        _ad_internals.primitive_linearizations  # noqa: B018 (the table the rule goes into)
    except AttributeError:  # no such JAX module, class or table
        return None
    if "linearized" not in names or "residuals" not in names:
        return None
    return 5 if "structured_res" in names else 4


def _probe_linearization(
    is_vjp: bool, nonzeros: Sequence[bool], *primals: Any, on_reached: Callable
) -> tuple:
    """The probe's linearization rule: the primals unchanged, no residuals, and its tangent
    map (`_probe_tangents`, which JAX calls under the tangent trace with the residuals, and
    with protocol 5 the structured residuals, before the tangents)."""
    residuals = (None,) * (2 if LINEARIZATION_PROTOCOL == 5 else 1)

    def linearized(*arguments: Any) -> list[Any]:
        return _probe_tangents(arguments[len(residuals) :], on_reached)

    return (list(primals), [True] * len(primals), *residuals, linearized)


# How the probe is linearized when JAX linearizes directly (`jax_use_direct_linearize`, the
# default): by its own rule, which costs a fraction of JAX's fallback (tracing the JVP rule
# to a jaxpr on every call). A JAX whose rules take another form gets none, and falls back
# to the JVP rule: always correct, only slower. Public replacement: none (the JVP rule).
LINEARIZATION_PROTOCOL = _linearization_protocol()
if LINEARIZATION_PROTOCOL is not None:
    _ad_internals.primitive_linearizations[_PROBE] = _probe_linearization
