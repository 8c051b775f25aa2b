"""Indexed updates of a variable (``v[index] = value``): the index read as NumPy reads it,
masks, and the indexed part's shape; `Variable.__setitem__` calls `set_item`, which checks
everything before the variable's update runs."""

from __future__ import annotations

import operator
from typing import Any

import jax
import numpy as np

from . import placement as _placement
from .cell import Cell
from .convert import (
    Tracer,
    check_not_deleted,
    is_concrete_array,
    native_byte_order,
    short_repr,
)
from .operators import ArrayOperators


def indexed_shape(variable: Cell, index: Any, traced: bool = False) -> tuple[int, ...]:
    """The shape of ``self[index]``, by NumPy's rules (JAX's for a ``traced`` index).

    Raises:
      IndexError: if the index is out of range, or selects by a traced boolean.
      ValueError: for a slice step of 0.
    """
    action = f"Cannot set Variable '{variable.name}'"
    if not traced:
        return index_shape(variable.shape, index, action)
    try:
        abstract = jax.ShapeDtypeStruct(variable.shape, variable.dtype)
        return jax.eval_shape(lambda x: x[index], abstract).shape
    except jax.errors.NonConcreteBooleanIndexError:
        raise IndexError(
            f"{action}[{short_repr(index)}]: a traced boolean "
            "index selects a number of elements known only when the step runs. Use "
            "v[mask] = scalar with a mask of the variable's shape, or "
            "v.assign(jnp.where(mask, new, v))"
        ) from None
    except (IndexError, ValueError) as error:  # out of range; a slice step of 0
        raise type(error)(
            f"{action}[{short_repr(index)}]: {error} (the variable's shape is {variable.shape})"
        ) from None


def concrete_index(variable: Cell, index: Any) -> Any:
    """Returns ``index`` with each slice bound that is a Variable or an array read to a
    Python int, as NumPy reads it (``__index__``), each list made a NumPy array, as
    NumPy takes it (a list of bools is a mask), and each big-endian NumPy array made
    native.

    A slice is part of the compiled update's static key: a Variable there would key it
    by identity, so a later update would reuse the bounds it had first.

    Raises:
      TypeError: for a bound that is not an integer, or that is traced (a slice's size
        must be known when the step is compiled).
    """

    def bound(part: Any) -> Any:
        if part is None or type(part) is int:
            return part
        part = read_operand(part)
        if isinstance(part, Tracer):
            raise TypeError(
                f"Cannot set Variable '{variable.name}'[{short_repr(index)}]: a slice bound "
                "is traced, so the slice's size is unknown when the step compiles. Use "
                "jax.lax.dynamic_update_slice for a slice of fixed size at a traced start"
            )
        try:
            return operator.index(part)
        except TypeError:
            raise TypeError(
                f"Cannot set Variable '{variable.name}'[{short_repr(index)}]: slice bounds "
                f"must be integers or None, got {short_repr(part)}"
            ) from None

    def read(part: Any) -> Any:
        if isinstance(part, slice):
            return slice(bound(part.start), bound(part.stop), bound(part.step))
        if isinstance(part, list):
            array = np.asarray(part)
            # NumPy's float64 for an empty list says nothing: an empty integer index.
            return array.astype(np.intp) if array.size == 0 else array
        return native_byte_order(part)

    return tuple(map(read, index)) if isinstance(index, tuple) else read(index)


def placed_index(variable: Cell, index: Any) -> Any:
    """Refuses deleted index arrays, and copies index arrays on another device to the
    variable's, as `convert_for_update` does for values."""
    action = f"Cannot set an item of Variable '{variable.name}'"

    # Over several devices: a mask takes the variable's sharding, other indices are
    # replicated.
    own = variable.sharding
    other = _placement.replicated(own)

    def place(part: Any) -> Any:
        if is_concrete_array(part):
            check_not_deleted(part, action, what="index")
            sharding = own if part.shape == variable.shape else other
            if part.sharding != sharding:
                return jax.device_put(part, sharding)
        return part

    return tuple(map(place, index)) if isinstance(index, tuple) else place(index)


def _boolean_rank(part: Any) -> int | None:
    """The rank of a concrete boolean index part (0 for ``True`` or ``np.True_``); None for
    anything else."""
    if isinstance(part, (bool, np.bool_)):
        return 0
    is_array = is_concrete_array(part) or isinstance(part, np.ndarray)
    return part.ndim if is_array and part.dtype == np.bool_ else None


def _is_mask(part: Any) -> bool:
    rank = _boolean_rank(part)
    return rank is not None and rank > 0


def is_scalar_mask(part: Any) -> bool:
    return _boolean_rank(part) == 0


def masks_to_indices(index: Any) -> Any:
    """Replaces each concrete boolean mask in ``index`` by the integer arrays it selects."""
    parts = index if isinstance(index, tuple) else (index,)
    if not any(_is_mask(part) for part in parts):
        return index
    return tuple(
        selected
        for part in parts
        for selected in (np.nonzero(np.asarray(part)) if _is_mask(part) else (part,))
    )


def on_host(part: Any) -> bool:
    """Whether an index part is one NumPy checks without waiting for a device or a trace:
    an integer, a slice of integers, None, Ellipsis, or integers or bools in a NumPy array
    or a list. (Anything else, JAX takes or refuses itself.)"""
    if part is None or part is Ellipsis or isinstance(part, (int, np.integer, np.bool_)):
        return True
    if isinstance(part, slice):
        return all(
            bound is None or isinstance(bound, (int, np.integer))
            for bound in (part.start, part.stop, part.step)
        )
    if isinstance(part, np.ndarray):
        return part.dtype == np.bool_ or np.issubdtype(part.dtype, np.integer)
    return isinstance(part, list) and all(
        isinstance(item, (int, np.integer, np.bool_)) for item in part
    )


def index_shape(shape: tuple[int, ...], index: Any, action: str) -> tuple[int, ...]:
    """The shape of ``x[index]`` for an array ``x`` of ``shape``, by NumPy's rules.

    Raises:
      IndexError: if the index is out of range (naming ``action``, as in ``"Cannot read
        Variable 'w'"``).
      ValueError: for a slice step of 0.
    """
    parts = index if isinstance(index, tuple) else (index,)
    try:
        return np.broadcast_to(np.empty((), np.bool_), shape)[
            tuple(np.asarray(part) if isinstance(part, jax.Array) else part for part in parts)
        ].shape
    except (IndexError, ValueError) as error:  # out of range; a slice step of 0
        raise type(error)(
            f"{action}[{short_repr(index)}]: {error} (the variable's shape is {shape})"
        ) from None


def unwrap_index(index: Any) -> Any:
    """Returns ``index`` with every variable (or view) in it replaced by its value."""
    if isinstance(index, ArrayOperators):
        return index._read()
    if isinstance(index, tuple):
        return tuple(part._read() if isinstance(part, ArrayOperators) else part for part in index)
    return index


def read_operand(x: Any) -> Any:
    """Returns a variable's (or view's) current, possibly traced, value; anything else as
    it is."""
    return x._read() if isinstance(x, ArrayOperators) else x


def split_index(index: Any) -> tuple[tuple, tuple]:
    """Splits an index into a hashable static part and a tuple of dynamic integer parts.

    Integers and integer or boolean arrays become dynamic, so ``v[i] = x`` in a loop over
    ``i`` compiles once; slices, ``None`` and ``Ellipsis`` stay static.
    """
    parts = index if isinstance(index, tuple) else (index,)
    static, dynamic = [], []
    for part in parts:
        if isinstance(part, slice):
            static.append(("slice", part.start, part.stop, part.step))
        elif part is None or part is Ellipsis:
            static.append(part)
        else:
            static.append("dynamic")
            dynamic.append(part)
    return tuple(static), tuple(dynamic)


def rebuild_index(static: tuple, dynamic: tuple) -> tuple:
    """Inverts `split_index`."""
    remaining = iter(dynamic)
    index = []
    for part in static:
        if isinstance(part, tuple):
            index.append(slice(*part[1:]))
        elif part == "dynamic":
            index.append(next(remaining))
        else:
            index.append(part)
    return tuple(index)
