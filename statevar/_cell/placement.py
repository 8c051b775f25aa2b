"""Device and mesh scopes, shardings, soft placement and placement logging."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax import lax
from jax.core import Tracer
from jax.sharding import (
    AbstractMesh,
    Mesh,
    NamedSharding,
    PartitionSpec,
    Sharding,
)

from .._errors import PlacementError
from .._state import STATE
from .._tracing import jax_internals as _jax_internals
from .cell import Cell

# jax.Device is a class at run time, but jaxlib ships no stub for it and pyright reads the
# alias as a variable: each annotation naming it carries an ignore for that alone.

logger = logging.getLogger("statevar")

# "gpu:0" and TensorFlow's spellings: "/GPU:0", "/device:GPU:0", "/job:w/task:0/device:GPU:0".
_DEVICE_PATTERN = re.compile(r"^(?:.*/)?(?:device:)?([A-Za-z]+)(?::(\d+))?$")
_PLATFORM_ALIASES = {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "rocm": "gpu", "tpu": "tpu"}


class PlacementWarning(UserWarning):
    """Soft placement moved a variable or computation to the default device."""


# The process-wide placement settings (see `_state`).
# This thread's stack of `device` and `mesh` scopes (``.stack``), private to this module.
_thread_scopes = threading.local()


@dataclasses.dataclass(eq=False, slots=True)
class PlacementSettings:
    """How placement treats a device this machine lacks, process-wide.

    Attributes:
      soft: whether a missing device falls back to the default one
        (`statevar.set_soft_device_placement`), as TensorFlow's soft placement.
    """

    soft: bool = True


SETTINGS = PlacementSettings()


def set_soft_device_placement(enabled: bool) -> None:
    """Turns soft device placement on or off (on by default).

    With soft placement on, asking for a device this machine lacks (``"gpu:0"`` on a
    CPU-only machine) places on the default device and warns with `PlacementWarning`.
    With it off, the same request raises `PlacementError`.

    Args:
      enabled: whether to fall back to the default device.
    """
    SETTINGS.soft = bool(enabled)


def set_log_device_placement(enabled: bool) -> None:
    """Turns logging of variable placement on or off (off by default).

    When on, every variable creation and update logs the variable's name, the operation and
    the device at level INFO on the ``"statevar"`` logger.

    Args:
      enabled: whether to log.
    """
    STATE.set_log_placement(bool(enabled))


def describe(device: jax.Device) -> str:  # pyright: ignore[reportInvalidTypeForm]
    """Returns the short form of a device, e.g. ``"cpu:0"``."""
    return f"{device.platform}:{device.id}"


def _available() -> str:
    return ", ".join(describe(d) for d in jax.devices())


def resolve(spec: str | jax.Device, *, what: str = "", stacklevel: int = 2) -> jax.Device:  # pyright: ignore[reportInvalidTypeForm]
    """Turns a device spec into a `jax.Device`, applying soft placement.

    Args:
      spec: ``"cpu"``, ``"cpu:0"``, ``"gpu:0"``, a TF-style ``"/GPU:0"`` or
        ``"/device:GPU:0"``, or a `jax.Device`.
      what: what is being placed, for messages (e.g. ``"Variable 'w'"``).
      stacklevel: how far up the stack the caller to blame for the warning is.

    Returns:
      The device to use.

    Raises:
      TypeError: if ``spec`` is neither a string nor a `jax.Device`.
      ValueError: if ``spec`` is a string that does not name a device.
      PlacementError: if the device does not exist and soft placement is off.
    """
    if isinstance(spec, jax.Device):
        return spec
    if not isinstance(spec, str):
        raise TypeError(
            f"Expected a device spec such as 'cpu:0' or a jax.Device, got {type(spec).__name__}"
        )
    match = _DEVICE_PATTERN.match(spec.strip())
    platform = _PLATFORM_ALIASES.get(match.group(1).lower()) if match else None
    if platform is None:
        raise ValueError(
            f"Cannot parse device spec {spec!r}{f' for {what}' if what else ''}: expected "
            "'cpu', 'gpu' or 'tpu', optionally with an index, e.g. 'gpu:0' or '/GPU:0'"
        )
    assert match is not None  # a spec that does not match has no platform
    index = int(match.group(2) or 0)
    try:
        # This process's devices: under jax.distributed, "cpu:0" is the first local one.
        devices = jax.local_devices(backend=platform)
    except RuntimeError:
        devices = []
    if index < len(devices):
        return devices[index]
    subject = f"{what} on " if what else ""
    if not SETTINGS.soft:
        raise PlacementError(
            f"Cannot place {subject}{spec!r}: no such device. Available devices: "
            f"{_available()}. Call statevar.set_soft_device_placement(True) to fall back "
            "to the default device."
        )
    fallback = jax.local_devices()[0]
    warnings.warn(
        f"Device {spec!r} does not exist; placing {subject or ''}{describe(fallback)} "
        f"instead (soft device placement). Available devices: {_available()}.",
        PlacementWarning,
        stacklevel=stacklevel + 1,
    )
    return fallback


@contextlib.contextmanager
def device(spec: str | jax.Device) -> Iterator[jax.Device]:  # pyright: ignore[reportInvalidTypeForm]
    """Places variables created, and arithmetic on variables run, inside the block.

    Like ``tf.device``: variables created in the scope live on its device, and arithmetic on
    variables in the scope copies its operands to that device and runs there. Scopes nest and
    are per thread; `device` and `mesh` scopes share one stack, and the innermost wins.

    Args:
      spec: ``"cpu"``, ``"cpu:0"``, ``"gpu:0"`` or a `jax.Device`.

    Yields:
      The resolved `jax.Device` (the default device if soft placement fell back).

    Raises:
      PlacementError: if the device does not exist and soft placement is off.

    Example:
      >>> import statevar
      >>> with statevar.device("cpu:0"):
      ...     v = statevar.Variable([1.0, 2.0])
      >>> v.device.platform
      'cpu'
    """
    resolved = resolve(spec, stacklevel=3)
    stack = _scope_stack()
    stack.append(resolved)
    try:
        yield resolved
    finally:
        stack.pop()


# What a sharding rule or ``sharding=`` may give: a PartitionSpec, a tuple of axis names
# (or None, or tuples of names) per dimension, None for replicated, or a Sharding.
SpecLike = PartitionSpec | Sequence[Any] | Sharding | None
Rule = tuple[str | re.Pattern, SpecLike | Callable[[str, tuple[int, ...]], SpecLike]]


class MeshScope:
    """An entry of the scope stack made by `mesh`: the mesh and its compiled rules."""

    __slots__ = ("mesh", "rules")

    def __init__(self, mesh: Mesh, rules: list[tuple[re.Pattern, Any]]):
        self.mesh = mesh
        self.rules = rules


def compile_rules(rules: Sequence[Rule] | None) -> list[tuple[re.Pattern, Any]]:
    """Checks sharding rules and compiles their regular expressions.

    Raises:
      TypeError: if a rule is not a ``(regex, spec)`` pair.
      ValueError: if a regex does not compile.
    """
    compiled = []
    for rule in rules or ():
        if not (isinstance(rule, tuple | list) and len(rule) == 2):
            raise TypeError(f"Expected each sharding rule to be a (regex, spec) pair, got {rule!r}")
        pattern, spec = rule
        if not isinstance(pattern, str | re.Pattern):
            raise TypeError(
                f"Expected the regex of sharding rule {rule!r} to be a str, got "
                f"{type(pattern).__name__}"
            )
        try:
            compiled.append((re.compile(pattern), spec))
        except re.error as error:
            raise ValueError(
                f"Cannot compile the regex of sharding rule {rule!r}: {error}"
            ) from None
    return compiled


@contextlib.contextmanager
def mesh(device_mesh: Mesh, rules: Sequence[Rule] | None = None) -> Iterator[Mesh]:
    """Places variables created inside the block on a device mesh.

    A variable created in the scope is replicated over the mesh, unless the first rule whose
    regex matches its name (`re.search`) gives a spec: a `jax.sharding.PartitionSpec`, a
    tuple of axis names per dimension, None for replicated, a `jax.sharding.Sharding`, or a
    callable ``(name, shape) -> spec``. An explicit ``sharding=`` or ``device=`` wins over
    the scope, and ``sharding=`` specs are resolved against the innermost mesh scope. Scopes
    nest with `device` scopes on one stack, per thread: the innermost wins. Rules match the
    ``name=`` given at creation; to shard a Module's variables by their paths, use
    `statevar.reshard` once it is built.

    Args:
      device_mesh: a `jax.sharding.Mesh` (``jax.make_mesh`` or ``Mesh(...)``; Auto and
        Explicit axes).
      rules: ``(regex, spec)`` pairs, tried in order.

    Yields:
      The mesh.

    Raises:
      TypeError: if ``device_mesh`` is not a Mesh, or a rule is not a ``(regex, spec)`` pair.
      ValueError: if a rule's regex does not compile.

    Example:
      >>> import jax
      >>> import statevar
      >>> from jax.sharding import PartitionSpec as P
      >>> devices = jax.make_mesh((len(jax.devices()),), ("data",))
      >>> with statevar.mesh(devices, rules=[("kernel", P(None, "data"))]):
      ...     kernel = statevar.Variable(jax.numpy.zeros((3, 8)), name="dense/kernel")
      ...     bias = statevar.Variable(jax.numpy.zeros(8), name="dense/bias")
      >>> kernel.sharding.spec, bias.sharding.spec
      (P(None, 'data'), P())
    """
    if not isinstance(device_mesh, Mesh):
        raise TypeError(
            f"statevar.mesh needs a jax.sharding.Mesh, got {type(device_mesh).__name__}; "
            "make one with jax.make_mesh((devices,), ('data',))"
        )
    scope = MeshScope(device_mesh, compile_rules(rules))
    stack = _scope_stack()
    stack.append(scope)
    try:
        yield device_mesh
    finally:
        stack.pop()


def _scope_stack() -> list[Any]:
    stack = getattr(_thread_scopes, "stack", None)
    if stack is None:
        stack = _thread_scopes.stack = []
    return stack


def current_device() -> jax.Device | None:  # pyright: ignore[reportInvalidTypeForm]
    """Returns the innermost scope's device, or None outside any scope or in a mesh scope."""
    stack = getattr(_thread_scopes, "stack", None)
    if stack and isinstance(stack[-1], jax.Device):
        return stack[-1]
    return None


def current_scope() -> jax.Device | MeshScope | None:  # pyright: ignore[reportInvalidTypeForm]
    """Returns the innermost `device` or `mesh` scope's entry, or None outside any."""
    stack = getattr(_thread_scopes, "stack", None)
    return stack[-1] if stack else None


def current_mesh() -> MeshScope | None:
    """Returns the innermost `mesh` scope, or None outside any."""
    for entry in reversed(getattr(_thread_scopes, "stack", None) or ()):
        if isinstance(entry, MeshScope):
            return entry
    return None


def rule_spec(rules: list[tuple[re.Pattern, Any]], name: str) -> tuple[bool, Any]:
    """Returns ``(True, spec)`` for the first rule whose regex matches ``name``, else
    ``(False, None)``."""
    for pattern, spec in rules:
        if pattern.search(name):
            return True, spec
    return False, None


def _describe_spec(spec: Any) -> str:
    if isinstance(spec, NamedSharding):
        return f"{spec.spec}"
    return repr(spec)


def reshard_target(spec: Any, shape: tuple[int, ...], action: str) -> Sharding:
    """What a variable's ``reshard`` takes, as a Sharding: a `jax.Device` (the whole array
    on it), or any spec `resolve_sharding` takes (and raises for)."""
    if isinstance(spec, jax.Device):
        return jax.sharding.make_single_device_sharding(spec)
    return resolve_sharding(spec, shape, action)


def resolve_sharding(
    spec: Any, shape: tuple[int, ...], action: str, mesh: Mesh | None = None
) -> Sharding:
    """Turns a spec into a Sharding for an array of ``shape``, checking it fits.

    Args:
      spec: a Sharding, a PartitionSpec, a tuple of axis names (None, a name or a tuple of
        names per dimension), None for replicated, or a callable ``(name, shape) -> spec``
        (called by the caller, not here).
      shape: the array's shape.
      action: what is attempted, naming the variable (``"Cannot create Variable 'w'"``).
      mesh: the mesh specs are resolved against; defaults to the innermost `mesh` scope's.

    Returns:
      The Sharding.

    Raises:
      PlacementError: if there is no mesh to resolve a spec against, or the spec names an
        axis the mesh lacks, is longer than the rank, or an axis does not divide its
        dimension.
      TypeError: if ``spec`` is none of the above.
    """
    where = f"{action} of shape {tuple(shape)} with sharding {_describe_spec(spec)}"
    if isinstance(spec, Sharding):
        if isinstance(spec, NamedSharding):
            _check_spec(spec.spec, spec.mesh, shape, where)
        return spec
    if spec is None:
        spec = PartitionSpec()
    elif isinstance(spec, list | tuple) and not isinstance(spec, PartitionSpec):
        spec = PartitionSpec(*spec)
    elif not isinstance(spec, PartitionSpec):
        raise TypeError(
            f"{action}: expected a sharding to be a jax.sharding.Sharding, a PartitionSpec, "
            f"a tuple of mesh axis names or None, got {type(spec).__name__}"
        )
    if mesh is None:
        scope = current_mesh()
        if scope is None:
            raise PlacementError(
                f"{where}: there is no mesh to resolve it against. Create the variable "
                "inside `with statevar.mesh(mesh):`, or pass a NamedSharding(mesh, spec)."
            )
        mesh = scope.mesh
    _check_spec(spec, mesh, shape, where)
    return NamedSharding(mesh, spec)


def _check_spec(
    spec: PartitionSpec, mesh: Mesh | AbstractMesh, shape: tuple[int, ...], where: str
) -> None:
    if len(spec) > len(shape):
        raise PlacementError(
            f"{where}: the spec has {len(spec)} entries, more than the {len(shape)} "
            "dimensions of the variable"
        )
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))
    used: set[str] = set()
    for dimension, entry in enumerate(spec):
        if entry is None or entry is PartitionSpec.UNCONSTRAINED:
            continue
        names = entry if isinstance(entry, tuple) else (entry,)
        size = 1
        for axis in names:
            if axis not in sizes:
                raise PlacementError(
                    f"{where}: the mesh has no axis {axis!r} (its axes are "
                    f"{tuple(mesh.axis_names)})"
                )
            if axis in used:
                raise PlacementError(f"{where}: mesh axis {axis!r} is used twice")
            used.add(axis)
            size *= sizes[axis]
        if shape[dimension] % size:
            raise PlacementError(
                f"{where}: dimension {dimension} ({shape[dimension]}) is not divisible by "
                f"the size of mesh axis {entry!r} ({size})"
            )


def is_multi_device(sharding: Sharding) -> bool:
    """Whether a variable of this sharding is pinned to it (anything but one device)."""
    return not _jax_internals.is_single_device(sharding)


def replicated(sharding: Sharding) -> Sharding:
    """Returns a sharding replicating an array of any shape over ``sharding``'s devices."""
    if isinstance(sharding, NamedSharding):
        return NamedSharding(sharding.mesh, PartitionSpec())
    if not is_multi_device(sharding):
        return sharding
    devices = sorted(sharding.device_set, key=lambda d: (d.process_index, d.id))
    return NamedSharding(Mesh(np.array(devices), ("devices",)), PartitionSpec())


def sharding_key(sharding: Sharding) -> Any:
    """A hashable key equal for equivalent shardings: ``P()`` and ``P(None)`` over one mesh
    (a compiled step on Explicit axes gives the latter for the former)."""
    if isinstance(sharding, NamedSharding):
        spec = list(sharding.spec)
        while spec and spec[-1] is None:
            spec.pop()
        return sharding.mesh, tuple(spec), sharding.memory_kind
    return sharding


def put(value: jax.Array, sharding: Sharding) -> jax.Array:
    """Returns a copy of ``value`` on ``sharding``; donates nothing.

    A sharding spanning several processes (`jax.distributed`) is filled from this process's
    copy of the value, shard by shard: every process holds the same value.
    """
    if not sharding.is_fully_addressable and value.is_fully_addressable:
        host = np.array(value)
        return jax.make_array_from_callback(value.shape, sharding, lambda index: host[index])
    return jax.device_put(value, sharding, may_alias=False)


def is_explicit(sharding: Sharding) -> bool:
    """Whether ``sharding`` is over a mesh with Explicit axes (sharding in types)."""
    if not isinstance(sharding, NamedSharding):
        return False
    return any(t == jax.sharding.AxisType.Explicit for t in sharding.mesh.axis_types)


def pin(value: Any, sharding: Sharding) -> Any:
    """Inside a trace, constrains ``value`` to ``sharding``: `jax.sharding.reshard` on a mesh
    with Explicit axes, `jax.lax.with_sharding_constraint` otherwise. Without it, a jitted
    update given a value of another sharding returns that sharding and does not donate."""
    if is_explicit(sharding):
        return jax.sharding.reshard(value, sharding)
    return lax.with_sharding_constraint(value, sharding)


def _where(array: Any) -> str:
    devices = sorted(array.sharding.device_set, key=lambda d: (d.platform, d.id))
    if len(devices) == 1:
        return describe(devices[0])
    return "{" + ", ".join(describe(d) for d in devices) + "}"


def is_committed(value: Any) -> bool:
    """Whether ``value`` is a concrete `jax.Array` committed to its devices: JAX runs work
    on it there, and commits what it computes from it."""
    return isinstance(value, jax.Array) and not isinstance(value, Tracer) and value.committed


def check_step_devices(
    subject: str, variables: Sequence[Cell], arrays: Sequence[Any], arguments: Sequence[Any]
) -> None:
    """`check_same_devices` for a compiled step given the arrays of ``variables`` and its
    array ``arguments``. A variable counts as placed on its device even while uncommitted:
    a compiled step does not move it to its arguments' devices.

    Raises:
      PlacementError: if they are on different sets of devices, naming them.
    """

    def name_of(index: int) -> str:
        if index < len(variables):
            return f"Variable {variables[index].name!r}"
        return f"argument {index - len(variables)}"

    check_same_devices(subject, [*arrays, *arguments], name_of, placed=len(variables))


def check_same_devices(
    subject: str, arrays: Sequence[Any], name_of: Callable[[int], str], placed: int = 0
) -> None:
    r"""Refuses committed arrays on different sets of devices, naming them.

    Args:
      subject: what runs them, for the message (``"The statevar.jit function 'step'"``).
      arrays: the values; those other than committed `jax.Array`\ s (NumPy arrays,
        scalars, uncommitted arrays, which JAX moves) are skipped.
      name_of: the name of ``arrays[i]`` for the message (``"Variable 'w'"``); called only
        to refuse, so a step over many variables names none of them when it runs.
      placed: how many of the first arrays count as committed whether they are or not
        (variables' arrays: a variable stays on its device).

    Raises:
      PlacementError: if two committed arrays are on different sets of devices.
    """
    groups: dict[frozenset, list[int]] = {}
    for index, array in enumerate(arrays):
        if isinstance(array, jax.Array) and not isinstance(array, Tracer):
            if (index < placed or array.committed) and not array.is_deleted():
                groups.setdefault(frozenset(array.sharding.device_set), []).append(index)
    if len(groups) > 1:
        parts = [
            f"{', '.join(map(name_of, indices))} on {_where(arrays[indices[0]])}"
            for indices in groups.values()
        ]
        raise PlacementError(
            f"{subject} got variables and arguments on different devices: "
            f"{'; '.join(parts)}. Put them on one set of devices (Variable.reshard, "
            "statevar.reshard, jax.device_put) before calling it."
        )


def log(name: str, operation: str, placed_on: jax.Device | Sharding) -> None:  # pyright: ignore[reportInvalidTypeForm]
    """Logs a placement when placement logging is on."""
    if STATE.log_placement:
        if isinstance(placed_on, Sharding) and not is_multi_device(placed_on):
            placed_on = next(iter(placed_on.device_set))
        where = describe(placed_on) if isinstance(placed_on, jax.Device) else placed_on
        logger.info("Variable '%s': %s on %s", name, operation, where)
