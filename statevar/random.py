"""`statevar.random`: a stateful random number generator whose key lives in a variable.

`Generator` is statevar's ``tf.random.Generator``: each draw splits the key it holds,
stores one half back in place and draws from the other, eagerly and inside `statevar.jit`
(a compiled step draws new numbers at every call, with no key argument), ``lax.scan`` and
``lax.cond``. Its key is a non-trainable variable, so a Module holding a Generator, a
checkpoint, a summary and a compiled step treat it as any other state.
`get_global_generator` and `set_global_generator` keep a process-wide one, as TensorFlow's.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from . import _random_args as args
from ._cell.convert import Tracer
from ._cell.creation import creating
from ._cell.variable import Variable
from ._errors import TraceContextError
from ._state import STATE
from ._tracing import frames as _frames
from ._tracing import nesting as _nesting
from ._train.module import Module

__all__ = ["Generator", "get_global_generator", "set_global_generator"]

Shape = int | Sequence[int]
_G = TypeVar("_G", bound="Generator")
_T = TypeVar("_T")


class Generator(Module):
    """A stateful random number generator, in the manner of ``tf.random.Generator``.

    Holds a JAX PRNG key as its raw data (``uint32``, `jax.random.key_data`) in a
    non-trainable variable, `state`. Each draw splits that key in two, assigns one half
    back to `state` and draws from the other, so that every draw gives new numbers: eagerly,
    inside `statevar.jit` (a compiled step draws anew at every call, without a key
    argument), inside ``jax.lax.scan`` (each iteration draws anew) and ``jax.lax.cond``
    (only a taken branch advances the key). The same seed gives the same stream eagerly and
    compiled (the same keys and bits; a value scaled or shifted, ``mean + stddev * z``, may
    differ in its last bit where XLA fuses the arithmetic with the rest of the step), and a
    draw inside a ``lax.scan`` of ``n`` steps gives what ``n`` eager draws give.

    Make one with ``Generator(seed)``, `from_seed`, `from_key` or
    `from_non_deterministic_state`. The draws take TensorFlow's arguments, shape first:
    `normal`, `truncated_normal`, `uniform`, `uniform_full_int`, `binomial`, and
    `bernoulli` (a dropout mask). `key` and `split_keys` give keys for `jax.random`,
    `split` gives new Generators, and `reset`, `reset_from_seed` and `skip` move the stream
    in place, where a compiled step holding the generator sees them.

    A Generator is a `statevar.Module`: held by a model, its key is saved, restored and
    summarized with the model's variables (as ``"rng/state"`` for ``model.rng``), and a
    compiled step lifts it as it lifts them; ``statevar.save(directory, {"rng": gen})``
    saves it alone.

    A draw assigns the key, so it raises `statevar.TraceContextError` wherever an
    assignment cannot go: under plain `jax.jit`, inside ``jax.vmap`` (where a variable
    cannot hold one key per element), and inside ``jax.checkpoint`` while differentiating
    (a rematerialized layer's dropout). There, take keys outside with `key` (or
    `split_keys`, one per element for ``jax.vmap``), pass them in, and draw with
    `jax.random`.

    Each draw assigns `state` as `Variable.assign` does: it donates the old key's buffer
    when nothing else holds it, and a key read earlier (``gen.state.value``) stays valid.
    Eager draws from several threads each get their own key: a draw's read, split and
    assignment hold the lock that every variable update holds. A draw whose arguments are
    refused raises before the key advances.

    Args:
      seed: a non-negative integer below ``2**32`` (or an integer scalar array), whose key
        is ``jax.random.key(seed)`` (JAX's default PRNG implementation), or a typed key
        (`jax.random.key`, one of the keys `jax.random.split` gives), whose stream the
        generator continues with the key's implementation.
      name: the name of the key variable in checkpoints and summaries; by default it is
        known by its path (``"state"``, or ``"rng/state"`` when ``model.rng`` holds it).

    Raises:
      TypeError: if ``seed`` is neither an integer (a bool is not) nor a typed key.
      ValueError: if ``seed`` is negative or at least ``2**32``, or is more than one key.
      TraceContextError: if created where a variable cannot be (see `statevar.Variable`).

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
            key = args.initial_key(seed, None, "a statevar.random.Generator")
            self._impl = str(jax.random.key_impl(key))
            self.state = Variable(jax.random.key_data(key), trainable=False, name=name)

    @classmethod
    def from_seed(
        cls: type[_G], seed: int | jax.Array, impl: str | None = None, *, name: str | None = None
    ) -> _G:
        """Returns a new Generator whose key is ``jax.random.key(seed, impl=impl)``, as
        ``tf.random.Generator.from_seed(seed, alg)``.

        Args:
          seed: a non-negative integer below ``2**32``, or an integer scalar array.
          impl: the name of a JAX PRNG implementation (``"threefry2x32"``, ``"rbg"``, ...);
            by default JAX's default one.
          name: the name of the key variable (see `Generator`).

        Raises:
          TypeError: if ``seed`` is not an integer, or ``impl`` not a string.
          ValueError: if ``seed`` is out of range, or JAX knows no ``impl`` by that name.

        Example:
          >>> import statevar
          >>> a = statevar.random.Generator.from_seed(1)
          >>> b = statevar.random.Generator(seed=1)
          >>> bool((a.normal((3,)) == b.normal((3,))).all())
          True
        """
        where = "statevar.random.Generator.from_seed"
        if args.is_key(seed):
            raise TypeError(
                f"Expected the seed of {where} to be an integer, got a typed key: use "
                "statevar.random.Generator.from_key(key)"
            )
        return cls(args.initial_key(seed, impl, where), name=name)

    @classmethod
    def from_key(
        cls: type[_G], key: jax.Array, impl: str | None = None, *, name: str | None = None
    ) -> _G:
        """Returns a new Generator that continues the stream of ``key``, as
        ``tf.random.Generator.from_state``.

        Args:
          key: a typed key (`jax.random.key`, one of the keys `jax.random.split` gives), or
            its raw ``uint32`` data (`jax.random.key_data`, another generator's ``state``).
          impl: the PRNG implementation of raw data; by default JAX's default one. A typed
            key carries its own (``impl``, if given, must be it).
          name: the name of the key variable (see `Generator`).

        Raises:
          TypeError: if ``key`` is neither a typed key nor a ``uint32`` array.
          ValueError: if it is several keys, raw data of another shape than ``impl``'s keys,
            or a key of another implementation than ``impl``.

        Example:
          >>> import jax
          >>> import statevar
          >>> gen = statevar.random.Generator.from_key(jax.random.key(1))
          >>> same = statevar.random.Generator.from_key(gen.state.value)
          >>> bool((gen.normal((3,)) == same.normal((3,))).all())
          True
        """
        where = "statevar.random.Generator.from_key"
        if not args.is_key(key):
            example = jax.random.key(0, impl=args.checked_impl(impl, where))
            impl = str(jax.random.key_impl(example))
            shape = jax.random.key_data(example).shape
            data = args.key_data(key, impl, shape, where, "from_seed")
            key = jax.random.wrap_key_data(data, impl=impl)
        return cls(args.initial_key(key, impl, where), name=name)

    @classmethod
    def from_non_deterministic_state(
        cls: type[_G], impl: str | None = None, *, name: str | None = None
    ) -> _G:
        """Returns a new Generator whose key is drawn from the operating system's source of
        randomness (`os.urandom`), as ``tf.random.Generator.from_non_deterministic_state``.

        Args:
          impl: the name of a JAX PRNG implementation; by default JAX's default one.
          name: the name of the key variable (see `Generator`).

        Raises:
          TypeError: if ``impl`` is not a string.
          ValueError: if JAX knows no ``impl`` by that name.

        Example:
          >>> import statevar
          >>> a = statevar.random.Generator.from_non_deterministic_state()
          >>> b = statevar.random.Generator.from_non_deterministic_state()
          >>> bool((a.state.value == b.state.value).all())
          False
        """
        impl = args.checked_impl(impl, "statevar.random.Generator.from_non_deterministic_state")
        return cls(jax.random.wrap_key_data(args.os_key_data(impl), impl=impl), name=name)

    @property
    def impl(self) -> str:
        """The name of the JAX PRNG implementation of the keys this generator holds and
        gives (``"threefry2x32"`` by default), as TensorFlow's ``algorithm``."""
        return self._impl

    def reset(self, state: jax.Array) -> None:
        """Resets the generator in place to ``state``: the next draws are those of
        ``Generator.from_key(state)``. A compiled step holding the generator sees it.

        Args:
          state: a typed key of this generator's implementation, or raw ``uint32`` key data
            of the shape of `state` (a ``gen.state.value`` read earlier, or another
            generator's ``state``).

        Raises:
          TypeError: if ``state`` is neither a typed key nor a ``uint32`` array.
          ValueError: if it is several keys, a key of another implementation, or data of
            another shape.
          TraceContextError: where the key cannot be assigned (see `Generator`).

        Example:
          >>> import statevar
          >>> gen = statevar.random.Generator(seed=0)
          >>> saved = gen.state.value
          >>> first = gen.normal((3,))
          >>> gen.reset(saved)
          >>> bool((gen.normal((3,)) == first).all())
          True
        """
        data = args.key_data(
            state, self._impl, self.state.shape, self._where("reset"), "reset_from_seed"
        )
        self._update(lambda _: (data, None), "reset")

    def reset_from_seed(self, seed: int | jax.Array) -> None:
        """Resets the generator in place to the key of ``seed``: the next draws are those of
        ``Generator.from_seed(seed, impl=gen.impl)``. A compiled step holding the generator
        sees it; inside one, ``seed`` may be traced.

        Args:
          seed: a non-negative integer below ``2**32``, or an integer scalar array.

        Raises:
          TypeError: if ``seed`` is not an integer.
          ValueError: if it is a concrete integer out of range.
          TraceContextError: where the key cannot be assigned (see `Generator`).

        Example:
          >>> import statevar
          >>> gen = statevar.random.Generator(seed=0)
          >>> _ = gen.normal((3,))
          >>> gen.reset_from_seed(0)
          >>> bool((gen.normal((3,)) == statevar.random.Generator(seed=0).normal((3,))).all())
          True
        """
        where = self._where("reset_from_seed")
        if args.is_key(seed):
            raise TypeError(
                f"Expected the seed of {where} to be an integer, got a typed key: use .reset(key)"
            )
        data = jax.random.key_data(args.initial_key(seed, self._impl, where))
        self._update(lambda _: (data, None), "reset")

    def skip(self, n: int | jax.Array) -> None:
        """Advances the generator as ``n`` draws would: the draws that follow are those that
        would follow ``n`` draws (each `key`, `normal`, `uniform`, ... is one draw). It takes
        time proportional to ``n``, in one compiled loop.

        Args:
          n: a non-negative integer below ``2**31``, or an integer scalar array (inside a
            compiled step, a traced one).

        Raises:
          TypeError: if ``n`` is not an integer.
          ValueError: if it is concrete and negative or at least ``2**31``.
          TraceContextError: where the key cannot be assigned (see `Generator`).

        Example:
          >>> import statevar
          >>> gen, other = statevar.random.Generator(seed=0), statevar.random.Generator(seed=0)
          >>> _ = [other.normal((3,)) for _ in range(2)]
          >>> gen.skip(2)
          >>> bool((gen.normal((3,)) == other.normal((3,))).all())
          True
        """
        where = self._where("skip")
        steps = args.count(n, where, "number of draws", limit=args.SKIP_LIMIT, arrays=True)
        steps = jnp.asarray(steps, jnp.int32)
        self._update(lambda data: (args.skip(data, self._impl, steps), None), "skip")

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
        return self._draw(1, lambda keys: keys[0])

    def split_keys(self, n: int) -> jax.Array:
        """Returns ``n`` new typed PRNG keys, advancing the generator once, as
        ``tf.random.Generator.make_seeds`` gives seeds for stateless functions.

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
          >>> jax.vmap(lambda key: jax.random.normal(key, (2,)))(gen.split_keys(4)).shape
          (4, 2)
        """
        count = args.count(n, self._where("split_keys"), "number of keys")
        return self._draw(count, lambda keys: keys)

    def split(self, count: int = 1) -> list[Generator]:
        """Returns ``count`` new Generators, each with its own stream, advancing this one
        once, as ``tf.random.Generator.split``.

        Their keys are variables made as any new variable is: on JAX's default device, or
        where a `statevar.device` or `statevar.mesh` scope around the call places them.
        They are made eagerly: inside a compiled step or a transformation, where the keys
        are traced, take keys with `split_keys` instead.

        Args:
          count: how many Generators, a non-negative integer.

        Returns:
          A list of ``count`` Generators of this one's implementation.

        Raises:
          TypeError: if ``count`` is not an integer.
          ValueError: if ``count`` is negative.
          TraceContextError: inside a compiled step or a transformation.

        Example:
          >>> import statevar
          >>> gen = statevar.random.Generator(seed=0)
          >>> a, b = gen.split(2)
          >>> bool((a.normal((3,)) == b.normal((3,))).any())
          False
        """
        number = args.count(count, self._where("split"), "number of generators")
        return self._draw(number, self._children)

    def _children(self, keys: jax.Array) -> list[Generator]:
        """New Generators, one for each of ``keys``.

        Raises:
          TraceContextError: if the keys are traced.
        """
        if isinstance(keys, Tracer):
            raise TraceContextError(
                f"Cannot split statevar.random.Generator '{self.state.name}' inside a "
                "compiled step or a "
                "transformation: split makes new Generators, whose keys would be traced "
                "values. Split outside, or take keys with .split_keys(n) and draw with "
                "jax.random."
            )
        return [Generator(key) for key in keys]

    def normal(
        self,
        shape: Shape = (),
        mean: jax.typing.ArrayLike = 0.0,
        stddev: jax.typing.ArrayLike = 1.0,
        dtype: jax.typing.DTypeLike = float,
        name: str | None = None,
    ) -> jax.Array:
        """Draws normal values, ``mean + stddev * z``, advancing the generator, as
        ``tf.random.Generator.normal``.

        Args:
          shape: the shape of the result: a sequence of non-negative integers, or one.
          mean: the mean, a number or an array that broadcasts to ``shape``.
          stddev: the standard deviation, likewise.
          dtype: a floating or complex dtype; by default JAX's default float (float32
            unless ``jax_enable_x64`` is on).
          name: accepted, as TensorFlow's operation name; JAX names no operations.

        Returns:
          An array of ``shape`` and ``dtype``.

        Raises:
          TypeError: if ``shape`` is not integers, ``mean`` or ``stddev`` not numbers,
            ``dtype`` not floating or complex, or ``name`` not a str.
          ValueError: if ``shape`` has a negative dimension.
          ShapeMismatchError: if ``mean`` or ``stddev`` does not broadcast to ``shape``.
          TraceContextError: where the generator's key cannot be assigned (see `Generator`).

        Example:
          >>> import jax.numpy as jnp
          >>> import statevar
          >>> gen = statevar.random.Generator(seed=0)
          >>> gen.normal((2, 3), mean=1.0, stddev=0.1, dtype=jnp.bfloat16).dtype
          dtype(bfloat16)
        """
        args.check_name(name, self._where("normal"))
        return self._normal("normal", shape, mean, stddev, dtype, truncated=False)

    def truncated_normal(
        self,
        shape: Shape = (),
        mean: jax.typing.ArrayLike = 0.0,
        stddev: jax.typing.ArrayLike = 1.0,
        dtype: jax.typing.DTypeLike = float,
        name: str | None = None,
    ) -> jax.Array:
        """Draws normal values within two standard deviations of the mean (redrawn beyond
        them), advancing the generator, as ``tf.random.Generator.truncated_normal``.

        Args:
          shape: the shape of the result: a sequence of non-negative integers, or one.
          mean: the mean, a real number or an array that broadcasts to ``shape``.
          stddev: the standard deviation of the normal before truncation, likewise.
          dtype: a floating dtype; by default JAX's default float.
          name: accepted, as TensorFlow's operation name; JAX names no operations.

        Returns:
          An array of ``shape`` and ``dtype``.

        Raises:
          TypeError: if ``shape`` is not integers, ``mean`` or ``stddev`` not real
            numbers, ``dtype`` not floating, or ``name`` not a str.
          ValueError: if ``shape`` has a negative dimension.
          ShapeMismatchError: if ``mean`` or ``stddev`` does not broadcast to ``shape``.
          TraceContextError: where the generator's key cannot be assigned (see `Generator`).

        Example:
          >>> import statevar
          >>> gen = statevar.random.Generator(seed=0)
          >>> values = gen.truncated_normal((1000,), mean=5.0, stddev=1.0)
          >>> bool((abs(values - 5.0) <= 2.0).all())
          True
        """
        args.check_name(name, self._where("truncated_normal"))
        return self._normal("truncated_normal", shape, mean, stddev, dtype, truncated=True)

    def _normal(
        self, method: str, shape: Shape, mean: Any, stddev: Any, dtype: Any, truncated: bool
    ) -> jax.Array:
        where = self._where(method)
        shape = args.shape_of(shape, where)
        kinds = (jnp.floating,) if truncated else (jnp.floating, jnp.complexfloating)
        expected = "a floating" if truncated else "a floating or complex"
        kind = "real" if truncated else "number"
        mean = args.operand(mean, "mean", where, shape, kind)
        stddev = args.operand(stddev, "stddev", where, shape, kind)
        dtype = args.dtype_of(dtype, where, expected, kinds)
        draw = functools.partial(args.normal, shape=shape, dtype=dtype, truncated=truncated)
        return self._draw(1, lambda keys: draw(keys[0], mean, stddev))

    def uniform(
        self,
        shape: Shape = (),
        minval: jax.typing.ArrayLike = 0,
        maxval: jax.typing.ArrayLike | None = None,
        dtype: jax.typing.DTypeLike = float,
        name: str | None = None,
    ) -> jax.Array:
        """Draws values uniform in ``[minval, maxval)``, advancing the generator, as
        ``tf.random.Generator.uniform``.

        Args:
          shape: the shape of the result: a sequence of non-negative integers, or one.
          minval: the lower bound (included), a number or an array that broadcasts to
            ``shape``; an integer for an integer dtype.
          maxval: the upper bound (excluded), likewise; None means 1 for a floating dtype,
            and an integer dtype needs it.
          dtype: a floating or integer dtype; by default JAX's default float.
          name: accepted, as TensorFlow's operation name; JAX names no operations.

        Returns:
          An array of ``shape`` and ``dtype``.

        Raises:
          TypeError: if ``shape`` is not integers, ``dtype`` neither floating nor integer,
            a bound not a real number (an integer, for an integer dtype), or ``name`` not
            a str.
          ValueError: if ``shape`` has a negative dimension, an integer dtype has no
            ``maxval``, or concrete integer bounds are outside the dtype's range or have
            ``minval >= maxval``.
          ShapeMismatchError: if a bound does not broadcast to ``shape``.
          TraceContextError: where the generator's key cannot be assigned (see `Generator`).

        Example:
          >>> import jax.numpy as jnp
          >>> import statevar
          >>> gen = statevar.random.Generator(seed=0)
          >>> values = gen.uniform((1000,), minval=-1.0, maxval=1.0)
          >>> bool((values >= -1.0).all() and (values < 1.0).all())
          True
          >>> gen.uniform((3,), 0, 10, dtype=jnp.int32).dtype
          dtype('int32')
        """
        where = self._where("uniform")
        args.check_name(name, where)
        shape = args.shape_of(shape, where)
        dtype = args.dtype_of(dtype, where, "a floating or integer", (jnp.floating, jnp.integer))
        integer = jnp.issubdtype(dtype, jnp.integer)
        kind = "integer" if integer else "real"
        minval = args.operand(minval, "minval", where, shape, kind)
        if maxval is None:
            if integer:
                raise ValueError(
                    f"Expected a maxval for {where} with the integer dtype {dtype}, got None: "
                    "an integer draw has no default upper bound"
                )
            maxval = 1.0
        maxval = args.operand(maxval, "maxval", where, shape, kind)
        if integer:
            args.check_bounds(minval, "minval", where, dtype)
            args.check_bounds(maxval, "maxval", where, dtype)
        low, high = args.concrete(minval), args.concrete(maxval)
        if integer and low is not None and high is not None and not np.all(low < high):
            raise ValueError(
                f"Expected minval < maxval for {where} with the integer dtype {dtype}, got "
                f"minval {low} and maxval {high}"
            )
        draw = functools.partial(args.uniform, shape=shape, dtype=dtype)
        return self._draw(1, lambda keys: draw(keys[0], minval, maxval))

    def uniform_full_int(
        self,
        shape: Shape = (),
        dtype: jax.typing.DTypeLike | None = None,
        name: str | None = None,
    ) -> jax.Array:
        """Draws integers over the whole range of ``dtype``, advancing the generator, as
        ``tf.random.Generator.uniform_full_int``.

        Args:
          shape: the shape of the result: a sequence of non-negative integers, or one.
          dtype: an integer dtype; by default ``uint64`` as TensorFlow's, which is
            ``uint32`` unless ``jax_enable_x64`` is on.
          name: accepted, as TensorFlow's operation name; JAX names no operations.

        Returns:
          An array of ``shape`` and ``dtype``.

        Raises:
          TypeError: if ``shape`` is not integers, ``dtype`` not an integer dtype, or
            ``name`` not a str.
          ValueError: if ``shape`` has a negative dimension.
          TraceContextError: where the generator's key cannot be assigned (see `Generator`).

        Example:
          >>> import jax.numpy as jnp
          >>> import statevar
          >>> gen = statevar.random.Generator(seed=0)
          >>> gen.uniform_full_int((2,), jnp.int8).dtype
          dtype('int8')
        """
        where = self._where("uniform_full_int")
        args.check_name(name, where)
        shape = args.shape_of(shape, where)
        dtype = args.dtype_of(
            jnp.uint64 if dtype is None else dtype, where, "an integer", (jnp.integer,)
        )
        draw = functools.partial(args.full_int, shape=shape, dtype=dtype)
        return self._draw(1, lambda keys: draw(keys[0]))

    def binomial(
        self,
        shape: Shape,
        counts: jax.typing.ArrayLike,
        probs: jax.typing.ArrayLike,
        dtype: jax.typing.DTypeLike = jnp.int32,
        name: str | None = None,
    ) -> jax.Array:
        """Draws the number of successes in ``counts`` trials, each a success with
        probability ``probs``, advancing the generator, as ``tf.random.Generator.binomial``.

        Args:
          shape: the shape of the result: a sequence of non-negative integers, or one.
          counts: the number of trials, a non-negative real number or an array that
            broadcasts to ``shape`` (checked where it is concrete).
          probs: the probability of success, between 0 and 1, likewise.
          dtype: an integer or floating dtype; int32 by default.
          name: accepted, as TensorFlow's operation name; JAX names no operations.

        Returns:
          An array of ``shape`` and ``dtype``.

        Raises:
          TypeError: if ``shape`` is not integers, ``counts`` or ``probs`` not real
            numbers, ``dtype`` neither integer nor floating, or ``name`` not a str.
          ValueError: if ``shape`` has a negative dimension, or concrete ``counts`` are
            negative or ``probs`` outside [0, 1].
          ShapeMismatchError: if ``counts`` or ``probs`` does not broadcast to ``shape``.
          TraceContextError: where the generator's key cannot be assigned (see `Generator`).

        Example:
          >>> import statevar
          >>> gen = statevar.random.Generator(seed=0)
          >>> successes = gen.binomial((1000,), counts=10, probs=0.5)
          >>> successes.dtype, bool(((successes >= 0) & (successes <= 10)).all())
          (dtype('int32'), True)
        """
        where = self._where("binomial")
        args.check_name(name, where)
        shape = args.shape_of(shape, where)
        counts = args.operand(counts, "counts", where, shape, "real")
        probs = args.operand(probs, "probs", where, shape, "real")
        dtype = args.dtype_of(dtype, where, "an integer or floating", (jnp.integer, jnp.floating))
        args.check_range(counts, "counts", where, 0, None)
        args.check_range(probs, "probs", where, 0, 1)
        draw = functools.partial(args.binomial, shape=shape, dtype=dtype)
        return self._draw(1, lambda keys: draw(keys[0], counts, probs))

    def bernoulli(self, shape: Shape | None = None, p: jax.typing.ArrayLike = 0.5) -> jax.Array:
        """Draws booleans, each True with probability ``p``, as `jax.random.bernoulli`,
        advancing the generator: a dropout mask keeps the values where it is True.

        Args:
          shape: the shape of the result: a sequence of non-negative integers, or one;
            None (the default) for ``p``'s shape. It comes first, as in every draw.
          p: the probability of True: a number or a floating array that broadcasts to
            ``shape``, between 0 and 1 (checked where it is concrete, not where it is
            traced).

        Returns:
          A bool array of ``shape``.

        Raises:
          TypeError: if ``p`` is not a number or a floating array, or ``shape`` is not
            integers.
          ValueError: if a concrete ``p`` is not between 0 and 1, or ``shape`` has a
            negative dimension.
          ShapeMismatchError: if ``p`` does not broadcast to ``shape``.
          TraceContextError: where the generator's key cannot be assigned (see `Generator`).

        Example:
          >>> import jax.numpy as jnp
          >>> import statevar
          >>> gen = statevar.random.Generator(seed=0)
          >>> x = jnp.ones((2, 4))
          >>> rate = 0.5
          >>> keep = gen.bernoulli(x.shape, 1.0 - rate)
          >>> dropped = jnp.where(keep, x / (1.0 - rate), 0.0)
          >>> keep.dtype, dropped.shape
          (dtype('bool'), (2, 4))
        """
        where = self._where("bernoulli")
        if shape is not None:
            hint = ""
            if isinstance(shape, (float, np.floating, jax.Array, np.ndarray)):
                hint = ": the shape comes first, as in every draw (bernoulli(shape, p))"
            shape = args.shape_of(shape, where, hint)
        p = args.operand(p, "the probability p", where, shape, "probability")
        args.check_range(p, "the probability p", where, 0, 1)
        draw = functools.partial(args.bernoulli, shape=np.shape(p) if shape is None else shape)
        return self._draw(1, lambda keys: draw(keys[0], p))

    def _where(self, method: str) -> str:
        """The generator and ``method``, for a message."""
        return f"statevar.random.Generator '{self.state.name}'.{method}"

    def _draw(self, count: int, use: Callable[[jax.Array], _T]) -> _T:
        """Splits the key into the one kept and ``count`` keys, assigns the kept one to
        `state` and returns ``use(keys)``, which runs before the assignment, so that a use
        that raises leaves the generator as it was."""

        def advance(data: jax.Array) -> tuple[jax.Array, _T]:
            kept, keys = args.split(data, self._impl, count)
            return kept, use(keys)

        return self._update(advance, "draw from")

    def _update(self, advance: Callable[[jax.Array], tuple[jax.Array, _T]], action: str) -> _T:
        """Assigns ``advance(key data)[0]`` to `state` and returns ``advance(...)[1]``.

        Holds the update lock (reentrant, and held by a compiled step's first call too), so
        that eager draws from several threads never share a key. Donates the old key's
        buffer when nothing else holds it (see `Variable.assign`).

        Raises:
          TraceContextError: where the key cannot be assigned, with the way out.
        """
        state = self.state
        with STATE.update_lock:
            try:
                if _frames.innermost() is None and _nesting.enclosing_vmap() is not None:
                    # No statevar trace to carry the assignment: the draw would run once,
                    # for every element alike.
                    raise TraceContextError(
                        f"Cannot assign to Variable '{state.name}' inside jax.vmap: a "
                        "variable holds one value, not one per batch element."
                    )
                # Under a nested transformation (a scan's body), the key moves into a ref
                # before it is read, so that each iteration reads what the one before wrote
                # and the step traces once.
                _frames.prepare_update(state, "assign to")
            except TraceContextError as error:
                raise self._cannot(action, error) from None
            new_data, result = advance(state.value)
            try:
                state.assign(new_data)
            except TraceContextError as error:
                raise self._cannot(action, error) from None
        return result

    def _cannot(self, action: str, error: TraceContextError) -> TraceContextError:
        """The error for an assignment of the key refused by ``error``, with the way out:
        ``action`` is "draw from", "reset" or "skip"."""
        if action == "draw from":
            what, way_out = (
                "a draw",
                (
                    "To draw there, take keys outside with .key() (or .split_keys(n), one per "
                    "element for jax.vmap), pass them in, and draw with jax.random inside."
                ),
            )
        else:
            what, way_out = f"a {action}", f"{action.capitalize()} it outside, or in statevar.jit."
        return TraceContextError(
            f"Cannot {action} statevar.random.Generator '{self.state.name}' here, since "
            f"{what} assigns its key. {error} {way_out}"
        )


_global_lock = threading.Lock()
_global: Generator | None = None


def get_global_generator() -> Generator:
    """Returns the process-wide Generator, as ``tf.random.get_global_generator``: the one
    `set_global_generator` set, or else one made on first use from the operating system's
    randomness (`Generator.from_non_deterministic_state`), the same one at every call.

    Example:
      >>> import statevar
      >>> gen = statevar.random.get_global_generator()
      >>> gen is statevar.random.get_global_generator()
      True
    """
    global _global
    with _global_lock:
        if _global is None:
            _global = Generator.from_non_deterministic_state()
        return _global


def set_global_generator(generator: Generator) -> None:
    """Makes ``generator`` the process-wide Generator that `get_global_generator` returns,
    as ``tf.random.set_global_generator``. Code that took the previous one keeps it.

    Raises:
      TypeError: if ``generator`` is not a `Generator`.

    Example:
      >>> import statevar
      >>> statevar.random.set_global_generator(statevar.random.Generator(seed=42))
      >>> first = statevar.random.get_global_generator().normal((2,))
      >>> bool((first == statevar.random.Generator(seed=42).normal((2,))).all())
      True
    """
    global _global
    if not isinstance(generator, Generator):
        raise TypeError(
            "Expected statevar.random.set_global_generator to be given a "
            f"statevar.random.Generator, got {args.describe(generator)}"
        )
    with _global_lock:
        _global = generator
