"""`statevar.jit`: compile a function that reads and assigns variables.

`jit` returns a `Step` (`statevar._compile.step`), which does the work of every call: it
binds as a method, as the function it compiles does, and a deep copy shares it for a plain
function, or compiles the copy of a bound method or callable object, which updates the
copied variables.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, overload

from .. import _caches
from .._state import STATE
from .protocol import Compiled, Params, Result
from .step import Step


@_caches.register
def _clear_compiled_steps() -> None:
    """Drops the entries of every `statevar.jit` function (see `statevar.clear_caches`)."""
    for compiled in list(STATE.compiled_functions):
        compiled._cache.clear()


@overload
def jit(fn: Callable[Params, Result], **jit_kwargs: Any) -> Compiled[Params, Result]: ...


@overload
def jit(
    fn: None = None, **jit_kwargs: Any
) -> Callable[[Callable[Params, Result]], Compiled[Params, Result]]: ...


def jit(fn: Callable | None = None, **jit_kwargs: Any) -> Any:
    """Compiles ``fn`` with `jax.jit`, letting it read and assign variables.

    Like ``tf.function``: ``fn`` may read and assign any Variables, captured by closure or
    passed in its arguments (directly, in containers, or inside Modules). Assignments take
    effect when the call returns. The variables' buffers are donated to the compiled call,
    so updates happen in place; an array read earlier stays valid (its variable is copied
    before donating instead). ``fn`` is traced again only when the set of variables it
    touches, or a shape, dtype or sharding, changes.

    Variables a function reaches through globals, closures, functions it calls from its own
    module and the Modules and Optimizers those hold are found before the first trace. A
    variable reached any other way is found while tracing, and the call traces once more,
    lifting it, before running anything. As with ``tf.function``, captured
    variables are bound when the function is traced: rebinding a global name to a new
    Variable afterwards is not seen (pass it as an argument instead). A Module replacing
    or deleting a variable, a sub-Module or an Optimizer by attribute is seen: each
    compiled step that lifted what it held traces again on its next call.

    As with ``tf.function``, the first trace may create variables (a Module built on its
    first call, a `statevar.random.Generator`, an Optimizer's state), from values that do
    not depend on the traced arguments (computed under `jax.ensure_compile_time_eval`): that
    trace is made again so that each is created once, and the step traces once more,
    lifting them. Not under ``lax.cond``, ``lax.scan`` or another JAX transformation inside
    the step, nor in a later trace (a new input signature).

    Args:
      fn: the function. Its arguments may hold Variables, Modules, arrays and Python
        numbers (traced); a Python bool, or anything else, is static: each value its own
        trace. ``step.memory_report(*args)`` reports what a call needs (see
        `statevar.MemoryReport`).
      **jit_kwargs: passed to `jax.jit`, except ``donate_argnums`` and ``donate_argnames``;
        ``static_argnums`` and ``static_argnames`` mark arguments static as in `jax.jit`.

    Returns:
      The compiled function.

    Raises:
      TypeError: if ``donate_argnums`` or ``donate_argnames`` is given, or
        ``static_argnums`` or ``static_argnames`` is not an int (a str) or a sequence of
        them.
      TraceContextError: if ``fn`` creates a Variable from a traced value, under a JAX
        transformation, or in a trace after its first; or assigns (or uses) a tracer that
        escaped another transformation.
      PlacementError: when called with variables and arguments on different sets of
        devices (before anything is donated).

    Example:
      >>> import jax.numpy as jnp
      >>> import statevar
      >>> total = statevar.Variable(0.0)
      >>> @statevar.jit
      ... def accumulate(x):
      ...     total.assign_add(x.sum())
      ...     return total.value * 2
      >>> accumulate(jnp.ones(3))
      Array(6., dtype=float32)
      >>> total
      <Variable 'Variable' shape=() dtype=float32, numpy=3.0>
    """
    if fn is None:
        return functools.partial(jit, **jit_kwargs)
    if isinstance(fn, (staticmethod, classmethod)):
        # @statevar.jit above @staticmethod or @classmethod: compile the function inside.
        return type(fn)(jit(fn.__func__, **jit_kwargs))
    return Step(fn, **jit_kwargs)
