"""`Variable`: a mutable cell holding an immutable `jax.Array`, and its update path.

A variable's eager updates take their hot path in `Variable._eager_update` (an uncommitted
array of the variable's abstract value, once compiled) and the general path, `update`,
for everything else: conversion and checks, the update traced into a frame, and the
donating or copying kernel run under the update lock, signal-safe (`run_kernel`). The
variable's array is stored only by `Variable._swap`, which makes the kernel's call and
the store indivisible, and by the stores listed at `ARRAY_ATTRIBUTE`.
"""

from __future__ import annotations

import collections
import itertools
import sys
from collections.abc import Callable
from typing import Any, Literal, Protocol, TypeAlias, overload

import jax
import numpy as np

from .._errors import (
    DtypeMismatchError,
    TraceContextError,
    interrupted_update_error,
    release_frames,
)
from .._signals import held_signals
from .._state import STATE
from .._tracing import frames as _frames
from . import copies as _copies
from . import creation as _creation
from . import kernels as _kernels
from . import placement as _placement
from .convert import Tracer, check_not_deleted, convert, convert_for_update, value_shape
from .indexing import (
    concrete_index,
    indexed_shape,
    is_scalar_mask,
    masks_to_indices,
    placed_index,
    read_operand,
    split_index,
    unwrap_index,
)
from .kernels import ASSIGN, ASSIGN_ADD, ASSIGN_SUB, SETITEM, SETMASK, Operation
from .operators import RefusedInPlace
from .view import Readable, register_readable, traced_update_error

# jax.Device annotations carry an ignore: see `_placement`.
# Bound once: the eager update is a hot path.
_SOLE_HOLDER_WITH_LOCAL, _getrefcount = _kernels.SOLE_HOLDER_WITH_LOCAL, sys.getrefcount
_starmap = itertools.starmap
consume = collections.deque(maxlen=0).extend  # runs an iterator to its end, in C
_update_lock = STATE.update_lock
_acquire, _release = _update_lock.acquire, _update_lock.release
# The type of a concrete array, as the eager hot path checks it: recorded when a hot path
# first opens (`Variable._open_hot_path`), so that importing statevar starts no JAX backend.
_array_type: type | None = None
# Each eager update's place in a variable's `_hot_avals` (see `Variable._open_hot_path`).
HOT_SLOTS = {ASSIGN: 0, ASSIGN_ADD: 1, ASSIGN_SUB: 2}

# What `Variable.reshard` takes.
ReshardTarget: TypeAlias = (
    "jax.sharding.Sharding | jax.Device | str | jax.sharding.PartitionSpec | tuple | None"  # pyright: ignore[reportInvalidTypeForm]
)

# The attribute holding a variable's array. Only this module stores it (the eager hot path,
# `Variable._swap`, `Variable._replace_array`, `reshard`, deep copies), and `lifted` (a
# compiled step's outputs, all or nothing: `stores`, and `put_back`).
ARRAY_ATTRIBUTE = "_value"


def keep_sharding(variable: Variable, value: Any) -> Any:
    """Inside `statevar.jit`'s trace, pins a variable's new value to the variable's sharding
    when it spans several devices: the compiled step then updates it in place, shard by
    shard, whatever the placement of what was assigned."""
    sharding = variable._value.sharding
    if _placement.is_multi_device(sharding):
        return _placement.pin(value, sharding)
    return value


class BoundUpdate(Protocol):
    """The type of ``v.assign``, ``v.assign_add`` and ``v.assign_sub``: the variable back,
    or None with ``read_value=False``."""

    @overload
    def __call__(
        self,
        value: jax.typing.ArrayLike | Readable,
        use_locking: bool | None = None,
        name: str | None = None,
        read_value: Literal[True] = True,
    ) -> Variable: ...

    @overload
    def __call__(
        self,
        value: jax.typing.ArrayLike | Readable,
        use_locking: bool | None = None,
        name: str | None = None,
        *,
        read_value: Literal[False],
    ) -> None: ...

    @overload
    def __call__(
        self,
        value: jax.typing.ArrayLike | Readable,
        use_locking: bool | None = None,
        name: str | None = None,
        read_value: bool = True,
    ) -> Variable | None: ...


class Update(Protocol):
    """An eager update as a method of `Variable` (see `BoundUpdate`)."""

    @overload
    def __get__(self, instance: None, owner: Any) -> Callable[..., Any]: ...

    @overload
    def __get__(self, instance: Variable, owner: Any) -> BoundUpdate: ...

    def __get__(self, instance: Variable | None, owner: Any) -> Any: ...


def _eager_update(operation: Operation, doc: str) -> Update:
    """Builds the method for ``operation`` (`ASSIGN`, `ASSIGN_ADD`, `ASSIGN_SUB`): the eager
    hot path, everything else left to `Variable._update`. One body serves the three methods,
    each its own function: a call costs one Python frame.

    The hot path takes an uncommitted array of the variable's abstract value (shape, dtype,
    strong type) in this compile epoch (`Variable._open_hot_path`), outside any trace and
    with placements not logged: nothing to convert or check. It donates the old buffer when
    nothing else holds it, else copies it (arrays read earlier stay valid), atomically with
    respect to exceptions raised at any bytecode: the variable holds its old or its new
    array, never a deleted one (``docs/safety.md``).
    """
    method_name, donating = operation.name, operation.donating
    slot = HOT_SLOTS[operation]

    def update(
        self: Variable,
        value: jax.typing.ArrayLike | Variable,
        use_locking: bool | None = None,
        name: str | None = None,
        read_value: bool = True,
    ) -> Variable | None:
        if use_locking is not None or name is not None or read_value is not True:
            # TensorFlow's keywords: checked, then the update without them.
            return with_keywords(self, update, value, use_locking, name, read_value, operation)
        # Acquired inside the try, so that an exception landing right after acquiring still
        # releases; cheaper than `with _update_lock`. The checks run under the lock too:
        # another thread may replace the array (commit or reshard it) in between.
        try:
            _acquire()
            old = self._value
            if (
                type(value) is _array_type
                # JAX interns abstract values: equal ones are one object
                and value.aval is self._hot_avals[slot]  # type: ignore[union-attr]
                and not value.committed  # type: ignore[union-attr]
                # not a new compile epoch, no trace frame open, placements not logged
                and self._hot_epoch == STATE.hot_epoch
                # not in a signal handler that interrupted a donation (see `_run_kernel`)
                and not STATE.donating
            ):
                try:
                    # Before the refcount is read: a handler from here on reads a copy.
                    STATE.donating = True
                    # The unpacking assignment consumes the iterator that makes the call: no
                    # signal check between the donation and the store of its result. Donated
                    # when only the variable (and `old`) holds it, else copied.
                    (self._value,) = map(
                        copying_kernel(self, operation)
                        if _getrefcount(old) > _SOLE_HOLDER_WITH_LOCAL
                        else donating,
                        (old,),
                        (value,),
                    )
                    if self._value.__class__ is not _array_type:
                        # Traced by an outer jax.jit (nothing donated): put back before any
                        # signal check (reads, identity tests and stores make none).
                        self._value = old
                except (RuntimeError, ValueError) as error:
                    return self._failed_update(operation, value, old, error)
                finally:
                    STATE.donating = False
                if self._value is old:  # put back: the update was traced
                    self._refuse_traced(operation)
                return self
            del old  # a reference held here would make the array look shared
            return self._update(operation, value)  # still holding the (reentrant) lock
        except BaseException as error:
            old = None  # noqa: F841 (a kept error keeps this frame, not the old array)
            release_frames(error)
            raise
        finally:
            try:
                _release()
            except RuntimeError:
                pass  # acquire itself was interrupted while waiting: nothing to release

    update.__name__ = update.__qualname__ = method_name
    update.__doc__ = doc
    return update  # pyright: ignore[reportReturnType]  (a function binds as `Update` says)


class Variable(RefusedInPlace, Readable):
    """A mutable cell holding an immutable `jax.Array`, in the manner of ``tf.Variable``.

    A Variable works as an array does with operators, NumPy, ``jnp`` functions and plain
    ``jax.jit`` arguments (`jax.lax` functions, and ``jax.nn.sigmoid``, take ``v.value``),
    and is updated in place with `assign`, `assign_add`,
    `assign_sub` and ``v[index] = x``. Updates run as cached jitted functions that donate
    the old buffer when nothing else holds it, so a large variable is updated without a
    second copy; an array read earlier is never deleted or changed by a later update.

    Args:
      initial_value: anything ``jnp.asarray`` accepts, another Variable, or a callable
        taking no arguments that returns the value (``lambda: jax.random.normal(key,
        shape)``), called once: eagerly, as ``tf.Variable`` calls it, or, when the
        variable may be spread over devices (``sharding=``, a `statevar.mesh` scope),
        traced once and computed directly with its sharding. What the callable raises
        reaches the caller with a note naming the variable. The value is always copied:
        the variable never shares memory with it. An array spread over several devices
        keeps its sharding unless ``sharding=`` or ``device=`` is given.
      trainable: whether `statevar.grad` differentiates with respect to this variable;
        True unless the variable is on-read (which cannot be trainable).
      name: a name for messages, summaries and checkpoints. Without one, a variable held
        by a `statevar.Module` is known by its path in the module tree (``"layers/0/kernel"``),
        any other by ``"Variable"``.
      dtype: the dtype; inferred as JAX infers it when omitted (``1`` gives int32, ``1.0``
        float32).
      device: ``"cpu:0"``, ``"gpu:0"``, a `jax.Device` or a `jax.sharding.Sharding`;
        defaults to the innermost `statevar.device` or `statevar.mesh` scope. A variable
        given none of these (nor a committed initial value) holds an uncommitted array
        on JAX's default device, as ``jnp.zeros`` does: compiled steps take it without a
        sharding annotation, and it becomes committed, on its device, when assigned a
        committed array or first lifted by a compiled step given committed arguments.
      sharding: a `jax.sharding.Sharding`, a `jax.sharding.PartitionSpec`, or a tuple of
        mesh axis names per dimension (None for a replicated dimension), resolved against
        the innermost `statevar.mesh`, or a callable ``(name, shape) -> spec``; not with
        ``device=``. The sharding is fixed like the shape: every update
        keeps it and runs in place, shard by shard; only `reshard` moves the variable.
      synchronization: ``"auto"`` or ``"on_write"`` (the default: one value), or
        ``"on_read"``: one value per replica along the first axis of the variable's mesh
        (from ``sharding=`` or the innermost `statevar.mesh`), read as their aggregate,
        as TensorFlow's ``VariableSynchronization.ON_READ``. An on-read variable is not
        trainable; `statevar.PerReplica` values update each replica on its own devices.
        See the scaling guide.
      aggregation: how an on-read variable's replicas combine into its value: ``"sum"``,
        ``"mean"`` (floating and complex dtypes) or ``"only_first_replica"``; required
        with ``synchronization="on_read"``. ``"none"`` (or None) otherwise; other
        variables keep the setting (``v.aggregation``) without using it. TensorFlow's
        enum members (``tf.VariableAggregation.SUM``) are accepted by name too.
      constraint: a function from the variable's value to its projection, of the same
        shape (``lambda w: jnp.clip(w, 0.0, 1.0)``), that an `Optimizer` applies after each
        of its updates of the variable, eagerly and in compiled steps, as TensorFlow's and
        Keras's optimizers do. A plain `assign` does not apply it. Read it as
        ``v.constraint``.

    Raises:
      TypeError: if ``initial_value`` is not numeric or cannot be converted to ``dtype``,
        or both ``device`` and ``sharding`` are given, or ``constraint`` is not callable,
        or an on-read variable has a dtype its aggregation cannot combine (a mean of
        integers, a sum of bools).
      ValueError: if ``synchronization`` or ``aggregation`` is unknown, or an on-read
        variable is asked to be trainable or lacks an aggregation.
      TraceContextError: if created while `statevar.grad` or `stateless_call` traces, or
        while `statevar.jit` traces other than at the step's own level in its first trace,
        or from a value traced there (see `statevar.jit`).
      OutOfMemoryError: (a MemoryError) if the value cannot fit where it would be held,
        found from its shape and dtype before anything is read, converted or copied: the
        host's memory for a value converted there, each device's memory for its shard
        (the allocator's limit where JAX reports it, ``device.memory_stats()``), or the
        memory free now when an allocation fails.
      PlacementError: if ``device`` does not exist and soft placement is off, or the
        sharding does not fit (an axis the mesh lacks, a dimension the axis does not
        divide, a spec longer than the rank, a spec without a mesh to resolve it), or an
        on-read variable has no mesh or is sharded over its mesh's first axis.

    Example:
      >>> import statevar
      >>> v = statevar.Variable([1.0, 2.0], name="v")
      >>> v.assign_add([1.0, 1.0])
      <Variable 'v' shape=(2,) dtype=float32, numpy=array([2., 3.], dtype=float32)>
    """

    # The class of each synchronization that has its own, registered by defining it with
    # ``class OnReadVariable(Variable, synchronization="on_read")`` (see `_on_read`).
    _synchronized_classes: dict[str, type[Variable]] = {}

    def __init_subclass__(cls, synchronization: str | None = None, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if synchronization is not None:
            Variable._synchronized_classes[synchronization] = cls

    def __new__(cls, *args: Any, **kwargs: Any) -> Variable:
        if cls is Variable and _creation.is_on_read(kwargs.get("synchronization")):
            # One value per replica: its own class, so that no update of it ever takes the
            # eager hot path of `statevar._cell.kernels` (see `_on_read`).
            cls = Variable._synchronized_classes["on_read"]
        return object.__new__(cls)

    def __init__(
        self,
        initial_value: jax.typing.ArrayLike | Variable,
        *,
        trainable: bool | None = None,
        name: str | None = None,
        dtype: jax.typing.DTypeLike | None = None,
        device: str | jax.Device | jax.sharding.Sharding | None = None,  # pyright: ignore[reportInvalidTypeForm]
        sharding: jax.sharding.Sharding | jax.sharding.PartitionSpec | tuple | None = None,
        synchronization: str = "auto",
        aggregation: str | None = None,
        constraint: Callable[[jax.Array], jax.Array] | None = None,
    ):
        _creation.check_constraint(name if name is not None else "Variable", constraint)
        state = _creation.initial_state(
            self,
            initial_value,
            trainable=trainable,
            name=name,
            dtype=dtype,
            device=device,
            sharding=sharding,
            synchronization=synchronization,
            aggregation=aggregation,
        )
        self._name, self._trainable = name, state.trainable
        if constraint is not None:
            self._constraint = constraint
        if state.synchronization != "auto" or state.aggregation != "none":
            self._synchronization, self._aggregation = state.synchronization, state.aggregation
        self._forget_compiled()
        # Uncommitted on JAX's default device where nothing asked where, as `jnp.zeros` is.
        self._value: jax.Array = state.array
        _placement.log(self.name, "create", self._value.sharding)

    # ----------------------------------------------------------------- properties

    _constraint: Callable[[jax.Array], jax.Array] | None = None

    @property
    def constraint(self) -> Callable[[jax.Array], jax.Array] | None:
        """The projection an Optimizer applies to the variable's value after each of its
        updates (``constraint=`` at creation), or None. A plain `assign` does not apply it,
        as in TensorFlow."""
        return self._constraint

    @property
    def trainable(self) -> bool:
        """Whether `statevar.grad` differentiates with respect to this variable."""
        return self._trainable

    @trainable.setter
    def trainable(self, enabled: bool) -> None:
        enabled = _creation.trainable_flag(self.name, enabled, allow_none=False)
        if enabled != self._trainable:
            self._trainable = enabled
            STATE.bump_compile_epoch()

    def reshard(self, sharding: ReshardTarget) -> Variable:
        """Moves the variable to another sharding (or device): the only update that does.

        Copies the value onto the new sharding; nothing is donated, so arrays read earlier
        stay valid, on their old placement. Compiled functions reading the variable trace
        again for the new sharding.

        Args:
          sharding: a `jax.sharding.Sharding`, a `jax.Device` or a device spec as
            ``device=`` takes it (``"cpu:2"``, ``"/GPU:0"``), or a PartitionSpec or tuple
            of axis names (None for replicated) resolved against the innermost
            `statevar.mesh`.

        Returns:
          The variable itself.

        Raises:
          PlacementError: if the sharding does not fit the variable (see `Variable`).
          TraceContextError: inside `statevar.jit` or `statevar.grad`.

        Example:
          >>> import jax
          >>> import statevar
          >>> w = statevar.Variable(jax.numpy.zeros((8, 2)), name="w")
          >>> with statevar.mesh(jax.make_mesh((len(jax.devices()),), ("data",))):
          ...     w = w.reshard(("data", None))
          >>> w.sharding.spec
          P('data', None)
        """
        if isinstance(sharding, str):  # "cpu:2", as device= takes it
            sharding = _placement.resolve(sharding, what=f"Variable '{self.name}'")
        target = _placement.reshard_target(
            sharding, self.shape, f"Cannot reshard Variable '{self.name}'"
        )
        if STATE.open_trace_frames and _frames.innermost() is not None:
            raise TraceContextError(
                f"Cannot reshard Variable '{self.name}' inside statevar.jit or statevar.grad: "
                "reshard it before the compiled step"
            )
        with _update_lock:  # an update in another thread lands before the copy or after
            new = _placement.put(self._read(), target)
            # Updates compiled for the old placement must not serve the new one: forgotten,
            # and a new compile epoch started, before the store, so that an exception
            # landing in between leaves the variable unmoved rather than moved unnoticed.
            self._forget_compiled()
            STATE.bump_compile_epoch()
            self._value = new
        _placement.log(self.name, "reshard", target)
        return self

    # ----------------------------------------------------------------- reads

    def _read(self) -> jax.Array:
        if STATE.open_trace_frames:
            traced = _frames.read(self)
            if traced is not None:
                return traced
        try:  # rather than `with _update_lock`, which costs more; see `_eager_update`
            _acquire()
            value = self._value
            if STATE.donating and not value.is_deleted():
                # In a signal handler that interrupted a donating update of this thread:
                # the array is about to be donated (see `ProcessState.donating`). A copy that
                # compiles nothing, so that a handler firing again meanwhile finds it done.
                value = jax.device_put(value, value.sharding, may_alias=False)
        finally:
            try:
                _release()
            except RuntimeError:
                pass  # acquire itself was interrupted while waiting: nothing to release
        if value.is_deleted():
            raise self._deleted_error("Cannot read")
        return value

    def _traced_here(self) -> bool:
        return _frames.innermost() is not None

    def _refuse_value_set(self, value: Any = None) -> None:
        """Refuses ``v.value = x`` (and ``del v.value``), which a flax nnx user may write.

        Raises:
          AttributeError: always, naming the variable and the method to call.
        """
        raise AttributeError(
            f"Cannot set Variable '{self.name}' by assigning to .value: a variable is "
            "updated in place with .assign(new_value) (or assign_add, assign_sub, v[i] = x)"
        )

    # `_read` itself as the property's getter: one Python call per read, not two.
    value = property(
        _read,
        _refuse_value_set,
        _refuse_value_set,
        doc="The current value; it stays valid after later updates.",
    )

    def _replace_array(self, array: jax.Array) -> None:
        """Stores ``array`` as the variable's value, as it is: no conversion, no check.

        The one store of a new array for code outside this module (the compiled step's
        store of its outputs aside: see `stores`). Donates nothing: the old array stays
        valid for whoever still holds it. Callers hold `ProcessState.update_lock` wherever
        another thread may update the variable. A change of commitment starts a new
        compile epoch (see `ProcessState.bump_compile_epoch`).
        """
        if array.committed is not self._value.committed:
            STATE.bump_compile_epoch()
        self._value = array
        self._lost = None

    def _set_path(self, path: str) -> None:
        """Lets the variable be known by ``path`` in the Module holding it (see `name`)."""
        self._path = path

    # ----------------------------------------------------------------- updates

    # The eager updates are built by `_eager_update` (one Python body with no extra call):
    # see there.
    assign = _eager_update(
        ASSIGN,
        """Sets the variable to ``value``, in place.

        The value is converted to the variable's dtype when that is safe and broadcast to
        its shape. Donates the old buffer when nothing else holds it; arrays read earlier
        stay valid.

        Takes ``tf.Variable.assign``'s keywords too: ``use_locking`` (accepted: every update
        is atomic already), ``name`` (no operation to name) and ``read_value``.

        Args:
          value: the new value.
          use_locking: True, False or None; changes nothing.
          name: a str or None; changes nothing.
          read_value: False to return None rather than the variable.

        Returns:
          The variable itself, or None with ``read_value=False``.

        Raises:
          TypeError: if the conversion would lose information (1.5 into int32), or a
            keyword is of the wrong type (checked before anything changes).
          ValueError: if the value does not broadcast to the variable's shape.
          StatevarError: in a signal handler that interrupted another update, which would
            store its result over this one.
        """,
    )
    assign_add = _eager_update(
        ASSIGN_ADD,
        """Adds ``delta`` in place, atomically; see `assign` for conversions, keywords
        (``use_locking``, ``name``, ``read_value``) and errors.

        Donates the old buffer when nothing else holds it; arrays read earlier stay valid.
        """,
    )
    assign_sub = _eager_update(
        ASSIGN_SUB,
        """Subtracts ``delta`` in place, atomically; see `assign` for conversions, keywords
        (``use_locking``, ``name``, ``read_value``) and errors.

        Donates the old buffer when nothing else holds it; arrays read earlier stay valid.
        """,
    )

    def __setitem__(self, index: Any, value: jax.typing.ArrayLike | Variable) -> None:
        """Sets ``self[index]`` to ``value`` in place (``v[index] = value``).

        Donates the old buffer when nothing else holds it; arrays read earlier stay valid.

        Raises:
          IndexError: if the index is out of range, or is a boolean traced inside a compiled
            function (its selection is known only when the step runs).
          TypeError: if a slice bound is not an integer, or is traced inside a compiled
            function (the slice's size must be known when it compiles).
          TypeError, ValueError: as `assign`, against the indexed part's shape.
        """
        try:
            set_item(self, index, value)
        except BaseException as error:
            release_frames(error)  # a kept error keeps no array (see `release_frames`)
            raise

    def _update(self, operation: Operation, value: Any, index: tuple | None = None) -> Variable:
        """Applies ``operation`` in place: the general path (see `update`)."""
        return update(self, operation, value, index)

    def _swap(self, kernel: Callable, old: jax.Array, operands: tuple) -> None:
        """Stores ``kernel(old, *operands)`` in place of ``old``: the one store of an
        update's result outside the hot path (`_eager_update`).

        The call is made by the iterator that the unpacking assignment consumes, so no
        bytecode (where an exception such as KeyboardInterrupt can land) comes between a
        donating call and the store. Under an outer jax.jit the update is only traced
        (nothing is donated): the old array is put back before any signal check
        (attribute reads, identity tests and stores make none), so no tracer is left
        stored.
        """
        (self._value,) = _starmap(kernel, ((old, *operands),))
        if self._value.__class__ is not old.__class__:
            self._value = old

    def _forget_compiled(self) -> None:
        """Forgets which updates this variable has run (JAX's fast path for their calls),
        for a new variable or a new placement."""
        # Signatures (`compiled_key`) of the donating calls this variable has run, in
        # `ProcessState.compiled_updates_generation` ``_compiled_generation``.
        self._compiled: set[Any] = set()
        self._compiled_generation = STATE.compiled_updates_generation
        # Per eager update (`HOT_SLOTS`): the abstract value it takes on the hot path, in
        # compile epoch `_hot_epoch`; None where the hot path is closed.
        self._hot_avals: list[Any] = [None, None, None]
        self._hot_epoch = -1

    def _open_hot_path(self, slot: int) -> None:
        """Lets the eager hot path (see `_eager_update`) run the update in ``slot`` for
        values of the variable's abstract value, uncommitted, until the next compile epoch:
        its donating call is compiled for the variable's commitment, which only a new
        compile epoch changes."""
        global _array_type
        if _array_type is not type(self._value):
            _array_type = type(self._value)
        epoch = STATE.compile_epoch
        if self._hot_epoch != epoch:
            self._hot_avals, self._hot_epoch = [None, None, None], epoch
        self._hot_avals[slot] = self._value.aval

    def _failed_update(
        self, operation: Operation, value: Any, old: jax.Array, error: Exception
    ) -> Variable:
        """Handles an update whose jitted call raised ``error``; the variable still holds
        ``old``.

        Returns the variable if the failure is recovered (an assign to a variable whose
        array was deleted outside statevar); otherwise raises, naming the variable.
        """
        if old.is_deleted():
            # Donated or deleted outside statevar: only assign can restore it.
            if operation is not ASSIGN:
                raise self._deleted_error(f"Cannot {operation.phrase}") from None
            self._replace_array(_kernels.fresh(value, old))
            return self
        # An array deleted (donated elsewhere) that passed the inline check above.
        check_not_deleted(value, f"Cannot {operation.phrase} Variable '{self.name}'")
        raise error

    def _refuse_traced(self, operation: Operation) -> None:
        """Raises for an update that an outer jax.jit traced, even with concrete operands
        (nothing is donated then), once its tracer was put back or never stored: it
        could never reach the variable.

        Raises:
          TraceContextError: naming the variable and the way out (statevar.jit).
        """
        raise traced_update_error(self, operation)

    def _deleted_error(self, action: str) -> ValueError:
        cause = self._lost or (
            "was donated or deleted outside statevar (by a jax.jit with donate_argnums, or "
            ".delete() on its value)"
        )
        return ValueError(
            f"{action} Variable '{self.name}': its array {cause}, so its value is lost. "
            "Restore it with .assign(new_value), or from a checkpoint with statevar.restore."
        )

    # How the variable's deleted array was lost, when statevar lost it (a compiled step that
    # failed after donating); cleared by whatever stores an array in its place.
    _lost: str | None = None

    def _mark_lost(self, cause: str) -> None:
        self._lost = cause

    def __copy__(self) -> Variable:
        """The variable itself, as for ``tf.Variable``: a variable stands for one piece of
        state, and a shallow copy sharing its array would part from it at the first update.
        ``copy.deepcopy`` makes a new variable."""
        return self

    def __deepcopy__(self, memo: dict) -> Variable:
        """A new variable holding a copy of the value, with the same name, trainable flag
        and placement."""
        value = self._read()
        copied = Variable(
            value,
            trainable=self._trainable,
            name=self._name,
            device=self.sharding,
            constraint=self._constraint,
        )
        if not value.committed:
            # Placed nowhere: so is the copy, on the same device (JAX runs work on
            # uncommitted arrays on its default device). Stored as it is: no compiled step
            # lifts the copy yet, so no compile epoch starts (`_replace_array`).
            with jax.default_device(self.device):
                copied._value = _kernels.copy_array(value)
        copied._path = self._path
        return copied


# ----------------------------------------------------------- the general update path


def compiled_key(signature: Any, *, committed: bool) -> Any:
    """The key under which a variable records that it has run the donating call of an
    update of ``signature`` (as `update` gives it: the bare operation name, that name with
    ``"committed"``, `_kernels.signature`, or any of these with a multi-device sharding):
    JAX compiles apart for a committed and an uncommitted variable array, so a variable
    that became committed runs its updates cold once more."""
    return (signature, "committed variable") if committed else signature


def update(variable: Variable, operation: Operation, value: Any, index: tuple | None = None) -> Any:
    """Applies ``operation`` in place: the general path (see `_general_update`). An error it
    raises holds no array of the variable's (see `release_frames`)."""
    try:
        return _general_update(variable, operation, value, index)
    except BaseException as error:
        release_frames(error)
        raise


def _general_update(
    variable: Variable, operation: Operation, value: Any, index: tuple | None
) -> Any:
    """Applies ``operation`` in place: the general path.

    Converts and checks ``value`` (a whole-variable update, ``index`` None; setitem and
    setmask validate it against the indexed part first and pass their index operands),
    records updates made while a transformation traces, and holds signal handlers
    through JAX's first call for new argument types, which runs Python code after
    donating. Donates the old buffer when nothing else holds it, else copies it: arrays
    read earlier stay valid. Atomic with respect to exceptions raised at any bytecode
    (``KeyboardInterrupt``, a signal handler's): the variable then holds its old or its
    new array, never a deleted one.
    """
    current = variable._value
    if index is None:
        if (
            type(value) is type(current)
            and value.aval == current.aval
            and (not value.committed or value.sharding == current.sharding)
        ):
            # An uncommitted value: the bare operation, the key the hot path looks for.
            key = operation.name
            signature: Any = (key, "committed") if value.committed else key
        else:
            value = convert_for_update(read_operand(value), current, variable.name, operation)
            signature = None
    else:
        signature = None
    del current
    if STATE.open_trace_frames and _frames.innermost() is not None:
        return record_traced(variable, operation, value, index)
    if signature is None:
        signature = _kernels.signature(operation, value, index)
    sharding = variable._value.sharding
    if _placement.is_multi_device(sharding):
        # Pinned to the variable's sharding whatever the value's placement, and never
        # the bare operation the hot path looks for.
        donating, copying = _kernels.pinned_updates(operation, sharding)
        signature = (signature, sharding)
    else:
        donating, copying = operation.donating, operation.copying
    operands = (value,) if index is None else (value, *index)
    run_kernel(variable, operation, (donating, copying), signature, value, operands)
    if STATE.log_placement:
        _placement.log(variable.name, operation.name, variable.device)
    return variable


def run_kernel(
    variable: Variable,
    operation: Operation,
    kernels: tuple,
    signature: Any,
    value: Any,
    operands: tuple,
) -> None:
    """Runs an update kernel on the variable's array and stores its result: the donating
    kernel of ``kernels`` (donating, copying) when nothing else holds the array, else
    the copying one (arrays read earlier stay valid).

    Atomic with respect to exceptions raised at any bytecode: JAX's first call for new
    argument types (``signature`` not yet run) runs Python code after donating, so the
    first donating call holds the signal handlers until the result is stored; later
    calls store the result with no check for signals in between (see `_eager_update`).
    A copying call needs neither: it donates nothing. Opens the eager hot path for the
    update once its donating call is compiled for a bare ``signature`` (an uncommitted
    array of the variable's abstract value, see `statevar._cell.kernels`).

    Raises:
      StatevarError: in a signal handler that interrupted a donating update (see
        `ProcessState.donating`).
      CopyError: under the copy policy ``"raise"``; like every error raised here, it
        holds no array of the variable's (see `release_frames`).
    """
    with _update_lock:
        if STATE.donating:
            raise interrupted_update_error(f"{operation.phrase} Variable '{variable.name}'")
        try:
            # Set before the reference count is read (see `ProcessState.donating`).
            STATE.donating = True
            _run_kernel_locked(variable, operation, kernels, signature, value, operands)
        except BaseException as error:
            # Its frames hold the old array: a kept error must not (see `release_frames`).
            release_frames(error)
            raise
        finally:
            STATE.donating = False


def _run_kernel_locked(
    variable: Variable,
    operation: Operation,
    kernels: tuple,
    signature: Any,
    value: Any,
    operands: tuple,
) -> None:
    """`run_kernel`'s body, under the update lock, with `ProcessState.donating` set."""
    donating, copying = kernels
    old = variable._value
    shared = _getrefcount(old) > _SOLE_HOLDER_WITH_LOCAL
    kernel = copying if shared else donating
    key = compiled_key(signature, committed=old.committed)
    if variable._compiled_generation != STATE.compiled_updates_generation:
        variable._forget_compiled()  # `statevar.clear_caches` dropped them
    first = key not in variable._compiled
    refused = None
    if shared:
        _copies.check(variable, _copies.HELD, old.nbytes, operation.name)
    elif first:
        refused = check_donation(variable, operation, kernel, key, (old, *operands))
    if not old.committed and any(map(_placement.is_committed, operands)):
        # JAX commits what it computes from a committed array: the variable becomes
        # committed. The new compile epoch starts before the store, so that no
        # exception can leave it committed in the epoch its hot path and compiled
        # steps were opened in.
        STATE.bump_compile_epoch()
    try:
        if first:
            check_operation(variable, operation)
        if first and not shared:
            # JAX's first call runs Python code after donating: signal handlers are held
            # until the result is stored.
            with held_signals():
                variable._swap(kernel, old, operands)
        else:
            # A copying call donates nothing: an exception landing in JAX's Python
            # code leaves the variable its old array.
            variable._swap(kernel, old, operands)
    except (RuntimeError, ValueError) as error:
        variable._failed_update(operation, value, old, error)
        return
    if variable._value is old:  # put back: the update was traced
        variable._refuse_traced(operation)
    if not shared and refused is None:
        # The donating call is compiled: JAX's fast path from now on. One whose donation
        # JAX refuses stays on this path, where each call applies the copy policy of its
        # time (a memo lookup: nothing is lowered again).
        variable._compiled.add(key)
    if variable._value.committed is not old.committed:
        # Committed some other way (not expected: see above); still a new epoch.
        STATE.bump_compile_epoch()
    elif not shared and refused is None and signature == operation.name:
        slot = HOT_SLOTS.get(operation)
        if slot is not None:
            variable._open_hot_path(slot)


def copying_kernel(variable: Variable, operation: Operation) -> Any:
    """The copying kernel of ``operation``, for the eager hot path's update of a variable
    whose array something else holds, once the copy policy has seen the copy.

    Raises:
      CopyError: under the copy policy ``"raise"`` (nothing is copied or stored).
    """
    if _copies.POLICY.policy != "silent":
        _copies.check(variable, _copies.HELD, variable._value.nbytes, operation.name)
    return operation.copying


def check_donation(
    variable: Variable, operation: Operation, kernel: Any, key: Any, arguments: tuple
) -> str | None:
    """Before a donating kernel's first call for a variable (and each later one while JAX
    refuses the donation), applies the copy policy if JAX refuses it (no output can take
    the buffer, or the platform does not donate): the kernel would copy. Lowers the kernel
    once per kind of arguments (the call that follows reuses the lowering; later calls
    find the refusal memoized); runs nothing.

    Returns:
      The cause of the refusal (see `statevar._cell.copies`), or None.

    Raises:
      CopyError: under the copy policy ``"raise"``.
    """
    if any(isinstance(argument, Tracer) for argument in arguments):
        return None  # an outer jax.jit traces the update: nothing is donated
    old = arguments[0]
    memo = (kernel, key, old.aval, old.sharding)
    cause = _copies.kernel_refusal(memo, kernel, arguments)
    if cause is not None:
        _copies.check(variable, cause, old.nbytes, operation.name)
    return cause


def record_traced(variable: Variable, operation: Operation, value: Any, index: tuple | None) -> Any:
    """Applies ``operation`` while `statevar.jit` or `statevar.grad` traces: records the
    new traced value in the innermost trace frame. The variable's own array is neither
    read for donation nor replaced.

    Raises:
      TraceContextError: for a value (or index) that escaped the transformation that made
        it (see `_frames.is_escaped`).
    """
    check_operation(variable, operation)
    if _frames.is_escaped(value) or (
        index is not None and any(map(_frames.is_escaped, jax.tree.leaves(index)))
    ):
        raise TraceContextError(
            f"Cannot {operation.phrase} Variable '{variable.name}' inside statevar.jit or "
            f"statevar.grad: the {'value' if _frames.is_escaped(value) else 'index'} is a "
            "tracer that escaped the JAX transformation that made it (kept by a side effect, "
            "such as appending to a list inside jax.jit), so it holds no value. Return "
            "values from transformed functions instead of saving them."
        )
    if operation is not ASSIGN:
        _frames.prepare_update(variable, operation.phrase)
    old = _frames.read(variable) if operation is not ASSIGN else None
    if old is None:
        old = variable._value
    new = operation.pure(old, value, *(index or ()))
    _frames.write(variable, new, operation.phrase)
    return variable


def with_keywords(
    variable: Variable,
    update: Any,
    value: Any,
    use_locking: Any,
    name: Any,
    read_value: Any,
    operation: Operation,
) -> Any:
    """Runs ``update(variable, value)`` for a call given TensorFlow's keywords: checks them
    first (a refused call changes nothing), then returns the variable, or None for
    ``read_value=False``. ``use_locking`` changes nothing (every update is atomic already),
    nor does ``name`` (no graph op to name).

    Raises:
      TypeError: if ``read_value`` or ``use_locking`` is not a bool (``use_locking`` may
        be None), or ``name`` is not a str or None.
    """
    action = f"Cannot {operation.phrase} Variable '{variable.name}' with"
    if not isinstance(read_value, (bool, np.bool_)):
        raise TypeError(
            f"{action} read_value={read_value!r}: expected True (return the variable) or "
            "False (return None)"
        )
    if use_locking is not None and not isinstance(use_locking, (bool, np.bool_)):
        raise TypeError(f"{action} use_locking={use_locking!r}: expected True, False or None")
    if name is not None and not isinstance(name, str):
        raise TypeError(
            f"{action} name={name!r}: expected a str or None (the name of the operation)"
        )
    update(variable, value)
    return variable if read_value else None


def check_operation(variable: Variable, operation: Operation) -> None:
    """Refuses arithmetic on a bool variable, as tf.Variable does (JAX would give a
    logical or for assign_add, and an error naming no variable for assign_sub).

    Raises:
      DtypeMismatchError: for assign_add or assign_sub on a bool variable.
    """
    if operation.arithmetic and variable._value.dtype == np.bool_:
        raise DtypeMismatchError(
            f"Cannot {operation.phrase} Variable '{variable.name}': it has dtype bool, "
            "which has no addition or subtraction; use assign (with jnp.logical_or or "
            "jnp.logical_xor of its value) instead"
        )


register_readable(Variable)


def set_item(variable: Variable, index: Any, value: Any) -> None:
    """`Variable.__setitem__` (which documents what it raises): reads the index, checks
    the value against the indexed part (a mask of the variable's shape with a scalar value
    is one compiled update for every mask), then runs the variable's update."""
    index = placed_index(variable, concrete_index(variable, unwrap_index(index)))
    if (
        isinstance(index, (jax.Array, np.ndarray))
        and index.dtype == np.bool_
        and index.shape == variable.shape
        and value_shape(
            read_operand(value),
            f"Cannot {SETITEM.phrase} Variable '{variable.name}'",
            variable.dtype,
        )
        == ()
    ):
        # v[v < 0] = 0: one compiled update for every mask of the variable's shape.
        value = convert_for_update(
            read_operand(value), variable._value, variable.name, SETITEM, target_shape=()
        )
        variable._update(SETMASK, value, (index,))
        return
    parts = index if isinstance(index, tuple) else (index,)
    if any(map(is_scalar_mask, parts)):
        # NumPy reads a 0-d boolean as a new axis that selects everything (True) or
        # nothing (False).
        if not all(bool(part) for part in parts if is_scalar_mask(part)):
            action = f"Cannot {SETITEM.phrase} Variable '{variable.name}'"
            target = indexed_shape(variable, index)
            convert(read_operand(value), variable.dtype, action, target, "indexed part")
            return  # nothing selected: the value checked, nothing to change
        index = tuple(None if is_scalar_mask(part) else part for part in parts)
    static, dynamic = split_index(index)
    if not any(isinstance(part, Tracer) for part in dynamic):
        target = indexed_shape(variable, index)
        # A jitted update cannot take a boolean mask (the selection's shape would depend
        # on its values), so a concrete mask becomes the integer indices it selects.
        static, dynamic = split_index(masks_to_indices(index))
    else:
        target = indexed_shape(variable, index, traced=True)
    value = convert_for_update(
        read_operand(value), variable._value, variable.name, SETITEM, target_shape=target
    )
    variable._update(SETITEM, value, (dynamic, static))
