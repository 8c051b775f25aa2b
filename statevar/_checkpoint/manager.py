"""`CheckpointManager`: numbered checkpoints of a training run in one directory.

Each step is ``directory/<step>/``: orbax's ``CheckpointManager`` writes the arrays into
``state/``, then statevar writes the manifest (see `statevar._checkpoint.save_restore`); a
step counts only once its manifest exists. With ``async_save=True`` orbax's manager writes
in the background and a `PendingSave`'s thread writes the manifest once it is done.
"""

from __future__ import annotations

import logging
import os
import pathlib
import shutil
import uuid
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from .._cell.view import Readable
from .._errors import CheckpointDamagedError, CheckpointExistsError, CheckpointNotFoundError
from .async_saves import (
    PendingSave,
    Snapshot,
    check_single_process,
    raising_write_errors,
    settle,
    starting,
)
from .manifest import MANIFEST, STEP_ITEM, write_manifest
from .save_restore import (
    _STEP_NAME,
    _STEP_TEMPORARY,
    PathLike,
    RestoreResult,
    _complete_steps,
    _orbax,
    _restore,
    background_write_options,
    check_untraced,
    directory_lock,
    directory_path,
    sync_processes,
)
from .targets import named_variables

if TYPE_CHECKING:
    import orbax.checkpoint as ocp

logger = logging.getLogger("statevar")

# Written into a step directory once its manifest is: a step holding it but no manifest lost
# its manifest afterwards (damaged), where one holding neither is a save that never finished.
MANIFEST_WRITTEN = "statevar_manifest_written"


def _step_problem(step_directory: pathlib.Path) -> tuple[str, str] | None:
    """What keeps a step directory without a readable manifest from being complete:
    ``("damaged", why)`` if it had one, or has something else in its place (a directory, a
    dangling link); ``("unfinished", why)`` if it holds data a save wrote but no manifest
    and no sign of one (a save stopped before it finished, or a manifest deleted before
    statevar marked manifests); None for a complete step or a directory holding neither."""
    manifest = step_directory / MANIFEST
    if manifest.is_file():
        return None
    if manifest.is_symlink():
        return "damaged", f"is a link to {os.readlink(manifest)!r}, which is no file"
    if manifest.exists():
        return "damaged", "is a directory, not a file" if manifest.is_dir() else "is no file"
    if (step_directory / MANIFEST_WRITTEN).exists():
        return "damaged", "was deleted"
    if (step_directory / STEP_ITEM).exists():
        return "unfinished", "is missing: a save that did not finish"
    return None


def _incomplete_steps(directory: pathlib.Path) -> dict[int, tuple[str, str]]:
    """The step directories under ``directory`` that hold data or a manifest's trace but no
    readable manifest, with what `_step_problem` says of each."""
    if not directory.is_dir():
        return {}
    found = {}
    for entry in directory.iterdir():
        if _STEP_NAME.match(entry.name) and entry.is_dir():
            problem = _step_problem(entry)
            if problem is not None:
                found[int(entry.name)] = problem
    return found


class CheckpointManager:
    """Keeps numbered checkpoints of a training run in one directory, built on orbax.

    ``save(step, target)`` writes ``directory/<step>/`` with orbax's ``CheckpointManager``,
    then statevar's manifest; a step counts only once its manifest exists, so an interrupted
    save is never listed or restored. Steps are ordered by number. One process at a time
    should save into a directory.

    With ``async_save=True``, `save` returns once orbax has taken the values and writes the
    step in the background (see `PendingSave`): training goes on meanwhile, and the step
    holds the values of its save call. The next save waits for the one in flight, and so do
    `restore` and `delete`; `wait_until_finished` waits for it, and `close` (or leaving a
    ``with`` block) before the program ends. A failed save is raised by the first of these
    calls, naming the step.

    Args:
      directory: where the step directories go; created by the first `save`.
      max_to_keep: how many of the highest-numbered steps to keep (the step just saved is
        always kept); None keeps every step.
      async_save: if True, write each step in the background.

    Raises:
      ValueError: if ``max_to_keep`` is not None or a positive int.
      TypeError: if ``directory`` is not a str or an os.PathLike, or ``async_save`` is not
        a bool.

    Example:
      >>> import tempfile, statevar
      >>> step = statevar.Variable(0, name="step")
      >>> manager = statevar.CheckpointManager(tempfile.mkdtemp(), max_to_keep=2)
      >>> print(manager.restore(step))  # nothing saved yet: start from scratch (and log it)
      None
      >>> for i in range(1, 4):
      ...     _ = step.assign(i)
      ...     manager.save(i, step)
      >>> manager.all_steps()
      [2, 3]
      >>> _ = step.assign(0)
      >>> manager.restore(step).step, int(step)
      (3, 3)
    """

    def __init__(
        self, directory: PathLike, *, max_to_keep: int | None = 5, async_save: bool = False
    ):
        if max_to_keep is not None and (type(max_to_keep) is not int or max_to_keep < 1):
            raise ValueError(
                f"Expected max_to_keep to be None or a positive int, got {max_to_keep!r}"
            )
        if not isinstance(async_save, bool):
            raise TypeError(
                f"Expected async_save to be True or False, got {type(async_save).__name__} "
                f"{async_save!r}"
            )
        self._directory = directory_path(directory, "create a CheckpointManager")
        self._shown = str(directory)
        self._max_to_keep = max_to_keep
        self._async_save = async_save

    @property
    def directory(self) -> pathlib.Path:
        """The directory holding the step directories."""
        return self._directory

    def all_steps(self) -> list[int]:
        """Returns the steps that hold a complete checkpoint, in increasing order; a step
        still being written in the background is not listed until it is complete."""
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
            enable_async_checkpointing=self._async_save,
            async_options=background_write_options(),
            lightweight_initialize=True,
        )
        return ocp.CheckpointManager(self._directory, options=options, item_names=(STEP_ITEM,))

    def save(self, step: int, target: Any) -> PendingSave | None:
        """Saves the target's variables as ``step``, then deletes steps beyond `max_to_keep`.

        Keys and reads are as in `statevar.save`: the values are read at the call. What an
        interrupted save or deletion left is cleared first: orbax's temporary directories,
        steps being deleted, and the directory of this same step if it has no manifest.
        Other directories without a manifest are never listed, and left alone. The save in
        flight into this directory, if any, is waited for first.

        Args:
          step: the step number, a non-negative int, or a scalar integer array or
            Variable such as ``optimizer.iterations``, read now.
          target: a Variable, a Module, an Optimizer, or a (possibly nested) list, tuple or
            dict of them.

        Returns:
          None; with ``async_save=True``, the `PendingSave` writing the step.

        Raises:
          TypeError: if ``step`` is not an int, or as `statevar.save` for the target.
          ValueError: if ``step`` is negative, or two different variables have one name.
          CheckpointExistsError: (a FileExistsError) if ``step`` already holds a complete
            checkpoint, or a damaged one (see `restore`); steps are never overwritten.
          CheckpointWriteError: (an OSError) if writing fails, naming the step, the
            directory and the cause (with ``async_save=True``, raised by the `PendingSave`
            and the calls that wait for it); or if the save in flight failed and no call
            has raised it yet: then nothing is saved.
          StatevarError: with ``async_save=True`` under `jax.distributed`.
        """
        check_untraced("save")
        step = _checked_step(step)
        variables = named_variables(target)
        if self._async_save:
            check_single_process("save")
        with Snapshot.read(variables) as snapshot:
            with directory_lock(self._directory, "save to"):  # one writer per directory
                settle(self._directory)
                if step in self.all_steps():
                    raise CheckpointExistsError(
                        f"Cannot save step {step} to {self._shown!r}: that step already holds "
                        "a checkpoint, and steps are never overwritten; save under a new step "
                        "number"
                    )
                problem = _incomplete_steps(self._directory).get(step)
                if problem is not None and problem[0] == "damaged":
                    raise CheckpointExistsError(
                        f"Cannot save step {step} to {self._shown!r}: that step holds data "
                        f"whose manifest {problem[1]} (damaged), and steps are never "
                        f"overwritten; move {str(self._directory / str(step))!r} away, or save "
                        "under a new step number"
                    )
                if self._async_save:
                    with starting():
                        return self._start_step(step, snapshot)
                with raising_write_errors(self._shown, step):
                    self._clear_interrupted(step)
                    manager = self._orbax_manager()
                    try:
                        self._save_data(manager, step, snapshot)
                    finally:
                        manager.close()
                    self._commit_step(step, snapshot)
        return None

    def _start_step(self, step: int, snapshot: Snapshot) -> PendingSave:
        """Starts writing ``step`` in the background: orbax's part now, then, in a
        `PendingSave`'s thread, its end, the manifest and the deletion of old steps."""
        pending = PendingSave(self._directory, self._shown, step)
        try:
            self._clear_interrupted(step)
            manager = self._orbax_manager()
        except Exception as error:  # raised by the PendingSave, as a failure in the background
            return pending._fail(error)
        try:
            self._save_data(manager, step, snapshot)
        except BaseException as error:
            manager.close()  # no write of orbax's goes on unowned, an interrupted one neither
            if not isinstance(error, Exception):
                raise
            return pending._fail(error)

        def finish() -> None:
            try:
                manager.wait_until_finished()
            finally:
                manager.close()
            self._commit_step(step, snapshot)

        return pending._begin(finish, snapshot)

    def _clear_interrupted(self, step: int) -> None:
        """Deletes what interrupted saves and deletions left (see `save`)."""
        if jax.process_index() == 0 and self._directory.is_dir():
            for entry in self._directory.iterdir():
                interrupted = _STEP_TEMPORARY.match(entry.name) or (
                    entry.name == str(step) and not (entry / MANIFEST).exists()
                )
                if interrupted and entry.is_dir():
                    shutil.rmtree(entry)
        sync_processes("statevar-manager-cleared")

    def _save_data(self, manager: ocp.CheckpointManager, step: int, snapshot: Snapshot) -> None:
        ocp = _orbax()
        manager.save(
            step,
            args=ocp.args.Composite(**{STEP_ITEM: ocp.args.StandardSave(snapshot.stored())}),
            force=True,  # orbax would otherwise skip, silently, a step below its latest
        )

    def _commit_step(self, step: int, snapshot: Snapshot) -> None:
        """Writes the manifest of ``step``, whose data is written, then deletes the steps
        beyond `max_to_keep`."""
        entries = snapshot.entries()
        sync_processes("statevar-manager-data")
        if jax.process_index() == 0:  # one manifest, written once every process wrote
            step_directory = self._directory / str(step)
            stored = any(entry["key"] is not None for entry in entries)  # an array written
            write_manifest(step_directory, STEP_ITEM if stored else None, entries)
            _mark_manifest_written(step_directory)
            self._drop_old_steps(step)
        sync_processes("statevar-manager-manifest")

    def _drop_old_steps(self, saved: int) -> None:
        """Deletes the oldest steps beyond `max_to_keep`, once step ``saved`` is saved. A
        deletion that fails is logged (a WARNING on the ``"statevar"`` logger), not raised:
        the step is saved, and the next save deletes what is left."""
        if self._max_to_keep is None:
            return
        older = [s for s in self.all_steps() if s != saved]
        for old in older[: max(0, len(older) - (self._max_to_keep - 1))]:
            try:
                self._delete(old)
            except OSError as error:
                logger.warning(
                    "Saved step %d to %r; deleting step %d (beyond max_to_keep=%d) failed, "
                    "and the next save tries again: %s",
                    *(saved, self._shown, old, self._max_to_keep, error),
                )

    def wait_until_finished(self) -> None:
        """Blocks until the save in flight into this directory, if any, is written.

        Raises:
          CheckpointWriteError: (an OSError) if that save failed and no call has raised
            it yet, naming its step, the directory and the cause.
        """
        settle(self._directory)

    def close(self) -> None:
        """Waits for the save in flight, as `wait_until_finished` does; call it (or use the
        manager in a ``with`` block) before the program ends. The manager stays usable.

        Raises:
          CheckpointWriteError: as `wait_until_finished`.
        """
        self.wait_until_finished()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def delete(self, step: int) -> None:
        """Deletes a complete step.

        One rename takes the step out of `all_steps` at once, so a process killed while its
        files are deleted leaves no half-deleted step; the next `save` clears the rest.

        Args:
          step: a step that `all_steps` lists.

        Raises:
          CheckpointNotFoundError: (a FileNotFoundError) if there is no such complete step.
          CheckpointWriteError: as `wait_until_finished`, which `delete` calls first.
        """
        with directory_lock(self._directory, "delete from"):
            settle(self._directory)
            self._delete(step)

    def _delete(self, step: int) -> None:
        if step not in self.all_steps():
            raise CheckpointNotFoundError(
                f"Cannot delete step {step} in {self._shown!r}: there is no complete step "
                f"{step}; the steps there are {self.all_steps()}"
            )
        doomed = self._directory / f"{step}.statevar-deleted-{uuid.uuid4().hex}"
        os.replace(self._directory / str(step), doomed)
        shutil.rmtree(doomed)

    def restore(
        self, target: Any, step: int | None = None, *, partial: bool = False
    ) -> RestoreResult | None:
        """Restores ``step`` (by default the latest) into the target; see `statevar.restore`.

        With ``step`` None this is "resume if possible": when there is no complete step
        yet, nothing changes, a WARNING on the ``"statevar"`` logger says so (naming the
        directory, and whether it exists, so a mistyped path shows), and None is returned.
        A newer step is never skipped silently: one whose manifest is missing or unreadable
        though it had one (damaged) raises, and one whose save did not finish (data, no
        manifest yet) is named by a WARNING along with the step restored instead.

        Args:
          target: a Variable, a Module, an Optimizer, or a (possibly nested) list, tuple or
            dict of them.
          step: the step to restore; None restores the latest complete step.
          partial: as in `statevar.restore`.

        Returns:
          A `RestoreResult` whose ``step`` is the step restored, or None when ``step`` is
          None and there is no checkpoint yet:
          ``start = 0 if restored is None else restored.step + 1``.

        Raises:
          CheckpointNotFoundError: (a FileNotFoundError) if ``step`` is given and holds no
            complete checkpoint; the message lists the steps there are.
          CheckpointDamagedError: (a CheckpointCorruptedError) if the step to restore, or
            with ``step`` None a step newer than every complete one, holds data but its
            manifest is missing (deleted) or unreadable (a directory, a dangling link in
            its place); the message names the step and how to restore an older one
            (``restore(target, step=n)``). Nothing is restored.
          TypeError, ValueError: if ``step`` is not a non-negative integer.
          CheckpointMismatchError, CheckpointCorruptedError: as `statevar.restore`.
          CheckpointWriteError: as `wait_until_finished`, which `restore` calls first.
        """
        check_untraced("restore")
        if step is not None:
            step = _checked_step(step)

        def locate() -> tuple[pathlib.Path, str, int] | None:
            # Under the directory's lock, once the save in flight is written (its step may
            # be the latest): no save deletes the step chosen before it is read.
            steps = self.all_steps()
            chosen = self._check_newer_steps(steps) if step is None else step
            if chosen is None:
                there = "holds no complete step" if self._directory.is_dir() else "does not exist"
                logger.warning(
                    "No checkpoint to restore: directory %r (%s) %s; nothing was restored",
                    *(self._shown, self._directory, there),
                )
                return None
            if chosen not in steps:
                problem = _incomplete_steps(self._directory).get(chosen)
                if problem is not None and problem[0] == "damaged":
                    raise self._damaged_error(chosen, problem[1], steps)
                raise CheckpointNotFoundError(
                    f"Checkpoint directory {self._shown!r} has no complete step {chosen}; the "
                    f"steps there are {steps}"
                )
            shown = os.path.join(self._shown, str(chosen))
            return self._directory / str(chosen), shown, chosen

        return _restore(target, partial, locks=(self._directory,), locate=locate)

    def _check_newer_steps(self, steps: list[int]) -> int | None:
        """Returns the step a restore without ``step=`` takes: the latest complete step,
        once no newer step is damaged; a newer save that did not finish is logged (a
        WARNING naming both steps). None if there is no complete step.

        Raises:
          CheckpointDamagedError: for the newest damaged step newer than every complete one.
        """
        latest = steps[-1] if steps else None
        newer = {
            number: problem
            for number, problem in _incomplete_steps(self._directory).items()
            if latest is None or number > latest
        }
        damaged = [number for number, (kind, _) in newer.items() if kind == "damaged"]
        if damaged:
            raise self._damaged_error(max(damaged), newer[max(damaged)][1], steps)
        for number in sorted(newer):
            logger.warning(
                "Step %d in checkpoint directory %r holds data but no manifest: a save that "
                "did not finish (or a manifest deleted). Restoring %s instead.",
                *(number, self._shown, "nothing" if latest is None else f"step {latest}"),
            )
        return latest

    def _damaged_error(self, step: int, why: str, steps: list[int]) -> CheckpointDamagedError:
        where = str(self._directory / str(step))
        if steps:
            instead = (
                f"Restore an older step explicitly, manager.restore(target, step={steps[-1]}) "
                f"(the complete steps are {steps}), or move {where!r} away to resume from "
                f"step {steps[-1]}"
            )
        else:
            instead = f"There is no complete step to restore instead; move {where!r} away"
        return CheckpointDamagedError(
            f"Checkpoint directory {self._shown!r}: step {step} is damaged: it holds data, but "
            f"its manifest {MANIFEST} {why}, so it can be neither verified nor restored; "
            f"nothing was restored. {instead}."
        )

    def __repr__(self) -> str:
        options = f"max_to_keep={self._max_to_keep}"
        if self._async_save:
            options += ", async_save=True"
        return f"CheckpointManager({self._shown!r}, {options})"


def _mark_manifest_written(step_directory: pathlib.Path) -> None:
    """Records, beside a step's manifest, that it was written (see `MANIFEST_WRITTEN`)."""
    descriptor = os.open(step_directory / MANIFEST_WRITTEN, os.O_WRONLY | os.O_CREAT, 0o644)
    os.close(descriptor)
    descriptor = os.open(step_directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _checked_step(step: Any) -> int:
    """Returns ``step`` as an int: an int, or a scalar integer array or Variable (such as
    ``optimizer.iterations``), read now.

    Raises:
      TypeError: if it is not an integer (a bool, a float such as 5.0).
      ValueError: if it is negative.
    """
    if isinstance(step, Readable):
        step = step.numpy()
    if isinstance(step, (jax.Array, np.ndarray)) and step.ndim == 0:
        if np.issubdtype(step.dtype, np.integer):
            step = int(step)
    if not isinstance(step, (int, np.integer)) or isinstance(step, bool):
        raise TypeError(f"Expected the step to be an int, got {type(step).__name__} {step!r}")
    if step < 0:
        raise ValueError(f"Expected the step to be non-negative, got {step}")
    return int(step)
