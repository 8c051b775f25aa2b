"""Closure discovery: the variables a function can reach before it is traced.

`statevar.jit` lifts these variables (passes their buffers, donated, into the compiled
call) from the first trace on; a variable reached any other way is found while tracing, and
the call traces again, lifting it, before running.
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any

from .._cell.variable import Variable
from .._state import STATE


def _is_compiled(obj: Any) -> bool:
    """Whether ``obj`` is what `statevar.jit` returned (`ProcessState.compiled_functions`
    holds them), to follow into the function it compiles. A wrapper made with
    functools.wraps copies a compiled function's attributes, so membership, not an
    attribute, tells them apart."""
    try:
        return obj in STATE.compiled_functions
    except TypeError:  # unhashable: no compiled function
        return False


def closure_variables(fn: Any) -> list[Variable]:
    """Returns the variables ``fn`` can reach through its closure and globals.

    Follows Modules, objects with ``_statevar_variables`` (Optimizers), containers, bound
    methods, ``functools.partial`` and functions defined in ``fn``'s own module.
    """
    found: dict[Variable, None] = {}
    home = getattr(inspect.unwrap(fn), "__module__", None) if callable(fn) else None
    _collect(fn, 0, home, found, set())
    return list(found)


def _collect(obj: Any, depth: int, home: str | None, found: dict, seen: set[int]) -> None:
    """Adds to ``found`` the variables ``obj`` reaches (see `closure_variables`). A function
    of the module, not a closure: a recursive closure would be a reference cycle holding
    everything found until the garbage collector runs."""
    if id(obj) in seen or depth > 6:
        return
    seen.add(id(obj))
    if isinstance(obj, Variable):
        found[obj] = None
    elif hasattr(type(obj), "_statevar_variables"):
        found.update(dict.fromkeys(obj._statevar_variables()))
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for item in obj:
            _collect(item, depth + 1, home, found, seen)
    elif isinstance(obj, dict):
        for item in obj.values():
            _collect(item, depth + 1, home, found, seen)
    elif isinstance(obj, types.MethodType):
        _collect(obj.__self__, depth + 1, home, found, seen)
        _collect(obj.__func__, depth + 1, home, found, seen)
    elif _is_compiled(obj):
        _collect(obj._fn, depth + 1, home, found, seen)
    elif isinstance(obj, functools.partial):
        for part in (obj.func, obj.args, obj.keywords):
            _collect(part, depth + 1, home, found, seen)
    elif isinstance(obj, types.FunctionType) and (depth == 0 or obj.__module__ == home):
        try:
            names = inspect.getclosurevars(obj)
        except (TypeError, ValueError):
            return
        for value in (*names.nonlocals.values(), *names.globals.values()):
            if not isinstance(value, types.ModuleType):
                _collect(value, depth + 1, home, found, seen)
