"""What a compiled step does with the variables it lifts.

A `statevar.jit` step takes its variables' arrays (donated) and returns their new ones: this
module holds what that asks of the variables, beside `Variable` itself. Their compile flags
(`compile_flags`: a step traces again when a trainable flag or a sharding changes), the store
of a step's outputs, all or nothing (`stores`), the put-back of their own arrays when a step
was traced rather than run (`put_back`), and the error for a call that failed after the
arrays were donated (`failed_call_error`). Only `statevar._cell.variable` and this module
store a variable's array.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import jax

from .._errors import PlacementError, StatevarError
from .._tracing import frames as _frames
from . import placement as _placement
from .variable import ARRAY_ATTRIBUTE, Variable, consume


def compile_flags(variables: tuple[Variable, ...]) -> tuple:
    """What a compiled step's trace depends on beyond shapes and dtypes: each variable's
    trainable flag (gradients) and sharding (the trace pins each output to it)."""
    return tuple((v._trainable, _placement.sharding_key(v._value.sharding)) for v in variables)


def put_back(variables: tuple[Variable, ...], arrays: list[jax.Array]) -> None:
    """Stores each variable's own array again, in one C call chain: a step called inside
    ``jax.jit`` was traced rather than run, and left tracers in the variables (copies
    made of shared arrays are tracers too). Nothing was donated."""
    consume(map(setattr, variables, _ARRAY_ATTRIBUTES, arrays))


def stores(variables: tuple[Variable, ...], outputs: Iterator[Any]) -> Iterator[None]:
    """The store of a compiled step's outputs, as a lazy chain of C calls: consumed (by
    `consume`), it takes each variable's new array from ``outputs`` and stores it. Given
    ``outputs`` that make the compiled call when first advanced (it donates the variables'
    arrays), the call and every store run in that one chain; the result, after the
    variables' arrays, stays in ``outputs`` (`map` stops at the last variable).

    Build it before donating, and consume it with nothing in between: Python runs signal
    handlers only when a Python function is entered, after a call returns and at a backward
    jump, and none of these happens inside the chain, so every variable holds its old
    array or its new one.
    """
    return map(setattr, variables, _ARRAY_ATTRIBUTES, outputs)


# The attribute name for each store of `stores` and `put_back` (stateless: shared).
_ARRAY_ATTRIBUTES = itertools.repeat(ARRAY_ATTRIBUTE)


def failed_call_error(
    subject: str,
    name: str,
    lifted: tuple[Variable, ...],
    arrays: list,
    error: Exception,
    dynamic: tuple = (),
) -> Exception:
    """The error to raise when the compiled step ``name`` (``subject`` in placement
    messages), given the arrays of ``lifted`` (donated) and ``dynamic``, failed: the error
    itself if no variable lost its array, else one naming the variables that did."""
    # A variable's own array: a shared one was copied, and only the copy donated.
    deleted = [
        v for v, a in zip(lifted, arrays, strict=True) if a.is_deleted() and v._value.is_deleted()
    ]
    if not deleted:
        try:
            _placement.check_step_devices(subject, lifted, arrays, dynamic)
        except PlacementError as refused:
            return refused
        if isinstance(error, jax.errors.UnexpectedTracerError):
            return _frames.escaped_tracer_error(f"The statevar.jit function {name!r}")
        return error
    debugging = jax.config.jax_debug_nans or jax.config.jax_debug_infs  # pyright: ignore[reportAttributeAccessIssue]
    if debugging and _is_deleted_error(error):
        # The step ran and gave a NaN or an infinity: JAX ran it again, operation by
        # operation, to find where, on the buffers the first run had been donated.
        for variable in deleted:
            variable._mark_lost(
                f"was donated to the statevar.jit function {name!r}, which "
                "gave a NaN or an infinity under jax_debug_nans or jax_debug_infs"
            )
        return FloatingPointError(
            f"The statevar.jit function {name!r} gave a NaN or an infinity "
            "(jax_debug_nans or jax_debug_infs is on). JAX runs the step again to find "
            "where, but the step had been given its variables' buffers (donated), so "
            f"these variables lost their values: {', '.join(repr(v.name) for v in deleted)}. "
            "To find NaNs without losing state, use jax.experimental.checkify in the "
            "step, or run its function without statevar.jit under jax_debug_nans."
        )
    if _is_deleted_error(error):
        # JAX refused the call before running it: the arrays were deleted beforehand.
        return deleted[0]._deleted_error(f"The statevar.jit function {name!r} cannot read")
    for variable in deleted:
        variable._mark_lost(f"was donated to the statevar.jit function {name!r}, which failed")
    return StatevarError(
        f"The statevar.jit function {name!r} failed after its variables' "
        "buffers were donated; these variables lost their values: "
        f"{', '.join(repr(v.name) for v in deleted)}"
    )


def _is_deleted_error(error: Exception) -> bool:
    """Whether ``error`` is JAX refusing a deleted array: its Python path's or its C++ fast
    path's message."""
    message = str(error)
    return message.startswith("Array has been deleted") or "has been deleted or donated" in message
