"""The process-wide mutable state that crosses concerns: one typed object, `STATE`.

`STATE` keeps what several concerns read and change: the update lock, the compile and
structure epochs that invalidate compiled steps (in one place,
`ProcessState.bump_compile_epoch`), the open trace frames and the eager hot path's epoch
computed from them, the compiled functions closure discovery follows, and the arrays
background saves hold. State of one concern stays with it: the copy policy in
`statevar._cell.copies` (`POLICY`), soft placement in `statevar._cell.placement`
(`SETTINGS`), the checkpoint directory locks in `statevar._checkpoint.save_restore`
(`DIRECTORY_LOCKS`), the concrete argument types of `statevar.jit`'s fast path in
`statevar._compile.cache`; per-thread state (the stack of trace frames in
`statevar._tracing.frames`, the device and mesh scopes in `statevar._cell.placement`) stays
private to its module. Caches register with `_caches`.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import weakref
from typing import Any


@dataclasses.dataclass(eq=False, slots=True)
class ProcessState:
    """Everything statevar keeps for the whole process, each field saying what it guards.

    Attributes:
      update_lock: guards every variable's array between reading it for an update and
        storing the result: eager updates and reads, and `statevar.jit` calls, which read,
        donate and replace many variables at once. One reentrant lock (rather than one per
        variable) keeps a compiled step to a single acquire and cannot deadlock.
      donating: whether the thread holding `update_lock` is between deciding to donate
        arrays (nothing else holds them) and storing what the donating call returned. Only a
        signal handler, which runs in that thread, can act meanwhile: its reads get copies
        (the array it would get is about to be donated), and its updates are refused (the
        update it interrupted would overwrite them). Other threads wait for the lock.
      compile_epoch: counts changes of any variable's trainable flag, sharding or
        commitment (`bump_compile_epoch`): when it moves, `statevar.jit` checks whether the
        flags and shardings its traces were made for still hold, and the eager hot path
        closes (see `hot_epoch`).
      structure_epoch: counts the changes of what a Module's attributes hold
        (`record_structure_change`): a compiled step traced before one traces again if it
        lifted a variable replaced since (`replaced`), or after an attribute that held no
        variable came to hold some (`state_added`), which any step may have read.
      replaced: each variable a Module let go of, by id: a weak reference to it (a step
        tracing again releases it) and the structure epoch in which it was let go of. By id,
        not a WeakKeyDictionary: weak references compare their referents with ``==``, which
        is elementwise for a Variable.
      attribute_epoch: counts the sets and deletions of Module attributes that held or
        hold a variable, a Module, a list, a tuple or a dict, and the attributes added
        (`record_attribute_change`): while it stays, a `statevar._cell.tree.Structure`
        compares only the containers in place, not every Module's attributes.
      state_added: the structure epoch of the latest attribute that came to hold variables
        where it held none.
      open_trace_frames: the trace frames open in any thread: while it is 0 (almost always,
        outside a first call), nothing is traced and reads and updates skip
        `statevar._tracing.frames`'s per-thread lookup.
      hot_epoch: the compile epoch in which the eager updates' hot path may run (see
        `Variable._open_hot_path`); `HOT_PATH_OFF` while a trace frame is open in any
        thread or placements are logged, so that the hot path compares one field.
      compiled_updates_generation: changed by `forget_compiled_updates`
        (`statevar.clear_caches`): a variable that recorded its compiled updates in another
        generation forgets them (see `_variable.run_kernel`).
      log_placement: whether placements are logged (`statevar.set_log_device_placement`).
      compiled_functions: what `statevar.jit` returned (each a `Step`), so that closure
        discovery can follow them into the function each compiles, and
        `statevar.clear_caches` can empty them.
      saved_arrays: how many background checkpoint saves in flight hold each array, by id
        (see `statevar._checkpoint.async_saves.PendingSave`): an update copying such an array copies
        for the save, which the copy policy tells apart. A save holds its arrays while registered,
        so their ids stay theirs.
    """

    update_lock: Any = dataclasses.field(default_factory=threading.RLock)
    donating: bool = False
    compile_epoch: int = 0
    structure_epoch: int = 0
    replaced: dict[int, tuple[weakref.ref, int]] = dataclasses.field(default_factory=dict)
    attribute_epoch: int = 0
    state_added: int = 0
    open_trace_frames: int = 0
    hot_epoch: int = 0
    compiled_updates_generation: int = 0
    log_placement: bool = False
    compiled_functions: weakref.WeakSet[Any] = dataclasses.field(default_factory=weakref.WeakSet)
    saved_arrays: dict[int, int] = dataclasses.field(default_factory=dict)
    # Guards the changes of `compile_epoch`, `open_trace_frames` and `hot_epoch`, which the
    # last is computed from.
    _counters_lock: Any = dataclasses.field(default_factory=threading.Lock)

    def bump_compile_epoch(self) -> None:
        """Invalidates every compiled step, the one place that does: records that a
        trainable flag, a sharding or a variable's commitment changed. Compiled steps check
        again, and run their next call as a first call (JAX compiles apart for a committed
        and an uncommitted array); eager updates leave the hot path until they run again."""
        with self._counters_lock:
            self.compile_epoch += 1
            self._set_hot_epoch()

    def record_structure_change(self, let_go: list[Any], added: bool) -> None:
        """Records that a Module's attribute let go of the variables ``let_go`` (replaced or
        deleted), or (``added``) came to hold variables where it held none. The compiled
        steps that lifted one of ``let_go``, or every step after ``added``, trace again on
        their next call (which a new compile epoch sends them through, see
        `statevar._compile.cache.stale`)."""
        with self._counters_lock:
            self.structure_epoch += 1
            for variable in let_go:
                key = id(variable)
                reference = weakref.ref(variable, _forget_replaced(self, key))
                self.replaced[key] = (reference, self.structure_epoch)
            if added:
                self.state_added = self.structure_epoch
        self.bump_compile_epoch()

    def record_attribute_change(self) -> None:
        """Records that a Module attribute watched by `attribute_epoch` changed."""
        with self._counters_lock:
            self.attribute_epoch += 1

    def forget_compiled_updates(self) -> None:
        """Records that JAX's compiled updates were dropped: every variable's next update
        runs as a first call (see `compiled_updates_generation`), and its hot path closes."""
        with self._counters_lock:
            self.compiled_updates_generation += 1
        self.bump_compile_epoch()

    def enter_trace_frame(self) -> None:
        """Counts a trace frame opened, in any thread."""
        with self._counters_lock:
            self.open_trace_frames += 1
            self._set_hot_epoch()

    def exit_trace_frame(self) -> None:
        """Counts a trace frame closed, in any thread."""
        with self._counters_lock:
            self.open_trace_frames -= 1
            self._set_hot_epoch()

    def set_log_placement(self, enabled: bool) -> None:
        """Turns logging of placements on or off (see `statevar.set_log_device_placement`)."""
        with self._counters_lock:
            self.log_placement = enabled
            self._set_hot_epoch()

    def _set_hot_epoch(self) -> None:
        off = self.open_trace_frames or self.log_placement
        self.hot_epoch = HOT_PATH_OFF if off else self.compile_epoch


# No compile epoch: the hot path is closed (see `ProcessState.hot_epoch`).
HOT_PATH_OFF = -2

STATE = ProcessState()
# In a child process made by os.fork, where every thread but the forking one is gone, the
# lock is free. typeshed omits RLock's `_at_fork_reinit`, which CPython has had since 3.9.
os.register_at_fork(after_in_child=STATE.update_lock._at_fork_reinit)


def _forget_replaced(state: ProcessState, key: int) -> Any:
    """The callback that drops a replaced variable's record once it is freed."""

    def forget(reference: weakref.ref) -> None:
        record = state.replaced.get(key)
        if record is not None and record[0] is reference:
            del state.replaced[key]

    return forget
