"""Why an update or a compiled step copies a variable instead of donating its buffer, and
what the copy policy (`set_copy_policy`) does about it.

A donated update writes the new value into the variable's own buffer; a copy needs room
for two. statevar copies in four cases, each a cause named here:

- `HELD`: the variable's array is still held elsewhere (an array read from it and still
  alive), which must stay valid; seen from its reference count before every update.
- `SAVING`: the one holding it is a checkpoint save in flight, in the background or in
  another thread (`ProcessState.saved_arrays`): the copy such a save costs by design, which
  the policy ``"warn"`` does not warn of and ``"raise"`` refuses as any other.
- `NOT_ALIASED`: XLA found no output of the compiled call to write the donated buffer
  into; JAX says so with its "Some donated buffers were not usable" warning when it lowers
  the call, which statevar catches (`lower_checked`) and names the variable instead.
- `UNSUPPORTED`: the platform does not implement donation (the same warning says so).

The policy is process state (`POLICY`, this module's), read in Python before each copying
call: never part of a JAX cache key or a trace context.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .. import _caches
from .._errors import CopyError, caller_stacklevel
from .._state import STATE
from .cell import Cell


@dataclasses.dataclass(eq=False, slots=True)
class CopyPolicy:
    """What an update or a compiled step does when it copies a variable instead of donating
    its buffer (`set_copy_policy`), process-wide.

    Attributes:
      policy: ``"silent"``, ``"warn"`` or ``"raise"``.
      min_bytes: the size from which ``policy`` applies; smaller copies are silent.
    """

    policy: str = "warn"
    min_bytes: int = 64 * 2**20  # the default: warn of copies of 64 MiB or more


POLICY = CopyPolicy()

HELD = "held"
SAVING = "saving"
NOT_ALIASED = "not aliased"
UNSUPPORTED = "unsupported"
POLICIES = ("silent", "warn", "raise")

# JAX's warning when it lowers a call whose donated buffers no output can take.
_NOT_USABLE = "Some donated buffers were not usable: "
_NOT_IMPLEMENTED = "Donation is not implemented for"

# What each cause is, and its fix, as the messages say them.
_EXPLAINED = {
    HELD: (
        "its array is still held elsewhere (an array read from it, such as v.value or "
        "np.asarray(v), or a NumPy view of it, is still alive), and must stay valid",
        "Let go of the read before the update (del it, or read after updating) to update in place.",
    ),
    SAVING: (
        "a checkpoint save in flight (in the background, as statevar.save(..., "
        "blocking=False) or an async CheckpointManager, or in another thread) holds its "
        "array until written, so the value saved stays the one of the save call",
        "This is the one copy a save in flight costs; wait for the save before updating "
        "to update in place.",
    ),
    NOT_ALIASED: (
        "XLA found no output of the compiled call to write its buffer into (JAX: 'Some "
        "donated buffers were not usable')",
        "Keep the variable's new value of the variable's shape, dtype, sharding and memory kind.",
    ),
    UNSUPPORTED: (
        "the {platform} platform does not implement buffer donation",
        "Every update of it needs room for two copies there; statevar.set_copy_policy"
        "('silent') accepts that.",
    ),
}


class CopyWarning(UserWarning):
    """An update or a compiled step copied a variable instead of donating its buffer.

    Issued once per variable and cause under the copy policy ``"warn"`` (see
    `statevar.set_copy_policy`), naming the variable, its size, the cause and the fix.
    """


def set_copy_policy(policy: str, *, min_bytes: int = 0) -> None:
    """Chooses what an update or a compiled step does when it must copy a variable instead
    of donating its buffer (its array is still read elsewhere, XLA could not alias it, or
    the platform does not donate): process-wide, as `set_soft_device_placement`.

    ``"silent"`` copies; ``"warn"`` copies and warns with `statevar.CopyWarning`, once
    per variable and cause; ``"raise"`` raises `statevar.CopyError` before anything is
    donated or stored, leaving every variable as it was. The policy applies to copies of
    ``min_bytes`` or more; smaller ones are silent. A process starts with
    ``set_copy_policy("warn", min_bytes=64 * 2**20)``: a copy of a small variable costs
    little, and reading a value before updating it is ordinary code.

    Args:
      policy: ``"silent"``, ``"warn"`` or ``"raise"``.
      min_bytes: the smallest copy, in bytes, the policy applies to (0: every copy).

    Raises:
      ValueError: if ``policy`` is none of these, or ``min_bytes`` is negative.
      TypeError: if ``min_bytes`` is not an integer.

    Example:
      >>> import statevar
      >>> statevar.set_copy_policy("raise")
      >>> v = statevar.Variable([1.0, 2.0], name="v")
      >>> before = v.value  # still alive: the update would copy v
      >>> try:
      ...     v.assign_add(1.0)
      ... except statevar.CopyError as error:
      ...     print(str(error)[:58])
      assign_add would copy Variable 'v' (8 bytes): its array is
      >>> del before
      >>> v.assign_add(1.0).numpy()
      array([2., 3.], dtype=float32)
      >>> statevar.set_copy_policy("warn", min_bytes=64 * 2**20)  # the default
    """
    if policy not in POLICIES:
        raise ValueError(
            f"Expected the copy policy to be 'silent', 'warn' or 'raise', got {policy!r}"
        )
    if isinstance(min_bytes, bool) or not isinstance(min_bytes, int):
        raise TypeError(
            f"Expected the copy policy's min_bytes to be an int, got {type(min_bytes).__name__}"
        )
    if min_bytes < 0:
        raise ValueError(f"Expected the copy policy's min_bytes to be >= 0, got {min_bytes}")
    POLICY.policy, POLICY.min_bytes = policy, min_bytes


@contextlib.contextmanager
def copy_policy(policy: str, *, min_bytes: int = 0) -> Iterator[None]:
    """Sets the copy policy (see `set_copy_policy`) for the ``with`` block, then puts the
    previous one back. Process-wide, like the setting itself: other threads see it too.

    Args:
      policy: ``"silent"``, ``"warn"`` or ``"raise"``.
      min_bytes: the smallest copy, in bytes, the policy applies to (0: every copy).

    Raises:
      ValueError, TypeError: as `set_copy_policy`.

    Example:
      >>> import statevar
      >>> v = statevar.Variable([1.0, 2.0], name="v")
      >>> before = v.value
      >>> with statevar.copy_policy("silent"):
      ...     v.assign_add(1.0).numpy()  # copies v quietly: `before` stays valid
      array([2., 3.], dtype=float32)
    """
    previous = POLICY.policy, POLICY.min_bytes
    set_copy_policy(policy, min_bytes=min_bytes)
    try:
        yield
    finally:
        POLICY.policy, POLICY.min_bytes = previous


# The (variable id, cause) pairs warned of, each with a weak reference to its variable
# (by id: weak references compare their referents with ``==``, elementwise for a Variable).
_warned: dict[tuple[int, str], weakref.ref] = {}


def _forget_warned(key: tuple[int, str]) -> Callable[[weakref.ref], None]:
    def forget(reference: weakref.ref) -> None:
        if _warned.get(key) is reference:
            del _warned[key]

    return forget


def held_cause(variable: Cell) -> str:
    """Why ``variable``'s array, held elsewhere, is: by a background checkpoint save in
    flight (`SAVING`), or by something else (`HELD`)."""
    return SAVING if id(variable._value) in STATE.saved_arrays else HELD


def applies(nbytes: int) -> bool:
    """Whether the copy policy acts on a copy of ``nbytes`` bytes (it is not silent)."""
    return POLICY.policy != "silent" and nbytes >= POLICY.min_bytes


def _explain(cause: str, variable: Cell) -> tuple[str, str]:
    reason, fix = _EXPLAINED[cause]
    if cause == UNSUPPORTED:
        reason = reason.format(platform=getattr(variable.device, "platform", "device"))
    return reason, fix


def check(variable: Cell, cause: str, nbytes: int, action: str) -> None:
    """Applies the copy policy to a copy of ``variable`` (``nbytes`` bytes) for ``cause``,
    made by ``action`` (``"assign_add"``, ``"The statevar.jit function 'step'"``), before
    the copying call: nothing, a `CopyWarning` (once per variable and cause), or a
    `CopyError`.

    Raises:
      CopyError: under the policy ``"raise"``, for a copy of at least its ``min_bytes``.
    """
    check_many([variable], [nbytes], [cause], action)


def check_many(
    variables: Sequence[Cell], sizes: Sequence[int], causes: Sequence[str], action: str
) -> None:
    """`check` for the copies of several variables by one call (a compiled step): one
    `CopyError` naming each, or one warning per variable and cause.

    Raises:
      CopyError: under the policy ``"raise"``, for copies of at least its ``min_bytes``.
    """
    found = [
        (variable, nbytes, held_cause(variable) if cause == HELD else cause)
        for variable, nbytes, cause in zip(variables, sizes, causes, strict=True)
        if applies(nbytes)
    ]
    if POLICY.policy == "warn":
        # A background save's copy is the cost it documents, not a mistake to warn of.
        found = [item for item in found if item[2] != SAVING]
    if not found:
        return
    if POLICY.policy == "raise":
        described = []
        for variable, nbytes, cause in found:
            reason, fix = _explain(cause, variable)
            described.append(f"Variable {variable.name!r} ({nbytes:,} bytes): {reason}. {fix}")
        raise CopyError(
            f"{action} would copy {'; '.join(described)} (the copy policy is 'raise': "
            "nothing was donated or changed)"
        )
    for variable, nbytes, cause in found:
        key = (id(variable), cause)
        warned = _warned.get(key)
        if warned is not None and warned() is variable:
            continue
        reason, fix = _explain(cause, variable)
        warnings.warn(
            f"{action} copied Variable {variable.name!r} ({nbytes:,} bytes) instead of "
            f"donating its buffer: {reason}. {fix}",
            CopyWarning,
            stacklevel=caller_stacklevel(),
        )
        # Recorded once warned: a warning a filter turned into an error comes again.
        _warned[key] = weakref.ref(variable, _forget_warned(key))


def lower_checked(lower: Callable[[], Any]) -> tuple[Any, tuple[str, list[str]] | None]:
    """Runs ``lower`` (a jitted call's lowering, which JAX caches for the call that
    follows) and catches JAX's warning about donated buffers no output can take.

    Returns:
      What ``lower`` returned, and None, or the refusal: its cause (`NOT_ALIASED` or
      `UNSUPPORTED`) and the abstract values JAX lists (``"float32[2,2]"``: per shard),
      in argument order. Every other warning is issued again, as it came.
    """
    # Python's warning filters are process state: while this runs (under the update lock,
    # where statevar's own calls wait), another thread's warning is caught and re-issued.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            lowered = lower()
        finally:
            refusal = _reissue(caught)
    return lowered, refusal


def _reissue(caught: list[warnings.WarningMessage]) -> tuple[str, list[str]] | None:
    refusal = None
    others = []
    for message in caught:
        text = str(message.message)
        if text.startswith(_NOT_USABLE):
            listed = text[len(_NOT_USABLE) :].split("\n", 1)[0].rstrip(".")
            cause = UNSUPPORTED if _NOT_IMPLEMENTED in text else NOT_ALIASED
            refusal = (cause, listed.split(", "))
        else:
            others.append(message)
    for message in others:
        # After the block: the filters are the caller's again.
        warnings.warn_explicit(message.message, message.category, message.filename, message.lineno)
    return refusal


def _shard_key(array: Any) -> str:
    """An array's abstract value as JAX's warning lists it: dtype and per-shard shape."""
    shape = array.sharding.shard_shape(array.shape)
    return f"{array.dtype.name}[{','.join(map(str, shape))}]"


def refused(refusal: tuple[str, list[str]], arrays: Sequence[Any]) -> dict[int, str]:
    """The donated arrays (all of ``arrays``, in argument order) that ``refusal`` (from
    `lower_checked`) says no output took, by index, with the cause.

    JAX gives each output the first donated buffer of its kind still free, so the buffers
    left are the last of their kind. A listed value that matches no array by shape is
    matched by dtype (a layout JAX writes otherwise).
    """
    cause, listed = refusal
    if cause == UNSUPPORTED:
        return dict.fromkeys(range(len(arrays)), cause)
    wanted = collections.Counter(listed)
    found: dict[int, str] = {}
    for index in reversed(range(len(arrays))):
        key = _shard_key(arrays[index])
        if wanted[key] > 0:
            wanted[key] -= 1
            found[index] = cause
    for key, count in wanted.items():
        dtype = key.split("[", 1)[0]
        for index in reversed(range(len(arrays))):
            if count and index not in found and arrays[index].dtype.name == dtype:
                found[index], count = cause, count - 1
    return found


# Per eager update kernel and kind of arguments (see `kernel_refusal`): the cause of the
# donation JAX refused when it lowered the kernel, or None.
_kernel_refusals: dict[Any, str | None] = {}
_caches.register(_kernel_refusals.clear)


def kernel_refusal(key: Any, kernel: Any, arguments: tuple) -> str | None:
    """The cause (`NOT_ALIASED`, `UNSUPPORTED`) of a refused donation of the first
    argument by ``kernel`` (a jitted update donating it) called on ``arguments``, or None;
    lowered once per ``key`` (the kernel and its arguments' kinds), as JAX lowers once.
    Runs nothing and donates nothing."""
    if key in _kernel_refusals:
        return _kernel_refusals[key]
    try:
        _, refusal = lower_checked(lambda: kernel.lower(*arguments))
    except Exception:
        return None  # not recorded: the call raises the same error, and says it
    found = _kernel_refusals[key] = None if refusal is None else refusal[0]
    return found
