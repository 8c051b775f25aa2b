"""The Python half of statevar's R package: moves values between R and JAX.

R stores arrays column-major; values cross as flat Python lists in R's order plus a shape, so
no conversion goes through NumPy's C interface (which reticulate 1.28 cannot use with NumPy 2).
"""

from __future__ import annotations

import logging
import operator
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import statevar

# R's storage modes and the NumPy dtype an R vector of that mode becomes.
_FROM_R = {"double": np.float64, "integer": np.int32, "logical": np.bool_, "complex": np.complex128}

_BINARY = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "^": operator.pow,
    "%%": operator.mod,
    "%/%": operator.floordiv,
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
    "<=": operator.le,
    ">=": operator.ge,
    "&": jnp.logical_and,
    "|": jnp.logical_or,
}

_UNARY = {"-": operator.neg, "+": operator.pos, "!": jnp.logical_not}

# R's Math group generics that have a JAX function of the same meaning.
_MATH = {
    "abs": jnp.abs,
    "sign": jnp.sign,
    "sqrt": jnp.sqrt,
    "floor": jnp.floor,
    "ceiling": jnp.ceil,
    "trunc": jnp.trunc,
    "exp": jnp.exp,
    "expm1": jnp.expm1,
    "log": jnp.log,
    "log2": jnp.log2,
    "log10": jnp.log10,
    "log1p": jnp.log1p,
    "cos": jnp.cos,
    "sin": jnp.sin,
    "tan": jnp.tan,
    "acos": jnp.arccos,
    "asin": jnp.arcsin,
    "atan": jnp.arctan,
    "cosh": jnp.cosh,
    "sinh": jnp.sinh,
    "tanh": jnp.tanh,
    "acosh": jnp.arccosh,
    "asinh": jnp.arcsinh,
    "atanh": jnp.arctanh,
}

_SUMMARY = {
    "sum": jnp.sum,
    "prod": jnp.prod,
    "max": jnp.max,
    "min": jnp.min,
    "any": jnp.any,
    "all": jnp.all,
}


def from_r(flat: Any, shape: list[int] | None, mode: str, scalar: bool) -> np.ndarray:
    """Builds a host array from an R vector given as a flat list in R's (column-major) order.

    Args:
      flat: the vector's elements (a list, or a single element for a length-one vector).
      shape: the R ``dim`` attribute, or None for a plain vector.
      mode: the vector's R storage mode ("double", "integer", "logical" or "complex").
      scalar: whether a length-one plain vector becomes a 0-d array (R has no scalars).
    """
    values = flat if isinstance(flat, list) else [flat]
    array = np.asarray(values, dtype=_FROM_R[mode])
    if shape is None:
        return array.reshape(()) if scalar and array.size == 1 else array
    return np.ascontiguousarray(array.reshape([int(n) for n in shape], order="F"))


def to_r(value: Any) -> tuple[list, list[int], str]:
    """Returns a value's elements as a flat list in R's order, its shape and its R mode.

    Integers R's 32-bit integers cannot hold (int64, uint32, uint64) and every float type
    become R doubles; bool becomes logical, complex types become R's complex.
    """
    array = np.asarray(value)
    if array.dtype == np.bool_:
        mode, target = "logical", np.bool_
    elif np.issubdtype(array.dtype, np.integer) and np.can_cast(array.dtype, np.int32):
        mode, target = "integer", np.int32
    elif np.issubdtype(array.dtype, np.complexfloating):
        mode, target = "complex", np.complex128
    else:
        mode, target = "double", np.float64
    flat = array.astype(target).ravel(order="F").tolist()
    return flat, list(array.shape), mode


def kind(value: Any) -> str:
    """What an object handed to R is: a variable, an array (tracers included), a list
    (Python list or tuple), a dict, None, or something else."""
    if isinstance(value, statevar.Variable):
        return "variable"
    if isinstance(value, jax.Array):
        return "array"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, dict):
        return "dict"
    return "none" if value is None else "other"


def describe(value: Any) -> str:
    """The first line R prints for a variable or an array."""
    shape = str(tuple(value.shape))
    if isinstance(value, statevar.Variable):
        return f"<Variable '{value.name}' shape={shape} dtype={value.dtype}>"
    return f"<Array shape={shape} dtype={value.dtype}>"


def is_concrete(value: Any) -> bool:
    """Whether a value can be read on the host (a tracer inside `grad` cannot)."""
    return not isinstance(value, jax.core.Tracer)


def _operand(value: Any) -> Any:
    # A host array from R joins the computation as a JAX array, so NumPy never takes over an
    # operator with a Variable on the other side.
    return jnp.asarray(value) if isinstance(value, np.ndarray) else value


def binary(op: str, left: Any, right: Any) -> Any:
    """Applies R's binary operator ``op`` (``"+"``, ``"=="``, ``"&"``, ...)."""
    return _BINARY[op](_operand(left), _operand(right))


def unary(op: str, value: Any) -> Any:
    """Applies R's unary operator ``op`` (``"-"``, ``"+"`` or ``"!"``)."""
    return _UNARY[op](_operand(value))


def matmul(left: Any, right: Any) -> Any:
    """R's ``%*%``: the matrix product."""
    return jnp.matmul(_operand(left), _operand(right))


def math(name: str, value: Any) -> Any:
    """Applies one of R's Math group functions, elementwise; None if JAX has none."""
    function = _MATH.get(name)
    return None if function is None else function(value)


def round_to(value: Any, digits: int) -> Any:
    """R's ``round(x, digits)`` (JAX also rounds halves to even, as R does)."""
    return jnp.round(value, int(digits))


def cumulative(name: str, value: Any) -> Any:
    """R's ``cumsum`` and ``cumprod``: over the elements in R's order, as a vector."""
    flat = jnp.ravel(value, order="F")
    return jnp.cumsum(flat) if name == "cumsum" else jnp.cumprod(flat)


def summary(name: str, values: list) -> Any:
    """Applies one of R's Summary group reductions (``sum``, ``max``, ``range``, ...) to
    every element of every value; None if JAX has none."""
    flat = [jnp.ravel(_operand(value)) for value in values]
    every = flat[0] if len(flat) == 1 else jnp.concatenate(flat)
    if name == "range":
        return jnp.stack([jnp.min(every), jnp.max(every)])
    function = _SUMMARY.get(name)
    return None if function is None else function(every)


def mean(value: Any) -> Any:
    """R's ``mean``: the mean of every element."""
    return jnp.mean(value)


def transpose(value: Any) -> Any:
    """R's ``t()``: the transpose (axes reversed)."""
    return jnp.transpose(value)


def keys(mapping: dict) -> list[str]:
    """A dict's keys, as strings, for R's names."""
    return [str(key) for key in mapping]


def value_of(value: Any) -> Any:
    """A variable's current array; an array stays as it is; host data becomes an array."""
    if isinstance(value, statevar.Variable):
        return value.value
    return jnp.asarray(value)


def as_array(value: Any, dtype: Any = None) -> jax.Array:
    """R's ``as_jax``: the value as a JAX array, of ``dtype`` if given."""
    array = value_of(value)
    return array if dtype is None else array.astype(dtype)


def set_log_device_placement(enabled: bool) -> None:
    """Turns placement logging on or off, and makes the "statevar" logger's INFO records
    reach standard error when Python's logging is not set up (as from R it seldom is)."""
    statevar.set_log_device_placement(enabled)
    logger = logging.getLogger("statevar")
    if enabled and not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        logger.addHandler(handler)
    if enabled and logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
