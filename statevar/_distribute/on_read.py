"""On-read variables: one value per replica, read as their aggregate.

``Variable(..., synchronization="on_read", aggregation=...)`` makes an `OnReadVariable`, as
TensorFlow's ``VariableSynchronization.ON_READ``: it holds one value per replica along the
first axis of its mesh, as one array of shape ``(replicas, *shape)`` sharded over that axis,
so that each replica's value lives on that replica's devices. A `PerReplica` update changes
every replica's value on its own devices, with no collective; a read combines them (sum,
mean, or the first replica's value), which is where the replicas communicate. Any other
update is cross-replica: it is split over the replicas so that the aggregate changes exactly
as it would for a plain variable.

The per-replica array is the variable's ``_value``: `statevar.jit` lifts and donates it like
any variable's, its trace sees it (reads aggregate it, updates are split over it), and
each write is pinned to its sharding. The shape, `Variable.sharding` and checkpoints are
the aggregate's. Updates never take the eager hot path of `Variable._update`: this class
has its own, which keeps the same interrupt-safe store.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from .. import _caches
from .._cell import kernels as _kernels
from .._cell import placement as _placement
from .._cell.convert import broadcasts_to, check_not_deleted, convert_for_update
from .._cell.indexing import read_operand
from .._cell.kernels import Operation
from .._cell.variable import Variable, check_operation, run_kernel
from .._cell.view import register_readable
from .._errors import DtypeMismatchError, PlacementError, ShapeMismatchError, TraceContextError
from .._state import STATE
from .._tracing import frames as _frames
from .per_replica import PerReplica

_getrefcount, _SOLE_HOLDER = sys.getrefcount, _kernels.SOLE_HOLDER


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where an on-read variable's replicas live, and how they combine.

    Attributes:
      aggregation: ``"sum"``, ``"mean"`` or ``"only_first_replica"``.
      axis: the mesh axis indexing the replicas (the mesh's first).
      replicas: the size of that axis.
      replica_sharding: the sharding of the ``(replicas, *shape)`` array.
      aggregate_sharding: the sharding of the aggregate (the variable's `sharding`).
    """

    aggregation: str
    axis: str
    replicas: int
    replica_sharding: NamedSharding
    aggregate_sharding: NamedSharding


def layout(action: str, aggregate_sharding: Any, aggregation: str) -> Layout:
    """Returns the layout of an on-read variable whose aggregate has ``aggregate_sharding``.

    Raises:
      PlacementError: if the sharding is not over a mesh, or uses the mesh's first axis.
    """
    if not isinstance(aggregate_sharding, NamedSharding):
        where = (
            _placement.describe(next(iter(aggregate_sharding.device_set)))
            if len(aggregate_sharding.device_set) == 1
            else repr(aggregate_sharding)
        )
        raise PlacementError(
            f"{action} with synchronization='on_read': it needs a device mesh, whose first "
            f"axis holds its replicas, and got none (it would be placed on {where}). Create "
            "it inside `with statevar.mesh(mesh):`, or pass "
            "sharding=NamedSharding(mesh, PartitionSpec())."
        )
    mesh, spec = aggregate_sharding.mesh, tuple(aggregate_sharding.spec)
    axis = mesh.axis_names[0]
    for entry in spec:
        if entry == axis or (isinstance(entry, tuple) and axis in entry):
            raise PlacementError(
                f"{action} with synchronization='on_read' and sharding "
                f"{aggregate_sharding.spec}: mesh axis {axis!r}, the mesh's first, holds the "
                "replicas, so the value cannot be sharded over it; use the mesh's other axes"
            )
    replica_sharding = NamedSharding(
        mesh, PartitionSpec(axis, *spec), memory_kind=aggregate_sharding.memory_kind
    )
    return Layout(aggregation, axis, mesh.shape[axis], replica_sharding, aggregate_sharding)


# --------------------------------------------------------------------------- pure functions


def _first_replica(shape: tuple[int, ...], sharding: NamedSharding) -> jax.Array:
    return _placement.pin(lax.broadcasted_iota(jnp.int32, shape, 0) == 0, sharding)


def aggregate(layout: Layout, replicas: Any) -> jax.Array:
    """Combines the ``(replicas, *shape)`` values into the variable's value.

    A mean is the first replica's value plus the mean of the others' differences from it:
    exact when the replicas agree, as after a cross-replica assign.
    """
    dtype = replicas.dtype
    if layout.aggregation == "sum":
        return jnp.sum(replicas, axis=0, dtype=dtype)
    sharding = _sharding_like(layout, replicas.ndim)
    first = _first_replica(replicas.shape, sharding)
    if dtype == np.bool_:
        return jnp.any(jnp.logical_and(first, replicas), axis=0)
    value = jnp.sum(jnp.where(first, replicas, jnp.zeros_like(replicas)), axis=0, dtype=dtype)
    if layout.aggregation == "only_first_replica":
        return value
    spread = jnp.sum(replicas - value, axis=0, dtype=dtype) / layout.replicas
    return value + spread.astype(dtype)


def _sharding_like(layout: Layout, ndim: int) -> NamedSharding:
    if ndim >= len(layout.replica_sharding.spec):
        return layout.replica_sharding
    return NamedSharding(layout.replica_sharding.mesh, PartitionSpec(layout.axis))


def split(layout: Layout, value: Any) -> jax.Array:
    """Splits a cross-replica value (or delta) into one per replica, shape ``(replicas,
    *value.shape)``, whose aggregate is ``value``: for a sum the first replica's is the
    value and the others' zero; otherwise every replica's is the value."""
    value = jnp.asarray(value)
    shape = (layout.replicas, *value.shape)
    sharding = _sharding_like(layout, len(shape))
    spread = _placement.pin(jnp.broadcast_to(value, shape), sharding)
    if layout.aggregation != "sum":
        return spread
    first = _first_replica(shape, sharding)
    return jnp.where(first, spread, jnp.zeros_like(spread))


def apply(operation: Operation, replicas: Any, operands: Any, index: tuple = ()) -> jax.Array:
    """Applies ``operation``'s pure update to each replica's value with its own
    operand, replica by replica (so on each replica's devices)."""
    pure = operation.pure
    return jax.vmap(lambda old, operand: pure(old, operand, *index))(replicas, operands)


# --------------------------------------------------------------------------- compiled forms


@_caches.register_cached
@functools.cache
def reader(layout: Layout) -> Any:
    """The compiled read: the aggregate, on the aggregate's sharding. Donates nothing."""
    return jax.jit(functools.partial(aggregate, layout), out_shardings=layout.aggregate_sharding)


@_caches.register_cached
@functools.cache
def initializer(layout: Layout) -> Any:
    """The compiled split of an aggregate into new per-replica values. Donates nothing."""
    return jax.jit(functools.partial(split, layout), out_shardings=layout.replica_sharding)


@_caches.register_cached
@functools.cache
def cross_replica_updates(operation: Operation, layout: Layout) -> tuple[Any, Any]:
    """(donating, copying) compiled updates by a cross-replica value: split over the
    replicas, then applied to each replica's value."""

    def update(old: Any, value: Any, *index: Any) -> jax.Array:
        new = apply(operation, old, split(layout, value), index)
        return _placement.pin(new, layout.replica_sharding)

    return _pair(update, layout, static_argnums=3 if operation is _kernels.SETITEM else ())


@_caches.register_cached
@functools.cache
def local_updates(operation: Operation, layout: Layout) -> tuple[Any, Any]:
    """(donating, copying) compiled updates by per-replica values, shape ``(replicas,
    *shape)``: each replica's value changes on its own devices, with no collective."""

    def update(old: Any, values: Any) -> jax.Array:
        values = _placement.pin(values, layout.replica_sharding)
        return _placement.pin(apply(operation, old, values), layout.replica_sharding)

    return _pair(update, layout)


def _pair(update: Any, layout: Layout, **kwargs: Any) -> tuple[Any, Any]:
    def written_through(old: Any, *args: Any) -> jax.Array:
        # Writing the result over the old values keeps them an input of the computation, so
        # an assign that ignores them still donates their buffer (JAX drops the donation of
        # an argument the result does not use); XLA folds the full-size write away.
        new = update(old, *args)
        return _placement.pin(
            lax.dynamic_update_slice(old, new, (0,) * old.ndim), layout.replica_sharding
        )

    kwargs.update(out_shardings=layout.replica_sharding)
    return jax.jit(written_through, donate_argnums=0, **kwargs), jax.jit(update, **kwargs)


def _like(shape: tuple[int, ...], dtype: Any, sharding: Any) -> jax.ShapeDtypeStruct:
    """What `convert_for_update` checks a value against: the aggregate, or the replicas."""
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


# --------------------------------------------------------------------------- the variable


class OnReadVariable(Variable, synchronization="on_read"):
    """A `Variable` made with ``synchronization="on_read"``: one value per replica.

    Created by ``statevar.Variable(..., synchronization="on_read", aggregation=...)``;
    see `Variable` for the arguments and the scaling guide for its use.
    """

    _is_on_read = True
    _layout: Layout

    def __init__(self, initial_value: Any, **kwargs: Any):
        super().__init__(initial_value, **kwargs)
        label, dtype = self.name, self._value.dtype
        placed = layout(
            f"Cannot create Variable '{label}'", self._value.sharding, self._aggregation
        )
        if self._aggregation == "mean" and not jnp.issubdtype(dtype, jnp.inexact):
            raise DtypeMismatchError(
                f"Cannot create Variable '{label}' with aggregation='mean' and dtype {dtype}: "
                "a mean needs a floating or complex dtype; use aggregation='sum' and divide, "
                "or a float dtype"
            )
        if self._aggregation == "sum" and dtype == np.bool_:
            raise DtypeMismatchError(
                f"Cannot create Variable '{label}' with aggregation='sum' and dtype bool: bool "
                "values have no sum; use an integer dtype, or aggregation='only_first_replica'"
            )
        self._layout = placed
        self._replace_array(initializer(placed)(self._value))

    # ----------------------------------------------------------------- properties

    @property
    def trainable(self) -> bool:
        """Always False: an on-read variable is never differentiated."""
        return False

    @trainable.setter
    def trainable(self, enabled: bool) -> None:
        if enabled:
            raise ValueError(
                f"Cannot make Variable '{self.name}' trainable: it is an on-read variable "
                "(one value per replica), which is never differentiated"
            )

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the variable's value (each replica's), fixed at creation."""
        return self._value.shape[1:]

    @property
    def ndim(self) -> int:
        """The number of dimensions of the variable's value."""
        return self._value.ndim - 1

    @property
    def size(self) -> int:
        """The number of elements of the variable's value."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def sharding(self) -> jax.sharding.Sharding:
        """The sharding of the value a read gives (the aggregate's)."""
        return self._layout.aggregate_sharding

    @property
    def device(self) -> jax.sharding.Sharding:
        """The sharding of the value a read gives: it spans the mesh."""
        return self._layout.aggregate_sharding

    @property
    def replicas(self) -> int:
        """The number of replicas: the size of the mesh's first axis."""
        return self._layout.replicas

    @property
    def replica_values(self) -> jax.Array:
        """Every replica's value, shape ``(replicas, *shape)``, sharded over the mesh's first
        axis (each replica's value on its devices). It stays valid after later updates."""
        return Variable._read(self)

    # ----------------------------------------------------------------- reads

    def _read(self) -> jax.Array:
        replicas = Variable._read(self)
        if replicas.ndim != self._value.ndim:
            # Inside statevar.grad or statevar.stateless_call, which hold the aggregate.
            return replicas
        return reader(self._layout)(replicas)

    value = property(
        _read,
        Variable._refuse_value_set,
        Variable._refuse_value_set,
        doc="The aggregate of the replicas' values (see `Variable.value`).",
    )

    # ----------------------------------------------------------------- updates

    def _aggregate_target(self) -> jax.ShapeDtypeStruct:
        return _like(self.shape, self._value.dtype, self._layout.aggregate_sharding)

    def _replica_operand(self, per_replica: PerReplica, operation: Operation) -> Any:
        """Checks per-replica values against the variable; returns them as one array of
        shape ``(replicas, *shape)``, converted to its dtype, on the replicas' sharding
        (concrete values) or traced. Donates nothing.

        Raises:
          TypeError: for values that cannot be converted safely.
          ShapeMismatchError: for the wrong number of replicas, or values that do not
            broadcast to the variable's shape.
        """
        # An indexed update never gets here: `__setitem__` refuses per-replica values.
        action = f"Cannot {operation.phrase} Variable '{self.name}'"
        try:
            values = per_replica.stacked()
        except ValueError as error:
            raise ShapeMismatchError(
                f"{action}: the statevar.PerReplica values have different shapes ({error})"
            ) from None
        check_not_deleted(values, action)
        count, part, shape = np.shape(values)[0], tuple(np.shape(values)[1:]), self.shape
        layout = self._layout
        if count != layout.replicas:
            raise ShapeMismatchError(
                f"{action}: statevar.PerReplica has {count} values, but the variable has "
                f"{layout.replicas} replicas (mesh axis {layout.axis!r})"
            )
        if not broadcasts_to(part, shape):
            raise ShapeMismatchError(
                f"{action}: each replica's value in statevar.PerReplica has shape {part}, "
                f"which does not broadcast to the variable's shape {shape}"
            )
        if part != shape:
            full = (count, *shape)
            aligned = (count, *(1,) * (len(shape) - len(part)), *part)
            numpy = isinstance(values, np.ndarray)
            values = (np if numpy else jnp).broadcast_to(values.reshape(aligned), full)
        target = _like((count, *shape), self._value.dtype, layout.replica_sharding)
        return convert_for_update(values, target, self.name, operation)

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(value, PerReplica):
            raise _indexed_per_replica_error(self)
        super().__setitem__(index, value)

    def _update(self, operation: Operation, value: Any, index: tuple | None = None) -> Variable:
        """Applies ``operation``: per replica for `PerReplica` values, else cross-replica.

        Donates the per-replica array when nothing else holds it, else copies it: arrays
        read earlier stay valid. As atomic as `Variable._update` with respect to
        exceptions raised at any bytecode.
        """
        if STATE.open_trace_frames and _frames.innermost() is not None:
            return self._update_traced(operation, value, index)
        layout = self._layout
        if isinstance(value, PerReplica):
            operand = self._replica_operand(value, operation)
            donating, copying = local_updates(operation, layout)
        else:
            if index is None:
                value = convert_for_update(
                    read_operand(value), self._aggregate_target(), self.name, operation
                )
            operand = value
            donating, copying = cross_replica_updates(operation, layout)
        check_operation(self, operation)
        signature = _kernels.signature(operation, operand, index)
        operands = (operand,) if index is None else (operand, *index)
        run_kernel(self, operation, (donating, copying), signature, value, operands)
        _placement.log(self.name, operation.name, self.sharding)
        return self

    def _update_traced(self, operation: Operation, value: Any, index: tuple | None) -> Variable:
        """Records an update made while `statevar.jit` (which holds the per-replica values)
        or `statevar.grad` or `statevar.stateless_call` (which hold the aggregate) traces."""
        old = _frames.read(self)
        if old is None:
            old = self._value
        per_replica = old.ndim == self._value.ndim
        frame = _frames.innermost()
        if per_replica and frame is not None and frame.kind != "jit" and not self._in_ref():
            # The write lands in statevar.grad's or stateless_call's frame, which hold the
            # aggregate (statevar.grad assigns it to the variable afterwards).
            old, per_replica = reader(self._layout)(old), False
        index = index or ()
        if isinstance(value, PerReplica):
            operand = self._replica_operand(value, operation)
            if per_replica:
                operand = _placement.pin(operand, self._layout.replica_sharding)
                new = apply(operation, old, operand)
            else:
                new = operation.pure(old, aggregate(self._layout, operand))
        else:
            if not index:
                value = convert_for_update(
                    read_operand(value), self._aggregate_target(), self.name, operation
                )
            if per_replica:
                new = apply(operation, old, split(self._layout, value), index)
            else:
                new = operation.pure(old, value, *index)
        check_operation(self, operation)
        if per_replica:
            new = _placement.pin(new, self._layout.replica_sharding)
        _frames.write(self, new, operation.phrase)
        return self

    def _in_ref(self) -> bool:
        """Whether a trace frame holds the variable in a `jax.Ref`, which writes then reach."""
        return any(self in frame.refs for frame in _frames._stack())

    def _failed_update(
        self, operation: Operation, value: Any, old: jax.Array, error: Exception
    ) -> Variable:
        if old.is_deleted() and operation is _kernels.ASSIGN:
            # Donated or deleted outside statevar: an assign gives every replica a value.
            if isinstance(value, PerReplica):
                operand = self._replica_operand(value, operation)
                self._replace_array(
                    _placement.put(jnp.asarray(operand), self._layout.replica_sharding)
                )
            else:
                like = self._aggregate_target()
                self._replace_array(initializer(self._layout)(_kernels.fresh(value, like)))
            return self
        return super()._failed_update(operation, value, old, error)

    def reshard(
        self, sharding: jax.sharding.Sharding | jax.sharding.PartitionSpec | tuple | None
    ) -> Variable:
        """Moves the variable onto another mesh (or shards its value otherwise): its
        aggregate is split over the new mesh's replicas as by a cross-replica assign.

        Nothing is donated: arrays read earlier stay valid.

        Args:
          sharding: the aggregate's new sharding: a `jax.sharding.NamedSharding`, or a
            PartitionSpec or tuple of axis names resolved against the innermost
            `statevar.mesh`.

        Returns:
          The variable itself.

        Raises:
          PlacementError: if the sharding is not over a mesh, uses the mesh's first axis,
            or does not fit the variable's shape.
          TraceContextError: inside `statevar.jit` or `statevar.grad`.
        """
        action = f"Cannot reshard Variable '{self.name}'"
        target = _placement.reshard_target(sharding, self.shape, action)
        placed = layout(action, target, self._aggregation)
        if STATE.open_trace_frames and _frames.innermost() is not None:
            raise TraceContextError(
                f"{action} inside statevar.jit or statevar.grad: reshard it before the "
                "compiled step"
            )
        with STATE.update_lock:  # an update in another thread lands before the copy or after
            new = initializer(placed)(_placement.put(self._read(), target))
            # As `Variable.reshard`: forgotten, and a new compile epoch started, before the
            # store.
            self._forget_compiled()
            STATE.bump_compile_epoch()
            self._layout = placed
            self._replace_array(new)
        _placement.log(self.name, "reshard", target)
        return self

    # ----------------------------------------------------------------- Python protocols

    def __repr__(self) -> str:
        try:
            array = np.asarray(self._read())
            text = repr(array.item()) if array.ndim == 0 else np.array_repr(array)
            if "\n" in text:
                text = "\n" + text
        except Exception as error:  # repr must never raise
            text = f"<unavailable: {type(error).__name__}>"
        return (
            f"<Variable '{self.name}' shape={self.shape} dtype={self.dtype}, on_read "
            f"aggregation={self._aggregation!r} replicas={self._layout.replicas}, numpy={text}>"
        )

    def __deepcopy__(self, memo: dict) -> Variable:
        copied = object.__new__(OnReadVariable)
        copied.__dict__.update(self.__dict__)
        copied._forget_compiled()
        copied._replace_array(_placement.put(self.replica_values, self._layout.replica_sharding))
        return copied


def _indexed_per_replica_error(variable: Variable) -> TypeError:
    return TypeError(
        f"Cannot set an item of Variable '{variable.name}' with statevar.PerReplica values: "
        "only assign, assign_add and assign_sub take them. Set the item with a plain value "
        "(a cross-replica update), or assign PerReplica values for the whole variable."
    )


# A pytree as Variable is (JAX registers exact types): it flattens to its aggregate.
register_readable(OnReadVariable)
