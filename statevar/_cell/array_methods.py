"""`ArrayMethods`: jax.Array's read methods on a variable (``v.T``, ``v.sum()``, ...).

Each reads the current value (a traced one inside `statevar.jit` or `statevar.grad`) and
calls the jax.Array method of the same name on it: it returns an array and never changes
the variable. Left out on purpose: ``reshape`` (a variable's shape is fixed, and
``hasattr(v, "reshape")`` is False, as for ``tf.Variable``: ``jnp.reshape(v, shape)`` reads
it into a new array), and ``at``, whose ``.set`` would return a new array and leave the
variable as it was: `ArrayMethods.at` says what to write instead.
"""

from __future__ import annotations

from typing import Any, NoReturn

import jax


class ArrayMethods:
    """jax.Array's read methods, for `Readable`. Reads go through ``_read``."""

    @property
    def name(self) -> str:
        raise NotImplementedError

    def _read(self) -> jax.Array:
        raise NotImplementedError

    # ----------------------------------------------------------------- properties

    @property
    def T(self) -> jax.Array:  # noqa: N802 (jax.Array's name)
        """The value transposed, as ``jax.Array.T``."""
        return self._read().T

    @property
    def mT(self) -> jax.Array:  # noqa: N802 (jax.Array's name)
        """The value with its last two axes swapped, as ``jax.Array.mT``."""
        return self._read().mT

    @property
    def real(self) -> jax.Array:
        """The real part of the value."""
        return self._read().real

    @property
    def imag(self) -> jax.Array:
        """The imaginary part of the value."""
        return self._read().imag

    @property
    def at(self) -> NoReturn:
        """Refuses: ``v.at[i].set(x)`` would return a new array and leave ``v`` as it was.

        Raises:
          AttributeError: naming the variable and showing ``v[i] = x`` and ``v.assign``.
        """
        raise AttributeError(
            f"Variable '{self.name}' has no .at: v.at[i].set(x) would return a new array and "
            "leave the variable unchanged. Update it in place with v[i] = x (or "
            "v[i] += x), or assign a whole new value with v.assign(v.value.at[i].set(x))"
        )

    # ----------------------------------------------------------------- conversions

    def astype(self, dtype: Any, *args: Any, **kwargs: Any) -> jax.Array:
        """The value converted to ``dtype`` (a new array; the variable's dtype is fixed)."""
        return self._read().astype(dtype, *args, **kwargs)

    def item(self, *args: Any) -> Any:
        """The value (or one element of it) as a Python scalar."""
        return self._read().item(*args)

    def tolist(self) -> Any:
        """The value as nested Python lists."""
        return self._read().tolist()

    def conj(self) -> jax.Array:
        """The complex conjugate of the value."""
        return self._read().conj()

    def round(self, decimals: int = 0) -> jax.Array:
        """The value rounded to ``decimals`` decimals."""
        return self._read().round(decimals)

    def clip(self, *args: Any, **kwargs: Any) -> jax.Array:
        """The value clipped, as ``jax.Array.clip``."""
        return self._read().clip(*args, **kwargs)

    def dot(self, other: Any, *args: Any, **kwargs: Any) -> jax.Array:
        """The dot product of the value with ``other``."""
        return self._read().dot(other, *args, **kwargs)

    # ----------------------------------------------------------------- reductions

    def sum(self, *args: Any, **kwargs: Any) -> jax.Array:
        """The sum of the value's elements, as ``jax.Array.sum``."""
        return self._read().sum(*args, **kwargs)

    def prod(self, *args: Any, **kwargs: Any) -> jax.Array:
        """The product of the value's elements, as ``jax.Array.prod``."""
        return self._read().prod(*args, **kwargs)

    def mean(self, *args: Any, **kwargs: Any) -> jax.Array:
        """The mean of the value's elements, as ``jax.Array.mean``."""
        return self._read().mean(*args, **kwargs)

    def std(self, *args: Any, **kwargs: Any) -> jax.Array:
        """The standard deviation of the value's elements, as ``jax.Array.std``."""
        return self._read().std(*args, **kwargs)

    def var(self, *args: Any, **kwargs: Any) -> jax.Array:
        """The variance of the value's elements, as ``jax.Array.var``."""
        return self._read().var(*args, **kwargs)

    def max(self, *args: Any, **kwargs: Any) -> jax.Array:
        """The largest element of the value, as ``jax.Array.max``."""
        return self._read().max(*args, **kwargs)

    def min(self, *args: Any, **kwargs: Any) -> jax.Array:
        """The smallest element of the value, as ``jax.Array.min``."""
        return self._read().min(*args, **kwargs)

    def argmax(self, *args: Any, **kwargs: Any) -> jax.Array:
        """The index of the largest element, as ``jax.Array.argmax``."""
        return self._read().argmax(*args, **kwargs)

    def argmin(self, *args: Any, **kwargs: Any) -> jax.Array:
        """The index of the smallest element, as ``jax.Array.argmin``."""
        return self._read().argmin(*args, **kwargs)

    def all(self, *args: Any, **kwargs: Any) -> jax.Array:
        """Whether every element is true, as ``jax.Array.all``."""
        return self._read().all(*args, **kwargs)

    def any(self, *args: Any, **kwargs: Any) -> jax.Array:
        """Whether any element is true, as ``jax.Array.any``."""
        return self._read().any(*args, **kwargs)

    def cumsum(self, *args: Any, **kwargs: Any) -> jax.Array:
        """The cumulative sum of the value, as ``jax.Array.cumsum``."""
        return self._read().cumsum(*args, **kwargs)

    def cumprod(self, *args: Any, **kwargs: Any) -> jax.Array:
        """The cumulative product of the value, as ``jax.Array.cumprod``."""
        return self._read().cumprod(*args, **kwargs)
