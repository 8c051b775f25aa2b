"""The jitted, buffer-donating updates behind ``assign``, ``assign_add``, ``assign_sub`` and
``v[i] = x``.

Each update exists twice: a donating version, used when the variable is the only holder of
its array (so XLA writes the result into the old buffer), and a copying version, used when
something else still holds the old array (a read taken earlier, a NumPy view, another
variable), which must stay valid. Whether anything else holds the array is read off its
reference count, calibrated below against the same access pattern.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.core import Tracer
from jax.sharding import Sharding

from .. import _caches
from . import copies as _copies
from .indexing import rebuild_index
from .placement import is_explicit, pin


def _fit(value: jax.Array, like: Any) -> jax.Array:
    """Converts ``value`` to ``like``'s dtype and broadcasts it to ``like``'s shape."""
    aval = getattr(value, "aval", None)
    if aval is not None and aval.dtype == like.dtype and aval.shape == like.shape:
        if not aval.weak_type:
            # Already fits: no conversion to trace (a step assigning 10,000 variables would
            # trace, lower and compile 10,000 of them).
            return value
    return jnp.broadcast_to(lax.convert_element_type(value, like.dtype), like.shape)


def _assign(old: jax.Array, value: Any) -> jax.Array:
    return _fit(value, old)


def _assign_in_place(old: jax.Array, value: Any) -> jax.Array:
    # Writing over ``old`` keeps it an input of the computation: JAX drops the donation of an
    # argument the result does not use (so the update would take a fresh buffer) and places
    # the computation by its remaining arguments (so a variable could change device).
    return lax.dynamic_update_slice(old, _fit(value, old), (0,) * old.ndim)


def _assign_add(old: jax.Array, delta: Any) -> jax.Array:
    return old + _fit(delta, old)


def _assign_sub(old: jax.Array, delta: Any) -> jax.Array:
    return old - _fit(delta, old)


def _set_item(old: jax.Array, value: Any, dynamic: tuple, static: tuple) -> jax.Array:
    index = rebuild_index(static, dynamic)
    return old.at[index].set(_fit(value, jax.eval_shape(lambda x: x[index], old)))


def _set_where(old: jax.Array, value: Any, mask: jax.Array) -> jax.Array:
    return jnp.where(mask, _fit(value, old), old)


@dataclasses.dataclass(frozen=True, eq=False)
class Operation:
    """One update of a variable, everything about it in one record.

    Each exists once (`ASSIGN`, `ASSIGN_ADD`, `ASSIGN_SUB`, `SETITEM`, `SETMASK`) and is
    compared and hashed by identity. The jitted kernels are bound once, at import: the eager
    update is a hot path.

    Attributes:
      name: the method's name (``"assign"``): keys compiled updates and placement logs.
      phrase: how messages name it, as in ``f"Cannot {phrase} Variable 'w'"``.
      pure: the update as a pure function ``(old, value, *index) -> new``, for traces.
      donating: the jitted update donating ``old``, for an array only the variable holds.
      copying: the jitted update without donation, for an array something else holds.
      arithmetic: whether it adds or subtracts, which a bool variable refuses.
    """

    name: str
    phrase: str
    pure: Callable[..., jax.Array]
    donating: Callable[..., jax.Array]
    copying: Callable[..., jax.Array]
    arithmetic: bool = False


def _operation(
    name: str,
    phrase: str,
    pure: Callable[..., jax.Array],
    *,
    kernel: Callable[..., jax.Array] | None = None,
    static_argnums: tuple[int, ...] = (),
    arithmetic: bool = False,
) -> Operation:
    """Builds an `Operation`, jitting ``kernel`` (``pure`` unless given) twice."""
    kernel = kernel or pure
    donating = jax.jit(kernel, donate_argnums=0, static_argnums=static_argnums)
    copying = jax.jit(kernel, static_argnums=static_argnums)
    return Operation(name, phrase, pure, donating, copying, arithmetic)


ASSIGN = _operation("assign", "assign to", _assign, kernel=_assign_in_place)
ASSIGN_ADD = _operation("assign_add", "assign_add to", _assign_add, arithmetic=True)
ASSIGN_SUB = _operation("assign_sub", "assign_sub to", _assign_sub, arithmetic=True)
SETITEM = _operation("setitem", "set an item of", _set_item, static_argnums=(3,))
SETMASK = _operation("setmask", "set an item of", _set_where)
# Every operation by its name.
OPERATIONS: dict[str, Operation] = {
    operation.name: operation for operation in (ASSIGN, ASSIGN_ADD, ASSIGN_SUB, SETITEM, SETMASK)
}

copy_array = jax.jit(jnp.copy)


@_caches.register_cached
@functools.cache
def pinned_updates(operation: Operation, sharding: Sharding) -> tuple[Callable, Callable]:
    """Returns (donating, copying) jitted versions of an update for a variable over several
    devices, whose results keep its ``sharding`` and reuse its buffers shard by shard,
    whatever the placement of the value (which plain jit would let decide the result's)."""
    update = _pinned(operation, sharding)
    static_argnums = (3,) if operation is SETITEM else ()
    return (
        jax.jit(update, donate_argnums=0, out_shardings=sharding, static_argnums=static_argnums),
        jax.jit(update, out_shardings=sharding, static_argnums=static_argnums),
    )


def _pinned(operation: Operation, sharding: Sharding) -> Callable[..., jax.Array]:
    """Returns ``operation``'s pure update with its result (and value) pinned to ``sharding``."""
    if operation is SETITEM:
        explicit = is_explicit(sharding)

        def set_item(old: Any, value: Any, dynamic: tuple, static: tuple) -> jax.Array:
            index = rebuild_index(static, dynamic)
            unsharded = jax.ShapeDtypeStruct(old.shape, old.dtype)
            part = _fit(value, jax.eval_shape(lambda x: x[index], unsharded))
            if explicit:
                # On Explicit axes JAX's scatter shards the value as the slice it replaces,
                # which jax 0.12.1 rejects for a slice narrower than its mesh axis (rows
                # 2:4 over 4 shards): scattered on Auto axes, the result given the sharding.
                def scatter(old: jax.Array, part: jax.Array) -> jax.Array:
                    return old.at[index].set(part)

                # (auto_axes returns a decorator when given no function: cast to the call)
                on_auto = cast(
                    Callable[..., jax.Array],
                    jax.sharding.auto_axes(scatter, out_sharding=sharding),
                )
                return on_auto(old, part)
            return pin(old.at[index].set(part), sharding)

        return set_item

    if operation is ASSIGN:

        def assign(old: Any, value: Any) -> jax.Array:
            new = pin(_fit(value, old), sharding)
            return pin(lax.dynamic_update_slice(old, new, (0,) * old.ndim), sharding)

        return assign

    pure = operation.pure

    def update(old: Any, value: Any, *index: Any) -> jax.Array:
        return pin(pure(old, pin(_fit(value, old), sharding), *index), sharding)

    return update


def fresh(value: Any, like: jax.Array | jax.ShapeDtypeStruct) -> jax.Array:
    """Returns ``value`` as a new array of ``like``'s shape, dtype and sharding.

    For an assignment to a variable whose array was deleted outside statevar: ``like`` may be
    deleted, only its metadata is read. Donates nothing, and never returns ``value``'s own
    buffer (the variable's next update would donate it).
    """
    new = _fit(jnp.asarray(value), jax.ShapeDtypeStruct(like.shape, like.dtype))
    if isinstance(like, jax.Array) and not like.committed and not new.committed:
        return jnp.array(new, copy=True)  # uncommitted, as the variable was
    return jax.device_put(new, like.sharding, may_alias=False)


def _describe(part: Any) -> Any:
    if isinstance(part, Tracer):
        return type(part), part.aval
    if isinstance(part, jax.Array):
        return type(part), part.aval, part.committed, part.sharding
    if isinstance(part, np.ndarray | np.generic):
        return type(part), part.shape, part.dtype
    if isinstance(part, tuple):
        return tuple(map(_describe, part))
    return part if isinstance(part, type(None) | slice | tuple | str) else type(part)


def signature(operation: Operation, value: Any, index: tuple | None) -> tuple:
    """Returns a hashable key telling apart the argument types an update is compiled for.

    Two calls with the same key take the same compiled code: after the first, JAX's fast
    path (see `_signals`).
    """
    return operation.name, _describe(value), _describe(index)


class _Probe:
    _value: object


def _calibrate_single() -> int:
    probe = _Probe()
    probe._value = object()
    return sys.getrefcount(probe._value)


def _calibrate_local() -> int:
    probe = _Probe()
    probe._value = object()
    held = probe._value
    return sys.getrefcount(held)


def _calibrate_list() -> tuple[int, int]:
    probe = _Probe()
    probe._value = object()
    arrays = [probe._value]
    return sum(map(sys.getrefcount, arrays)), [sys.getrefcount(a) for a in arrays][0]


# Reference count of an array held only by a variable's ``_value`` attribute: as seen by
# ``sys.getrefcount(var._value)``; by ``sys.getrefcount(held)`` after ``held = var._value``
# (the eager hot path); by each step of ``sum(map(sys.getrefcount, arrays))``
# over a list of such arrays; and inside `copy_shared` below.
SOLE_HOLDER = _calibrate_single()
SOLE_HOLDER_WITH_LOCAL = _calibrate_local()
SOLE_HOLDER_IN_MAP, _SOLE_HOLDER_IN_LOOP = _calibrate_list()


def held_elsewhere(arrays: list[jax.Array]) -> list[bool]:
    """For each of ``arrays``, a list holding each variable's ``_value`` and nothing more,
    whether something else holds it too (a read still alive): an update would copy it."""
    return [sys.getrefcount(a) > _SOLE_HOLDER_IN_LOOP for a in arrays]


def copy_shared(arrays: list[jax.Array], variables: tuple, action: str) -> list[jax.Array]:
    """Returns ``arrays`` with every array that something else still holds replaced by a copy.

    ``arrays`` must hold each variable's ``_value`` (of ``variables``, in order) and nothing
    more, so that the result can be donated: the copies are donated in place of the shared
    arrays, which stay valid. The copy policy sees each copy first (``action`` names the
    call making them). Callers first check ``sum(map(sys.getrefcount, arrays)) >
    SOLE_HOLDER_IN_MAP * len(arrays)``, which is true when any array is shared: every array
    counts at least ``SOLE_HOLDER_IN_MAP`` there (`sum` rather than `max`, which parses
    keywords on every call).

    Raises:
      CopyError: under the copy policy ``"raise"``, before anything is copied.
    """
    shared = held_elsewhere(arrays)
    held = [i for i, is_shared in enumerate(shared) if is_shared]
    _copies.check_many(
        [variables[i] for i in held],
        [arrays[i].nbytes for i in held],
        [_copies.HELD] * len(held),
        action,
    )
    return [copy_array(a) if is_shared else a for a, is_shared in zip(arrays, shared, strict=True)]
