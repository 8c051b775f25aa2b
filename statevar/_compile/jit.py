"""`statevar.jit`: compile a function that reads and assigns variables.

`jit` makes a `Step` (`statevar._compile.step`), which does the work of every call, and
returns what calls it: a plain function for a plain function (it binds as a method and deep
copies share it), else a `CompiledFunction`, which binds as a method and deep-copies with the
instance it belongs to.
"""

from __future__ import annotations

import copy
import functools
import types
from collections.abc import Callable
from typing import Any, cast, overload

import jax

from .. import _caches
from .._state import STATE
from .memory_report import MemoryReport
from .protocol import Compiled, Params, Result
from .step import Step, wrap


@_caches.register
def _clear_compiled_steps() -> None:
    """Drops the entries of every `statevar.jit` function (see `statevar.clear_caches`)."""
    for compiled in list(STATE.compiled_functions):
        compiled.jit_function._cache.clear()


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
    compiled = Step(fn, **jit_kwargs)
    if isinstance(fn, types.FunctionType):
        return _plain_function(compiled, fn, jit_kwargs)
    # A bound method (an Optimizer's, say), a partial or a callable object belongs to an
    # instance: a deep copy of that instance must get a function compiled for the copy.
    wrapper = wrap(CompiledFunction(compiled.__call__, compiled, jit_kwargs), fn)
    STATE.compiled_functions.add(wrapper)
    return wrapper


def _plain_function(compiled: Step, fn: Callable, jit_kwargs: dict[str, Any]) -> Any:
    """What `jit` returns for a plain function: a plain function calling ``compiled``. It
    binds as a method, Python calls it fastest, and a deep copy shares it, as it shares any
    function."""
    run = compiled.__call__

    def call(*args: Any, **kwargs: Any) -> Any:
        return run(*args, **kwargs)

    call.jit_function, call._jit_kwargs, call.lower = compiled, jit_kwargs, compiled.lower
    call.memory_report = compiled.memory_report
    STATE.compiled_functions.add(call)
    return wrap(call, fn)


class CompiledFunction(functools.partial):
    """What `jit` returns for anything but a plain function: a function that binds as a
    method and deep-copies with the instance it belongs to.

    A `functools.partial` of the `Step`'s bound ``__call__``, which Python calls
    almost as fast as a plain function.
    """

    # Set on each instance by `__new__` (a partial has a ``__dict__``), as on the plain
    # functions `jit` returns.
    jit_function: Step
    lower: Callable[..., jax.stages.Lowered]
    memory_report: Callable[..., MemoryReport]
    _jit_kwargs: dict[str, Any]

    def __new__(
        cls, call: Callable, compiled: Step, jit_kwargs: dict[str, Any]
    ) -> CompiledFunction:
        self = super().__new__(cls, call)
        self.jit_function = compiled
        self.lower = compiled.lower
        self.memory_report = compiled.memory_report
        self._jit_kwargs = jit_kwargs
        return self

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        return self if instance is None else types.MethodType(self, instance)

    def __copy__(self) -> CompiledFunction:
        return self

    def __deepcopy__(self, memo: dict) -> CompiledFunction:
        # A copy compiles the deep copy of the function: for a bound method (say, an
        # Optimizer's), one bound to the copied object, which updates the copied variables.
        # That copy is again no plain function, so `jit` gives a CompiledFunction, which its
        # overloads (typed by the signature alone) cannot tell.
        copied = cast(
            CompiledFunction,
            jit(copy.deepcopy(self.jit_function._fn, memo), **self._jit_kwargs),
        )
        copied.jit_function.subject = self.jit_function.subject  # named as the original
        return copied

    def __repr__(self) -> str:
        return f"<statevar.jit function {self.jit_function.__name__}>"
