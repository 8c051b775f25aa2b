"""Looking at a Module: `summary` (a table of its variables) and a readable Module repr."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table

from .._cell.placement import describe
from .._cell.tree import Node, has_named_variables, walk
from .._cell.variable import Variable
from .._cell.view import Readable
from .._distribute.on_read import OnReadVariable
from .._errors import format_bytes

_COLUMNS = ("path", "shape", "dtype", "trainable", "placement", "params", "bytes")
_NUMERIC = {"params", "bytes"}
_REPR_WIDTH = 88
_REPR_DEPTH = 12
_REPR_ITEMS = 16


# --------------------------------------------------------------------------- summary


def placement(variable: Variable) -> str:
    """Returns where a variable lives: ``"cpu:0"``, or its sharding over several devices;
    for an on-read variable, its replicas and aggregation too."""
    if isinstance(variable, OnReadVariable):
        spec = variable.replica_values.sharding.spec  # type: ignore[union-attr]
        return f"on_read {variable.aggregation} x{variable.replicas} {spec}"
    sharding = variable.sharding
    devices = sharding.device_set
    if len(devices) == 1:
        return describe(next(iter(devices)))
    spec = getattr(sharding, "spec", None)
    layout = f"{spec} " if spec is not None else f"{type(sharding).__name__} "
    return f"{layout}over {len(devices)} devices"


def _found(target: Any) -> list[tuple[str, Any]]:
    """``(path, Variable or sub-Module)`` for every row of a Module's table; an Optimizer's
    state variables by their names (``"optimizer/mu/kernel"``)."""
    if isinstance(target, Node):
        return walk(target)[0]
    return [(variable.name, variable) for variable in target._state_by_name()[1].values()]


def _rows(module: Any) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Returns one row per sub-Module and variable, in attribute order, and the totals.

    A sub-Module's row holds the subtotal of the variables listed below it; each row has a
    ``depth`` (how many sub-Modules it is in) and a ``kind``.
    """
    found = _found(module)
    rows: list[dict[str, Any]] = []
    open_modules: list[dict[str, Any]] = []  # the sub-Module rows holding the current row
    totals = dict(variables=0, params=0, bytes=0, trainable_params=0, trainable_bytes=0)
    for path, item in found:
        while open_modules and not path.startswith(open_modules[-1]["path"] + "/"):
            open_modules.pop()
        depth = len(open_modules)
        if isinstance(item, Node):
            row = dict(kind="module", path=path, type=type(item).__name__, depth=depth)
            row.update(params=0, bytes=0)
            rows.append(row)
            open_modules.append(row)
            continue
        size, nbytes = item.size, item.size * item.dtype.itemsize
        label = path if item._name is None or item._name == path else f"{path} ({item._name!r})"
        rows.append(
            dict(
                kind="variable",
                path=label,
                depth=depth,
                shape=str(item.shape),
                dtype=str(item.dtype),
                trainable="yes" if item.trainable else "no",
                placement=placement(item),
                params=size,
                bytes=nbytes,
            )
        )
        for holder in open_modules:
            holder["params"] += size
            holder["bytes"] += nbytes
        totals["variables"] += 1
        totals["params"] += size
        totals["bytes"] += nbytes
        if item.trainable:
            totals["trainable_params"] += size
            totals["trainable_bytes"] += nbytes
    return rows, totals


def _cells(row: dict[str, Any]) -> list[str]:
    indent = "  " * row["depth"]
    if row["kind"] == "module":
        cells = [f"{indent}{row['path']}", row["type"], "", "", ""]
    else:
        cells = [f"{indent}{row['path']}"] + [
            row[column] for column in ("shape", "dtype", "trainable", "placement")
        ]
    return cells + [f"{row['params']:,}", format_bytes(row["bytes"])]


def _totals_line(totals: dict[str, int]) -> str:
    frozen_params = totals["params"] - totals["trainable_params"]
    frozen_bytes = totals["bytes"] - totals["trainable_bytes"]
    count = totals["variables"]
    return (
        f"Total: {totals['params']:,} params ({format_bytes(totals['bytes'])}) in {count} "
        f"variable{'' if count == 1 else 's'}; trainable {totals['trainable_params']:,} "
        f"({format_bytes(totals['trainable_bytes'])}), non-trainable {frozen_params:,} "
        f"({format_bytes(frozen_bytes)})"
    )


def summary_text(module: Any) -> str:
    """Returns the plain-text table that `summary` prints where there is no terminal."""
    rows, totals = _rows(module)
    header: list[str] = list(_COLUMNS)
    table = [header] + [_cells(row) for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(_COLUMNS))]

    def line(cells: list[str]) -> str:
        parts = [
            cell.rjust(width) if column in _NUMERIC else cell.ljust(width)
            for column, cell, width in zip(_COLUMNS, cells, widths, strict=True)
        ]
        return "  ".join(parts).rstrip()

    rule = "-" * len(line(["-" * width for width in widths]))
    text = [_title(module), line(table[0]), rule, *map(line, table[1:]), rule]
    return "\n".join(text + [_totals_line(totals)]) + "\n"


def _title(module: Any) -> str:
    """A summary's title: the Module's class, and the name it was given, if any."""
    given = vars(module).get("_module_name") if isinstance(module, Node) else None
    return type(module).__name__ + (f" {given!r}" if given is not None else "")


def _print_rich(module: Any, file: TextIO) -> None:
    rows, totals = _rows(module)
    table = Table(title=_title(module), title_justify="left")
    for column in _COLUMNS:
        right = column in _NUMERIC
        table.add_column(column, justify="right" if right else "left", overflow="fold")
    for row in rows:
        if row["kind"] == "module":
            style = "bold"
        else:
            style = None if row["trainable"] == "yes" else "dim"
        table.add_row(*_cells(row), style=style)
    console = Console(file=file)
    console.print(table)
    console.print(_totals_line(totals), soft_wrap=True)


def summary(module: Any, *, file: TextIO | None = None) -> None:
    """Prints a table of a Module's variables, like Keras's ``model.summary()``.

    An Optimizer's table lists its state variables (the step count, then the optax state
    named after the parameters).

    One row per variable, in attribute order, by path (and explicit name, if it has one):
    shape, dtype, trainable, placement (the device, or the sharding over several devices),
    the number of elements and the bytes. Each sub-Module gets a row with the subtotal of
    the variables below it; the last line gives the totals, trainable and not. On a
    terminal the table is drawn with `rich <https://rich.readthedocs.io>`_; elsewhere (a
    file, a pipe, a log) it is plain text. Reads only shapes and dtypes: no value is
    copied or read to the host.

    Args:
      module: the Module (or Optimizer) to describe.
      file: where to print; ``sys.stdout`` by default.

    Raises:
      TypeError: if ``module`` is neither a `statevar.Module` nor a `statevar.Optimizer`.

    Example:
      >>> import statevar
      >>> class Dense(statevar.Module):
      ...     def __init__(self):
      ...         self.kernel = statevar.Variable([[1.0], [2.0]])
      ...         self.bias = statevar.Variable([0.0])
      >>> class Model(statevar.Module):
      ...     def __init__(self):
      ...         self.layers = [Dense()]
      ...         self.step = statevar.Variable(0, trainable=False, name="step")
      >>> statevar.summary(Model())
      Model
      path               shape   dtype    trainable  placement  params  bytes
      -----------------------------------------------------------------------
      layers/0           Dense                                       3   12 B
        layers/0/kernel  (2, 1)  float32  yes        cpu:0           2    8 B
        layers/0/bias    (1,)    float32  yes        cpu:0           1    4 B
      step               ()      int32    no         cpu:0           1    4 B
      -----------------------------------------------------------------------
      Total: 4 params (16 B) in 3 variables; trainable 3 (12 B), non-trainable 1 (4 B)
    """
    if not (isinstance(module, Node) or has_named_variables(module)):
        raise TypeError(
            f"Expected statevar.summary's module to be a statevar.Module or "
            f"statevar.Optimizer, got {type(module).__name__}"
        )
    out = sys.stdout if file is None else file
    isatty = getattr(out, "isatty", None)
    if isatty is not None and isatty():
        _print_rich(module, out)
    else:
        out.write(summary_text(module))


# --------------------------------------------------------------------------- repr


def _describe_variable(variable: Readable) -> str:
    extras = "".join(
        [
            f", name={variable._name!r}" if variable._name is not None else "",
            "" if variable.trainable else ", trainable=False",
            f", synchronization='on_read', aggregation={variable.aggregation!r}"
            if variable.synchronization == "on_read"
            else "",
        ]
    )
    shape = ",".join(str(d) for d in variable.shape)
    return f"Variable({variable.dtype}[{shape}]{extras})"


def _short(value: Any) -> str:
    """A one-line repr of an attribute that holds no variables."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if isinstance(shape, tuple) and dtype is not None:
        return f"{type(value).__name__}({dtype}[{','.join(str(d) for d in shape)}])"
    try:
        text = repr(value)
    except Exception as error:  # a repr must never raise
        text = f"<{type(value).__name__}: repr failed with {type(error).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= 60 else text[:57] + "..."


def module_repr(module: Node) -> str:
    """Returns a Module's repr: its public attributes, variables by shape and dtype,
    sub-Modules nested, on one line when it fits and indented otherwise.

    Example:
      >>> import statevar
      >>> class Dense(statevar.Module):
      ...     def __init__(self):
      ...         self.kernel = statevar.Variable([[1.0], [2.0]])
      ...         self.activation = "relu"
      >>> Dense()
      Dense(kernel=Variable(float32[2,1]), activation='relu')
    """
    return _render(_repr_tree(module, 0, set()), 0, 0)


def _repr_tree(value: Any, depth: int, ancestors: set[int]) -> Any:
    """Returns a str (a leaf) or ``(opening, [(prefix, child)], closing)`` for `module_repr`;
    ``ancestors`` holds the ids of the containers being described, to show cycles."""
    if isinstance(value, Readable):  # a Variable, or a view of one
        return _describe_variable(value)
    if id(value) in ancestors:
        return f"<cycle: {type(value).__name__}>"
    if depth >= _REPR_DEPTH and isinstance(value, (Node, list, tuple, dict)):
        return f"{type(value).__name__}(...)"
    if isinstance(value, Node):
        entries = [
            (f"{key}=", item)
            for key, item in vars(value).items()
            if not key.startswith("_") or isinstance(item, (Readable, Node))
        ]
        given = vars(value).get("_module_name")
        if given is not None:  # a name given explicitly (see `Module.name`)
            entries.insert(0, ("name=", given))
        opening, closing = f"{type(value).__name__}(", ")"
    elif isinstance(value, dict):
        entries = [(f"{key!r}: ", item) for key, item in value.items()]
        opening, closing = "{", "}"
    elif isinstance(value, (list, tuple)):
        entries = [("", item) for item in value]
        opening, closing = ("[", "]") if isinstance(value, list) else ("(", ")")
    else:
        return _short(value)
    ancestors.add(id(value))
    children = [
        (prefix, _repr_tree(item, depth + 1, ancestors)) for prefix, item in entries[:_REPR_ITEMS]
    ]
    ancestors.discard(id(value))
    if len(entries) > _REPR_ITEMS:
        children.append(("", f"... ({len(entries) - _REPR_ITEMS} more)"))
    if isinstance(value, tuple) and len(entries) == 1 and not isinstance(value, Node):
        closing = ",)"
    return opening, children, closing


def _flat(tree: Any) -> str:
    if isinstance(tree, str):
        return tree
    opening, children, closing = tree
    return opening + ", ".join(prefix + _flat(child) for prefix, child in children) + closing


def _render(tree: Any, level: int, column: int) -> str:
    one_line = _flat(tree)
    if isinstance(tree, str) or column + len(one_line) <= _REPR_WIDTH or not tree[1]:
        return one_line
    opening, children, closing = tree
    pad = "  " * (level + 1)
    lines = [
        f"{pad}{prefix}{_render(child, level + 1, len(pad) + len(prefix))},"
        for prefix, child in children
    ]
    return "\n".join([opening, *lines, "  " * level + closing.lstrip(",")])
