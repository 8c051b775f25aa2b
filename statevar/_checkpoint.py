"""Checkpoints: `save` and `restore` named variables, and a step-numbered `CheckpointManager`.

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

import os
import pathlib
import re
import shutil
import uuid
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from ._errors import (
    CheckpointCorruptedError,
    CheckpointExistsError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
)
from ._manifest import (
    MANIFEST,
    STEP_ITEM,
    array_sha256,
    read_manifest,
    verify_data_files,
    verify_values,
    write_manifest,
)
from ._module import Module
from ._variable import Variable, refuse_view

if TYPE_CHECKING:
    import orbax.checkpoint as ocp

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


def _orbax() -> Any:
    """Imports orbax-checkpoint on first use, keeping it out of ``import statevar``."""
    import orbax.checkpoint

    return orbax.checkpoint


# --------------------------------------------------------------------------- targets


def _named_variables(target: Any) -> dict[str, Variable]:
    """Returns the target's variables by checkpoint key: a Module's `named_variables`, a bare
    Variable's own name. Containers add nothing to the keys."""
    named: dict[str, Variable] = {}
    where: dict[str, str] = {}
    key_of: dict[int, str] = {}

    def add(key: str, variable: Variable, path: str) -> None:
        if key in named and named[key] is not variable:
            raise ValueError(
                f"Two variables in the checkpoint target have the name {key!r} (at "
                f"{where[key]} and {path}); give them distinct name= values (for the state "
                "of two Optimizers, Optimizer(..., name=...)), or hold them in a "
                "statevar.Module, which names unnamed variables by their path"
            )
        if key_of.get(id(variable), key) != key:
            first = key_of[id(variable)]
            raise ValueError(
                f"One variable appears in the checkpoint target under two names, {first!r} "
                f"(at {where[first]}) and {key!r} (at {path}); include it once"
            )
        named[key], where[key], key_of[id(variable)] = variable, path, key

    def visit(obj: Any, path: str) -> None:
        if isinstance(obj, Variable):
            refuse_view(obj, "the checkpoint target", path or "the top level")
            add(obj.name, obj, path or "the top level")
        elif isinstance(obj, Module):
            for key, variable in obj.named_variables().items():
                add(key, variable, f"{path or type(obj).__name__}/{key}")
        elif isinstance(obj, (list, tuple)):
            for i, item in enumerate(obj):
                visit(item, f"{path}[{i}]")
        elif isinstance(obj, dict):
            for key, item in obj.items():
                visit(item, f"{path}[{key!r}]")
        else:
            raise TypeError(
                "Expected the checkpoint target to be a Variable, a Module, or a list, tuple "
                f"or dict of them; got {type(obj).__name__} at {path or 'the top level'}"
            )

    visit(target, "")
    return named


def _describe(shape: Any, dtype: Any) -> str:
    return f"{dtype}[{','.join(str(d) for d in shape)}]"


# --------------------------------------------------------------------------- save


def _snapshot(variables: dict[str, Variable]) -> tuple[list[dict[str, Any]], dict[str, jax.Array]]:
    """Reads every value once; returns the manifest entries and the arrays orbax stores,
    keyed by position. Orbax cannot store zero-size arrays, and need not: the manifest's
    shape and dtype rebuild them."""
    entries, arrays = [], {}
    for name, variable in variables.items():
        value = variable.value
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


def save(directory: PathLike, target: Any) -> None:
    """Saves the target's variables to ``directory``, atomically, replacing what is there.

    Variables are keyed by name: a Module's by `Module.named_variables` (explicit ``name=``,
    else the path, such as ``"layers/0/kernel"``), a Variable given directly or in a
    container by its own ``name``; containers add nothing. The values are read once; nothing
    is donated or changed, and arrays read earlier stay valid.

    Saving over a checkpoint replaces it atomically: the arrays go to a new data directory,
    one rename puts the new manifest in place of the old, then the old data is deleted. A
    process killed at any moment leaves the old checkpoint or the new one, whole. Files that
    statevar did not write are left alone.

    Args:
      directory: where to save; created if missing.
      target: a Variable, a Module, or a (possibly nested) list, tuple or dict of them.

    Raises:
      TypeError: if ``target`` holds anything but Variables, Modules and containers.
      ValueError: if two different variables have the same name.

    Example:
      >>> import tempfile, statevar
      >>> w = statevar.Variable([1.0, 2.0], name="w")
      >>> directory = tempfile.mkdtemp()
      >>> statevar.save(directory, w)
      >>> w.assign([0.0, 0.0])
      <Variable 'w' shape=(2,) dtype=float32, numpy=array([0., 0.], dtype=float32)>
      >>> statevar.restore(directory, w)
      ['w']
      >>> w
      <Variable 'w' shape=(2,) dtype=float32, numpy=array([1., 2.], dtype=float32)>
    """
    entries, arrays = _snapshot(_named_variables(target))
    checkpoint = pathlib.Path(directory).absolute()
    checkpoint.mkdir(parents=True, exist_ok=True)
    data = None
    if arrays:
        data = f"data-{uuid.uuid4().hex}"
        _write_data(checkpoint / data, arrays)
    write_manifest(checkpoint, data, entries)
    for entry in checkpoint.iterdir():
        if entry.name != data and _DEBRIS.match(entry.name):
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


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
            values[name] = jax.device_put(
                jnp.zeros(entry["shape"], entry["dtype"]), variables[name].sharding
            )
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


def _restore(checkpoint: pathlib.Path, target: Any, partial: bool, shown: str) -> list[str]:
    variables = _named_variables(target)
    manifest = _read_manifest(checkpoint, shown)
    entries = {entry["name"]: entry for entry in manifest["variables"]}
    missing = [name for name in variables if name not in entries]
    unexpected = [name for name in entries if name not in variables]
    common = {name: variable for name, variable in variables.items() if name in entries}
    differing = [
        f"{name!r} (checkpoint {_describe(entries[name]['shape'], entries[name]['dtype'])}, "
        f"variable {_describe(variable.shape, variable.dtype)})"
        for name, variable in common.items()
        if _describe(entries[name]["shape"], entries[name]["dtype"])
        != _describe(variable.shape, variable.dtype)
    ]
    if differing or (not partial and (missing or unexpected)) or (variables and not common):
        problems = []
        if missing and (not partial or not common):
            problems.append(
                "missing from the checkpoint (the target has them, the checkpoint does not): "
                + ", ".join(repr(name) for name in missing)
            )
        if unexpected and (not partial or not common):
            problems.append(
                "unexpected in the checkpoint (the checkpoint has them, the target does not): "
                + ", ".join(repr(name) for name in unexpected)
            )
        if differing:
            problems.append("shape or dtype differs: " + ", ".join(differing))
        hint = (
            "\nPass partial=True to restore only the names both have."
            if not partial and not differing and common
            else ""
        )
        raise CheckpointMismatchError(
            f"Cannot restore from checkpoint {shown!r}: it does not match the target's "
            "variables, so no variable was changed.\n  " + "\n  ".join(problems) + hint
        )
    values = _read_values(checkpoint, manifest, entries, common, shown)
    for name, variable in common.items():
        variable.assign(values[name])
    return list(common)


def restore(directory: PathLike, target: Any, *, partial: bool = False) -> list[str]:
    """Loads a checkpoint into the target's variables, in place, all or nothing.

    Variables are matched by name, as `save` keys them. Every value is read onto its
    variable's device and sharding and checked against its sha256 before any variable
    changes; then each is set with `Variable.assign`, which donates the old buffer when
    nothing else holds it (arrays read earlier stay valid). Dtypes must match: nothing is cast.

    Args:
      directory: a directory written by `save`, or one step directory of a
        `CheckpointManager`.
      target: a Variable, a Module, or a (possibly nested) list, tuple or dict of them.
      partial: if True, restore only the names both the checkpoint and the target have,
        leaving the target's other variables unchanged.

    Returns:
      The names of the variables restored, in the target's order.

    Raises:
      CheckpointNotFoundError: (a FileNotFoundError) if ``directory`` does not exist or
        holds no complete checkpoint.
      CheckpointMismatchError: (a ValueError) if a shape or dtype differs, or names are
        missing from the checkpoint or unexpected in it (only when ``partial`` is False), or
        no name is shared at all; the message names every offending variable.
      CheckpointCorruptedError: (a ValueError) if the manifest or the data is damaged.
      TypeError, ValueError: as `save`, for the target.

    Example:
      >>> import tempfile, statevar
      >>> directory = tempfile.mkdtemp()
      >>> statevar.save(directory, [statevar.Variable(1, name="step")])
      >>> step = statevar.Variable(0, name="step")
      >>> extra = statevar.Variable(0.5, name="extra")
      >>> statevar.restore(directory, [step, extra], partial=True)
      ['step']
      >>> int(step), float(extra)
      (1, 0.5)
    """
    return _restore(pathlib.Path(directory).absolute(), target, partial, str(directory))


# --------------------------------------------------------------------------- manager


def _complete_steps(directory: pathlib.Path) -> list[int]:
    """The steps under ``directory`` whose manifest exists, in increasing order."""
    if not directory.is_dir():
        return []
    return sorted(
        int(entry.name)
        for entry in directory.iterdir()
        if _STEP_NAME.match(entry.name) and (entry / MANIFEST).is_file()
    )


class CheckpointManager:
    """Keeps numbered checkpoints of a training run in one directory, built on orbax.

    ``save(step, target)`` writes ``directory/<step>/`` with orbax's ``CheckpointManager``,
    then statevar's manifest; a step counts only once its manifest exists, so an interrupted
    save is never listed or restored. Steps are ordered by number. One process at a time
    should save into a directory.

    Args:
      directory: where the step directories go; created by the first `save`.
      max_to_keep: how many of the highest-numbered steps to keep (the step just saved is
        always kept); None keeps every step.

    Raises:
      ValueError: if ``max_to_keep`` is not None or a positive int.

    Example:
      >>> import tempfile, statevar
      >>> step = statevar.Variable(0, name="step")
      >>> manager = statevar.CheckpointManager(tempfile.mkdtemp(), max_to_keep=2)
      >>> print(manager.restore(step))  # nothing saved yet: start from scratch
      None
      >>> for i in range(1, 4):
      ...     _ = step.assign(i)
      ...     manager.save(i, step)
      >>> manager.all_steps()
      [2, 3]
      >>> _ = step.assign(0)
      >>> manager.restore(step), int(step)
      (3, 3)
    """

    def __init__(self, directory: PathLike, *, max_to_keep: int | None = 5):
        if max_to_keep is not None and (type(max_to_keep) is not int or max_to_keep < 1):
            raise ValueError(
                f"Expected max_to_keep to be None or a positive int, got {max_to_keep!r}"
            )
        self._shown = str(directory)
        self._directory = pathlib.Path(directory).absolute()
        self._max_to_keep = max_to_keep

    @property
    def directory(self) -> pathlib.Path:
        """The directory holding the step directories."""
        return self._directory

    def all_steps(self) -> list[int]:
        """Returns the steps that hold a complete checkpoint, in increasing order."""
        return _complete_steps(self._directory)

    def latest_step(self) -> int | None:
        """Returns the highest complete step, or None if there is none."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def _orbax_manager(self) -> ocp.CheckpointManager:
        # A fresh orbax manager per save sees the directory as it is now. Lightweight
        # initialization reads no step metadata, so it has nothing to warn about.
        ocp = _orbax()
        options = ocp.CheckpointManagerOptions(
            create=True,
            cleanup_tmp_directories=True,
            enable_async_checkpointing=False,
            lightweight_initialize=True,
        )
        return ocp.CheckpointManager(self._directory, options=options, item_names=(STEP_ITEM,))

    def save(self, step: int, target: Any) -> None:
        """Saves the target's variables as ``step``, then deletes steps beyond `max_to_keep`.

        Keys and reads are as in `statevar.save`. What an interrupted save or deletion left
        is cleared first: orbax's temporary directories, steps being deleted, and the
        directory of this same step if it has no manifest. Other directories without a
        manifest are never listed, and left alone.

        Args:
          step: the step number, a non-negative int.
          target: a Variable, a Module, or a (possibly nested) list, tuple or dict of them.

        Raises:
          TypeError: if ``step`` is not an int, or as `statevar.save` for the target.
          ValueError: if ``step`` is negative, or two different variables have one name.
          CheckpointExistsError: (a FileExistsError) if ``step`` already holds a complete
            checkpoint; steps are never overwritten.
        """
        if not isinstance(step, (int, np.integer)) or isinstance(step, bool):
            raise TypeError(f"Expected the step to be an int, got {type(step).__name__}")
        step = int(step)
        if step < 0:
            raise ValueError(f"Expected the step to be non-negative, got {step}")
        if step in self.all_steps():
            raise CheckpointExistsError(
                f"Cannot save step {step} to {self._shown!r}: that step already holds a "
                "checkpoint, and steps are never overwritten; save under a new step number"
            )
        entries, arrays = _snapshot(_named_variables(target))
        for entry in self._directory.iterdir() if self._directory.is_dir() else ():
            interrupted = _STEP_TEMPORARY.match(entry.name) or (
                entry.name == str(step) and not (entry / MANIFEST).exists()
            )
            if interrupted and entry.is_dir():
                shutil.rmtree(entry)
        ocp = _orbax()
        manager = self._orbax_manager()
        try:
            manager.save(
                step,
                args=ocp.args.Composite(**{STEP_ITEM: ocp.args.StandardSave(arrays)}),
                force=True,  # orbax would otherwise skip, silently, a step below its latest
            )
            step_directory = self._directory / str(step)
            write_manifest(step_directory, STEP_ITEM if arrays else None, entries)
            if self._max_to_keep is not None:
                older = [s for s in self.all_steps() if s != step]
                for old in older[: max(0, len(older) - (self._max_to_keep - 1))]:
                    self.delete(old)
        finally:
            manager.close()

    def delete(self, step: int) -> None:
        """Deletes a complete step.

        One rename takes the step out of `all_steps` at once, so a process killed while its
        files are deleted leaves no half-deleted step; the next `save` clears the rest.

        Args:
          step: a step that `all_steps` lists.

        Raises:
          CheckpointNotFoundError: (a FileNotFoundError) if there is no such complete step.
        """
        if step not in self.all_steps():
            raise CheckpointNotFoundError(
                f"Cannot delete step {step} in {self._shown!r}: there is no complete step "
                f"{step}; the steps there are {self.all_steps()}"
            )
        doomed = self._directory / f"{step}.statevar-deleted-{uuid.uuid4().hex}"
        os.replace(self._directory / str(step), doomed)
        shutil.rmtree(doomed)

    def restore(self, target: Any, step: int | None = None, *, partial: bool = False) -> int | None:
        """Restores ``step`` (by default the latest) into the target; see `statevar.restore`.

        Args:
          target: a Variable, a Module, or a (possibly nested) list, tuple or dict of them.
          step: the step to restore; None restores the latest complete step.
          partial: as in `statevar.restore`.

        Returns:
          The step restored, or None (and nothing changes) when ``step`` is None and there
          is no checkpoint yet: ``start = 0 if restored is None else restored + 1``.

        Raises:
          CheckpointNotFoundError: (a FileNotFoundError) if ``step`` is given and holds no
            complete checkpoint; the message lists the steps there are.
          CheckpointMismatchError, CheckpointCorruptedError: as `statevar.restore`.
        """
        steps = self.all_steps()
        if step is None:
            if not steps:
                return None
            step = steps[-1]
        elif step not in steps:
            raise CheckpointNotFoundError(
                f"Checkpoint directory {self._shown!r} has no complete step {step}; the steps "
                f"there are {steps}"
            )
        _restore(self._directory / str(step), target, partial, os.path.join(self._shown, str(step)))
        return step

    def __repr__(self) -> str:
        return f"CheckpointManager({self._shown!r}, max_to_keep={self._max_to_keep})"
