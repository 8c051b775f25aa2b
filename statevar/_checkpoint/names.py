"""Matching a checkpoint's names to a restore target's, as a pure function.

`match_checkpoint` compares what the manifest holds (name -> shape and dtype) with what the
target holds, and returns a `CheckpointMatch`: the names both have, those on one side only,
those whose shape or dtype differs, and whether the restore may go ahead. The match renders
the messages a user sees (the refusal, and the log line after a restore); reading files and
assigning values stay in `statevar._checkpoint.save_restore`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# A variable's signature in a checkpoint or in a target: its shape and its dtype.
Signature = tuple[Sequence[int], Any]


def describe(shape: Iterable[int], dtype: Any) -> str:
    """A shape and dtype as a checkpoint message shows them: ``float32[2,3]``."""
    return f"{dtype}[{','.join(str(d) for d in shape)}]"


@dataclasses.dataclass(frozen=True)
class CheckpointMatch:
    """How a checkpoint's names meet a target's.

    Attributes:
      common: the names both have, in the target's order.
      missing: the target's names the checkpoint does not have.
      unexpected: the checkpoint's names the target does not have.
      differing: the common names whose shape or dtype differs, each rendered as
        ``'name' (checkpoint float32[2], variable float32[3])``.
      partial: whether the restore asked for only the names both have.
    """

    common: list[str]
    missing: list[str]
    unexpected: list[str]
    differing: list[str]
    partial: bool

    @property
    def is_refused(self) -> bool:
        """Whether the restore must change nothing: a shape or dtype differs, a name is on
        one side only without ``partial``, or the target has variables and none is shared."""
        one_sided = bool(self.missing or self.unexpected)
        return bool(self.differing) or (not self.partial and one_sided) or self.no_shared_name

    @property
    def no_shared_name(self) -> bool:
        """Whether the target has variables and the checkpoint holds none of them."""
        return bool(self.missing or self.common) and not self.common

    @property
    def untouched(self) -> list[str]:
        """The target's names a restore leaves as they were."""
        return self.missing

    def refusal(self, shown: str) -> str:
        """The message of the `CheckpointMismatchError` that refuses this match."""
        problems = []
        report_one_sided = not self.partial or not self.common
        if self.missing and report_one_sided:
            problems.append(
                "missing from the checkpoint (the target has them, the checkpoint does not): "
                + ", ".join(repr(name) for name in self.missing)
            )
        if self.unexpected and report_one_sided:
            problems.append(
                "unexpected in the checkpoint (the checkpoint has them, the target does not): "
                + ", ".join(repr(name) for name in self.unexpected)
            )
        if self.differing:
            problems.append("shape or dtype differs: " + ", ".join(self.differing))
        hint = ""
        if not self.partial and not self.differing and self.common:
            hint = "\nPass partial=True to restore only the names both have."
        return (
            f"Cannot restore from checkpoint {shown!r}: it does not match the target's "
            "variables, so no variable was changed.\n  " + "\n  ".join(problems) + hint
        )

    def report(self, shown: str) -> tuple[int, str]:
        """The log level and message after a restore: WARNING when names were on one side
        only, else INFO."""
        untouched = self.untouched
        if not (untouched or self.unexpected):
            return logging.INFO, f"Restored {len(self.common)} variables from checkpoint {shown!r}"
        return logging.WARNING, (
            f"Restored {len(self.common)} of the target's {len(self.common) + len(untouched)} "
            f"variables from checkpoint {shown!r}. Left unchanged (not in the checkpoint): "
            f"{', '.join(untouched) or 'none'}. Not restored (not in the target): "
            f"{', '.join(self.unexpected) or 'none'}."
        )


def match_checkpoint(
    stored: Mapping[str, Signature],
    wanted: Mapping[str, Signature],
    *,
    partial: bool,
) -> CheckpointMatch:
    """Matches a checkpoint's variables to a target's by name.

    Args:
      stored: the checkpoint's variables, name -> (shape, dtype), in the manifest's order.
      wanted: the target's variables, name -> (shape, dtype), in the target's order.
      partial: whether names on one side only are allowed.

    Returns:
      A `CheckpointMatch`; nothing is read or changed.

    Example:
      >>> match = match_checkpoint(
      ...     {"w": ((2,), "float32")}, {"w": ((3,), "float32")}, partial=False
      ... )
      >>> match.is_refused, match.differing
      (True, ["'w' (checkpoint float32[2], variable float32[3])"])
    """
    common = [name for name in wanted if name in stored]
    differing = []
    for name in common:
        checkpoint, variable = describe(*stored[name]), describe(*wanted[name])
        if checkpoint != variable:
            differing.append(f"{name!r} (checkpoint {checkpoint}, variable {variable})")
    return CheckpointMatch(
        common=common,
        missing=[name for name in wanted if name not in stored],
        unexpected=[name for name in stored if name not in wanted],
        differing=differing,
        partial=partial,
    )
