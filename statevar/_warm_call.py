"""The warm call of a compiled step: its hot path, written out for its number of variables.

A warm call reads the lifted variables' arrays, calls the compiled step (JAX's C++ fast
path), and stores each variable's new array and the result. Its cost is what
`statevar.jit` adds to a step over hand-written ``jax.jit``, so it is made of as few and
as cheap operations as the guarantees allow. `warm_call` builds it from `_TEMPLATE`,
written out for the entry's number of variables (as `dataclasses` writes out ``__init__``):

- the arrays are read by one list display, ``[v0._value, v1._value, ...]``;
- the outputs are stored by `_variable.bulk_store`, one unpacking assignment written out
  for the variables, ``((v0._value, v1._value, ..., result),) = starmap(jitted, ...)``:
  only `_variable` stores a variable's array.

The call is atomic with respect to exceptions raised at any bytecode (``KeyboardInterrupt``,
a signal handler's) once JAX serves it from its C++ fast path: Python runs signal handlers
only when a function is entered, after a call and at a backward jump, and the store's
unpacking assignment consumes the iterator, which makes the call, then stores every
output, with none of these in between. The first call with new argument types or shapes runs JAX's
Python path inside the call, after donating: an interrupt landing there, within the
~100 us that path takes once per new signature, loses the variables (see the README's
known limits). Refusing that path (``jax_no_tracing``) would make JAX fall back to it for
that signature on every later call.
"""

from __future__ import annotations

import functools
import itertools
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from . import _update, _variable
from ._convert import Tracer
from ._errors import CopyError
from ._jit_cache import Entry
from ._state import STATE
from ._variable import Variable

# The template. Its free names are globals of the function made from it: `_NAMESPACE`'s,
# and the entry's own (see `warm_call`).
_TEMPLATE = """
def call(dynamic):
    if _STATE.compile_epoch != epoch:
        # A trainable flag or a sharding changed somewhere: the general call checks them.
        return _MISS
    if uncommitted and _any(_map(_getattr, dynamic, _COMMITTED, _NOT_COMMITTED)):
        # A variable placed nowhere, and an argument committed to a device: the general
        # call checks their devices and commits the variable.
        return _COLD_MISS
    # Acquired inside the try, so that an exception landing right after acquiring still
    # releases.
    try:
        _acquire()
        if _STATE.donating:
            raise owner_ref()._interrupted()
        arrays = originals = [{reads}]
        found = traced.found
        # The call, made when the unpacking assignment below consumes it. Its arguments
        # sit in a list, so that copies of shared arrays can take their place.
        calls = [(arrays, dynamic)]
        call = _starmap(jitted, calls)
        try:
            # Set while the reference counts are read (see `ProcessState.donating`), and cleared
            # with no signal check before the call: the step itself may run Python (JAX
            # tracing it for new shapes, a jax.debug.callback) that reads and updates
            # variables it did not lift.
            _STATE.donating = True
            # `Entry.arrays`, written out: an array read earlier is copied, not donated.
            if _sum(_map(_getrefcount, arrays)) > unshared:
                arrays = _copy_shared(originals, variables, action)
                calls[0] = (arrays, dynamic)
            _STATE.donating = False
            result = store(call)
        except _CopyError:
            raise  # refused before the call: nothing donated, no variable changed
        except Exception as error:
            raise _failed(owner_ref, variables, arrays, error, dynamic) from error
        finally:
            _STATE.donating = False
        # What a trace JAX made inside this call found, read under the lock: another
        # thread's call may trace again once it is released.
        retraced = traced.found
        if {first_is_tracer}:
            # Called inside jax.jit without traced arguments: traced, nothing donated.
            _put_back(variables, originals)
            raise owner_ref()._under_transformation()
    finally:
        try:
            _release()
        except RuntimeError:
            pass  # acquire itself was interrupted while waiting: nothing to release
    if retraced is not found and retraced.needs_retrace:
        # JAX traced again for new shapes, and that trace gave every variable back
        # unchanged: run the call again on an entry lifting what it found.
        return _MISS
    return result
"""


class Miss:
    """What a warm call returns when it does not serve the call: the caller runs it through
    its general path, which checks what changed (``cold``: as a first call, dropping the
    warm call, to check the arguments' devices and commit the variables)."""

    __slots__ = ("cold",)

    def __init__(self, cold: bool):
        self.cold = cold


MISS, COLD_MISS = Miss(False), Miss(True)


class StepOwner(Protocol):
    """The compiled function a warm call belongs to, as the warm call sees it: what builds
    its errors."""

    def _failed_call(
        self, lifted: tuple[Variable, ...], arrays: list, error: Exception, dynamic: tuple = ()
    ) -> Exception: ...

    def _interrupted(self) -> Exception: ...

    def _under_transformation(self) -> Exception: ...

    @property
    def copy_action(self) -> str:
        """How the copy policy's messages name the step."""
        ...


def _failed(
    owner_ref: weakref.ref[StepOwner],
    variables: tuple[Variable, ...],
    arrays: list,
    error: Exception,
    dynamic: tuple[Any, ...],
) -> Exception:
    """The error to raise for a compiled call that failed (see `StepOwner._failed_call`)."""
    owner = owner_ref()
    assert owner is not None  # it holds the cache that holds the calling entry
    return owner._failed_call(variables, arrays, error, dynamic)


_NAMESPACE = {
    "_STATE": STATE,
    "_acquire": STATE.update_lock.acquire,
    "_release": STATE.update_lock.release,
    "_sum": sum,
    "_map": map,
    "_getrefcount": sys.getrefcount,
    "_copy_shared": _update.copy_shared,  # fails on a deleted array
    # Warnings raised in a warm call point past it, at the caller (`caller_stacklevel`).
    "__name__": __name__,
    "_starmap": itertools.starmap,
    "_MISS": MISS,
    "_COLD_MISS": COLD_MISS,
    "_failed": _failed,
    "_CopyError": CopyError,
    "_put_back": _variable.put_back,
    "_isinstance": isinstance,
    "_any": any,
    "_getattr": getattr,
    # `getattr(argument, "committed", False)` for each argument, by `map` (in C).
    "_COMMITTED": itertools.repeat("committed"),
    "_NOT_COMMITTED": itertools.repeat(False),
    "Tracer": Tracer,
}


@functools.cache
def _code(count: int) -> types.CodeType:
    """The code of warm calls for steps lifting ``count`` variables, compiled once.

    The variables are globals ``v0``, ``v1``, ... of each function made from it: the
    compiler handles ten thousand globals in a third of the time it takes for as many
    closure cells."""
    attribute = _variable.ARRAY_ATTRIBUTE
    names = [f"v{i}" for i in range(count)]
    source = _TEMPLATE.format(
        reads=", ".join(f"{name}.{attribute}" for name in names),
        # Called inside jax.jit without traced arguments: traced, nothing donated.
        first_is_tracer=f"_isinstance(v0.{attribute}, Tracer)" if count else "False",
    )
    defined: dict[str, Any] = {}
    exec(compile(source, f"<statevar warm call, {count} variables>", "exec"), {}, defined)
    return defined["call"].__code__


def warm_call(owner: StepOwner, entry: Entry) -> Callable[[tuple[Any, ...]], Any]:
    """Returns the lean call of an entry that has run: the hot path of a compiled step.

    It does what the general path of a compiled call does, with everything fixed between
    calls bound once: the variables and the compiled function. Under the update lock, it
    donates the variables' arrays (copies of those something else holds: arrays read
    earlier stay valid) and stores every output, atomically (see the module docstring). It
    holds neither the entry nor its owner (a reference cycle would free them only when the
    garbage collector runs), and returns a `Miss` for the caller's general path to run
    the call when any trainable flag or sharding changed (a new epoch), an argument
    committed to a device meets a variable placed nowhere (the first call's placement
    check and commit: `COLD_MISS`), or JAX traced the step again for new argument shapes
    and that trace found variables to lift. It runs nothing then, or (JAX's trace for new
    shapes) a step that gave every variable back unchanged.
    """
    lifted = entry.lifted
    bound = {
        **_NAMESPACE,
        **{f"v{i}": variable for i, variable in enumerate(lifted)},
        "variables": lifted,
        "jitted": entry.jitted,
        "store": _variable.bulk_store(lifted),
        "traced": entry._traced,
        "epoch": entry.epoch,
        "uncommitted": any(not v._value.committed for v in lifted),
        # The sum of the arrays' reference counts when no array is shared.
        "unshared": _update.SOLE_HOLDER_IN_MAP * len(lifted),
        "owner_ref": weakref.ref(owner),
        "action": owner.copy_action,
    }
    # A code object of its own: Python keeps its caches of global lookups in the code
    # object, and two steps taking turns would otherwise keep invalidating each other's.
    return types.FunctionType(_code(len(lifted)).replace(), bound, "warm_call")
