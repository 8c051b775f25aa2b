"""Checkpoints: one-shot `save` and `restore` of named variables (`_manager` numbers them).

orbax-checkpoint stores the arrays (``directory/data-<hex>/`` for `save`,
``directory/<step>/state/`` for `CheckpointManager`). Beside them statevar writes
``statevar_checkpoint.json`` (see `statevar._checkpoint.manifest`): each variable's name,
shape, dtype and sha256, and each data file's size and sha256, sealed by a sha256 of its
own. Nothing on disk is a pickle.

A directory is a checkpoint only once its manifest exists. orbax writes into a temporary
directory and renames it when done; then the data is flushed to disk and the manifest is
written to a temporary file that ``os.replace`` moves into place. A process killed at any
moment so leaves the previous checkpoint or the new one, never a mixture. A save in the
background (``blocking=False``) takes the same steps: orbax's `AsyncCheckpointer` writes
the data, then a thread of `statevar._checkpoint.async_saves` writes the manifest (see
`PendingSave`).
Orbax keys the arrays by position (``"0"``, ``"1"``, ...), not by name, because it maps
some distinct names to one storage key (``"a"`` and ``"a/"``); the manifest maps names to
keys.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pathlib
import re
import shutil
import threading
import uuid
from collections.abc import Callable
from typing import Any, Literal, overload

import jax
import jax.numpy as jnp
import numpy as np

from .._cell.placement import put
from .._cell.variable import Variable
from .._errors import (
    CheckpointCorruptedError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    StatevarError,
)
from .._signals import held_signals
from .._state import STATE
from .._tracing import frames as _frames
from .async_saves import (
    PendingSave,
    Snapshot,
    check_single_process,
    interrupt_behind,
    raising_write_errors,
    settle,
    starting,
)
from .manifest import MANIFEST, read_manifest, verify_data_files, verify_values, write_manifest
from .names import match_checkpoint
from .targets import named_variables

# What a save into a plain directory may leave behind when it is killed: unreferenced data
# directories, orbax's temporary directories for them, and temporary manifests.
_DEBRIS = re.compile(
    r"^(data-[0-9a-f]{32}(\.orbax-checkpoint-tmp.*)?|"
    + re.escape(MANIFEST)
    + r"\.tmp-[0-9a-f]{32})$"
)
_STEP_NAME = re.compile(r"^(0|[1-9][0-9]*)$")
_STEP_TEMPORARY = re.compile(
    r"^(0|[1-9][0-9]*)\.(orbax-checkpoint-tmp.*|statevar-deleted-[0-9a-f]{32})$"
)

PathLike = str | os.PathLike
logger = logging.getLogger("statevar")


def _orbax() -> Any:
    """Imports orbax-checkpoint on first use, keeping it out of ``import statevar``."""
    import orbax.checkpoint

    return orbax.checkpoint


# --------------------------------------------------------------------------- save


def _write_data(path: pathlib.Path, arrays: dict[str, jax.Array]) -> None:
    ocp = _orbax()
    checkpointer = ocp.Checkpointer(ocp.StandardCheckpointHandler())
    try:
        checkpointer.save(path, args=ocp.args.StandardSave(arrays))
    finally:
        checkpointer.close()


def _start_data(path: pathlib.Path, arrays: dict[str, jax.Array]) -> Any:
    """Starts orbax's background write of ``arrays`` to ``path``; returns its checkpointer,
    whose ``wait_until_finished`` finishes it. orbax copies the arrays to the host before
    returning (on the CPU it reads them in place; the snapshot holds them meanwhile)."""
    ocp = _orbax()
    checkpointer = ocp.AsyncCheckpointer(
        ocp.StandardCheckpointHandler(), async_options=background_write_options()
    )
    try:
        checkpointer.save(path, args=ocp.args.StandardSave(arrays))
    except BaseException:
        checkpointer.close()
        raise
    return checkpointer


def background_write_options() -> Any:
    """orbax's options for a write in the background. orbax gives up on a write after 20
    minutes by default; a blocking save has no such limit, and neither has this (one day)."""
    return _orbax().AsyncOptions(timeout_secs=24 * 3600)


def _finish_data(checkpointer: Any) -> None:
    """Waits for what `_start_data` started; raises its failure."""
    try:
        checkpointer.wait_until_finished()
    finally:
        checkpointer.close()


@dataclasses.dataclass(eq=False, slots=True)
class DirectoryLocks:
    """One lock per checkpoint directory (resolved path) that this process saves into or
    restores from (see `directory_lock`): a save deletes what it did not write, so two
    threads saving into one directory would delete each other's data.

    Attributes:
      locks: the lock of each directory, by resolved path.
      guard: guards ``locks``.
    """

    locks: dict[str, Any] = dataclasses.field(default_factory=dict)
    guard: Any = dataclasses.field(default_factory=threading.Lock)


DIRECTORY_LOCKS = DirectoryLocks()


def directory_lock(directory: pathlib.Path, action: str) -> Any:
    """The lock this process's saves into and restores from ``directory`` hold, one at a
    time (see `DirectoryLocks`).

    Raises:
      StatevarError: if this thread holds it already: a signal handler saving or
        restoring while the save or restore it interrupted, of the same directory, is
        under way (waiting would never end).
    """
    with DIRECTORY_LOCKS.guard:
        lock = DIRECTORY_LOCKS.locks.setdefault(str(directory.resolve()), threading.RLock())
    if lock._is_owned():  # pyright: ignore[reportAttributeAccessIssue]
        raise StatevarError(
            f"Cannot {action} {str(directory)!r} in a signal handler that interrupted a save "
            "to or restore from it: the two would delete each other's files. Have the "
            "handler set a plain Python flag, and save where the loop checks it."
        )
    return lock


def check_untraced(action: str) -> None:
    """Refuses a checkpoint's ``action`` (``"save"``, ``"restore"``) inside a compiled or
    differentiated function, where the variables' values are only traced.

    Raises:
      TraceContextError: if a statevar transformation traces.
    """
    _frames.check_outside(
        f"{action} a checkpoint",
        "a checkpoint reads or writes files when it is called, while here the variables' "
        "values are only being traced. Call it between calls of the compiled step.",
    )


def directory_path(directory: Any, action: str) -> pathlib.Path:
    """Returns the checkpoint ``directory`` (a str or an `os.PathLike`) as an absolute path.

    Raises:
      TypeError: for anything else, naming ``action`` (``"save a checkpoint"``).
    """
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(
            f"Cannot {action}: expected the directory to be a str or an os.PathLike "
            f"(a pathlib.Path), got {type(directory).__name__} {directory!r:.60}"
        )
    return pathlib.Path(directory).absolute()


def check_flag(action: str, name: str, value: Any) -> None:
    """Refuses a flag argument (``blocking=``, ``partial=``) that is not a bool.

    Raises:
      TypeError: naming ``action`` (``"save a checkpoint"``), the flag and what it got.
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(
            f"Cannot {action}: expected {name}= to be True or False, got "
            f"{type(value).__name__} {value!r:.60}"
        )


@overload
def save(directory: PathLike, target: Any, *, blocking: Literal[True] = True) -> None: ...


@overload
def save(directory: PathLike, target: Any, *, blocking: Literal[False]) -> PendingSave: ...


@overload
def save(directory: PathLike, target: Any, *, blocking: bool) -> PendingSave | None: ...


def save(directory: PathLike, target: Any, *, blocking: bool = True) -> PendingSave | None:
    """Saves the target's variables to ``directory``, atomically, replacing what is there.

    Variables are keyed by name: a Module's by `Module.named_variables` (explicit ``name=``,
    else the path, such as ``"layers/0/kernel"``), an Optimizer's by their names
    (``"optimizer/mu/layers/0/kernel"``), a Variable given directly or in a list by its own
    ``name``. Dict keys namespace what they hold: ``{"generator": G, "discriminator": D}``
    keys G's kernel ``"generator/kernel"``; a Variable right under a key is keyed by the
    key, and an Optimizer's variables by the key in place of the optimizer's name. Lists
    and tuples add nothing. The values are read once, at the call; nothing is donated or
    changed, and arrays read earlier stay valid.

    Saving over a checkpoint replaces it atomically: the arrays go to a new data directory,
    one rename puts the new manifest in place of the old, then the old data is deleted. A
    process killed at any moment leaves the old checkpoint or the new one, whole. Files that
    statevar did not write are left alone. A save waits for the save in flight into the same
    directory, if any.

    With ``blocking=False`` the save returns once orbax has taken the values (copied them
    to the host), and is written in the background: see `PendingSave`. Until it is written
    it holds the arrays it read, so the first update of each saved variable copies instead
    of donating, at most one extra copy of the saved arrays.

    Under `jax.distributed`, every process calls `save` with the same target: each writes
    its shards of one checkpoint, and the first process writes the manifest once all have
    written, between barriers. It restores in any number of processes, onto any mesh.

    Args:
      directory: where to save; created if missing.
      target: a Variable, a Module, an Optimizer, or a (possibly nested) list, tuple or
        dict of them.
      blocking: if False, write in the background and return a `PendingSave` at once.

    Returns:
      None; with ``blocking=False``, a `PendingSave`, whose `PendingSave.wait` finishes it.

    Raises:
      CheckpointWriteError: (an OSError) if writing fails (a full disk, a directory that
        cannot be written), naming the directory and the cause; with ``blocking=False``,
        raised by `PendingSave.wait` instead. Also a failure of the earlier save in the
        background into ``directory`` that no call has raised yet: then nothing is saved.
      TypeError: if ``directory`` is not a str or an os.PathLike, ``blocking`` is not a
        bool, or ``target`` holds anything but Variables, Modules, Optimizers and
        containers.
      ValueError: if two different variables have the same name, or an Optimizer has no
        state yet (it was never built).
      TraceContextError: if called inside `statevar.jit`, `statevar.grad` or
        `stateless_call`.
      StatevarError: with ``blocking=False`` under `jax.distributed`.

    Example:
      >>> import tempfile, statevar
      >>> w = statevar.Variable([1.0, 2.0], name="w")
      >>> directory = tempfile.mkdtemp()
      >>> statevar.save(directory, w)
      >>> w.assign([0.0, 0.0])
      <Variable 'w' shape=(2,) dtype=float32, numpy=array([0., 0.], dtype=float32)>
      >>> statevar.restore(directory, w).restored
      ['w']
      >>> w
      <Variable 'w' shape=(2,) dtype=float32, numpy=array([1., 2.], dtype=float32)>
    """
    check_untraced("save")
    check_flag("save a checkpoint", "blocking", blocking)
    variables = named_variables(target)
    if not blocking:
        check_single_process("save")
    checkpoint, shown = directory_path(directory, "save a checkpoint"), str(directory)
    with Snapshot.read(variables) as snapshot:
        with directory_lock(checkpoint, "save to"):  # one writer per directory
            settle(checkpoint)
            if not blocking:
                with starting():
                    return _start_checkpoint(checkpoint, shown, snapshot)
            with raising_write_errors(shown, None):
                _write_checkpoint(checkpoint, snapshot)
    return None


def _write_checkpoint(checkpoint: pathlib.Path, snapshot: Snapshot) -> None:
    """Writes the data, then the manifest, then deletes what the directory held before
    (see `save`)."""
    checkpoint.mkdir(parents=True, exist_ok=True)
    arrays, data = snapshot.stored(), None
    if arrays:
        data = f"data-{shared_token()}"
        _write_data(checkpoint / data, arrays)
    _commit_checkpoint(checkpoint, data, snapshot)


def _start_checkpoint(checkpoint: pathlib.Path, shown: str, snapshot: Snapshot) -> PendingSave:
    """Starts `_write_checkpoint`'s steps in the background: orbax's write of the data
    now, then, in a `PendingSave`'s thread, its end and the manifest."""
    pending = PendingSave(checkpoint, shown, None)
    arrays, data, checkpointer = snapshot.stored(), None, None
    try:
        checkpoint.mkdir(parents=True, exist_ok=True)
        if arrays:
            data = f"data-{shared_token()}"
            checkpointer = _start_data(checkpoint / data, arrays)
    except Exception as error:  # raised by the PendingSave, as a failure in the background
        return pending._fail(error)

    def finish() -> None:
        if checkpointer is not None:
            _finish_data(checkpointer)
        _commit_checkpoint(checkpoint, data, snapshot)

    return pending._begin(finish, snapshot)


def _commit_checkpoint(checkpoint: pathlib.Path, data: str | None, snapshot: Snapshot) -> None:
    """Writes the manifest of the data written (``data``: its directory's name, None if no
    array is stored), then deletes what the directory held before."""
    entries = snapshot.entries()
    # Under jax.distributed every process writes its shards; the first writes the manifest
    # once all are written, and the others return once it is in place.
    sync_processes("statevar-save-data")
    if jax.process_index() == 0:
        write_manifest(checkpoint, data, entries)
        # The new checkpoint is in place: what is left of the old one goes now, or, if it
        # cannot, with the next save's.
        for entry in checkpoint.iterdir():
            if entry.name != data and _DEBRIS.match(entry.name):
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        entry.unlink(missing_ok=True)
    sync_processes("statevar-save-manifest")


def shared_token() -> str:
    """A random hex token, the same in every process (the first process's)."""
    token = uuid.uuid4()
    if jax.process_count() == 1:
        return token.hex
    from jax.experimental import multihost_utils

    shared = multihost_utils.broadcast_one_to_all(np.frombuffer(token.bytes, np.uint8))
    return bytes(np.asarray(shared, np.uint8)).hex()


def sync_processes(name: str) -> None:
    """Waits until every process reaches this point (a no-op with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


# --------------------------------------------------------------------------- restore


def _read_values(
    checkpoint: pathlib.Path,
    manifest: dict[str, Any],
    entries: dict[str, dict[str, Any]],
    variables: dict[str, Variable],
    shown: str,
) -> dict[str, jax.Array]:
    """Reads the values of ``variables`` onto their own shardings and verifies every one
    against the manifest (whose ``entries`` are given by name) before returning any."""
    wanted = {name: entries[name] for name in variables}
    stored = {name: entry for name, entry in wanted.items() if entry["key"] is not None}
    values: dict[str, jax.Array] = {}
    if stored:
        # Checking the files first keeps damaged bytes away from orbax, which reports them
        # as a generic Exception and leaves its pending reads to fail at garbage collection.
        verify_data_files(checkpoint, manifest, shown)
        ocp = _orbax()
        item, restore_args = {}, {}
        for name, entry in stored.items():
            shape, sharding = tuple(entry["shape"]), variables[name].sharding
            item[entry["key"]] = jax.ShapeDtypeStruct(
                shape, variables[name].dtype, sharding=sharding
            )
            # dtype=None reads the array in its stored dtype: nothing is cast on the way.
            restore_args[entry["key"]] = ocp.ArrayRestoreArgs(
                sharding=sharding, global_shape=shape, dtype=None
            )
        checkpointer = ocp.Checkpointer(ocp.PyTreeCheckpointHandler())
        try:
            arguments = ocp.args.PyTreeRestore(
                item=item, restore_args=restore_args, partial_restore=True
            )
            read = checkpointer.restore(checkpoint / manifest["data"], args=arguments)
        except Exception as error:  # tensorstore reports damage as ValueError or Exception
            interrupt = interrupt_behind(error)
            if interrupt is not None:
                # Ctrl-C while orbax waited for a read: an interruption, not damage.
                raise interrupt from None
            first_line = (str(error).splitlines() or [""])[0][:300]
            raise CheckpointCorruptedError(
                f"Checkpoint {shown!r} is corrupted: its data could not be read "
                f"({type(error).__name__}: {first_line}); no variable was changed"
            ) from error
        finally:
            checkpointer.close()
        values = {name: read[entry["key"]] for name, entry in stored.items()}
    for name, entry in wanted.items():
        if entry["key"] is None:
            values[name] = put(jnp.zeros(entry["shape"], entry["dtype"]), variables[name].sharding)
    verify_values(values, wanted, shown)
    return values


def _read_manifest(checkpoint: pathlib.Path, shown: str) -> dict[str, Any]:
    """Reads and checks the manifest of ``checkpoint``, explaining why when there is none."""
    if not (checkpoint / MANIFEST).is_file():
        steps = _complete_steps(checkpoint)
        if checkpoint.exists() and not checkpoint.is_dir():
            reason = "is a file, not a checkpoint directory"
        elif not checkpoint.is_dir():
            reason = "does not exist"
        elif steps:
            reason = (
                "holds CheckpointManager steps, not a checkpoint; use "
                f"statevar.CheckpointManager({shown!r}).restore(target), or restore one step "
                f"directory such as {os.path.join(shown, str(steps[-1]))!r}"
            )
        else:
            reason = (
                f"holds no complete checkpoint (no {MANIFEST}): it is empty, holds something "
                "else, or a save into it stopped before it finished"
            )
        raise CheckpointNotFoundError(f"Checkpoint directory {shown!r} {reason}")
    return read_manifest(checkpoint, shown)


@dataclasses.dataclass(frozen=True)
class RestoreResult:
    """What a restore did, by checkpoint name.

    Attributes:
      restored: the target's variables that were restored, in the target's order.
      untouched: the target's variables left as they were because the checkpoint does not
        have them (only with ``partial=True``).
      unused: the checkpoint's variables that the target does not have (only with
        ``partial=True``).
      step: the step restored, for `CheckpointManager.restore`; else None.
    """

    restored: list[str]
    untouched: list[str]
    unused: list[str]
    step: int | None = None


def _restore(
    target: Any,
    partial: bool,
    *,
    locks: tuple[pathlib.Path, ...],
    locate: Callable[[], tuple[pathlib.Path, str, int | None] | None],
) -> RestoreResult | None:
    """Reads the checkpoint ``locate()`` names, as ``(directory, shown, step)``, matches it
    to the target (see `match_checkpoint`) and assigns the matched values, or raises before
    changing any variable; if ``locate()`` gives None, restores nothing and returns None.

    Locates and reads holding the locks of the directories ``locks``, outermost first (not
    while a save replaces or deletes what it reads, nor between the choice of a step and
    its reading); assigns holding the update lock only (a save in a signal handler that
    interrupted an update holds that one and waits for a directory lock). A save in flight
    into each is waited for first, and its failure raised if no call has raised it."""
    check_flag("restore a checkpoint", "partial", partial)
    with contextlib.ExitStack() as held:
        for lock in locks:
            held.enter_context(directory_lock(lock, "restore from"))
            settle(lock)
        located = locate()
        if located is None:
            return None
        checkpoint, shown, step = located
        match, placed = _read_restored(checkpoint, target, partial, shown)
    # All or nothing: a step another thread runs lands before the restore or after it, and
    # a signal (Ctrl-C) arriving meanwhile is raised once every variable is restored.
    with STATE.update_lock, held_signals():
        for variable, value in placed:
            variable.assign(value)
    logger.log(*match.report(shown))
    return RestoreResult(match.common, match.untouched, match.unexpected, step)


def _read_restored(
    checkpoint: pathlib.Path, target: Any, partial: bool, shown: str
) -> tuple[Any, list[tuple[Variable, jax.Array]]]:
    """Reads and checks what `_restore` assigns: the match, and each variable with its
    value, placed."""
    variables = named_variables(target)
    manifest = _read_manifest(checkpoint, shown)
    entries = {entry["name"]: entry for entry in manifest["variables"]}
    match = match_checkpoint(
        {name: (entry["shape"], entry["dtype"]) for name, entry in entries.items()},
        {name: (variable.shape, variable.dtype) for name, variable in variables.items()},
        partial=partial,
    )
    if match.is_refused:
        raise CheckpointMismatchError(match.refusal(shown))
    common = {name: variables[name] for name in match.common}
    values = _read_values(checkpoint, manifest, entries, common, shown)
    return match, [(v, _as_placed(values[name], v)) for name, v in common.items()]


def _as_placed(value: jax.Array, variable: Variable) -> jax.Array:
    """The value read for ``variable`` (on its sharding, committed), uncommitted if the
    variable is placed nowhere: a restore changes values, never placements (a committed
    variable would compile its steps and updates again)."""
    if variable._value.committed:
        return value
    return jnp.asarray(np.asarray(value))  # read to the host already, for its checksum


def restore(directory: PathLike, target: Any, *, partial: bool = False) -> RestoreResult:
    """Loads a checkpoint into the target's variables, in place, all or nothing.

    Variables are matched by name, as `save` keys them. Every value is read onto its
    variable's device and sharding and checked against its sha256 before any variable
    changes; then each is set with `Variable.assign`, which donates the old buffer when
    nothing else holds it (arrays read earlier stay valid). Dtypes must match: nothing is cast.

    What was restored is logged on the ``"statevar"`` logger: at level INFO, or WARNING
    when ``partial=True`` left target variables unchanged or checkpoint variables unused.

    Args:
      directory: a directory written by `save`, or one step directory of a
        `CheckpointManager`.
      target: a Variable, a Module, an Optimizer, or a (possibly nested) list, tuple or dict
        of them.
      partial: if True, restore only the names both the checkpoint and the target have,
        leaving the target's other variables unchanged.

    Returns:
      A `RestoreResult`: the names restored, and (with ``partial=True``) the target's
      names left untouched and the checkpoint's names left unused.

    Raises:
      CheckpointNotFoundError: (a FileNotFoundError) if ``directory`` does not exist or
        holds no complete checkpoint.
      CheckpointMismatchError: (a ValueError) if a shape or dtype differs, or names are
        missing from the checkpoint or unexpected in it (only when ``partial`` is False), or
        no name is shared at all; the message names every offending variable.
      CheckpointCorruptedError: (a ValueError) if the manifest or the data is damaged.
      CheckpointWriteError: (an OSError) if a save in the background into ``directory``
        (or into the `CheckpointManager` directory holding it) failed and no call has
        raised it yet; the restore waits for a save in flight there first.
      TypeError: if ``partial`` is not a bool.
      TypeError, ValueError, TraceContextError: as `save`.

    Example:
      >>> import tempfile, statevar
      >>> directory = tempfile.mkdtemp()
      >>> statevar.save(directory, [statevar.Variable(1, name="step")])
      >>> step = statevar.Variable(0, name="step")
      >>> extra = statevar.Variable(0.5, name="extra")
      >>> statevar.restore(directory, [step, extra], partial=True)
      RestoreResult(restored=['step'], untouched=['extra'], unused=[], step=None)
      >>> int(step), float(extra)
      (1, 0.5)
    """
    check_untraced("restore")
    checkpoint = directory_path(directory, "restore a checkpoint")
    locks = (checkpoint,)
    if _STEP_NAME.match(checkpoint.name):  # perhaps a step of a CheckpointManager's, whose
        locks = (checkpoint.parent, checkpoint)  # saves write and delete steps
    result = _restore(
        target, partial, locks=locks, locate=lambda: (checkpoint, str(directory), None)
    )
    assert result is not None  # located
    return result


def _complete_steps(directory: pathlib.Path) -> list[int]:
    """The steps under ``directory`` whose manifest exists, in increasing order."""
    if not directory.is_dir():
        return []
    return sorted(
        int(entry.name)
        for entry in directory.iterdir()
        if _STEP_NAME.match(entry.name) and (entry / MANIFEST).is_file()
    )
