"""A compiled step's memory, as XLA plans it: `MemoryReport`, made by a `statevar.jit`
function's ``memory_report``."""

from __future__ import annotations

import dataclasses
import io
import shutil
import sys
from typing import Any

import jax
from rich.console import Console
from rich.table import Table

from .._cell import copies as _copies
from .._errors import format_bytes

_COLUMNS: tuple[str, ...] = ("path", "shape", "dtype", "bytes", "fate")
# What each fate means, for the docs and the table's legend.
FATES = {
    "donated": "updated in place: the step writes its new value into the variable's buffer",
    "copied": "copied before the step (see the cause): the step needs room for both",
    "read": "passed through unchanged: its buffer is donated and given back as it is",
}


@dataclasses.dataclass(frozen=True)
class VariableMemory:
    """One variable of a compiled step, in its `MemoryReport`.

    Attributes:
      path: the variable's name (its path in the Module holding it, unless named).
      shape: its shape.
      dtype: its dtype's name.
      bytes: the bytes of its value.
      fate: ``"donated"`` (updated in place), ``"copied"`` (copied before the call: see
        ``cause``) or ``"read"`` (passed through unchanged, its buffer given back).
      cause: why it is copied (``"held"``: an array read from it is alive; ``"saving"``:
        a background checkpoint save holds it; ``"not aliased"``; ``"unsupported"``: the
        platform does not donate), else None.
    """

    path: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    fate: str
    cause: str | None = None


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """What a compiled step's call needs, from XLA's compiled program: made by
    ``step.memory_report(*args)`` (see `statevar.jit`) without running the step.

    ``print(report)`` shows a table (drawn with rich on a terminal, plain text elsewhere);
    `as_dict` gives the same figures to programs.

    Attributes:
      function: the compiled function's name.
      variables: one `VariableMemory` per variable the step lifts, in order.
      argument_bytes: the call's inputs: the variables' buffers and the array arguments.
      output_bytes: its outputs: the variables' new values and the result.
      alias_bytes: the outputs written into donated input buffers (counted in both above).
      temp_bytes: XLA's scratch memory for the intermediate values.
      flops: the floating-point operations XLA counts, or None where it counts none.

    Example:
      >>> import jax.numpy as jnp
      >>> import statevar
      >>> w = statevar.Variable(jnp.zeros(1024), name="w")
      >>> @statevar.jit
      ... def step(x):
      ...     w.assign_add(x)
      >>> report = step.memory_report(jnp.ones(1024))
      >>> [(row.path, row.bytes, row.fate) for row in report.variables]
      [('w', 4096, 'donated')]
      >>> report.argument_bytes, report.alias_bytes
      (8192, 4096)
    """

    function: str
    variables: tuple[VariableMemory, ...]
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    flops: float | None

    @property
    def peak_bytes(self) -> int:
        """The memory the call holds at once by XLA's plan: its arguments, the outputs
        that take no donated buffer, and the temporaries."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    def as_dict(self) -> dict[str, Any]:
        """The report as plain Python values (lists, dicts, ints, strings)."""
        return {
            "function": self.function,
            "variables": [dataclasses.asdict(row) for row in self.variables],
            "argument_bytes": self.argument_bytes,
            "output_bytes": self.output_bytes,
            "alias_bytes": self.alias_bytes,
            "temp_bytes": self.temp_bytes,
            "peak_bytes": self.peak_bytes,
            "flops": self.flops,
        }

    def text(self) -> str:
        """The plain-text table that ``print(report)`` shows where there is no terminal."""
        table = [list(_COLUMNS), *map(_cells, self.variables)]
        widths = [max(len(line[i]) for line in table) for i in range(len(_COLUMNS))]

        def line(cells: list[str]) -> str:
            parts = [
                cell.rjust(width) if column == "bytes" else cell.ljust(width)
                for column, cell, width in zip(_COLUMNS, cells, widths, strict=True)
            ]
            return "  ".join(parts).rstrip()

        rule = "-" * len(line(["-" * width for width in widths]))
        lines = [self._title(), line(table[0]), rule, *map(line, table[1:]), rule]
        return "\n".join([*lines, *self._totals()])

    def __str__(self) -> str:
        if not sys.stdout.isatty():
            return self.text()
        buffer = io.StringIO()
        width = shutil.get_terminal_size().columns
        console = Console(file=buffer, force_terminal=True, width=width)
        table = Table(title=self._title(), title_justify="left")
        for column in _COLUMNS:
            table.add_column(column, justify="right" if column == "bytes" else "left")
        for row in self.variables:
            table.add_row(*_cells(row), style="dim" if row.fate == "read" else None)
        console.print(table)
        for total in self._totals():
            console.print(total, soft_wrap=True)
        return buffer.getvalue().rstrip("\n")

    def __repr__(self) -> str:
        return (
            f"<MemoryReport of {self.function!r}: {len(self.variables)} variables, "
            f"peak {format_bytes(self.peak_bytes)}>"
        )

    def _title(self) -> str:
        return f"Memory of the statevar.jit function {self.function!r}"

    def _totals(self) -> list[str]:
        fates = {fate: 0 for fate in FATES}
        for row in self.variables:
            fates[row.fate] += row.bytes
        flops = "not counted" if self.flops is None else f"{self.flops:,.0f}"
        return [
            "Variables: " + ", ".join(f"{format_bytes(n)} {fate}" for fate, n in fates.items()),
            f"Arguments {format_bytes(self.argument_bytes)}, outputs "
            f"{format_bytes(self.output_bytes)} ({format_bytes(self.alias_bytes)} in donated "
            f"buffers), temporaries {format_bytes(self.temp_bytes)}; peak "
            f"{format_bytes(self.peak_bytes)}; flops {flops}",
        ]


def _cells(row: VariableMemory) -> list[str]:
    fate = row.fate if row.cause is None else f"{row.fate} ({row.cause})"
    return [row.path, str(row.shape), row.dtype, format_bytes(row.bytes), fate]


def build(
    name: str, entry: Any, arrays: list[jax.Array], held: list[bool], dynamic: tuple
) -> MemoryReport:
    """Compiles the step of ``entry`` (a `statevar._compile.entry.Entry`) for the variables' own
    ``arrays`` and the call's ``dynamic`` arguments, and reports its memory; runs nothing,
    donates nothing.

    ``held`` says which arrays something else holds (`statevar._cell.kernels.held_elsewhere`): the
    step would copy them. The variables whose donation JAX refuses are recorded in ``entry.refused``
    (see `Entry.lowered`). Call it under `ProcessState.update_lock`.
    """
    traced = entry.jitted.trace(arrays, dynamic)
    jaxpr = traced.jaxpr  # its invars and outvars: the step's arguments and results
    lowered = entry.lowered(traced.lower, arrays)
    compiled = lowered.compile()  # kept by JAX for the step's calls
    stats = compiled.memory_analysis()
    costs = compiled.cost_analysis()
    if isinstance(costs, list):  # one dict per program on some JAX versions
        costs = costs[0] if costs else None
    flops = costs.get("flops") if costs else None
    rows = []
    for index, (variable, array) in enumerate(zip(entry.lifted, arrays, strict=True)):
        cause = _copies.held_cause(variable) if held[index] else entry.refused.get(index)
        if cause is not None:
            fate = "copied"
        elif jaxpr.outvars[index] is jaxpr.invars[index]:
            fate = "read"
        else:
            fate = "donated"
        shape, dtype = tuple(array.shape), array.dtype.name
        rows.append(VariableMemory(variable.name, shape, dtype, array.nbytes, fate, cause))
    return MemoryReport(
        name,
        tuple(rows),
        _field(stats, "argument_size_in_bytes"),
        _field(stats, "output_size_in_bytes"),
        _field(stats, "alias_size_in_bytes"),
        _field(stats, "temp_size_in_bytes"),
        None if flops is None else float(flops),
    )


def _field(stats: Any, name: str) -> int:
    """A figure of XLA's memory analysis; 0 where the backend gives none."""
    return int(getattr(stats, name, 0) or 0) if stats is not None else 0
