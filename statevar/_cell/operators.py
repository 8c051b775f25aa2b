"""Arithmetic, bitwise and comparison operators of variables, as annotated methods.

`ArrayOperators` gives a Variable (and a view of one) the operators of a `jax.Array`: each
reads the current value and applies Python's operator to it, so that the array's own rules
decide: a new `jax.Array`, or, for an operand a `jax.Array` does not take (``None``,
``pytest.approx``), that operand's turn. A Python list or tuple of numbers is converted to
an array first, in either order (``v + [1.0, 1.0]``, ``[[1.0, 2.0]] @ v``), as TensorFlow
converts it: deliberately unlike a `jax.Array`, which refuses lists. A type checker
accepts ``v + 1``, ``1 - v``, ``-v``, ``v < 0``, ``v + [1.0]`` and ``[1.0] - v``; it reads
``(2.0, 2.0) * v`` as a tuple repeated (a Variable has ``__index__``), though Python runs
the Variable's ``__rmul__``. Operands on different devices are brought together first
(see `colocate`). `RefusedInPlace` refuses ``v += 1``, which would rebind the name to a new
array and leave the variable unchanged; `RebindingInPlace` allows it for views, which are
values, as for a `jax.Array`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from . import placement as _placement
from .convert import is_concrete_array

# What an operator accepts: anything `jnp` does, a Variable (or a view of one), and a
# Python list or tuple of numbers (converted, as TensorFlow converts it).
Operand: TypeAlias = "ArrayLike | ArrayOperators | list[Any] | tuple[Any, ...]"
# What a reflected operator accepts (``1 - v``, ``[1.0] - v``).
Reflected: TypeAlias = "ArrayLike | list[Any] | tuple[Any, ...]"


def sequence_operand(other: list | tuple) -> Any:
    """A list or tuple operand as an array (``jnp.asarray``'s rules), or as it is if it
    holds what no array can (then it gets its turn, as against a `jax.Array`)."""
    try:
        return jnp.asarray(other)
    except (TypeError, ValueError):
        return other


def colocate(a: Any, b: Any) -> tuple[Any, Any]:
    """Moves concrete operands to the device scope's device, or ``b`` to ``a``'s device."""
    scope = _placement.current_device()
    if scope is not None:
        return tuple(jax.device_put(x, scope) if is_concrete_array(x) else x for x in (a, b))
    if is_concrete_array(a) and is_concrete_array(b) and a.sharding != b.sharding and b.committed:
        sharding = a.sharding
        if b.shape != a.shape and _placement.is_multi_device(sharding):
            sharding = _placement.replicated(sharding)  # a broadcast operand: replicated
        b = jax.device_put(b, sharding)
    return a, b


class ArrayOperators:
    """The operators of a `jax.Array`, applied to the current value (``self._read()``)."""

    if TYPE_CHECKING:

        def _read(self) -> jax.Array: ...

    def _binary(self, op: Callable[..., Any], other: Any, reflected: bool = False) -> Any:
        # Python's operator on the arrays, so that the jax.Array's own rules apply: an
        # operand it does not take (None, ``pytest.approx``) gets its turn, as it would
        # against an array, and ``v == None`` is False.
        own = self._read()
        if isinstance(own, (np.ndarray, np.generic)):
            own = jnp.asarray(own)  # a view of what jax.device_get gave: JAX's rules still
        if isinstance(other, ArrayOperators):
            other = other._read()
        elif isinstance(other, (list, tuple)) and isinstance(own, jax.Array):
            # (A view may hold what a tree function made of a variable: a shape, say.)
            other = sequence_operand(other)
        a, b = colocate(own, other)
        return op(b, a) if reflected else op(a, b)

    def _unary(self, op: Callable[[jax.Array], jax.Array]) -> jax.Array:
        (a, _) = colocate(self._read(), None)
        return op(a)

    def __add__(self, other: Operand) -> jax.Array:
        return self._binary(operator.add, other)

    def __radd__(self, other: Reflected) -> jax.Array:
        return self._binary(operator.add, other, reflected=True)

    def __sub__(self, other: Operand) -> jax.Array:
        return self._binary(operator.sub, other)

    def __rsub__(self, other: Reflected) -> jax.Array:
        return self._binary(operator.sub, other, reflected=True)

    def __mul__(self, other: Operand) -> jax.Array:
        return self._binary(operator.mul, other)

    def __rmul__(self, other: Reflected) -> jax.Array:
        return self._binary(operator.mul, other, reflected=True)

    def __truediv__(self, other: Operand) -> jax.Array:
        return self._binary(operator.truediv, other)

    def __rtruediv__(self, other: Reflected) -> jax.Array:
        return self._binary(operator.truediv, other, reflected=True)

    def __floordiv__(self, other: Operand) -> jax.Array:
        return self._binary(operator.floordiv, other)

    def __rfloordiv__(self, other: Reflected) -> jax.Array:
        return self._binary(operator.floordiv, other, reflected=True)

    def __mod__(self, other: Operand) -> jax.Array:
        return self._binary(operator.mod, other)

    def __rmod__(self, other: Reflected) -> jax.Array:
        return self._binary(operator.mod, other, reflected=True)

    def __divmod__(self, other: Operand) -> tuple[jax.Array, jax.Array]:
        return self._binary(divmod, other)

    def __rdivmod__(self, other: Reflected) -> tuple[jax.Array, jax.Array]:
        return self._binary(divmod, other, reflected=True)

    def __pow__(self, other: Operand) -> jax.Array:
        return self._binary(operator.pow, other)

    def __rpow__(self, other: Reflected) -> jax.Array:
        return self._binary(operator.pow, other, reflected=True)

    def __matmul__(self, other: Operand) -> jax.Array:
        return self._binary(operator.matmul, other)

    def __rmatmul__(self, other: Reflected) -> jax.Array:
        return self._binary(operator.matmul, other, reflected=True)

    def __and__(self, other: Operand) -> jax.Array:
        return self._binary(operator.and_, other)

    def __rand__(self, other: Reflected) -> jax.Array:
        return self._binary(operator.and_, other, reflected=True)

    def __or__(self, other: Operand) -> jax.Array:
        return self._binary(operator.or_, other)

    def __ror__(self, other: Reflected) -> jax.Array:
        return self._binary(operator.or_, other, reflected=True)

    def __xor__(self, other: Operand) -> jax.Array:
        return self._binary(operator.xor, other)

    def __rxor__(self, other: Reflected) -> jax.Array:
        return self._binary(operator.xor, other, reflected=True)

    def __lshift__(self, other: Operand) -> jax.Array:
        return self._binary(operator.lshift, other)

    def __rlshift__(self, other: Reflected) -> jax.Array:
        return self._binary(operator.lshift, other, reflected=True)

    def __rshift__(self, other: Operand) -> jax.Array:
        return self._binary(operator.rshift, other)

    def __rrshift__(self, other: Reflected) -> jax.Array:
        return self._binary(operator.rshift, other, reflected=True)

    # Elementwise, as for a jax.Array: the result is an array, not a bool.
    def __eq__(self, other: Any) -> jax.Array:  # type: ignore[override]
        return self._binary(operator.eq, other)

    def __ne__(self, other: Any) -> jax.Array:  # type: ignore[override]
        return self._binary(operator.ne, other)

    def __lt__(self, other: Operand) -> jax.Array:
        return self._binary(operator.lt, other)

    def __le__(self, other: Operand) -> jax.Array:
        return self._binary(operator.le, other)

    def __gt__(self, other: Operand) -> jax.Array:
        return self._binary(operator.gt, other)

    def __ge__(self, other: Operand) -> jax.Array:
        return self._binary(operator.ge, other)

    # Identity, not value: a variable is a mutable cell, usable as a dict key.
    __hash__ = object.__hash__

    def __neg__(self) -> jax.Array:
        return self._unary(jnp.negative)

    def __pos__(self) -> jax.Array:
        return self._unary(jnp.positive)

    def __abs__(self) -> jax.Array:
        return self._unary(jnp.abs)

    def __invert__(self) -> jax.Array:
        return self._unary(jnp.invert)


class RefusedInPlace:
    """Refuses ``v += x`` and the other augmented assignments, naming the update to use."""

    if TYPE_CHECKING:

        @property
        def name(self) -> str: ...

    def _refuse(self, symbol: str, hint: str) -> NoReturn:
        raise TypeError(
            f"Cannot use {symbol} on Variable '{self.name}': it would rebind the name to a new "
            f"array and leave the variable unchanged. Update it in place with {hint}."
        )

    def __iadd__(self, other: Operand) -> NoReturn:
        self._refuse("+=", "v.assign_add(x)")

    def __isub__(self, other: Operand) -> NoReturn:
        self._refuse("-=", "v.assign_sub(x)")

    def __imul__(self, other: Operand) -> NoReturn:
        self._refuse("*=", "v.assign(v * x)")

    def __itruediv__(self, other: Operand) -> NoReturn:
        self._refuse("/=", "v.assign(v / x)")

    def __ifloordiv__(self, other: Operand) -> NoReturn:
        self._refuse("//=", "v.assign(v // x)")

    def __imod__(self, other: Operand) -> NoReturn:
        self._refuse("%=", "v.assign(v % x)")

    def __ipow__(self, other: Operand) -> NoReturn:
        self._refuse("**=", "v.assign(v ** x)")

    def __imatmul__(self, other: Operand) -> NoReturn:
        self._refuse("@=", "v.assign(v @ x)")

    def __iand__(self, other: Operand) -> NoReturn:
        self._refuse("&=", "v.assign(v & x)")

    def __ior__(self, other: Operand) -> NoReturn:
        self._refuse("|=", "v.assign(v | x)")

    def __ixor__(self, other: Operand) -> NoReturn:
        self._refuse("^=", "v.assign(v ^ x)")

    def __ilshift__(self, other: Operand) -> NoReturn:
        self._refuse("<<=", "v.assign(v << x)")

    def __irshift__(self, other: Operand) -> NoReturn:
        self._refuse(">>=", "v.assign(v >> x)")


class RebindingInPlace(ArrayOperators):
    """``x += 1`` on a value: rebinds the name to the new array, as for a `jax.Array`."""

    def __iadd__(self, other: Operand) -> jax.Array:
        return self._binary(operator.add, other)

    def __isub__(self, other: Operand) -> jax.Array:
        return self._binary(operator.sub, other)

    def __imul__(self, other: Operand) -> jax.Array:
        return self._binary(operator.mul, other)

    def __itruediv__(self, other: Operand) -> jax.Array:
        return self._binary(operator.truediv, other)

    def __ifloordiv__(self, other: Operand) -> jax.Array:
        return self._binary(operator.floordiv, other)

    def __imod__(self, other: Operand) -> jax.Array:
        return self._binary(operator.mod, other)

    def __ipow__(self, other: Operand) -> jax.Array:
        return self._binary(operator.pow, other)

    def __imatmul__(self, other: Operand) -> jax.Array:
        return self._binary(operator.matmul, other)

    def __iand__(self, other: Operand) -> jax.Array:
        return self._binary(operator.and_, other)

    def __ior__(self, other: Operand) -> jax.Array:
        return self._binary(operator.or_, other)

    def __ixor__(self, other: Operand) -> jax.Array:
        return self._binary(operator.xor, other)

    def __ilshift__(self, other: Operand) -> jax.Array:
        return self._binary(operator.lshift, other)

    def __irshift__(self, other: Operand) -> jax.Array:
        return self._binary(operator.rshift, other)
