"""What a `Variable` and a `View` of one share: the read side of a variable.

`Readable` holds the properties (name, shape, dtype, placement), the reads, the operators
and the array protocols. `Variable` adds updates; `View`, what JAX's tree functions make of
a Variable, refuses them. The two are siblings, so ``isinstance(x, Variable)`` is False
for a view and no consumer needs to tell them apart.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, NoReturn

import jax
import numpy as np

from .._errors import TraceContextError
from .._state import STATE
from .._tracing import frames as _frames
from . import placement as _placement
from .array_methods import ArrayMethods
from .convert import Tracer, is_concrete_array, short_repr
from .indexing import index_shape, on_host, unwrap_index
from .kernels import ASSIGN, ASSIGN_ADD, ASSIGN_SUB, SETITEM, Operation
from .operators import ArrayOperators, RebindingInPlace

_update_lock = STATE.update_lock


class Readable(ArrayOperators, ArrayMethods):
    """The read side of a variable, shared by `Variable` and `View`: properties, reads,
    operators, jax.Array's read methods (`ArrayMethods`), array protocols and repr. Reads go
    through ``_read``, which each defines."""

    __array_priority__ = 100
    _name: str | None
    _trainable: bool
    _value: jax.Array
    # The path of an unnamed variable in the Module that holds it, set by `statevar.Module`.
    _path: str | None = None
    _synchronization = "auto"
    _aggregation = "none"

    # ----------------------------------------------------------------- properties

    @property
    def name(self) -> str:
        """The name given at creation; else the variable's path in the `statevar.Module`
        holding it (from the outermost Module, as in ``"layers/0/kernel"``); else
        ``"Variable"``."""
        if self._name is not None:
            return self._name
        return self._path if self._path is not None else "Variable"

    @property
    def trainable(self) -> bool:
        """Whether `statevar.grad` differentiates with respect to this variable."""
        return self._trainable

    @property
    def synchronization(self) -> str:
        """``"auto"``, ``"on_write"`` or ``"on_read"``, as given at creation."""
        return self._synchronization

    @property
    def aggregation(self) -> str:
        """How an on-read variable's replicas combine: ``"sum"``, ``"mean"`` or
        ``"only_first_replica"``; ``"none"`` unless given."""
        return self._aggregation

    @property
    def value(self) -> jax.Array:
        """The current value. It stays valid, unchanged, after later updates."""
        return self._read()

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape, fixed at creation."""
        return self._value.shape

    @property
    def dtype(self) -> np.dtype:
        """The dtype, fixed at creation."""
        return self._value.dtype

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return self._value.ndim

    @property
    def size(self) -> int:
        """The number of elements."""
        return self._value.size

    @property
    def device(self) -> jax.Device | jax.sharding.Sharding:  # pyright: ignore[reportInvalidTypeForm]  # jax.Device: an alias the stubs declare as a variable
        """The device the variable lives on; its Sharding if it spans several devices, as
        `jax.Array.device` gives."""
        sharding = self._value.sharding
        if _placement.is_multi_device(sharding):
            return sharding
        return next(iter(sharding.device_set))

    @property
    def sharding(self) -> jax.sharding.Sharding:
        """The sharding of the variable's array, fixed at creation (see `reshard`)."""
        return self._value.sharding

    # ----------------------------------------------------------------- reads

    def _read(self) -> jax.Array:
        """The current value (a traced one while `statevar.jit` or `statevar.grad` traces)."""
        raise NotImplementedError

    def read_value(self) -> jax.Array:
        """Returns the current value; later updates never delete or change it."""
        return self._read()

    def numpy(self) -> np.ndarray:
        """Returns a NumPy copy of the current value.

        Raises:
          ValueError: if the variable is spread over several processes (`jax.distributed`):
            this process holds only its own shards.
        """
        return np.array(self._host_readable())

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        array = np.asarray(self._host_readable(), dtype=dtype)
        return array.copy() if copy else array

    def _host_readable(self) -> jax.Array:
        value = self._read()
        if (
            is_concrete_array(value)
            and not value.is_fully_addressable
            and not value.is_fully_replicated  # each process holds all of it: NumPy reads it
        ):
            raise ValueError(
                f"Cannot read Variable '{self.name}' into NumPy: it is spread over several "
                "processes and this one holds only its own shards. Gather it first "
                "(jax.experimental.multihost_utils.process_allgather(v.value)), or read "
                "v.value.addressable_shards."
            )
        return value

    def __jax_array__(self) -> jax.Array:
        return self._read()

    def __getitem__(self, index: Any) -> jax.Array:
        """Returns ``self.value[index]``. An index known on the host is checked as NumPy
        checks it (JAX would clamp an integer out of range to the last element).

        Raises:
          IndexError: if the index is out of range, or is of a kind NumPy refuses.
          TypeError: if the index is of a kind JAX refuses (a str, a float).
        """
        index = unwrap_index(index)
        if type(index) is int and self.shape and -self.shape[0] <= index < self.shape[0]:
            pass  # the common v[i], in range
        elif all(map(on_host, index if isinstance(index, tuple) else (index,))):
            index_shape(self.shape, index, f"Cannot read Variable '{self.name}'")
        try:
            # No local holds the value: a kept error keeps this frame.
            return self._read()[index]
        except (TypeError, IndexError) as error:
            if type(error) not in (TypeError, IndexError):
                raise  # JAX's own kinds (a traced boolean index), which users catch by name
            # An index of a kind JAX refuses: v["x"], v[1.5], v[object()].
            raise type(error)(
                f"Cannot read Variable '{self.name}'[{short_repr(index)}]: expected an index "
                "of integers, slices, None, Ellipsis, or integer or boolean arrays "
                f"({str(error).splitlines()[0]}); the variable's shape is {self.shape}"
            ) from None

    # ----------------------------------------------------------------- Python protocols

    def _traced_here(self) -> bool:
        """Whether the value is being traced here (a Variable inside `statevar.jit` or
        `statevar.grad`): its repr shows no numbers, which would be the value before the
        step."""
        return False

    def __repr__(self) -> str:
        if self._traced_here():
            return (
                f"<Variable '{self.name}' shape={self.shape} dtype={self.dtype}, "
                "numpy=<traced: print it with jax.debug.print>>"
            )
        try:
            # Under the lock, so that an update in another thread cannot donate the array
            # between reading the attribute and converting it.
            with _update_lock:
                value = self._value
            if not isinstance(value, (jax.Array, np.ndarray, np.generic)):
                # A view of what JAX's tree functions made of the value (a shape, say).
                return f"<Variable '{self.name}' value={value!r}>"
            if isinstance(value, jax.Array) and value.is_deleted():
                raise _DeletedOutside
            array = np.asarray(value)
            text = repr(array.item()) if array.ndim == 0 else np.array_repr(array)
            if "\n" in text:
                text = "\n" + text
        except _DeletedOutside:
            text = "<deleted outside statevar: assign a new value>"
        except Exception as error:  # repr must never raise
            text = f"<unavailable: {type(error).__name__}>"
        try:
            shape, dtype = self.shape, self.dtype
        except Exception:
            shape, dtype = "?", "?"
        return f"<Variable '{self.name}' shape={shape} dtype={dtype}, numpy={text}>"

    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        if math.prod(self.shape) != 1:
            raise ValueError(
                f"The truth value of Variable '{self.name}' (shape {self.shape}) is "
                "ambiguous: expected one element. Use jnp.any(v) or jnp.all(v)"
            )
        return bool(self._read())

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError(f"len() of unsized Variable '{self.name}' (shape ())")
        return self.shape[0]

    def __iter__(self) -> Iterator[jax.Array]:
        if not self.shape:
            raise TypeError(f"Cannot iterate over unsized Variable '{self.name}' (shape ())")
        return iter(self._read())

    def _check_scalar(self, kind: str) -> None:
        """Refuses converting a value of more than zero dimensions to a Python ``kind``.

        Raises:
          TypeError: naming the variable and its shape.
        """
        if self.shape:
            raise TypeError(
                f"Cannot convert Variable '{self.name}' to a Python {kind}: expected shape "
                f"(), got shape {self.shape}. Index one element first (v[0])"
            )

    def __float__(self) -> float:
        self._check_scalar("float")
        return float(self._read())

    def __int__(self) -> int:
        self._check_scalar("int")
        return int(self._read())

    def __complex__(self) -> complex:
        self._check_scalar("complex")
        return complex(self._read())

    def __index__(self) -> int:
        self._check_scalar("int")
        return self._read().__index__()

    def __round__(self, ndigits: int | None = None) -> Any:
        return round(self._read(), ndigits)

    def __format__(self, format_spec: str) -> str:
        """``f"{v:.3f}"`` formats a 0-d value as a jax.Array does; ``f"{v}"`` is ``str(v)``."""
        if not format_spec:
            return str(self)
        value = self._read()
        if value.ndim:
            raise TypeError(
                f"Cannot format Variable '{self.name}' with {format_spec!r}: it has shape "
                f"{value.shape}, and only a 0-d value takes a format spec (as for a jax.Array)"
            )
        return format(value, format_spec)

    def __contains__(self, item: Any) -> bool:
        return item in self._read()

    def __array_namespace__(self, *, api_version: str | None = None) -> Any:
        return self._read().__array_namespace__(api_version=api_version)

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._read().__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self._read().__dlpack_device__()  # pyright: ignore[reportAttributeAccessIssue]  # in jax.Array, missing from its stub

    # Pytree: a variable flattens to its value, so plain jax.jit, jax.tree and jnp
    # functions accept it. What they unflatten is a read-only view of the value they hold
    # (a tracer inside plain jax.jit, an array after jax.tree.map), not the variable.
    def tree_flatten(self) -> tuple[tuple[jax.Array], tuple[str | None, bool]]:
        return (self._read(),), (self._name, self._trainable)

    @classmethod
    def tree_unflatten(cls, aux: tuple[str | None, bool], children: tuple[Any, ...]) -> View:
        view = object.__new__(View)
        view._name, view._trainable = aux
        view._value = children[0]
        return view


class View(RebindingInPlace, Readable):
    """What JAX's tree functions make of a Variable: a read-only view of one value.

    Inside plain `jax.jit`, `jax.grad` or `jax.vmap` a Variable argument becomes a view of
    its tracer; `jax.tree.map` and `jax.device_get` give views of their results. A view
    reads like the variable and refuses updates, which could never reach the variable. It
    is not a `Variable`: `statevar.jit` passes it as its array, a Module's walk skips it,
    and where a Variable is needed (`statevar.grad`'s ``wrt``, an Optimizer, a checkpoint)
    it is refused, naming the variable to pass instead.
    """

    def _read(self) -> jax.Array:
        # Its own value, never a traced one: a view is not lifted, and is never updated.
        return self._value

    def __deepcopy__(self, memo: dict[int, Any]) -> View:
        # Still a view (of the same immutable value): a copied Module keeps its variables.
        return View.tree_unflatten((self._name, self._trainable), (self._value,))

    def assign(
        self, value: Any, use_locking: Any = None, name: Any = None, read_value: Any = True
    ) -> NoReturn:
        """Refuses: a view is read-only (update the Variable itself)."""
        self._refuse(ASSIGN)

    def assign_add(
        self, delta: Any, use_locking: Any = None, name: Any = None, read_value: Any = True
    ) -> NoReturn:
        """Refuses: a view is read-only (update the Variable itself)."""
        self._refuse(ASSIGN_ADD)

    def assign_sub(
        self, delta: Any, use_locking: Any = None, name: Any = None, read_value: Any = True
    ) -> NoReturn:
        """Refuses: a view is read-only (update the Variable itself)."""
        self._refuse(ASSIGN_SUB)

    def __setitem__(self, index: Any, value: Any) -> NoReturn:
        self._refuse(SETITEM)

    def _refuse(self, operation: Operation) -> NoReturn:
        """Raises the error for ``operation`` on a view.

        Raises:
          TraceContextError: for a view of a tracer inside plain `jax.jit`.
          TypeError: otherwise.
        """
        if isinstance(self._value, Tracer) and _frames.innermost() is None:
            raise traced_update_error(self, operation)
        if isinstance(self._value, Tracer):
            raise TypeError(
                f"Cannot {operation.phrase} Variable '{self.name}': this is a read-only view "
                "of its value, made where a JAX function (jax.tree.map, or a jax.jit "
                "function given the variable as an argument) read it, not the variable. "
                "Inside statevar.jit, update the Variable itself: reach it by closure, or "
                "pass it to the statevar.jit function."
            )
        raise TypeError(
            f"Cannot {operation.phrase} Variable '{self.name}': this is a read-only view "
            "made by a JAX tree function such as jax.tree.map or jax.device_get, not the "
            "variable. Update the Variable itself, or create a new one from the view."
        )


def register_readable(cls: type[Readable]) -> None:
    """Registers a variable class as a pytree node (JAX looks up a node's exact type): one
    child, its value, keyed ``.value`` (``jax.tree_util.keystr`` gives ``"['w'].value"``
    for a variable under a dict's key ``"w"``)."""

    def flatten_with_keys(variable: Readable) -> tuple[tuple[tuple[Any, Any], ...], Any]:
        (value,), aux = variable.tree_flatten()
        return ((_VALUE_KEY, value),), aux

    def unflatten(aux: Any, children: Any) -> Any:
        return cls.tree_unflatten(aux, tuple(children))

    jax.tree_util.register_pytree_with_keys(
        cls, flatten_with_keys, unflatten, lambda variable: variable.tree_flatten()
    )


_VALUE_KEY = jax.tree_util.GetAttrKey("value")
register_readable(View)


class _DeletedOutside(Exception):
    """A variable's array was donated or deleted outside statevar (for `Readable.__repr__`)."""


def traced_update_error(variable: Readable, operation: Operation) -> TraceContextError:
    """The error for an update of ``variable`` traced by plain `jax.jit` (or another JAX
    transformation), which could never reach the variable."""
    return TraceContextError(
        f"Cannot {operation.phrase} Variable '{variable.name}' inside jax.jit or another "
        "JAX transformation: use statevar.jit, which carries the update out of the trace."
    )
