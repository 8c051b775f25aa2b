"""Closure discovery: the variables a function can reach before it is traced.

`statevar.jit` lifts these variables (passes their buffers, donated, into the compiled
call) from the first trace on; a variable reached any other way is found while tracing, and
the call traces again, lifting it, before running.
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any, cast

from ._state import compiled_functions
from ._variable import Variable

# `compiled_functions` holds what `statevar.jit` returned, to follow into the function each
# compiles. A wrapper made with functools.wraps copies a compiled function's attributes, so
# membership, not an attribute, tells them apart.


def closure_variables(fn: Any) -> list[Variable]:
    """Returns the variables ``fn`` can reach through its closure and globals.

    Follows Modules, objects with ``_statevar_variables`` (Optimizers), containers, bound
    methods, ``functools.partial`` and functions defined in ``fn``'s own module.
    """
    found: dict[Variable, None] = {}
    home = getattr(inspect.unwrap(fn), "__module__", None) if callable(fn) else None
    seen: set[int] = set()

    def collect(obj: Any, depth: int) -> None:
        if id(obj) in seen or depth > 6:
            return
        seen.add(id(obj))
        if isinstance(obj, Variable):
            found[obj] = None
        elif hasattr(type(obj), "_statevar_variables"):
            found.update(dict.fromkeys(obj._statevar_variables()))
        elif isinstance(obj, (list, tuple, set, frozenset)):
            for item in obj:
                collect(item, depth + 1)
        elif isinstance(obj, dict):
            for item in obj.values():
                collect(item, depth + 1)
        elif isinstance(obj, types.MethodType):
            collect(obj.__self__, depth + 1)
            collect(obj.__func__, depth + 1)
        elif isinstance(obj, (types.FunctionType, functools.partial)) and obj in compiled_functions:
            collect(cast(Any, obj).jit_function._fn, depth + 1)
        elif isinstance(obj, functools.partial):
            collect(obj.func, depth + 1)
            collect(obj.args, depth + 1)
            collect(obj.keywords, depth + 1)
        elif isinstance(obj, types.FunctionType) and (depth == 0 or obj.__module__ == home):
            try:
                names = inspect.getclosurevars(obj)
            except (TypeError, ValueError):
                return
            for value in (*names.nonlocals.values(), *names.globals.values()):
                if not isinstance(value, types.ModuleType):
                    collect(value, depth + 1)

    collect(fn, 0)
    return list(found)
