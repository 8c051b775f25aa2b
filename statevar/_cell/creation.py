"""Creating a variable: its settings, its initial value (an array or an initializer),
its dtype and where it goes; `Variable` calls `initial_state` and stores what it returns.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, TypeGuard

import jax
import jax.numpy as jnp
import numpy as np

from .._errors import DtypeMismatchError, OutOfMemoryError, TraceContextError, format_bytes
from .._tracing import frames as _frames
from .._tracing import jax_internals as _jax_internals
from . import placement as _placement
from .cell import Cell, ConstrainedCell
from .convert import (
    Tracer,
    check_not_deleted,
    convert,
    initial_dtype,
    is_concrete_array,
    short_repr,
    value_shape,
)
from .view import Readable

SYNCHRONIZATIONS = ("auto", "on_write", "on_read")
AGGREGATIONS = ("none", "sum", "mean", "only_first_replica")


class _Subjects(threading.local):
    """What this thread is creating, when a variable is made for an object that speaks for
    it (a `statevar.random.Generator`): messages about where it cannot be created name it."""

    def __init__(self) -> None:
        self.subject: str | None = None


_subjects = _Subjects()


@contextlib.contextmanager
def creating(subject: str) -> Iterator[None]:
    """Inside the block, a variable refused where it cannot be created (see
    `_frames.check_creation`) is named as ``subject`` (``"a statevar.random.Generator"``)."""
    outer, _subjects.subject = _subjects.subject, subject
    try:
        yield
    finally:
        _subjects.subject = outer


def creation_subject(name: str | None) -> str:
    """How messages about where a variable cannot be created name it: by its name, or as
    the object it is made for (see `creating`)."""
    subject = _subjects.subject
    label = f"Variable '{name if name is not None else 'Variable'}'"
    if subject is None:
        return label
    return subject if name is None else f"{subject} (its {label})"


def spelling(value: Any) -> Any:
    """A setting as statevar spells it: lower case, from a str or an enum member's name
    (``tf.VariableSynchronization.ON_READ`` gives ``"on_read"``)."""
    if value is None:
        return "none"
    name = value if isinstance(value, str) else getattr(value, "name", None)
    return name.lower() if isinstance(name, str) else value


def is_on_read(synchronization: Any) -> bool:
    """Whether a ``synchronization=`` argument asks for an on-read variable."""
    return synchronization is not None and spelling(synchronization) == "on_read"


def option(label: str, what: str, value: Any, allowed: tuple[str, ...]) -> str:
    """Returns the setting ``value`` of ``what`` as one of ``allowed``.

    Raises:
      ValueError: if it is none of them.
    """
    spelled = "auto" if what == "synchronization" and value is None else spelling(value)
    if spelled not in allowed:
        raise ValueError(
            f"Cannot create Variable '{label}' with {what}={value!r}: expected one of "
            f"{', '.join(repr(a) for a in allowed)}"
        )
    return spelled


def trainable_flag(label: str, trainable: Any, allow_none: bool) -> Any:
    """Returns ``trainable`` as a Python bool (None kept where ``allow_none``).

    Raises:
      TypeError: if it is not a bool (Python's or NumPy's), or None where allowed.
    """
    if trainable is None and allow_none:
        return None
    if isinstance(trainable, (bool, np.bool_)):
        return bool(trainable)
    action = (
        f"create Variable '{label}' with trainable="
        if allow_none
        else f"set Variable '{label}'.trainable to "
    )
    expected = "True, False or None" if allow_none else "True or False"
    raise TypeError(
        f"Cannot {action}{type(trainable).__name__} {short_repr(trainable)}: expected "
        f"{expected} (a Python or NumPy bool)"
    )


def check_on_read(variable: Cell, label: str, trainable: Any, aggregation: str) -> None:
    """Refuses what an on-read variable cannot be, as TensorFlow does.

    Raises:
      ValueError: if it is asked to be trainable or has no aggregation, or is of a
        subclass of Variable.
    """
    if trainable:
        raise ValueError(
            f"Cannot create Variable '{label}' with synchronization='on_read' and "
            "trainable=True: an on-read variable holds one value per replica and is never "
            "differentiated. Pass trainable=False (the default for on-read variables)."
        )
    if aggregation == "none":
        raise ValueError(
            f"Cannot create Variable '{label}' with synchronization='on_read' and no "
            "aggregation: expected aggregation='sum', 'mean' or 'only_first_replica', which "
            "says how its replicas' values combine when it is read"
        )
    if not getattr(variable, "_is_on_read", False):
        raise ValueError(
            f"Cannot create Variable '{label}' of the subclass {type(variable).__name__} "
            "with synchronization='on_read': create a statevar.Variable"
        )


def is_initializer(value: Any) -> TypeGuard[Callable[[], Any]]:
    """Whether ``value`` is a callable computing the initial value (not an array that
    happens to be callable)."""
    return callable(value) and not isinstance(value, jax.Array | np.ndarray | Readable)


def target_sharding(
    label: str, shape: tuple[int, ...], sharding: Any, device: Any, initial_value: Any
) -> jax.sharding.Sharding | jax.Device | None:  # pyright: ignore[reportInvalidTypeForm]
    """Where a new variable goes: ``sharding=`` (or a Sharding given as ``device=``), else
    ``device=``, else the sharding of an array spread over several devices, else the
    innermost `statevar.mesh` scope (by its rules) or `statevar.device` scope, else None:
    JAX's default device, uncommitted (see `Variable`). Checks a sharding fits before
    anything is created."""
    action = f"Cannot create Variable '{label}'"
    if sharding is not None:
        if callable(sharding) and not isinstance(sharding, jax.sharding.Sharding):
            sharding = sharding(label, tuple(shape))
        return _placement.resolve_sharding(sharding, shape, action)
    if device is not None:
        return _placement.resolve(device, what=f"Variable '{label}'", stacklevel=5)
    if is_concrete_array(initial_value) and _placement.is_multi_device(initial_value.sharding):
        if initial_value.committed:
            return initial_value.sharding
    scope = _placement.current_scope()
    if isinstance(scope, _placement.MeshScope):
        _, spec = _placement.rule_spec(scope.rules, label)
        if callable(spec) and not isinstance(spec, jax.sharding.Sharding):
            spec = spec(label, tuple(shape))
        return _placement.resolve_sharding(spec, shape, action, scope.mesh)
    return scope


def placement_request(label: str, device: Any, sharding: Any) -> tuple[Any, Any]:
    """Returns the ``(device, sharding)`` a new variable asks for: a Sharding given as
    ``device=`` counts as ``sharding=``.

    Raises:
      TypeError: if both are given.
    """
    if sharding is not None and device is not None:
        raise TypeError(
            f"Cannot create Variable '{label}' with both device= and sharding=: pass one"
        )
    if isinstance(device, jax.sharding.Sharding):
        return None, device
    return device, sharding


def evaluate_initializer(
    label: str, initial_value: Any, sharding: Any, device: Any
) -> tuple[Any, Any]:
    """Returns ``(initial value, target placement)``: for a callable initial value, its
    result, and the placement it was computed with (None if it was called eagerly); for
    anything else, the value itself and None.

    The callable runs once. Eagerly, as ``tf.Variable`` calls it, unless the variable may
    be spread over devices (``sharding=``, a Sharding as ``device=``, a `statevar.mesh`
    scope): then it is traced once and computed directly with the variable's sharding,
    never whole on one device first.

    Raises:
      DtypeMismatchError: if the callable returns a tuple, list or dict, not one array.
      PlacementError: if the placement does not fit (see `Variable`).
      Exception: whatever the callable raises, with a note naming the variable.
    """
    if not is_initializer(initial_value):
        return initial_value, None
    may_spread = sharding is not None or (
        device is None and isinstance(_placement.current_scope(), _placement.MeshScope)
    )
    try:
        if not may_spread:
            result = initial_value()
        else:
            traced = jax.jit(initial_value).trace()
            result = traced.out_info
    except Exception as error:
        error.add_note(f"(raised by the initial value callable of Variable '{label}')")
        raise
    if isinstance(result, (tuple, list, dict)) or (may_spread and not hasattr(result, "shape")):
        raise DtypeMismatchError(
            f"Cannot create Variable '{label}': its initial value callable returns "
            f"{type(result).__name__}, expected one array"
        )
    if not may_spread:
        return (result._read() if isinstance(result, Readable) else result), None
    target = target_sharding(label, result.shape, sharding, device, None)
    check_size(label, result.shape, result.dtype, target, on_host=False)
    run = _jax_internals.jaxpr_as_fun(traced.jaxpr)
    return jax.jit(lambda: run()[0], out_shardings=target)(), target


def check_constraint(label: str, constraint: Any) -> None:
    """Refuses a ``constraint=`` that is neither callable nor None.

    Raises:
      TypeError: if it is not.
    """
    if constraint is not None and not callable(constraint):
        raise TypeError(
            f"Cannot create Variable '{label}' with constraint={short_repr(constraint)}: "
            "expected a function from the variable's value to its projection, or None"
        )


def constrained(variable: ConstrainedCell, value: Any) -> Any:
    """Returns ``value``, a new value an Optimizer computed for ``variable``, projected by
    the variable's constraint (unchanged without one).

    Raises:
      ValueError: if the constraint returns something of another shape.
    """
    constraint = variable.constraint
    if constraint is None:
        return value
    projected = constraint(value)
    shape = tuple(getattr(projected, "shape", ()))
    if not hasattr(projected, "shape") or shape != tuple(value.shape):
        raise ValueError(
            f"The constraint of Variable '{variable.name}' returned "
            f"{type(projected).__name__} of shape {shape}, expected the variable's shape "
            f"{tuple(value.shape)}"
        )
    return projected


def check_initial_value(label: str, initial_value: Any) -> None:
    """Refuses an initial value that is deleted or traced.

    Raises:
      ValueError: if it is a deleted array.
      TraceContextError: if it is a tracer.
    """
    check_not_deleted(initial_value, f"Cannot create Variable '{label}'")
    if isinstance(initial_value, Tracer):
        subject = creation_subject(None if label == "Variable" else label)
        raise TraceContextError(
            f"Cannot create {subject} from a traced value inside a JAX transformation: "
            "create variables outside jitted or differentiated functions (a statevar.jit "
            "step may create them in its first trace)."
        )


def host_memory() -> int | None:
    """The bytes of physical memory this machine has, where the system says; else None."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows), or no such name
        return None


def device_memory(device: Any) -> tuple[int, str] | None:
    """The bytes one array on ``device`` can take at most, and what they are: the limit of
    JAX's allocator where the device reports one (``device.memory_stats()``, on GPUs and
    TPUs), else, for a CPU device, the host's physical memory; None if neither is known."""
    try:
        stats = device.memory_stats()
    except Exception:  # a backend that keeps no statistics
        stats = None
    limit = stats.get("bytes_limit") if isinstance(stats, dict) else None
    if isinstance(limit, int) and limit > 0:
        return limit, f"the memory of {device}"
    host = host_memory() if device.platform == "cpu" else None
    return None if host is None else (host, f"the memory of this host, which holds {device}")


def check_size(label: str, shape: Any, dtype: Any, target: Any, *, on_host: bool) -> None:
    """Refuses a variable whose value cannot fit where it would be held, from its shape
    and dtype alone (no element is read): on each device of ``target`` (a Sharding, a
    Device, or None for JAX's default device), its shard; on the host, when the value
    (``on_host``) is converted there first, the whole of it.

    Raises:
      OutOfMemoryError: naming the variable, its shape, its bytes and the memory.
    """
    itemsize = np.dtype(dtype).itemsize
    total = math.prod(shape) * itemsize
    if isinstance(target, jax.sharding.Sharding):
        per_device = math.prod(target.shard_shape(tuple(shape))) * itemsize
        devices = list(target.addressable_devices)
    else:
        per_device, devices = total, [target if target is not None else default_device()]
    # (bytes needed, (bytes there are, where) or None if unknown, the way out)
    needs = [(per_device, device_memory(device), DEVICE) for device in devices]
    host = host_memory() if on_host else None
    if host is not None:
        where = "the memory of this host, where it is converted first"
        needs.insert(0, (total, (host, where), HOST))
    for count, memory, way_out in needs:
        if memory is None or count <= memory[0]:
            continue
        limit, where = memory
        each = "" if count == total else f" ({count:,} bytes on each of its devices)"
        raise OutOfMemoryError(
            f"Cannot create Variable '{label}' of shape {tuple(shape)} and dtype "
            f"{np.dtype(dtype)}: it needs {total:,} bytes ({format_bytes(total)}){each}, "
            f"more than {where} ({limit:,} bytes, {format_bytes(limit)}). Nothing was "
            f"allocated. Make it smaller, or {way_out}"
        )


# The ways out `check_size` names: for a host value, for a device's shard.
HOST = "create it from a callable that computes it where it goes (an initializer)"
DEVICE = "spread it over more devices with sharding="


def default_device() -> jax.Device:  # pyright: ignore[reportInvalidTypeForm]
    # A local device: under jax.distributed, another process's devices come first in
    # jax.devices() on every process but the first.
    # A config option is a dynamic attribute, which jax's stub does not declare.
    configured = jax.config.jax_default_device  # pyright: ignore[reportAttributeAccessIssue]
    if isinstance(configured, jax.Device):
        return configured
    if isinstance(configured, str):
        return jax.local_devices(backend=configured)[0]
    return jax.local_devices()[0]


class InitialState(NamedTuple):
    """What a new variable holds: its array and its settings."""

    array: jax.Array
    trainable: bool
    synchronization: str
    aggregation: str


def initial_array(
    name: str | None, initial_value: Any, dtype: Any, device: Any, sharding: Any, frame: Any
) -> jax.Array:
    """A new variable's array: its initial value converted, copied and placed (see
    `initial_state`); ``frame`` is the `statevar.jit` frame creating it, or None.

    Raises:
      as `Variable`.
    """
    label = name if name is not None else "Variable"
    if isinstance(initial_value, Readable):  # a Variable, or a view of one
        initial_value = initial_value._read()
    device, sharding = placement_request(label, device, sharding)
    initial_value, target = evaluate_initializer(label, initial_value, sharding, device)
    if frame is not None and isinstance(initial_value, Tracer):
        _frames.refuse_traced_initial_value(frame, creation_subject(name))
    check_initial_value(label, initial_value)
    dtype = initial_dtype(initial_value, dtype, label)
    action = f"Cannot create Variable '{label}'"
    # Where it goes and whether it fits, from its shape alone: checked before anything is
    # read, converted or copied (a broadcast view of 2**40 elements holds one), so a bad
    # request changes nothing.
    shape = value_shape(initial_value, action, dtype)
    if target is None:
        target = target_sharding(label, shape, sharding, device, initial_value)
    on_host = not isinstance(initial_value, jax.Array)
    check_size(label, shape, dtype, target, on_host=on_host)
    try:
        initial_value, shape = convert(initial_value, dtype, action)
        return _placed_copy(initial_value, dtype, target)
    except (MemoryError, jax.errors.JaxRuntimeError) as error:
        if isinstance(error, jax.errors.JaxRuntimeError) and "RESOURCE_EXHAUSTED" not in str(error):
            raise
        # It fits the memory, but not what is free of it now.
        raise OutOfMemoryError(
            f"Cannot create Variable '{label}' of shape {tuple(shape)} and dtype {dtype}: "
            f"its {math.prod(shape) * dtype.itemsize:,} bytes do not fit in the memory free "
            f"{'on the host or ' if on_host else ''}on its device now "
            f"({str(error).splitlines()[0] if str(error) else type(error).__name__})"
        ) from error


def initial_state(
    variable: Cell,
    initial_value: Any,
    *,
    trainable: Any,
    name: str | None,
    dtype: Any,
    device: Any,
    sharding: Any,
    synchronization: Any,
    aggregation: Any,
) -> InitialState:
    """Checks a new variable's arguments and computes what it holds (see `Variable`).

    The initial value is converted to the dtype (inferred as JAX infers it, stored as JAX
    stores it) and always copied, then placed: on ``sharding=`` or ``device=``, else where
    the innermost `statevar.mesh` or `statevar.device` scope says, else uncommitted on
    JAX's default device, as ``jnp.zeros`` is. Everything is checked before anything is
    copied to a device. In the first trace of a `statevar.jit` step, the value is computed
    under `jax.ensure_compile_time_eval` (see `_frames.Creation`).

    Raises:
      as `Variable`; and `_frames.NeedsEagerTrace` (see `_frames.check_creation`).
    """
    label = name if name is not None else "Variable"
    if name is not None and not isinstance(name, str):
        raise TypeError(f"Expected the Variable's name to be a str, got {type(name).__name__}")
    trainable = trainable_flag(label, trainable, allow_none=True)
    synchronization = option(label, "synchronization", synchronization, SYNCHRONIZATIONS)
    aggregation = option(label, "aggregation", aggregation, AGGREGATIONS)
    on_read = synchronization == "on_read"
    if on_read:
        check_on_read(variable, label, trainable, aggregation)
    # In a statevar.jit step's first trace, values not computed from the step's traced
    # arguments are computed, concrete, as the variable is created.
    frame = _frames.check_creation(creation_subject(name))
    with jax.ensure_compile_time_eval() if frame is not None else contextlib.nullcontext():
        value = initial_array(name, initial_value, dtype, device, sharding, frame)
    return InitialState(
        value, bool(not on_read if trainable is None else trainable), synchronization, aggregation
    )


def _placed_copy(initial_value: Any, dtype: np.dtype, target: Any) -> jax.Array:
    """A strongly typed copy of the converted initial value (an explicit dtype: a variable's
    dtype is fixed), placed on ``target`` (see `initial_state`)."""
    value = jnp.array(initial_value, dtype=dtype, copy=True)
    if target is not None or value.committed:
        # A copy on the device, then put on the sharding: a NumPy value put straight onto a
        # sharding can alias host memory, and the next donated update would not be in place.
        value = jax.device_put(value, target or default_device())
    return value
