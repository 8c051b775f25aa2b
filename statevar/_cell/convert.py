"""Dtype conversion rules: which values a variable accepts, and how they are converted.

A value converts safely into a variable when its dtype family (bool, integer, floating,
complex) is the variable's or a later one, bool excepted, and when integers fit the
variable's integer range. The same rules apply to an explicit ``dtype=`` at creation and to
every update; a rejected value raises before anything is donated.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any, NamedTuple, Protocol, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer as Tracer

from .._errors import DtypeMismatchError, ShapeMismatchError, TraceContextError, caller_stacklevel
from .._tracing import frames as _frames
from .placement import is_multi_device, replicated

# Dtype families, ordered so that a value converts safely into its own family or a later one.
BOOL, INT, FLOAT, COMPLEX = range(4)
FAMILY_NAMES = {BOOL: "bool", INT: "integer", FLOAT: "floating", COMPLEX: "complex"}
PYTHON_SCALARS = {bool: BOOL, int: INT, float: FLOAT, complex: COMPLEX}
PYTHON_SCALAR_DTYPES = {bool: "bool", int: "int", float: "float", complex: "complex"}
_FAMILY_TYPES = {family: kind for kind, family in PYTHON_SCALARS.items()}
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


@functools.cache
def family(dtype: np.dtype) -> int | None:
    """Returns the family (`BOOL`, `INT`, `FLOAT` or `COMPLEX`) of ``dtype``; None if other."""
    if dtype == np.bool_:
        return BOOL
    for found, kind in (
        (INT, jnp.integer),
        (FLOAT, jnp.floating),
        (COMPLEX, jnp.complexfloating),
    ):
        if jnp.issubdtype(dtype, kind):
            return found
    return None


@functools.cache
def integer_range(dtype: np.dtype) -> tuple[int, int]:
    """Returns the smallest and largest values of integer ``dtype``."""
    info = jnp.iinfo(dtype)
    return int(info.min), int(info.max)


def converts_safely(source: int, target: int | None) -> bool:
    """The dtype-family rule: whether values of family ``source`` convert safely into family
    ``target``: the same family, or a later one for anything but bool."""
    return source == target or (target is not None and BOOL < source < target)


def holds_range_of(dtype: np.dtype, other: np.dtype) -> bool:
    """Whether integer ``dtype`` holds every value of integer ``other``."""
    smallest, largest = integer_range(dtype)
    other_smallest, other_largest = integer_range(other)
    return smallest <= other_smallest and other_largest <= largest


def is_concrete_array(x: Any) -> bool:
    """Whether ``x`` is a `jax.Array` holding data, not a tracer."""
    return isinstance(x, jax.Array) and not isinstance(x, Tracer)


def short_repr(value: Any, limit: int = 60) -> str:
    """Returns ``repr(value)``, cut to ``limit`` characters for messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def fits_weakly(value: int, dtype: np.dtype) -> bool:
    """Whether a Python int can enter a jitted update as it is (a weak int32) and fit ``dtype``."""
    if not _INT32_MIN <= value <= _INT32_MAX:
        return False
    kind = family(dtype)
    if kind == INT:
        smallest, largest = integer_range(dtype)
        return smallest <= value <= largest
    if kind == FLOAT:  # 70000 would be inf in float16: checked on the host instead
        return abs(value) <= _float_max(dtype)
    return True


@functools.cache
def _float_max(dtype: np.dtype) -> float:
    return float(jnp.finfo(dtype).max)


def distinct_elements(value: Any) -> Any:
    """Returns a NumPy array without the repeats of a broadcast view: one element along each
    axis of stride 0, so that a range check reads each distinct element once, never the
    2**40 elements that ``np.broadcast_to(x, (2**20, 2**20))`` shows. Anything else as it
    is."""
    if not isinstance(value, np.ndarray) or 0 not in value.strides or not value.size:
        return value
    return value[tuple(slice(0, 1) if step == 0 else slice(None) for step in value.strides)]


def convert_host_integers(value: int | np.ndarray | np.generic, dtype: np.dtype) -> Any:
    """Converts a Python int or NumPy integers to ``dtype`` on the host; None if out of range.

    Converting on the host keeps every value exact that ``dtype`` can hold: on its way into
    a jitted update a Python int becomes a weakly typed int32 (which overflows past 2**31)
    and NumPy int64 becomes int32 with x64 off (which wraps), and the conversion to an
    integer dtype wraps too (300 into int8 would give 44).
    """
    if family(dtype) == INT:
        smallest, largest = integer_range(dtype)
        if isinstance(value, int):
            low = high = value
        else:
            distinct = distinct_elements(value)
            low, high = (distinct.min(), distinct.max()) if value.size else (0, 0)
        if low < smallest or high > largest:
            return None
    try:
        with np.errstate(over="raise"):
            if isinstance(value, np.ndarray) and 0 in value.strides and value.size:
                # A broadcast view stays one: its distinct elements converted, broadcast.
                distinct = np.asarray(distinct_elements(value), dtype=dtype)
                return np.broadcast_to(distinct, value.shape)
            return np.asarray(value, dtype=dtype)
    except (OverflowError, FloatingPointError):
        return None


def check_device_range(value: jax.Array, dtype: np.dtype, action: str, described: Any) -> None:
    """Refuses a device integer array with values outside integer ``dtype``'s range.

    Args:
      value: a concrete integer `jax.Array`.
      dtype: the integer dtype it is to be converted to.
      action: what was attempted, for the message (``"Cannot assign to Variable 'w'"``).
      described: how the message names the value's dtype.

    Raises:
      DtypeMismatchError: if a value does not fit (300 into int8 would wrap to 44).
    """
    if holds_range_of(dtype, value.dtype) or not value.size:
        return
    low, high = int(value.min()), int(value.max())
    smallest, largest = integer_range(dtype)
    if low < smallest or high > largest:
        raise DtypeMismatchError(
            f"{action}: a value of dtype {described} (from {low} to {high}) is out of range "
            f"for the variable's dtype {dtype}"
        )


def check_not_deleted(value: Any, action: str, what: str = "value") -> None:
    """Refuses a value that is a deleted array (donated to a jitted function, or deleted).

    Args:
      value: the value (or index) given to create or update a variable.
      action: what was attempted, for the message (``"Cannot assign to Variable 'w'"``).
      what: what ``value`` is, for the message.

    Raises:
      ValueError: if ``value`` is a concrete `jax.Array` that has been deleted.
    """
    if is_concrete_array(value) and value.is_deleted():
        raise ValueError(
            f"{action}: the {what} is a {value.dtype}{list(value.shape)} array that has been "
            "deleted (donated to a jitted function or deleted with .delete())"
        ) from None


class _Source(NamedTuple):
    """A value classified for an update: the value (host values as a NumPy array), its dtype
    family (None if not numeric), its shape, and how messages name its dtype."""

    value: Any
    family: int | None
    shape: tuple[int, ...]
    described: Any


class Phrased(Protocol):
    """An update as messages name it (`statevar._cell.kernels.Operation`): ``"assign to"``, ``"add
    to"``."""

    @property
    def phrase(self) -> str: ...


def convert_for_update(
    value: Any,
    current: jax.Array | jax.ShapeDtypeStruct,
    name: str,
    operation: Phrased,
    target_shape: tuple[int, ...] | None = None,
) -> Any:
    """Validates ``value`` for an update of a variable, before anything is donated; returns it
    ready for the jitted update.

    Does not donate: the variable's array and ``value`` stay valid. A concrete array on
    another device is copied to the variable's sharding. The steps, in order: classify the
    value, check its dtype family, its integer range, its shape, then place it.

    Args:
      value: the value or delta; callers read a Variable into its array first.
      current: the variable's array; gives the dtype, shape and sharding to meet.
      name: the variable's name, for messages.
      operation: the update (its `Operation.phrase` names it in messages).
      target_shape: the shape of the indexed part for ``v[index] = value``; None for the
        whole variable.

    Returns:
      ``value`` itself when it can enter the update as it is, else converted: host integers
      to the variable's dtype, a concrete array to the variable's sharding.

    Raises:
      DtypeMismatchError: if the value is not numeric, or the conversion would lose
        information (a float into int32, 300 into int8).
      ShapeMismatchError: if the value does not broadcast to the variable's shape (or the
        indexed part's).
      TraceContextError: if the value is a tracer outside `statevar.jit` and `statevar.grad`.
      ValueError: if the value is an array that has been deleted.
    """
    if target_shape is None and _enters_as_it_is(value, current):
        return value  # the common assign_add(1.0), and v.assign(new) while tracing
    action = f"Cannot {operation.phrase} Variable '{name}'"
    expected = current.shape if target_shape is None else target_shape
    what = "variable" if target_shape is None else "indexed part"
    value, shape = convert(value, current.dtype, action, expected, what)
    return _place(value, shape, current)


def convert(
    value: Any,
    dtype: np.dtype,
    action: str,
    expected_shape: tuple[int, ...] | None = None,
    what: str = "variable",
) -> tuple[Any, tuple[int, ...]]:
    """The rules every value entering a variable follows, at creation and on every update:
    classify the value, check its dtype family, its integer range and (given
    ``expected_shape``) its shape. Returns the value, host integers converted to ``dtype``
    exactly, and its shape.

    Args:
      value: the value; callers read a Variable into its array first.
      dtype: the variable's dtype.
      action: what was attempted, for messages (``"Cannot assign to Variable 'w'"``).
      expected_shape: the shape the value must broadcast to (``what``'s); None: any.
      what: what ``expected_shape`` is the shape of, for messages.

    Raises:
      DtypeMismatchError: if the value is not numeric, or the conversion would lose
        information (a float into int32, 300 into int8).
      ShapeMismatchError: if the value does not broadcast to ``expected_shape``.
      TraceContextError: if the value is a tracer outside `statevar.jit` and `statevar.grad`.
      ValueError: if the value is an array that has been deleted.
    """
    check_not_deleted(value, action)
    source = _classify(value, action, dtype)
    if expected_shape is not None:
        # First, before any conversion, copy or range scan: a wrong shape is refused at
        # once, whatever the value's size (a broadcast view of 2**40 elements holds none).
        _check_shape(source.shape, expected_shape, action, what)
    _check_family(source, dtype, action)
    source = _widest_jax_dtype(source, action)
    converted = _fit_integers(source, dtype, action)
    converted = _fit_floats(source, converted, dtype, action)
    return converted, source.shape


def initial_dtype(initial_value: Any, dtype: Any, label: str) -> np.dtype:
    """The dtype of a variable created from ``initial_value``: ``dtype``, or else the
    value's own as JAX infers it (a Python float gives float32), as JAX stores it (64-bit
    dtypes become 32-bit unless x64 is on).

    Raises:
      DtypeMismatchError: if ``dtype`` is not a dtype, or it (or the value's own) is not a
        bool, integer, floating or complex dtype.
    """
    if dtype is not None:
        try:
            requested = jnp.dtype(dtype)
        except TypeError as error:
            raise DtypeMismatchError(
                f"Cannot create Variable '{label}' with dtype {dtype!r}: {error}"
            ) from None
    else:
        requested = _own_dtype(initial_value, label)
    if not getattr(requested, "isnative", True):  # (JAX's extended dtypes have none)
        requested = requested.newbyteorder("=")  # a big-endian NumPy array's, say
    if family(requested) is None:
        keys = jnp.issubdtype(requested, jax.dtypes.prng_key)
        raise DtypeMismatchError(
            f"Cannot create Variable '{label}' with dtype {requested}: expected a bool, "
            "integer, floating or complex dtype"
            + (
                ". Hold a key's data, Variable(jax.random.key_data(key)), and use "
                "jax.random.wrap_key_data(variable.value)"
                if keys
                else ""
            )
        )
    stored = jax.dtypes.canonicalize_dtype(requested)
    if dtype is not None and dtype not in (bool, int, float, complex) and stored != requested:
        # As jnp.array(x, dtype=jnp.float64) warns (and dtype=float, JAX's default float
        # type, does not).
        warnings.warn(
            f"Variable '{label}' was given dtype {requested}, which JAX does not store "
            f"without the jax_enable_x64 configuration option: it holds {stored}",
            UserWarning,
            stacklevel=caller_stacklevel(),
        )
    return stored


def _own_dtype(value: Any, label: str) -> np.dtype:
    """The dtype NumPy gives ``value`` (a Python int: int64), before JAX stores it."""
    if isinstance(value, (jax.Array, np.ndarray, np.generic)):
        return _EXTENDED.get(value.dtype, value.dtype)
    if type(value) in PYTHON_SCALARS:
        return np.dtype(type(value))
    described = f"{type(value).__name__} {short_repr(value)}"
    try:
        own = np.asarray(value).dtype
    except (TypeError, ValueError) as error:
        raise DtypeMismatchError(
            f"Cannot create Variable '{label}' from {described}: {error}"
        ) from None
    if family(own) is None:
        raise DtypeMismatchError(
            f"Cannot create Variable '{label}' from {described}: expected a bool, integer, "
            "floating or complex value"
        )
    return own


def _enters_as_it_is(value: Any, current: jax.Array | jax.ShapeDtypeStruct) -> bool:
    """Whether ``value`` can enter a jitted update of ``current`` unconverted, with nothing
    to check: a Python scalar that converts safely into its dtype, or a value traced for
    statevar of its very shape and dtype (a traced step may assign thousands of variables).
    """
    if isinstance(value, Tracer):
        return (
            value.shape == current.shape
            and value.dtype == current.dtype
            and _frames.innermost() is not None
        )
    dtype = current.dtype
    source = PYTHON_SCALARS.get(type(value))
    if source is None or not converts_safely(source, family(dtype)):
        return False
    if source == INT:
        return fits_weakly(value, dtype)
    # A float beyond the dtype's largest value may round to inf: checked on the host.
    return source == BOOL or not _beyond(value, dtype)


def _beyond(value: float | complex, dtype: np.dtype) -> bool:
    """Whether a finite Python float (or a complex's part) is beyond ``dtype``'s largest
    value (it may round to inf there)."""
    largest = max(abs(value.real), abs(value.imag))
    return math.isfinite(largest) and largest > _float_max(dtype)


def native_byte_order(value: Any) -> Any:
    """Returns a big-endian NumPy array (``np.array(x, ">f4")``) in the machine's byte
    order, as `jnp.asarray` reads it; anything else as it is."""
    if isinstance(value, np.ndarray) and not value.dtype.isnative:
        return value.astype(value.dtype.newbyteorder("="))
    return value


def _classify(value: Any, action: str, dtype: np.dtype) -> _Source:
    """Classifies an update's value: an array (refusing a tracer outside statevar's
    transformations), a Python scalar, or anything NumPy reads as a numeric array."""
    value = native_byte_order(value)
    if isinstance(value, (jax.Array, np.ndarray, np.generic)):
        if isinstance(value, Tracer) and _frames.innermost() is None:
            raise TraceContextError(
                f"{action} inside jax.jit, jax.grad or another JAX transformation: the "
                "variable would keep a tracer. Use statevar.jit and statevar.grad, which "
                "carry the update out of the trace."
            )
        return _Source(value, family(value.dtype), value.shape, value.dtype)
    if type(value) in PYTHON_SCALARS:
        kind = type(value)
        return _Source(value, PYTHON_SCALARS[kind], (), PYTHON_SCALAR_DTYPES[kind])
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as error:
        if "inhomogeneous" in str(error):
            raise _ragged_error(value, action, dtype) from None
        array = np.asarray(None)
    if array.size == 0 and array.dtype == np.float64 and not isinstance(value, np.ndarray):
        # An empty list holds no numbers; NumPy's float64 for it says nothing about them.
        array = array.astype(dtype)
        return _Source(array, family(dtype), array.shape, array.dtype)
    source = family(array.dtype)
    if source is None:
        raise DtypeMismatchError(
            f"{action}: expected a numeric value convertible to {dtype}, got "
            f"{type(value).__name__} {short_repr(value)}"
        )
    described: Any = array.dtype
    if array.dtype == np.float64 or array.dtype == np.int64:
        # Python numbers in a list are weakly typed, as in JAX.
        described = f"Python {PYTHON_SCALAR_DTYPES[_FAMILY_TYPES[source]]}s"
    return _Source(array, source, array.shape, described)


def value_shape(value: Any, action: str, dtype: np.dtype) -> tuple[int, ...]:
    """The shape of an update's value, as NumPy reads it.

    Raises:
      DtypeMismatchError: for a ragged sequence (rows of different lengths).
    """
    try:
        return np.shape(value)
    except ValueError as error:
        if "inhomogeneous" in str(error):
            raise _ragged_error(value, action, dtype) from None
        raise


def _ragged_error(value: Any, action: str, dtype: np.dtype) -> DtypeMismatchError:
    return DtypeMismatchError(
        f"{action}: expected a numeric value convertible to {dtype}, got "
        f"{type(value).__name__} {short_repr(value)}, which is ragged (its rows have "
        "different lengths, so it is no array)"
    )


# NumPy's extended-precision floats, which JAX cannot take: read as the widest it can.
_EXTENDED = {
    np.dtype(np.longdouble): np.dtype(np.float64),
    np.dtype(np.clongdouble): np.dtype(np.complex128),
}


def _widest_jax_dtype(source: _Source, action: str) -> _Source:
    """A host value of NumPy's extended precision (``np.longdouble``), which JAX cannot
    take, converted to float64 (or complex128): the range checks that follow refuse what
    the variable's dtype cannot hold.

    Raises:
      DtypeMismatchError: for a finite value beyond float64's range.
    """
    value = source.value
    if not isinstance(value, (np.ndarray, np.generic)) or value.dtype not in _EXTENDED:
        return source
    wider = _EXTENDED[value.dtype]
    if wider == value.dtype:  # where long double is double (Windows, some ARM)
        return source
    distinct = distinct_elements(value)
    with np.errstate(over="ignore", invalid="ignore"):
        converted = distinct.astype(wider)
    lost = np.isfinite(distinct) & ~np.isfinite(converted)
    if lost.any():
        raise DtypeMismatchError(
            f"{action}: a value of dtype {value.dtype} "
            f"({str(np.asarray(distinct)[lost].flat[0])}) is out of range for every dtype JAX "
            "holds"
        )
    if converted.shape != np.shape(value):  # a broadcast view stays one
        converted = np.broadcast_to(converted, np.shape(value))
    return _Source(converted, source.family, source.shape, source.described)


def _check_family(source: _Source, dtype: np.dtype, action: str) -> None:
    """Refuses a value whose dtype family does not convert safely into ``dtype``'s."""
    target = family(dtype)
    if source.family is not None and converts_safely(source.family, target):
        return
    families = (
        ""
        if source.family is None
        else f" ({FAMILY_NAMES[source.family]} into {FAMILY_NAMES[cast(int, target)]})"
    )
    raise DtypeMismatchError(
        f"{action}: a value of dtype {source.described} cannot be converted safely to the "
        f"variable's dtype {dtype}{families}"
    )


def _fit_integers(source: _Source, dtype: np.dtype, action: str) -> Any:
    """Refuses integers out of ``dtype``'s range; returns host integers converted to it."""
    value = source.value
    if source.family != INT:
        return value
    if family(dtype) == INT and is_concrete_array(value):
        check_device_range(value, dtype, action, source.described)
    if isinstance(value, jax.Array):
        return value
    converted = convert_host_integers(value, dtype)
    if converted is None:
        raise DtypeMismatchError(
            f"{action}: a value of dtype {source.described} ({short_repr(value)}) is out of "
            f"range for the variable's dtype {dtype}"
        )
    return converted


def _fit_floats(source: _Source, value: Any, dtype: np.dtype, action: str) -> Any:
    """Refuses finite host floats that floating ``dtype`` cannot hold: converted, they would
    become inf (70000.0 in float16, 1e40 in float32). Converts as JAX does: a Python float,
    or a float64 array with x64 off, becomes float32 first. Returns the value as it is
    (values on a device are not checked: that would wait for them)."""
    if source.family not in (FLOAT, COMPLEX) or family(dtype) not in (FLOAT, COMPLEX):
        return value
    if isinstance(value, (float, complex)):
        if not _beyond(value, dtype):
            return value
        array: Any = np.asarray(value)
    elif (
        isinstance(value, (np.ndarray, np.generic))
        and value.dtype != dtype
        and _float_max(value.dtype) > _float_max(dtype)  # else every value fits
    ):
        array = value
    else:
        return value
    array = distinct_elements(array)  # a broadcast view's repeats need no second look
    with np.errstate(over="ignore", invalid="ignore"):
        converted = array.astype(jax.dtypes.canonicalize_dtype(array.dtype)).astype(dtype)
    lost = np.isfinite(array) & ~np.isfinite(converted)
    if lost.any():
        raise DtypeMismatchError(
            f"{action}: a value of dtype {source.described} "
            f"({short_repr(np.asarray(array)[lost].flat[0].item())}) is out of range for the "
            f"variable's dtype {dtype}, whose largest value is {_float_max(dtype):.6g}: it "
            f"would become {np.asarray(converted)[lost].flat[0]}"
        )
    return value


def broadcasts_to(shape: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    """Whether a value of ``shape`` broadcasts to ``expected`` (NumPy's rules)."""
    if shape == expected:
        return True
    try:
        return np.broadcast_shapes(shape, expected) == expected
    except ValueError:
        return False


def _check_shape(shape: tuple[int, ...], expected: tuple[int, ...], action: str, what: str) -> None:
    """Refuses a value whose shape does not broadcast to ``expected`` (``what``'s shape)."""
    if not broadcasts_to(shape, expected):
        raise ShapeMismatchError(
            f"{action}: shape {shape} does not match the {what}'s shape {expected}"
        )


def _place(value: Any, shape: tuple[int, ...], current: jax.Array | jax.ShapeDtypeStruct) -> Any:
    """Copies a concrete array on another placement to the variable's sharding (replicated
    over several devices for a part or a broadcast value)."""
    if not is_concrete_array(value) or value.sharding == current.sharding:
        return value
    sharding = current.sharding
    if shape != current.shape and is_multi_device(sharding):
        sharding = replicated(sharding)
    if value.sharding != sharding:
        value = jax.device_put(value, sharding)
    return value
