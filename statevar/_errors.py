"""Exceptions raised by statevar, and where its warnings point.

Each error subclasses the builtin a user would catch, so ``except ValueError`` works as it
does with ``tf.Variable``.
"""

from __future__ import annotations

import sys

# The modules whose frames `release_frames` clears: statevar's own and JAX's, never the user's.
_RELEASED_MODULES = ("statevar.", "jax.", "jaxlib.")


def caller_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning raised by the caller of this function point
    at the first frame outside statevar: the user's line, however deep the call."""
    level, frame = 2, sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("statevar."):
        level, frame = level + 1, frame.f_back
    return level


def release_frames(error: BaseException) -> None:
    """Clears the local variables of statevar's and JAX's finished frames in the tracebacks
    of ``error`` and of the errors it chains to (its cause and context).

    An error a user keeps (``except CopyError as e: kept = e``, an interactive session's
    last exception) keeps its traceback's frames, and with them whatever they held: a
    variable's old array would stay alive, and the variable's next update could not
    donate it. Called where an update or a compiled call lets an error out to the user.
    Frames still running (the caller's own) are left as they are, and so are the user's
    frames: they hold what the user holds.
    """
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        traceback = current.__traceback__
        while traceback is not None:
            frame = traceback.tb_frame
            if frame.f_globals.get("__name__", "").startswith(_RELEASED_MODULES):
                try:
                    frame.clear()
                except RuntimeError:
                    pass  # still running: the frame that is handling the error
            traceback = traceback.tb_next
        pending += (current.__cause__, current.__context__)


def format_bytes(size: int) -> str:
    """Returns a byte count as ``"12 B"``, ``"1.5 KiB"``, ``"3.0 MiB"``...

    Example:
      >>> from statevar._errors import format_bytes
      >>> format_bytes(12), format_bytes(1536), format_bytes(3 * 2**30)
      ('12 B', '1.5 KiB', '3.0 GiB')
    """
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


class StatevarError(Exception):
    """Base class of every error statevar raises."""


class ShapeMismatchError(StatevarError, ValueError):
    """A value's shape does not fit the variable it is meant for."""


class DtypeMismatchError(StatevarError, TypeError):
    """A value cannot be converted to a variable's dtype without loss."""


class PlacementError(StatevarError, ValueError):
    """A device was asked for that this machine does not have."""


class TraceContextError(StatevarError, RuntimeError):
    """A variable was created or assigned where a transformation forbids it."""


class OutOfMemoryError(StatevarError, MemoryError):
    """A variable's value does not fit in the memory that would hold it: checked from its
    shape and dtype before anything is converted, copied or placed."""


class CopyError(StatevarError, BufferError):
    """An update or a compiled step would copy a variable instead of donating its buffer,
    and the copy policy is ``"raise"`` (see `statevar.set_copy_policy`): a buffer could not
    be used as asked."""


class CheckpointNotFoundError(StatevarError, FileNotFoundError):
    """The checkpoint directory or step does not exist."""


class CheckpointExistsError(StatevarError, FileExistsError):
    """A save would overwrite a checkpoint that must be kept."""


class CheckpointMismatchError(StatevarError, ValueError):
    """A checkpoint does not match the variables it is restored into."""


class CheckpointCorruptedError(StatevarError, ValueError):
    """A checkpoint's data does not match the checksums stored with it."""


class CheckpointDamagedError(CheckpointCorruptedError):
    """A `CheckpointManager` step holds data, but its manifest is missing or unreadable (it
    was deleted, or replaced by a directory or a dangling link), so it cannot be verified
    or restored. Restoring without a step raises this rather than restoring an older step
    silently; pass ``step=`` to restore an older one."""


class CheckpointWriteError(StatevarError, OSError):
    """Writing a checkpoint failed (a full disk, a directory that cannot be written); the
    checkpoints saved before it are left as they were. ``errno`` is the operating system's
    error code when the cause gives one."""


def interrupted_update_error(action: str) -> StatevarError:
    """The error for an update (``action``: ``"assign to Variable 'w'"``) that a signal
    handler makes while the update it interrupted is donating (see `ProcessState.donating`)."""
    return StatevarError(
        f"Cannot {action} in a signal handler that interrupted an update: the interrupted "
        "update stores its result when the handler returns, over this one. Have the "
        "handler set a plain Python flag, and update variables where the loop checks it."
    )
