"""Checkpoints: one-shot `save` and `restore` of named variables (`_manager` numbers them).

orbax-checkpoint stores the arrays (``directory/data-<hex>/`` for `save`,
``directory/<step>/state/`` for `CheckpointManager`). Beside them statevar writes
``statevar_checkpoint.json`` (see `statevar._manifest`): each variable's name, shape, dtype
and sha256, and each data file's size and sha256, sealed by a sha256 of its own. Nothing on
disk is a pickle.

A directory is a checkpoint only once its manifest exists. orbax writes into a temporary
directory and renames it when done; then the data is flushed to disk and the manifest is
written to a temporary file that ``os.replace`` moves into place. A process killed at any
moment so leaves the previous checkpoint or the new one, never a mixture. Orbax keys the
arrays by position (``"0"``, ``"1"``, ...), not by name, because it maps some distinct
names to one storage key (``"a"`` and ``"a/"``); the manifest maps names to keys.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import re
import shutil
import threading
import uuid
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _trace
from ._errors import (
    CheckpointCorruptedError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    StatevarError,
    caller_stacklevel,
)
from ._manifest import (
    MANIFEST,
    array_sha256,
    read_manifest,
    verify_data_files,
    verify_values,
    write_manifest,
)
from ._matching import match_checkpoint
from ._module import Module
from ._placement import put
from ._signals import held_signals
from ._state import STATE
from ._tree import has_named_variables, named_targets
from ._variable import Variable

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


# --------------------------------------------------------------------------- targets


def _named_variables(target: Any) -> dict[str, Variable]:
    """Returns the target's variables by checkpoint key (see `named_targets`): dict keys
    namespace what they hold, lists and tuples add nothing.

    Warns of an Optimizer a Module holds and the target leaves out.
    """
    found = named_targets(target, "the checkpoint target")
    named: dict[str, Variable] = {}
    where: dict[str, str] = {}
    key_of: dict[int, str] = {}
    for key, variable, path in found:
        if key in named and named[key] is not variable:
            raise ValueError(
                f"Two variables in the checkpoint target have the name {key!r} (at "
                f"{where[key]} and {path}); give them distinct name= values, put them under "
                "distinct keys of a dict ({'generator': G, 'discriminator': D}), or hold "
                "them in a statevar.Module, which names unnamed variables by their path"
            )
        if key_of.get(id(variable), key) != key:
            first = key_of[id(variable)]
            raise ValueError(
                f"One variable appears in the checkpoint target under two names, {first!r} "
                f"(at {where[first]}) and {key!r} (at {path}); include it once"
            )
        named[key], where[key], key_of[id(variable)] = variable, path, key
    _warn_of_optimizers_left_out(target, set(map(id, named.values())))
    return named


def _warn_of_optimizers_left_out(target: Any, included: set[int]) -> None:
    """Warns of each Optimizer a Module in ``target`` holds whose state the checkpoint
    leaves out (``included``: the ids of the variables it holds): a Module's variables are
    its own, not those of an Optimizer kept as its attribute (``self.opt``), and training
    resumed without them would start Adam's moments and the step count afresh."""
    pending: list[tuple[Any, str]] = [(target, "")]
    seen: set[int] = set()
    while pending:
        obj, path = pending.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if has_named_variables(obj):
            # (An Optimizer not built yet has no state to leave out.)
            if path and obj.built and id(obj.iterations) not in included:
                warnings.warn(
                    f"The checkpoint leaves out Optimizer {obj.name!r}, which a Module holds "
                    f"at {path!r}: a Module's variables do not include an Optimizer's state. "
                    "Include the Optimizer in the target as well: "
                    "statevar.save(directory, [model, model.opt])",
                    UserWarning,
                    stacklevel=caller_stacklevel(),
                )
        elif isinstance(obj, Module):
            pending += [(value, f"{path}/{key}".lstrip("/")) for key, value in vars(obj).items()]
        elif isinstance(obj, (list, tuple)) and path:
            pending += [(value, f"{path}/{i}") for i, value in enumerate(obj)]
        elif isinstance(obj, dict) and path:
            pending += [(value, f"{path}/{key}") for key, value in obj.items()]
        elif isinstance(obj, (list, tuple, dict)):  # the target's own containers
            values = obj.values() if isinstance(obj, dict) else obj
            pending += [(value, "") for value in values]


# --------------------------------------------------------------------------- save


def _snapshot(variables: dict[str, Variable]) -> tuple[list[dict[str, Any]], dict[str, jax.Array]]:
    """Reads every value once; returns the manifest entries and the arrays orbax stores,
    keyed by position. Orbax cannot store zero-size arrays, and need not: the manifest's
    shape and dtype rebuild them."""
    entries, arrays = [], {}
    # All read under one hold of the lock: a step another thread runs lands before the
    # checkpoint or after it, never between two of its variables. (A read value stays
    # valid: the checksums are computed after the lock is released.)
    with STATE.update_lock:
        values = [variable.value for variable in variables.values()]
    for name, value in zip(variables, values, strict=True):
        key = None if value.size == 0 else str(len(arrays))
        if key is not None:
            arrays[key] = value
        shape, dtype, sha256 = list(value.shape), str(value.dtype), array_sha256(value)
        entries.append(dict(name=name, key=key, shape=shape, dtype=dtype, sha256=sha256))
    return entries, arrays


def _write_data(path: pathlib.Path, arrays: dict[str, jax.Array]) -> None:
    ocp = _orbax()
    checkpointer = ocp.Checkpointer(ocp.StandardCheckpointHandler())
    try:
        checkpointer.save(path, args=ocp.args.StandardSave(arrays))
    finally:
        checkpointer.close()


def directory_lock(directory: pathlib.Path, action: str) -> Any:
    """The lock this process's saves into and restores from ``directory`` hold, one at a
    time (see `ProcessState.checkpoint_locks`).

    Raises:
      StatevarError: if this thread holds it already: a signal handler saving or
        restoring while the save or restore it interrupted, of the same directory, is
        under way (waiting would never end).
    """
    with STATE.checkpoint_locks_guard:
        lock = STATE.checkpoint_locks.setdefault(str(directory.resolve()), threading.RLock())
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
    _trace.check_outside(
        f"{action} a checkpoint",
        "a checkpoint reads or writes files when it is called, while here the variables' "
        "values are only being traced. Call it between calls of the compiled step.",
    )


def save(directory: PathLike, target: Any) -> None:
    """Saves the target's variables to ``directory``, atomically, replacing what is there.

    Variables are keyed by name: a Module's by `Module.named_variables` (explicit ``name=``,
    else the path, such as ``"layers/0/kernel"``), an Optimizer's by their names
    (``"optimizer/mu/layers/0/kernel"``), a Variable given directly or in a list by its own
    ``name``. Dict keys namespace what they hold: ``{"generator": G, "discriminator": D}``
    keys G's kernel ``"generator/kernel"``; a Variable right under a key is keyed by the
    key, and an Optimizer's variables by the key in place of the optimizer's name. Lists
    and tuples add nothing. The values are read once; nothing is donated or changed, and
    arrays read earlier stay valid.

    Saving over a checkpoint replaces it atomically: the arrays go to a new data directory,
    one rename puts the new manifest in place of the old, then the old data is deleted. A
    process killed at any moment leaves the old checkpoint or the new one, whole. Files that
    statevar did not write are left alone.

    Under `jax.distributed`, every process calls `save` with the same target: each writes
    its shards of one checkpoint, and the first process writes the manifest once all have
    written, between barriers. It restores in any number of processes, onto any mesh.

    Args:
      directory: where to save; created if missing.
      target: a Variable, a Module, an Optimizer, or a (possibly nested) list, tuple or
        dict of them.

    Raises:
      TypeError: if ``target`` holds anything but Variables, Modules, Optimizers and
        containers.
      ValueError: if two different variables have the same name, or an Optimizer has no
        state yet (it was never built).
      TraceContextError: if called inside `statevar.jit`, `statevar.grad` or
        `stateless_call`.

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
    entries, arrays = _snapshot(_named_variables(target))
    checkpoint = pathlib.Path(directory).absolute()
    with directory_lock(checkpoint, "save to"):  # one writer per directory
        _write_checkpoint(checkpoint, entries, arrays)


def _write_checkpoint(
    checkpoint: pathlib.Path, entries: list[dict[str, Any]], arrays: dict[str, jax.Array]
) -> None:
    """Writes the data, then the manifest, then deletes what the directory held before
    (see `save`)."""
    checkpoint.mkdir(parents=True, exist_ok=True)
    data = None
    if arrays:
        data = f"data-{shared_token()}"
        _write_data(checkpoint / data, arrays)
    # Under jax.distributed every process writes its shards; the first writes the manifest
    # once all are written, and the others return once it is in place.
    sync_processes("statevar-save-data")
    if jax.process_index() == 0:
        write_manifest(checkpoint, data, entries)
        for entry in checkpoint.iterdir():
            if entry.name != data and _DEBRIS.match(entry.name):
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
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
            interrupt = _interrupt_behind(error)
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


def _interrupt_behind(error: BaseException) -> BaseException | None:
    """Returns the KeyboardInterrupt (or other non-`Exception`) that ``error`` wraps, if any."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if not isinstance(cause, Exception):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


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
    checkpoint: pathlib.Path,
    target: Any,
    partial: bool,
    shown: str,
    step: int | None = None,
    *,
    lock: pathlib.Path,
) -> RestoreResult:
    """Reads the checkpoint, matches it to the target (see `match_checkpoint`) and assigns
    the matched values, or raises before changing any variable. Reads holding the lock of
    directory ``lock`` (not while a save replaces or deletes what it reads); assigns
    holding the update lock only (a save in a signal handler that interrupted an update
    holds that one and waits for a directory lock)."""
    with directory_lock(lock, "restore from"):
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
    variables = _named_variables(target)
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
    checkpoint = pathlib.Path(directory).absolute()
    return _restore(checkpoint, target, partial, str(directory), lock=checkpoint)


def _complete_steps(directory: pathlib.Path) -> list[int]:
    """The steps under ``directory`` whose manifest exists, in increasing order."""
    if not directory.is_dir():
        return []
    return sorted(
        int(entry.name)
        for entry in directory.iterdir()
        if _STEP_NAME.match(entry.name) and (entry / MANIFEST).is_file()
    )
