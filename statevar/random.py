"""`statevar.random`: a stateful random number generator whose key lives in a variable.

`Generator` is statevar's ``tf.random.Generator``: each draw splits the key it holds,
stores one half back in place and draws from the other, eagerly and inside `statevar.jit`
(a compiled step draws new numbers at every call, with no key argument), ``lax.scan`` and
``lax.cond``. Its key is a non-trainable variable, so a Module holding a Generator, a
checkpoint, a summary and a compiled step treat it as any other state.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from . import _nesting, _trace
from ._convert import Tracer
from ._creation import creating
from ._errors import TraceContextError
from ._module import Module
from ._state import STATE
from ._variable import Variable

__all__ = ["Generator"]

# Seeds are taken as 32 bits, whatever jax_enable_x64 says: without it JAX would keep the
# low 32 bits of a larger seed, silently giving 2**32 the stream of 0.
_SEED_LIMIT = 2**32


@functools.partial(jax.jit, static_argnums=(1, 2))
def _split(data: jax.Array, impl: str, count: int) -> tuple[jax.Array, jax.Array]:
    """Splits the key whose raw data is ``data`` into the key data the generator keeps and
    ``count`` typed keys to draw from. One function, compiled or inlined into a compiled
    step, so that eager and compiled draws take the same keys."""
    keys = jax.random.split(jax.random.wrap_key_data(data, impl=impl), count + 1)
    return jax.random.key_data(keys[0]), keys[1:]


def _initial_key(seed: int | jax.Array) -> jax.Array:
    """The typed key a Generator starts from: ``seed``'s own, or ``jax.random.key(seed)``.

    Raises:
      TypeError: if ``seed`` is neither an integer nor a typed key.
      ValueError: if ``seed`` is an integer out of range, or keys of another shape than ().
    """
    if isinstance(seed, jax.Array) and jnp.issubdtype(seed.dtype, jax.dtypes.prng_key):
        if seed.shape != ():
            raise ValueError(
                "Expected the seed of a statevar.random.Generator to be one key, got keys "
                f"of shape {seed.shape}: pass one of them (keys[0])"
            )
        return seed
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        hint = ""
        if isinstance(seed, (jax.Array, np.ndarray)) and seed.dtype == np.uint32:
            hint = ": for raw key data, pass jax.random.wrap_key_data(data)"
        raise TypeError(
            "Expected the seed of a statevar.random.Generator to be an integer or a typed "
            f"key, got {_describe(seed)}{hint}"
        )
    if not 0 <= seed < _SEED_LIMIT:
        raise ValueError(
            "Expected the seed of a statevar.random.Generator to be a non-negative "
            f"integer below 2**32, got {seed}"
        )
    return jax.random.key(int(seed))


def _describe(value: object) -> str:
    """``value`` for a message: an array by its dtype and shape, anything else by its type
    and repr."""
    if isinstance(value, (jax.Array, np.ndarray)):
        return f"an array of dtype {value.dtype} and shape {value.shape}"
    return f"{type(value).__name__} {value!r}"


class Generator(Module):
    """A stateful random number generator, in the manner of ``tf.random.Generator``.

    Holds a JAX PRNG key as its raw data (``uint32``, `jax.random.key_data`) in a
    non-trainable variable, `state`. Each draw splits that key in two, assigns one half
    back to `state` and draws from the other, so that every draw gives new numbers: eagerly,
    inside `statevar.jit` (a compiled step draws anew at every call, without a key
    argument), inside ``jax.lax.scan`` (each iteration draws anew) and ``jax.lax.cond``
    (only a taken branch advances the key). The same seed gives the same stream eagerly and
    compiled, and a draw inside a ``lax.scan`` of ``n`` steps gives what ``n`` eager draws
    give.

    A Generator is a `statevar.Module`: held by a model, its key is saved, restored and
    summarized with the model's variables (as ``"rng/state"`` for ``model.rng``), and a
    compiled step lifts it as it lifts them; ``statevar.save(directory, {"rng": gen})``
    saves it alone. The methods mirror `jax.random`'s, with the key filled in.

    A draw assigns the key, so it raises `statevar.TraceContextError` wherever an
    assignment cannot go: under plain `jax.jit`, inside ``jax.vmap`` (where a variable
    cannot hold one key per element), and inside ``jax.checkpoint`` while differentiating
    (a rematerialized layer's dropout). There, take keys outside with `key` (or `split`,
    one per element for ``jax.vmap``), pass them in, and draw with `jax.random`.

    Each draw assigns `state` as `Variable.assign` does: it donates the old key's buffer
    when nothing else holds it, and a key read earlier (``gen.state.value``) stays valid.
    Eager draws from several threads each get their own key: a draw's read, split and
    assignment hold the lock that every variable update holds.

    Args:
      seed: a non-negative integer below ``2**32``, whose key is ``jax.random.key(seed)``
        (JAX's default PRNG implementation), or a typed key (`jax.random.key`, one of the
        keys `jax.random.split` gives), whose stream the generator continues with the
        key's implementation.
      name: the name of the key variable in checkpoints and summaries; by default it is
        known by its path (``"state"``, or ``"rng/state"`` when ``model.rng`` holds it).

    Raises:
      TypeError: if ``seed`` is neither an integer (a bool is not) nor a typed key.
      ValueError: if ``seed`` is negative or at least ``2**32``, or is more than one key.
      TraceContextError: if created inside `statevar.jit` or `statevar.grad`.

    Example:
      >>> import statevar
      >>> gen = statevar.random.Generator(seed=0)
      >>> first, second = gen.normal((3,)), gen.normal((3,))
      >>> bool((first == second).any())
      False
      >>> @statevar.jit
      ... def noisy(x):
      ...     return x + gen.normal(x.shape)
      >>> bool((noisy(first) == noisy(first)).any())
      False
    """

    def __init__(self, seed: int | jax.Array, *, name: str | None = None):
        with creating("a statevar.random.Generator"):  # named so where it cannot be made
            key = _initial_key(seed)
            self._impl = str(jax.random.key_impl(key))
            self.state = Variable(jax.random.key_data(key), trainable=False, name=name)

    def key(self) -> jax.Array:
        """Returns a new typed PRNG key (as `jax.random.key` makes), advancing the generator.

        For `jax.random` functions the Generator has no method for, and for code where a
        draw cannot assign the generator's key (inside ``jax.checkpoint`` while
        differentiating): take the key outside, pass it in.

        Returns:
          A scalar key array of dtype ``key<impl>``; `jax.random.key_data` gives its raw
          ``uint32`` data.

        Raises:
          TraceContextError: where the generator's key cannot be assigned (see `Generator`).

        Example:
          >>> import jax
          >>> import statevar
          >>> gen = statevar.random.Generator(seed=0)
          >>> key = gen.key()
          >>> jax.random.permutation(key, 4).shape
          (4,)
        """
        return self._advance(1, None)[0]

    def split(self, n: int) -> jax.Array:
        """Returns ``n`` new typed PRNG keys, advancing the generator once.

        A variable holds one value, not one per batch element, so a draw cannot assign the
        key inside ``jax.vmap``: map over these keys instead, drawing with `jax.random`.

        Args:
          n: how many keys, a non-negative integer.

        Returns:
          A key array of shape ``(n,)``.

        Raises:
          TypeError: if ``n`` is not an integer.
          ValueError: if ``n`` is negative.
          TraceContextError: where the generator's key cannot be assigned (see `Generator`).

        Example:
          >>> import jax
          >>> import statevar
          >>> gen = statevar.random.Generator(seed=0)
          >>> jax.vmap(lambda key: jax.random.normal(key, (2,)))(gen.split(4)).shape
          (4, 2)
        """
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
            raise TypeError(
                f"Expected statevar.random.Generator '{self.state.name}'.split to be given "
                f"an integer number of keys, got {type(n).__name__} {n!r}"
            )
        if n < 0:
            raise ValueError(
                f"Expected statevar.random.Generator '{self.state.name}'.split to be given "
                f"a non-negative number of keys, got {n}"
            )
        return self._advance(int(n), None)

    def normal(
        self, shape: int | Sequence[int] = (), dtype: jax.typing.DTypeLike = float
    ) -> jax.Array:
        """Draws standard normal values, as `jax.random.normal`, advancing the generator.

        Args:
          shape: the shape of the result: a sequence of non-negative integers, or one.
          dtype: a floating or complex dtype; by default JAX's default float (float32
            unless ``jax_enable_x64`` is on).

        Returns:
          An array of ``shape`` and ``dtype``.

        Raises:
          TypeError: if ``shape`` is not integers or ``dtype`` is not floating or complex.
          ValueError: if ``shape`` has a negative dimension.
          TraceContextError: where the generator's key cannot be assigned (see `Generator`).

        Example:
          >>> import jax.numpy as jnp
          >>> import statevar
          >>> gen = statevar.random.Generator(seed=0)
          >>> gen.normal((2, 3), jnp.bfloat16).dtype
          dtype(bfloat16)
        """
        shape = self._shape("normal", shape)
        self._check_dtype("normal", dtype, "a floating or complex", jnp.inexact)
        return self._advance(1, functools.partial(jax.random.normal, shape=shape, dtype=dtype))

    def uniform(
        self,
        shape: int | Sequence[int] = (),
        dtype: jax.typing.DTypeLike = float,
        *,
        minval: jax.typing.ArrayLike = 0.0,
        maxval: jax.typing.ArrayLike = 1.0,
    ) -> jax.Array:
        """Draws values uniform in ``[minval, maxval)``, as `jax.random.uniform`, advancing
        the generator.

        Args:
          shape: the shape of the result: a sequence of non-negative integers, or one.
          dtype: a floating dtype; by default JAX's default float.
          minval: the lower bound (included), broadcast to ``shape``.
          maxval: the upper bound (excluded), broadcast to ``shape``.

        Returns:
          An array of ``shape`` and ``dtype``.

        Raises:
          TypeError: if ``shape`` is not integers or ``dtype`` is not floating.
          ValueError: if ``shape`` has a negative dimension.
          TraceContextError: where the generator's key cannot be assigned (see `Generator`).

        Example:
          >>> import statevar
          >>> gen = statevar.random.Generator(seed=0)
          >>> values = gen.uniform((1000,), minval=-1.0, maxval=1.0)
          >>> bool((values >= -1.0).all() and (values < 1.0).all())
          True
        """
        shape = self._shape("uniform", shape)
        self._check_dtype("uniform", dtype, "a floating", jnp.floating)
        draw = functools.partial(
            jax.random.uniform, shape=shape, dtype=dtype, minval=minval, maxval=maxval
        )
        return self._advance(1, draw)

    def bernoulli(
        self, p: jax.typing.ArrayLike = 0.5, shape: int | Sequence[int] | None = None
    ) -> jax.Array:
        """Draws booleans, each True with probability ``p``, as `jax.random.bernoulli`,
        advancing the generator: a dropout mask keeps the values where it is True.

        Args:
          p: the probability of True: a number or a floating array broadcast to ``shape``,
            between 0 and 1 (checked where it is concrete, not where it is traced).
          shape: the shape of the result: a sequence of non-negative integers, or one;
            None (the default) for ``p``'s shape.

        Returns:
          A bool array of ``shape``.

        Raises:
          TypeError: if ``p`` is not a number or a floating array, or ``shape`` is not
            integers.
          ValueError: if a concrete ``p`` is not between 0 and 1, or ``shape`` has a
            negative dimension.
          TraceContextError: where the generator's key cannot be assigned (see `Generator`).

        Example:
          >>> import jax.numpy as jnp
          >>> import statevar
          >>> gen = statevar.random.Generator(seed=0)
          >>> x = jnp.ones((2, 4))
          >>> rate = 0.5
          >>> keep = gen.bernoulli(1.0 - rate, x.shape)
          >>> dropped = jnp.where(keep, x / (1.0 - rate), 0.0)
          >>> keep.dtype, dropped.shape
          (dtype('bool'), (2, 4))
        """
        p = self._probability(p)
        if shape is not None:
            shape = self._shape("bernoulli", shape)
        return self._advance(1, functools.partial(jax.random.bernoulli, p=p, shape=shape))

    def _advance(self, count: int, draw: Callable[[jax.Array], jax.Array] | None) -> jax.Array:
        """Splits the key into the one kept and ``count`` keys, assigns the kept one to
        `state` and returns the keys, or ``draw(keys[0])`` when given.

        The draw runs before the assignment, so that a draw JAX refuses leaves the
        generator as it was. Holds the update lock (reentrant, and held by a compiled
        step's first call too), so that eager draws from several threads never share a key.
        Donates the old key's buffer when nothing else holds it (see `Variable.assign`).

        Raises:
          TraceContextError: where the key cannot be assigned, with the way out.
        """
        state = self.state
        try:
            if _trace.innermost() is None and _nesting.enclosing_vmap() is not None:
                # No statevar trace to carry the assignment: the draw would run once, for
                # every element alike.
                raise TraceContextError(
                    f"Cannot assign to Variable '{state.name}' inside jax.vmap: a variable "
                    "holds one value, not one per batch element."
                )
            with STATE.update_lock:
                # Under a nested transformation (a scan's body), the key moves into a ref
                # before it is read, so that each iteration reads what the one before wrote
                # and the step traces once.
                _trace.prepare_update(state, "assign to")
                kept, keys = _split(state.value, self._impl, count)
                result = keys if draw is None else draw(keys[0])
                state.assign(kept)
        except TraceContextError as error:
            raise TraceContextError(
                f"Cannot draw from statevar.random.Generator '{state.name}' here, since a "
                f"draw assigns its key. {error} To draw there, take keys outside with .key() "
                "(or .split(n), one per element for jax.vmap), pass them in, and draw with "
                "jax.random inside."
            ) from None
        return result

    def _shape(self, method: str, shape: int | Sequence[int]) -> tuple[int, ...]:
        """Returns ``shape`` as a tuple of ints.

        Raises:
          TypeError: if it is not an integer or a sequence of integers.
          ValueError: if a dimension is negative.
        """
        dimensions = (shape,) if isinstance(shape, (int, np.integer)) else shape
        where = f"statevar.random.Generator '{self.state.name}'.{method}"
        if not isinstance(dimensions, Sequence) or any(
            isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer))
            for d in dimensions
        ):
            raise TypeError(
                f"Expected the shape given to {where} to be a sequence of integers, got {shape!r}"
            )
        if any(d < 0 for d in dimensions):
            raise ValueError(
                f"Expected the shape given to {where} to have non-negative dimensions, got "
                f"{tuple(map(int, dimensions))}"
            )
        return tuple(map(operator.index, dimensions))

    def _check_dtype(
        self, method: str, dtype: jax.typing.DTypeLike, expected: str, kind: type
    ) -> None:
        """Raises a TypeError unless ``dtype`` is a dtype of ``kind``."""
        try:
            given = jax.dtypes.canonicalize_dtype(dtype)
        except TypeError:
            given = None
        if given is None or not jnp.issubdtype(given, kind):
            got = repr(dtype) if given is None else str(given)
            raise TypeError(
                f"Expected {expected} dtype for statevar.random.Generator "
                f"'{self.state.name}'.{method}, got {got}"
            )

    def _probability(self, p: jax.typing.ArrayLike) -> float | jax.Array:
        """Returns ``p`` as a float or a floating array, checked where it is concrete.

        Raises:
          TypeError: if it is neither a number nor a floating array.
          ValueError: if it is concrete and not between 0 and 1.
        """
        where = f"statevar.random.Generator '{self.state.name}'.bernoulli"
        probability: float | jax.Array
        if isinstance(p, (int, float, np.integer, np.floating)) and not isinstance(
            p, (bool, np.bool_)
        ):
            probability = float(p)
        else:
            try:
                probability = jnp.asarray(p)
            except (TypeError, ValueError):
                got = type(p).__name__
            else:
                got = f"dtype {probability.dtype}"
                if jnp.issubdtype(probability.dtype, jnp.floating):
                    got = None
            if got is not None:
                raise TypeError(
                    f"Expected the probability p given to {where} to be a number or a "
                    f"floating array, got {got}"
                )
        if not isinstance(probability, Tracer):
            values = np.asarray(probability)
            if not np.all((values >= 0) & (values <= 1)):
                raise ValueError(
                    f"Expected the probability p given to {where} to be between 0 and 1, "
                    f"got {values if values.size <= 8 else 'values outside it'}"
                )
        return probability
