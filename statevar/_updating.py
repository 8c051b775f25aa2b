"""The general path of a variable's update: conversion and checks, the update traced into
a frame, and the donating or copying kernel run under the update lock, signal-safe.

`Variable`'s eager updates take their hot path in `_variable` (an uncommitted array of
the variable's abstract value, once compiled) and come here for everything else. The
variable's array is stored only by `Variable._swap`, which makes the kernel's call and
the store indivisible.
"""

from __future__ import annotations

import sys
from typing import Any

import jax
import numpy as np

from . import _copies, _placement, _trace, _update
from ._convert import Tracer, check_not_deleted, convert_for_update
from ._errors import (
    DtypeMismatchError,
    TraceContextError,
    interrupted_update_error,
    release_frames,
)
from ._signals import held_signals
from ._state import STATE
from ._update import ASSIGN, Operation
from ._view import read_operand

_SOLE_HOLDER_WITH_LOCAL, _getrefcount = _update.SOLE_HOLDER_WITH_LOCAL, sys.getrefcount
_update_lock = STATE.update_lock
# Each eager update's place in a variable's `_hot_avals` (see `Variable._open_hot_path`).
HOT_SLOTS = {_update.ASSIGN: 0, _update.ASSIGN_ADD: 1, _update.ASSIGN_SUB: 2}


def compiled_key(signature: Any, *, committed: bool) -> Any:
    """The key under which a variable records that it has run the donating call of an
    update of ``signature`` (as `update` gives it: the bare operation name, that name with
    ``"committed"``, `_update.signature`, or any of these with a multi-device sharding):
    JAX compiles apart for a committed and an uncommitted variable array, so a variable
    that became committed runs its updates cold once more."""
    return (signature, "committed variable") if committed else signature


def update(variable: Any, operation: Operation, value: Any, index: tuple | None = None) -> Any:
    """Applies ``operation`` in place: the general path (see `_general_update`). An error it
    raises holds no array of the variable's (see `release_frames`)."""
    try:
        return _general_update(variable, operation, value, index)
    except BaseException as error:
        release_frames(error)
        raise


def _general_update(variable: Any, operation: Operation, value: Any, index: tuple | None) -> Any:
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
    if STATE.open_trace_frames and _trace.innermost() is not None:
        return record_traced(variable, operation, value, index)
    if signature is None:
        signature = _update.signature(operation, value, index)
    sharding = variable._value.sharding
    if _placement.is_multi_device(sharding):
        # Pinned to the variable's sharding whatever the value's placement, and never
        # the bare operation the hot path looks for.
        donating, copying = _update.pinned_updates(operation, sharding)
        signature = (signature, sharding)
    else:
        donating, copying = operation.donating, operation.copying
    operands = (value,) if index is None else (value, *index)
    run_kernel(variable, operation, (donating, copying), signature, value, operands)
    if STATE.log_placement:
        _placement.log(variable.name, operation.name, variable.device)
    return variable


def run_kernel(
    variable: Any, operation: Operation, kernels: tuple, signature: Any, value: Any, operands: tuple
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
    array of the variable's abstract value, see `_update`).

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
    variable: Any, operation: Operation, kernels: tuple, signature: Any, value: Any, operands: tuple
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


def copying_kernel(variable: Any, operation: Operation) -> Any:
    """The copying kernel of ``operation``, for the eager hot path's update of a variable
    whose array something else holds, once the copy policy has seen the copy.

    Raises:
      CopyError: under the copy policy ``"raise"`` (nothing is copied or stored).
    """
    if _copies.POLICY.policy != "silent":
        _copies.check(variable, _copies.HELD, variable._value.nbytes, operation.name)
    return operation.copying


def check_donation(
    variable: Any, operation: Operation, kernel: Any, key: Any, arguments: tuple
) -> str | None:
    """Before a donating kernel's first call for a variable (and each later one while JAX
    refuses the donation), applies the copy policy if JAX refuses it (no output can take
    the buffer, or the platform does not donate): the kernel would copy. Lowers the kernel
    once per kind of arguments (the call that follows reuses the lowering; later calls
    find the refusal memoized); runs nothing.

    Returns:
      The cause of the refusal (see `statevar._copies`), or None.

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


def record_traced(variable: Any, operation: Operation, value: Any, index: tuple | None) -> Any:
    """Applies ``operation`` while `statevar.jit` or `statevar.grad` traces: records the
    new traced value in the innermost trace frame. The variable's own array is neither
    read for donation nor replaced.

    Raises:
      TraceContextError: for a value (or index) that escaped the transformation that made
        it (see `_trace.is_escaped`).
    """
    check_operation(variable, operation)
    if _trace.is_escaped(value) or (
        index is not None and any(map(_trace.is_escaped, jax.tree.leaves(index)))
    ):
        raise TraceContextError(
            f"Cannot {operation.phrase} Variable '{variable.name}' inside statevar.jit or "
            f"statevar.grad: the {'value' if _trace.is_escaped(value) else 'index'} is a "
            "tracer that escaped the JAX transformation that made it (kept by a side effect, "
            "such as appending to a list inside jax.jit), so it holds no value. Return "
            "values from transformed functions instead of saving them."
        )
    if operation is not ASSIGN:
        _trace.prepare_update(variable, operation.phrase)
    old = _trace.read(variable) if operation is not ASSIGN else None
    if old is None:
        old = variable._value
    new = operation.pure(old, value, *(index or ()))
    _trace.write(variable, new, operation.phrase)
    return variable


def failed_update(
    variable: Any, operation: Operation, value: Any, old: jax.Array, error: Exception
) -> Any:
    """Handles an update whose jitted call raised ``error``; the variable still holds
    ``old``.

    Returns the variable if the failure is recovered (an assign to a variable whose
    array was deleted outside statevar); otherwise raises, naming the variable.
    """
    if old.is_deleted():
        # Donated or deleted outside statevar: only assign can restore it.
        if operation is not ASSIGN:
            raise variable._deleted_error(f"Cannot {operation.phrase}") from None
        variable._replace_array(_update.fresh(value, old))
        return variable
    # An array deleted (donated elsewhere) that passed the inline check above.
    check_not_deleted(value, f"Cannot {operation.phrase} Variable '{variable.name}'")
    raise error


def with_keywords(
    variable: Any,
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


def check_operation(variable: Any, operation: Operation) -> None:
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
