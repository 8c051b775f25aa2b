"""The process-wide mutable state every module shares, each name saying what it guards.

Nothing else in the package keeps module-level state that another module reads or changes:
the modules use these names from here (hot paths bind them once at import, or read them as
``_state.name``, a module attribute read). Per-thread state stays private to the module
that owns it: the stack of trace frames in `_trace` and the stack of device and mesh
scopes in `_placement`.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

import numpy as np

# Guards every variable's array between reading it for an update and storing the result:
# eager updates and reads, and `statevar.jit` calls, which read, donate and replace many
# variables at once. One reentrant lock (rather than one per variable) keeps a compiled
# step to a single acquire and cannot deadlock.
update_lock = threading.RLock()
# In a child process made by os.fork, where every thread but the forking one is gone, the
# lock is free. typeshed omits RLock's `_at_fork_reinit`, which CPython has had
# since 3.9.
os.register_at_fork(after_in_child=update_lock._at_fork_reinit)  # pyright: ignore[reportAttributeAccessIssue]

# Whether the thread holding `update_lock` is between deciding to donate arrays (nothing
# else holds them) and storing what the donating call returned (a one-item list, changed
# in place). Only a signal handler, which runs in that thread, can act meanwhile: its reads
# get copies (the array it would get is about to be donated), and its updates are refused
# (the update it interrupted would overwrite them). Other threads wait for the lock.
donating = [False]

# Counts changes of any variable's trainable flag, sharding or commitment (a one-item list,
# changed in place by `bump_compile_epoch`): when it moves, `statevar.jit` checks whether
# the flags and shardings its traces were made for still hold, and the eager hot path
# closes (see `hot_epoch`).
compile_epoch = [0]

# Counts the changes of what a Module's attributes hold (``model.kernel = Variable(...)``),
# made by `record_structure_change`. A compiled step traced before one reads what was
# there then, wherever it reached it (a closure, an attribute read while tracing): it
# traces again if it lifted a variable replaced since (`replaced`), or after an attribute
# that held no variable came to hold some (`state_added`), which any step may have read.
structure_epoch = [0]
# Each variable a Module let go of, by id: a weak reference to it (a step tracing again
# releases it) and the structure epoch in which it was let go of. By id, not a
# WeakKeyDictionary: weak references compare their referents with ``==``, which is
# elementwise for a Variable.
replaced: dict[int, tuple[weakref.ref, int]] = {}
# The structure epoch of the latest attribute that came to hold variables where it held
# none.
state_added = [0]

# Number of trace frames open in any thread: while it is 0 (almost always, outside a first
# call), nothing is traced and reads and updates skip `_trace`'s per-thread lookup. Changed only by
# `enter_trace_frame` and `exit_trace_frame`.
open_trace_frames = 0
# Guards the changes of `compile_epoch`, `open_trace_frames` and `hot_epoch`, which the
# last is computed from.
_counters_lock = threading.Lock()

# The compile epoch in which the eager updates' hot path may run (see
# `Variable._open_hot_path`); `HOT_PATH_OFF`, no epoch, while a trace frame is open in any
# thread or placements are logged. Kept by `_set_hot_epoch` under `_counters_lock`, so
# that the hot path compares one name.
HOT_PATH_OFF = -2
hot_epoch = 0


class PlacementSettings:
    """Whether soft placement is on (a missing device falls back to the default one) and
    whether placements are logged; set by `statevar.set_soft_device_placement` and
    `statevar.set_log_device_placement`."""

    soft_placement = True
    log_placement = False


# The placement settings, process-wide, as TensorFlow's.
placement_settings = PlacementSettings()

# What `statevar.jit` returned (plain functions and `CompiledFunction` partials), so that
# closure discovery can follow them into the function each compiles.
compiled_functions: weakref.WeakSet[Any] = weakref.WeakSet()

# One lock per checkpoint directory (resolved path) that this process saves into or
# restores from (see `_checkpoint.directory_lock`): a save deletes what it did not write
# (data of replaced checkpoints, what interrupted saves left), so two threads saving into
# one directory would delete each other's data.
checkpoint_locks: dict[str, Any] = {}
checkpoint_locks_guard = threading.Lock()


# The exact types of the concrete (non-tracer) array arguments `statevar.jit` has seen; its
# fast path accepts arguments of these types only.
concrete_argument_types: set[type] = {np.ndarray, bool, int, float, complex}


# Changed by `forget_compiled_updates` (`statevar.clear_caches`): a variable that recorded
# its compiled updates in another generation forgets them (see `Variable._run_kernel`).
compiled_updates_generation = [0]


def forget_compiled_updates() -> None:
    """Records that JAX's compiled updates were dropped: every variable's next update runs
    as a first call (see `compiled_updates_generation`), and its hot path closes."""
    with _counters_lock:
        compiled_updates_generation[0] += 1
    bump_compile_epoch()


def bump_compile_epoch() -> None:
    """Records that a trainable flag, a sharding or a variable's commitment changed:
    compiled steps check again, and run their next call as a first call (JAX compiles
    apart for a committed and an uncommitted array); eager updates leave the hot path until
    they run again."""
    with _counters_lock:
        compile_epoch[0] += 1
        _set_hot_epoch()


def record_structure_change(let_go: list[Any], added: bool) -> None:
    """Records that a Module's attribute let go of the variables ``let_go`` (replaced or
    deleted), or (``added``) came to hold variables where it held none. The compiled steps
    that lifted one of ``let_go``, or every step after ``added``, trace again on their next
    call (which a new compile epoch sends them through, see `stale`)."""
    with _counters_lock:
        structure_epoch[0] += 1
        for variable in let_go:
            key = id(variable)
            replaced[key] = (weakref.ref(variable, _forget_replaced(key)), structure_epoch[0])
        if added:
            state_added[0] = structure_epoch[0]
    bump_compile_epoch()


def stale(lifted: tuple[Any, ...], traced_in: int) -> bool:
    """Whether a compiled step traced in structure epoch ``traced_in``, lifting ``lifted``,
    may read what a Module no longer holds (see `record_structure_change`)."""
    if traced_in == structure_epoch[0]:
        return False
    if state_added[0] > traced_in:
        return True
    for variable in lifted:
        record = replaced.get(id(variable))
        if record is not None and record[0]() is variable and record[1] > traced_in:
            return True
    return False


def _forget_replaced(key: int) -> Any:
    """The callback that drops a replaced variable's record once it is freed."""

    def forget(reference: weakref.ref) -> None:
        record = replaced.get(key)
        if record is not None and record[0] is reference:
            del replaced[key]

    return forget


def _set_hot_epoch() -> None:
    global hot_epoch
    off = open_trace_frames or placement_settings.log_placement
    hot_epoch = HOT_PATH_OFF if off else compile_epoch[0]


def enter_trace_frame() -> None:
    """Counts a trace frame opened, in any thread."""
    global open_trace_frames
    with _counters_lock:
        open_trace_frames += 1
        _set_hot_epoch()


def exit_trace_frame() -> None:
    """Counts a trace frame closed, in any thread."""
    global open_trace_frames
    with _counters_lock:
        open_trace_frames -= 1
        _set_hot_epoch()


def set_log_placement(enabled: bool) -> None:
    """Turns logging of placements on or off (see `statevar.set_log_device_placement`)."""
    with _counters_lock:
        placement_settings.log_placement = enabled
        _set_hot_epoch()
