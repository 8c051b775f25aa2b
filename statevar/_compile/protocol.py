"""The static type of what `statevar.jit` returns: the compiled function's own signature.

Only type checkers read this module; at run time `statevar.jit` returns a
`statevar._compile.step.Step`, which has these attributes.
"""

from __future__ import annotations

from typing import Any, Generic, ParamSpec, Protocol, TypeVar

import jax

from .memory_report import MemoryReport

Params = ParamSpec("Params")
Result = TypeVar("Result", covariant=True)


class Compiled(Protocol, Generic[Params, Result]):
    """A `statevar.jit`-compiled function: called with the arguments of the function it
    compiles, it returns that function's result."""

    def __call__(self, *args: Params.args, **kwargs: Params.kwargs) -> Result: ...

    def lower(self, *args: Params.args, **kwargs: Params.kwargs) -> jax.stages.Lowered:
        """JAX's `Lowered` for these arguments, for inspection; runs and changes nothing."""
        ...

    def memory_report(self, *args: Params.args, **kwargs: Params.kwargs) -> MemoryReport:
        """The memory a call with these arguments needs, by XLA's plan; runs nothing."""
        ...

    # A compiled method binds like a function; checkers then see the bound method as Any.
    def __get__(self, instance: Any, owner: type | None = None) -> Any: ...
