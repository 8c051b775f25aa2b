"""The arguments of `statevar.random.Generator`: seeds, keys, shapes, dtypes and the
parameters of a draw, checked before the generator's key advances, and the compiled
functions that draw from a key.

Every check names the generator and the method (``where``), what it expected and what it
was given, so that no JAX or NumPy error about a bad argument reaches the user.
"""

from __future__ import annotations

import functools
import operator
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._cell.convert import Tracer
from ._errors import ShapeMismatchError

# Seeds are taken as 32 bits, whatever jax_enable_x64 says: without it JAX would keep the
# low 32 bits of a larger seed, silently giving 2**32 the stream of 0.
SEED_LIMIT = 2**32
# skip(n) counts in an int32 loop whatever jax_enable_x64 says.
SKIP_LIMIT = 2**31

_KINDS = {
    "integer": ("an integer or an integer array", (jnp.integer,)),
    "real": ("a real number or a real array", (jnp.integer, jnp.floating)),
    "number": ("a number or a numeric array", (jnp.integer, jnp.floating, jnp.complexfloating)),
    "probability": ("a number or a floating array", (jnp.floating,)),
}


def describe(value: object) -> str:
    """``value`` for a message: an array by its dtype and shape, anything else by its type
    and repr."""
    if isinstance(value, (jax.Array, np.ndarray)):
        return f"an array of dtype {value.dtype} and shape {value.shape}"
    return f"{type(value).__name__} {value!r}"


def _is_dtype(value: object) -> bool:
    """Whether ``value`` names a dtype (``jnp.float32``, ``np.dtype("int8")``, ``float``)
    rather than being a number."""
    return isinstance(value, (np.dtype, type))


def is_key(value: object) -> bool:
    """Whether ``value`` is a typed PRNG key array."""
    return isinstance(value, jax.Array) and jnp.issubdtype(value.dtype, jax.dtypes.prng_key)


def initial_key(seed: Any, impl: str | None, where: str) -> jax.Array:
    """The typed key a Generator starts from, or is reset to: ``seed``'s own, or
    ``jax.random.key(seed, impl=impl)``.

    Raises:
      TypeError: if ``seed`` is neither an integer (a bool is not; an integer scalar array
        is) nor a typed key.
      ValueError: if ``seed`` is a concrete integer out of range, keys of another shape
        than (), a key of another implementation than ``impl``, or ``impl`` is unknown.
    """
    if is_key(seed):
        if seed.shape != ():
            raise ValueError(
                f"Expected the seed of {where} to be one key, got keys of shape {seed.shape}: "
                "pass one of them (keys[0])"
            )
        check_impl(seed, impl, where)
        return seed
    integer = isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_))
    if not integer and not (
        isinstance(seed, (jax.Array, np.ndarray))
        and seed.shape == ()
        and jnp.issubdtype(seed.dtype, jnp.integer)
    ):
        hint = ""
        if isinstance(seed, (jax.Array, np.ndarray)) and seed.dtype == np.uint32:
            hint = ": for raw key data, use statevar.random.Generator.from_key(data)"
        raise TypeError(
            f"Expected the seed of {where} to be an integer or a typed key, got "
            f"{describe(seed)}{hint}"
        )
    if not isinstance(seed, Tracer) and not 0 <= int(seed) < SEED_LIMIT:
        raise ValueError(
            f"Expected the seed of {where} to be a non-negative integer below 2**32, got "
            f"{int(seed)}"
        )
    return jax.random.key(int(seed) if integer else seed, impl=checked_impl(impl, where))


def checked_impl(impl: str | None, where: str) -> str | None:
    """Returns ``impl`` if JAX knows a PRNG implementation by that name (or it is None).

    Raises:
      TypeError: if it is not a string.
      ValueError: if JAX knows no implementation by that name.
    """
    if impl is None:
        return None
    if not isinstance(impl, str):
        raise TypeError(
            f"Expected the impl given to {where} to be the name of a JAX PRNG implementation "
            f"(such as 'threefry2x32' or 'rbg'), got {describe(impl)}"
        )
    try:
        jax.random.key_impl(jax.random.key(0, impl=impl))
    except ValueError as error:
        raise ValueError(f"Expected a PRNG implementation for {where}: {error}") from None
    return impl


def check_impl(key: jax.Array, impl: str | None, where: str) -> None:
    """Raises a ValueError if ``impl`` is given and is not ``key``'s implementation."""
    if impl is not None and str(jax.random.key_impl(key)) != checked_impl(impl, where):
        raise ValueError(
            f"Expected a key of implementation {impl!r} for {where}, got a key of "
            f"implementation {str(jax.random.key_impl(key))!r}"
        )


def os_key_data(impl: str | None) -> jax.Array:
    """Key data of ``impl`` (JAX's default when None) read from the operating system's
    source of randomness, as much as the key holds."""
    shape = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0, impl=impl))).shape
    size = int(np.prod(shape))
    return jnp.asarray(np.frombuffer(os.urandom(4 * size), dtype=np.uint32).reshape(shape))


def key_data(
    value: Any, impl: str, shape: tuple[int, ...], where: str, seed_method: str
) -> jax.Array:
    """Returns the raw key data of ``value`` (a typed key, or raw ``uint32`` key data, or a
    Variable holding either) for a
    generator of ``impl`` whose state has ``shape``. An integer is refused with a pointer to
    ``seed_method``, which takes seeds.

    Raises:
      TypeError: if ``value`` is neither a typed key nor a ``uint32`` array.
      ValueError: if it is a key of another implementation, several keys, or data of
        another shape.
    """
    if hasattr(value, "__jax_array__") and not isinstance(value, jax.Array):
        value = jnp.asarray(value)  # a Variable: its value
    if is_key(value):
        if value.shape != ():
            raise ValueError(
                f"Expected {where} to be given one key, got keys of shape {value.shape}"
            )
        check_impl(value, impl, where)
        return jax.random.key_data(value)
    if not isinstance(value, (jax.Array, np.ndarray)) or value.dtype != np.uint32:
        raise TypeError(
            f"Expected {where} to be given a typed key or its raw uint32 data "
            f"(jax.random.key_data), got {describe(value)}"
            + (f": for a seed, use {seed_method}(seed)" if isinstance(value, int) else "")
        )
    if value.shape != shape:
        raise ValueError(
            f"Expected {where} to be given key data of shape {shape} (implementation "
            f"{impl!r}), got shape {value.shape}"
        )
    return jnp.asarray(value)


def check_name(name: Any, where: str) -> None:
    """Raises a TypeError unless ``name`` (TensorFlow's operation name) is a str or None."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"Expected the name given to {where} to be a str, got {describe(name)}")


def count(
    value: Any, where: str, what: str, *, limit: int | None = None, arrays: bool = False
) -> Any:
    """Returns ``value`` as a non-negative count: a Python integer or, with ``arrays``, an
    integer scalar array (checked where it is concrete, and returned as a JAX array).

    Raises:
      TypeError: if it is not an integer.
      ValueError: if it is concrete and negative, or at least ``limit``.
    """
    integer = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if not integer:
        if not (
            arrays
            and isinstance(value, (jax.Array, np.ndarray))
            and value.shape == ()
            and jnp.issubdtype(value.dtype, jnp.integer)
        ):
            raise TypeError(
                f"Expected {where} to be given an integer {what}, got {describe(value)}"
            )
        if isinstance(value, Tracer):
            return value
    number = int(value)
    if number < 0 or (limit is not None and number >= limit):
        bound = "" if limit is None else f" below 2**{limit.bit_length() - 1}"
        raise ValueError(f"Expected {where} to be given a non-negative {what}{bound}, got {number}")
    return number if integer else jnp.asarray(value)


def shape_of(shape: Any, where: str, hint: str = "") -> tuple[int, ...]:
    """Returns ``shape`` as a tuple of ints.

    Raises:
      TypeError: if it is not an integer or a sequence of integers.
      ValueError: if a dimension is negative.
    """
    dimensions = (shape,) if isinstance(shape, (int, np.integer)) else shape
    if not isinstance(dimensions, Sequence) or any(
        isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)) for d in dimensions
    ):
        raise TypeError(
            f"Expected the shape given to {where} to be a sequence of integers, got "
            f"{describe(shape) if isinstance(shape, (jax.Array, np.ndarray)) else repr(shape)}"
            f"{hint}"
        )
    if any(d < 0 for d in dimensions):
        raise ValueError(
            f"Expected the shape given to {where} to have non-negative dimensions, got "
            f"{tuple(map(int, dimensions))}"
        )
    return tuple(map(operator.index, dimensions))


def dtype_of(dtype: Any, where: str, expected: str, kinds: tuple[type, ...]) -> np.dtype:
    """Returns ``dtype`` as JAX holds it (64-bit dtypes are 32-bit unless jax_enable_x64 is
    on, as in JAX).

    Raises:
      TypeError: unless ``dtype`` is a dtype of one of ``kinds``.
    """
    try:
        given = jax.dtypes.canonicalize_dtype(dtype)
    except TypeError:
        given = None
    if given is None or not any(jnp.issubdtype(given, kind) for kind in kinds):
        got = repr(dtype) if given is None else str(given)
        raise TypeError(f"Expected {expected} dtype for {where}, got {got}")
    return np.dtype(given)


def operand(value: Any, name: str, where: str, shape: tuple[int, ...] | None, kind: str) -> Any:
    """Returns a parameter of a draw (a mean, a bound, a probability) as given, or as an
    array, after checking that it is ``kind`` (see ``_KINDS``) and broadcasts to
    ``shape`` (any shape where ``shape`` is None).

    Raises:
      TypeError: if it is not a number or an array of ``kind`` (a dtype given where a
        parameter goes is named as such).
      ShapeMismatchError: if its shape does not broadcast to ``shape``.
    """
    text, kinds = _KINDS[kind]
    if _is_dtype(value):
        raise TypeError(
            f"Expected {name} given to {where} to be {text}, got the dtype "
            f"{value!r}: pass the dtype by keyword (dtype=...), as TensorFlow's signature "
            "puts it last"
        )
    if hasattr(value, "__jax_array__") and not isinstance(value, jax.Array):
        value = jnp.asarray(value)  # a Variable: its value
    try:
        dtype = value.dtype if isinstance(value, jax.Array) else np.asarray(value).dtype
        value_shape = np.shape(value)
    except (TypeError, ValueError):
        dtype, value_shape = np.dtype(object), ()
    scalar = isinstance(value, (int, float)) and kind != "integer"  # Python's: weakly typed
    if isinstance(value, (bool, np.bool_)) or not (
        scalar or any(jnp.issubdtype(dtype, k) for k in kinds)
    ):
        raise TypeError(
            f"Expected {name} given to {where} to be {text}, got "
            f"{describe(value) if dtype.kind in 'biufc' else type(value).__name__}"
        )
    if shape is not None and _broadcasts(value_shape, shape) != shape:
        raise ShapeMismatchError(
            f"Expected {name} given to {where} to broadcast to the shape {shape}, got shape "
            f"{value_shape}"
        )
    if isinstance(value, int) and kind != "integer":
        return float(value)  # within a float's range, where it might not be within int32's
    return np.asarray(value) if isinstance(value, (list, tuple)) else value


def _broadcasts(value_shape: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return tuple(np.broadcast_shapes(value_shape, shape))
    except ValueError:
        return None


def check_bounds(value: Any, name: str, where: str, dtype: np.dtype) -> None:
    """Raises a ValueError if concrete integer ``value`` has values that ``dtype`` cannot
    hold (JAX would clip them, or refuse a Python integer with an OverflowError)."""
    values = concrete(value)
    info = np.iinfo(dtype)
    if values is not None and not np.all((values >= info.min) & (values <= info.max)):
        raise ValueError(
            f"Expected {name} given to {where} to be within the range of {dtype}, "
            f"[{info.min}, {info.max}], got {values if values.size <= 8 else 'values outside it'}"
        )


def concrete(value: Any) -> np.ndarray | None:
    """``value``'s values as a NumPy array, or None where it is traced."""
    return None if isinstance(value, Tracer) else np.asarray(value)


def check_range(value: Any, name: str, where: str, low: float, high: float | None) -> None:
    """Raises a ValueError if concrete ``value`` has values outside ``[low, high]`` (NaN
    included); ``high`` None means no upper bound."""
    values = concrete(value)
    if values is None:
        return
    inside = values >= low if high is None else (values >= low) & (values <= high)
    if not np.all(inside):
        between = f"at least {low}" if high is None else f"between {low} and {high}"
        raise ValueError(
            f"Expected {name} given to {where} to be {between}, got "
            f"{values if values.size <= 8 else 'values outside it'}"
        )


@functools.partial(jax.jit, static_argnums=(1, 2))
def split(data: jax.Array, impl: str, count: int) -> tuple[jax.Array, jax.Array]:
    """Splits the key whose raw data is ``data`` into the key data the generator keeps and
    ``count`` typed keys to draw from. One function, compiled or inlined into a compiled
    step, so that eager and compiled draws take the same keys."""
    keys = jax.random.split(jax.random.wrap_key_data(data, impl=impl), count + 1)
    return jax.random.key_data(keys[0]), keys[1:]


@functools.partial(jax.jit, static_argnums=1)
def skip(data: jax.Array, impl: str, n: jax.Array) -> jax.Array:
    """The key data a generator holds after ``n`` draws from ``data``."""
    return jax.lax.fori_loop(0, n, lambda _, kept: split(kept, impl, 1)[0], data)


@functools.partial(jax.jit, static_argnames=("shape", "dtype", "truncated"))
def normal(key, mean, stddev, *, shape, dtype, truncated):
    """``mean + stddev * z``, with ``z`` standard normal, truncated to [-2, 2] if asked."""
    if truncated:
        z = jax.random.truncated_normal(key, -2.0, 2.0, shape, dtype)
    else:
        z = jax.random.normal(key, shape, dtype)
    return jnp.asarray(mean, dtype) + jnp.asarray(stddev, dtype) * z


@functools.partial(jax.jit, static_argnames=("shape", "dtype"))
def uniform(key, minval, maxval, *, shape, dtype):
    """Values uniform in ``[minval, maxval)``: integers for an integer dtype."""
    if jnp.issubdtype(dtype, jnp.integer):
        return jax.random.randint(key, shape, minval, maxval, dtype)
    return jax.random.uniform(key, shape, dtype, minval, maxval)


@functools.partial(jax.jit, static_argnames=("shape",))
def bernoulli(key, p, *, shape):
    """Booleans, each True with probability ``p`` (a Python integer taken as a float)."""
    p = jnp.asarray(p)
    return jax.random.bernoulli(key, p if jnp.issubdtype(p.dtype, jnp.floating) else 1.0 * p, shape)


@functools.partial(jax.jit, static_argnames=("shape", "dtype"))
def binomial(key, counts, probs, *, shape, dtype):
    """Binomial counts, drawn in a floating dtype (``dtype``'s own, or JAX's default float)
    and given in ``dtype``."""
    floating = dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.dtype(jnp.result_type(float))
    counts, probs = jnp.asarray(counts, floating), jnp.asarray(probs, floating)
    return jax.random.binomial(key, counts, probs, shape, floating).astype(dtype)


@functools.partial(jax.jit, static_argnames=("shape", "dtype"))
def full_int(key, *, shape, dtype):
    """Integers over ``dtype``'s whole range: random bits, read as ``dtype``."""
    bits = jax.random.bits(key, shape, np.dtype(f"uint{8 * dtype.itemsize}"))
    return (
        bits
        if jnp.issubdtype(dtype, jnp.unsignedinteger)
        else jax.lax.bitcast_convert_type(bits, dtype)
    )
