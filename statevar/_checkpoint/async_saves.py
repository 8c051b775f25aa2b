"""Saves in flight: what a save read, the handle of a save written in the background
(`PendingSave`), and how every other save and restore of a directory waits for it.

A save reads every value at the call, into a `Snapshot`, and holds those arrays until they
are written. An update of a variable whose array is held elsewhere copies instead of
donating (see `Variable.assign_add`), so training goes on while a save is written: the
first update of each saved variable makes one copy, and the save writes the values of the
save call, never a deleted array nor a later value.

Each save and restore of a directory, in this process, first waits (holding the
directory's lock) for the save in flight there, if any (`settle`); a failure no call has
raised yet is raised there. When the interpreter exits, every save in flight is finished
and a failure still unraised is logged (`_finish_at_exit`).
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401  (its exit hook is registered first: see the end)
import contextlib
import dataclasses
import logging
import os
import pathlib
import re
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import jax

from .._errors import CheckpointWriteError, StatevarError
from .._signals import held_signals
from .._state import STATE
from .manifest import array_sha256

logger = logging.getLogger("statevar")

# tensorstore reports the operating system's error inside its message text.
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")


# --------------------------------------------------------------------------- snapshot


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The values a save read at its call, by checkpoint name.

    While a save holds it, the variables' updates copy rather than donate these arrays
    (they are held elsewhere), so the values stay valid and unchanged until written.
    """

    values: dict[str, jax.Array]

    @classmethod
    @contextlib.contextmanager
    def read(cls, variables: dict[str, Any]) -> Iterator[Snapshot]:
        """Reads every variable once, all under one hold of the update lock: a step another
        thread runs lands before the snapshot or after it, never between two variables.

        Until the block ends the arrays count as held by a save (`ProcessState.saved_arrays`):
        an update that copies one meanwhile, in another thread, is the save's doing (see
        `statevar.set_copy_policy`). A save in the background holds them again until it is
        written (`PendingSave`).
        """
        with STATE.update_lock:
            snapshot = cls({name: variable.value for name, variable in variables.items()})
            held = _hold(snapshot)
        try:
            yield snapshot
        finally:
            _release(held)

    def stored(self) -> dict[str, jax.Array]:
        """The arrays orbax stores, keyed by position (see
        `statevar._checkpoint.save_restore`). Orbax cannot store zero-size arrays, and need
        not: the manifest's shape and dtype rebuild them."""
        nonempty = [value for value in self.values.values() if value.size]
        return {str(position): value for position, value in enumerate(nonempty)}

    def entries(self) -> list[dict[str, Any]]:
        """The manifest's entry of every value, with its sha256 (reads each to the host)."""
        entries, position = [], 0
        for name, value in self.values.items():
            key = None
            if value.size:
                key, position = str(position), position + 1
            shape, dtype, sha256 = list(value.shape), str(value.dtype), array_sha256(value)
            entries.append(dict(name=name, key=key, shape=shape, dtype=dtype, sha256=sha256))
        return entries


# --------------------------------------------------------------------------- errors


def interrupt_behind(error: BaseException) -> BaseException | None:
    """Returns the KeyboardInterrupt (or other non-`Exception`) that ``error`` wraps, if any."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if not isinstance(cause, Exception):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def _error_code(error: BaseException) -> int | None:
    """The operating system's error code behind ``error``: an OSError's ``errno``, or the
    code tensorstore writes into its message (``os_error_code='28'``)."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno:
            return cause.errno
        found = _OS_ERROR_CODE.search(str(cause))
        if found:
            return int(found[1])
        cause = cause.__cause__
    return None


def write_error(shown: str, step: int | None, error: BaseException) -> BaseException:
    """The error a failed write raises: ``error`` itself if it is an interruption or
    statevar's own error; else a `CheckpointWriteError` naming the step, the directory
    (``shown``, as the user gave it), the operating system's reason and the cause."""
    interrupt = interrupt_behind(error)
    if interrupt is not None:
        return interrupt
    if isinstance(error, StatevarError):
        return error
    where = f"step {step} to {shown!r}" if step is not None else f"to {shown!r}"
    code = _error_code(error)
    reason = f": {os.strerror(code)} (errno {code})" if code else ""
    first_line = (str(error).strip().splitlines() or [""])[0][:500]
    wrapped = CheckpointWriteError(
        f"Saving {where} failed{reason} ({type(error).__name__}: {first_line}). The "
        "checkpoints saved before it are left as they were."
    )
    wrapped.errno = code
    # As ``raise wrapped from error`` sets them, for a failure raised later, elsewhere.
    wrapped.__cause__, wrapped.__suppress_context__ = error, True
    return wrapped


@contextlib.contextmanager
def raising_write_errors(shown: str, step: int | None) -> Iterator[None]:
    """Raises what `write_error` makes of an exception in the block, from it."""
    try:
        yield
    except Exception as error:
        raised = write_error(shown, step, error)
        if raised is error:
            raise
        if isinstance(raised, CheckpointWriteError):
            raise raised from error
        raise raised from None  # the interruption behind an error orbax raised


def _detach_tracebacks(error: BaseException) -> None:
    """Replaces the traceback of each exception in ``error``'s chain by its text, in a note.

    A traceback holds its frames, and they hold the snapshot's arrays (a frame whose locals
    are cleared still holds its function, a closure over them), for as long as the error is
    kept: until a call raises it, perhaps the next save. Without them a failed save lets go
    of its arrays at once.
    """
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if cause.__traceback__ is not None:
            text = "".join(traceback.format_tb(cause.__traceback__)).rstrip()
            cause.add_note(f"Raised in the background save, at:\n{text}")
            cause.__traceback__ = None
        cause = cause.__cause__ or cause.__context__


def check_single_process(action: str) -> None:
    """Refuses a save in the background under `jax.distributed`.

    Raises:
      StatevarError: if more than one process runs.
    """
    if jax.process_count() > 1:
        raise StatevarError(
            f"Cannot {action} in the background with {jax.process_count()} processes "
            "(jax.distributed): background saves are written by one process only. Save "
            "with blocking=True, or use a CheckpointManager made without async_save=True"
        )


def starting() -> contextlib.AbstractContextManager[None]:
    """The block that starts a save in the background, from orbax's write to the save's
    registration (`PendingSave._begin`): a signal waits until it ends, since an
    interruption in between would leave orbax writing a save that nothing waits for and
    whose failure nothing reports."""
    return held_signals()


# --------------------------------------------------------------------------- in flight

# The latest save started into each directory (by resolved path) until it succeeds, or
# until its failure is raised; guarded by `_registry_lock`. Only this module reads it.
_in_flight: dict[str, PendingSave] = {}
_registry_lock = threading.Lock()
# Whether the interpreter has begun to exit (`_finish_at_exit` ran): nothing waits for a
# save started since, so it logs its own failure.
_exiting = False
# Guards `ProcessState.saved_arrays`' counts: a lock of its own, which nothing holds while
# taking another (the update lock may be held by the thread a save interrupted).
_saved_lock = threading.Lock()


def _key(directory: pathlib.Path) -> str:
    return str(directory.resolve())


class PendingSave:
    """A checkpoint being written in the background, as ``statevar.save(directory, target,
    blocking=False)`` and the ``save`` of a `CheckpointManager` made with
    ``async_save=True`` return it.

    The values were read at the save call: updates made while the save is written (donating
    ones included) change the variables, never the checkpoint. `wait` finishes the save and
    raises its failure. A failure is raised by the first of: `wait`, the next save into the
    same directory, a restore from it, and the manager's `CheckpointManager.close`; one never
    raised by any of them is logged when the interpreter exits. Until its manifest is
    written the save is not a checkpoint: the previous one stays whole and is what a process
    killed meanwhile leaves.

    Attributes:
      directory: the directory saved into (a `CheckpointManager`'s, for a step).
      step: the step saved by a `CheckpointManager`; None for `statevar.save`.

    Example:
      >>> import tempfile, statevar
      >>> w = statevar.Variable([1.0, 2.0], name="w")
      >>> directory = tempfile.mkdtemp()
      >>> pending = statevar.save(directory, w, blocking=False)
      >>> _ = w.assign_add([10.0, 10.0])  # training goes on while the save is written
      >>> pending.wait()
      >>> pending.is_done()
      True
      >>> _ = statevar.restore(directory, w)
      >>> w.numpy()  # the values of the save call
      array([1., 2.], dtype=float32)
    """

    def __init__(self, directory: pathlib.Path, shown: str, step: int | None):
        self.directory = directory
        self.step = step
        self._shown = shown
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._reported = False  # whether a call has raised ``_error``
        self._finish: Callable[[], None] | None = None
        self._saved: tuple[int, ...] = ()  # the ids of the arrays it holds (`_hold`)

    def is_done(self) -> bool:
        """Whether the save has finished, written or failed; never blocks."""
        return self._done.is_set()

    def wait(self) -> None:
        """Blocks until the save is written.

        Raises:
          CheckpointWriteError: (an OSError) if the save failed: a full disk, a directory
            that cannot be written. It names the step, the directory and the cause; the
            checkpoints saved before are left as they were. Raised by every call of `wait`.
          StatevarError: statevar's own error, as it was raised, if writing raised one.
        """
        self._done.wait()
        if self._error is not None:
            with _registry_lock:
                self._reported = True
                _forget(self)
            raise self._error.with_traceback(None)

    def __repr__(self) -> str:
        state = "failed" if self._error is not None else "done" if self.is_done() else "writing"
        step = "" if self.step is None else f" step {self.step}"
        return f"<PendingSave{step} to {self._shown!r}: {state}>"

    def _begin(self, finish: Callable[[], None], snapshot: Snapshot) -> PendingSave:
        """Registers the save as the one in flight into its directory and runs ``finish``
        (the rest of the write) in a thread the interpreter waits for at exit. The arrays
        of ``snapshot`` count as held by a save (`ProcessState.saved_arrays`) until then.

        Call it in a `starting` block, as the save's orbax write starts."""
        self._finish = finish
        self._saved = _hold(snapshot)
        # Started before it is registered: a thread that cannot start leaves nothing to
        # wait for. One that finishes first leaves a finished save registered, which
        # `settle` and `wait` take as it is.
        try:
            threading.Thread(target=self._run, name="statevar-save", daemon=False).start()
        except RuntimeError:  # no thread to be had (the interpreter exiting): finished here
            self._run()
        with _registry_lock:
            _in_flight[_key(self.directory)] = self
        return self

    def _fail(self, error: BaseException) -> PendingSave:
        """Records that the save failed before it went to the background.

        Raises:
          KeyboardInterrupt: (or another interruption) the one behind ``error``, at once,
            as a blocking save raises it: an interruption is no failure to report later.
        """
        failure = write_error(self._shown, self.step, error)
        if not isinstance(failure, Exception):
            raise failure from None
        self._error = failure
        _detach_tracebacks(self._error)
        with _registry_lock:
            _in_flight[_key(self.directory)] = self
        self._done.set()
        if _exiting:
            _log_unreported(self)
        return self

    def _run(self) -> None:
        finish, self._finish = self._finish, None
        try:
            assert finish is not None
            finish()
        except BaseException as error:  # raised where the user waits, never here
            self._error = write_error(self._shown, self.step, error)
            _detach_tracebacks(self._error)
        finally:
            _release(self._saved)
            self._saved = ()
            del finish  # the snapshot's arrays: later updates donate again
            if self._error is None:
                with _registry_lock:
                    _forget(self)
            self._done.set()
            if _exiting:
                _log_unreported(self)


def _hold(snapshot: Snapshot) -> tuple[int, ...]:
    """Counts ``snapshot``'s arrays as held by a save in flight; returns their ids."""
    ids = tuple(map(id, snapshot.values.values()))
    with _saved_lock:
        for key in ids:
            STATE.saved_arrays[key] = STATE.saved_arrays.get(key, 0) + 1
    return ids


def _release(ids: tuple[int, ...]) -> None:
    """Undoes `_hold`, before the save lets go of the arrays."""
    with _saved_lock:
        for key in ids:
            count = STATE.saved_arrays.pop(key) - 1
            if count:
                STATE.saved_arrays[key] = count


def _forget(pending: PendingSave) -> None:
    """Drops ``pending`` from the registry if it is still there; holds `_registry_lock`."""
    key = _key(pending.directory)
    if _in_flight.get(key) is pending:
        del _in_flight[key]


def settle(directory: pathlib.Path) -> None:
    """Waits for the save in flight into ``directory``, if any, and raises its failure if
    no call has raised it yet. A save or restore calls it holding the directory's lock
    (`directory_lock`), so that no other save starts there meanwhile; a manager's
    ``wait_until_finished`` and ``close`` call it without, to wait.

    Raises:
      CheckpointWriteError: the failure of that save, once.
    """
    with _registry_lock:
        pending = _in_flight.get(_key(directory))
    if pending is None:
        return
    pending._done.wait()
    with _registry_lock:
        _forget(pending)
        unreported = pending._error is not None and not pending._reported
        pending._reported = True
    if unreported:
        assert pending._error is not None
        raise pending._error.with_traceback(None)


def _finish_at_exit() -> None:
    """Waits for every save in flight and logs each failure that no call raised. A save
    started later (by an ``atexit`` function) logs its failure as it fails."""
    global _exiting
    _exiting = True
    with _registry_lock:
        pending_saves = list(_in_flight.values())
    for pending in pending_saves:
        pending._done.wait()
        _log_unreported(pending)


def _log_unreported(pending: PendingSave) -> None:
    """Logs the failure of ``pending`` if no call raised it: nothing will wait for it."""
    with _registry_lock:
        unreported = pending._error is not None and not pending._reported
        pending._reported = True
    if unreported:
        logger.error("A checkpoint save failed and nothing waited for it: %s", pending._error)


def _forget_in_child() -> None:
    """In a child made by os.fork, which has no thread of the parent's saves: forgets them
    (its exit would wait for them forever) and the arrays they hold (a copy of a variable
    is no save's doing there), and frees the locks another thread may hold."""
    _registry_lock._at_fork_reinit()  # pyright: ignore[reportAttributeAccessIssue]
    _saved_lock._at_fork_reinit()  # pyright: ignore[reportAttributeAccessIssue]
    _in_flight.clear()
    STATE.saved_arrays.clear()


os.register_at_fork(after_in_child=_forget_in_child)
# Run as the interpreter exits, before the thread pools orbax's writes need stop taking
# work: `atexit` functions run too late (once `concurrent.futures` has shut its pools down,
# an orbax write still in flight fails). Hooks run last registered first, so registering
# after `concurrent.futures.thread` (imported above) runs this one before its own.
threading._register_atexit(_finish_at_exit)  # pyright: ignore[reportAttributeAccessIssue]
