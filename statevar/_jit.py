"""`statevar.jit`: compile a function that reads and assigns variables."""

from __future__ import annotations

import collections
import copy
import functools
import inspect
import itertools
import operator
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any, overload

import jax
import numpy as np

from . import _placement, _trace, _update, _variable
from ._closure import closure_variables, compiled_functions
from ._convert import Tracer
from ._errors import PlacementError, StatevarError, TraceContextError
from ._signals import held_signals
from ._tree import Node, Structure, is_state, read_variables, variables_and_structure
from ._typing import Compiled, Params, Result
from ._variable import Variable

# Bound once: a compiled call is a hot path.
_getrefcount, _SOLE_HOLDER_IN_MAP = sys.getrefcount, _update.SOLE_HOLDER_IN_MAP
_consume = collections.deque(maxlen=0).extend  # runs an iterator to its end, in C
_flatten = itertools.chain.from_iterable
_setattr = setattr
_acquire, _release = _update.state_lock.acquire, _update.state_lock.release
_trainable_epoch = _variable.trainable_epoch  # a one-item list, updated in place
_ARRAY_TYPES = (jax.Array, np.ndarray, np.generic, bool, int, float, complex)
# The exact types of the concrete (non-tracer) array arguments seen so far; the fast path of
# a call accepts arguments of these types only.
_CONCRETE_TYPES: set[type] = {np.ndarray, bool, int, float, complex}


class _Entry:
    """One compiled form of the function: the variables it lifts and its `jax.jit`."""

    __slots__ = (
        "lifted",
        "jitted",
        "found",
        "split",
        "extra",
        "flags",
        "epoch",
        "refs",
        "warm",
        "call",
    )

    def __init__(
        self,
        lifted: tuple[Variable, ...],
        jitted: Callable,
        split: tuple,
        extra: tuple,
        refs: tuple[Variable, ...],
        found: _Found,
    ):
        self.lifted = lifted
        self.jitted = jitted
        self.found = found
        # How the call's arguments were split: (treedef, fixed, arg_variables), ``fixed``
        # holding a reference to each non-array argument by position (see `_reference`).
        self.split = split
        self.extra = extra
        # Gradients depend on which variables are trainable, and the trace pins each new
        # value to its variable's sharding: the trace is valid for these flags, checked
        # again whenever any variable's flag or sharding changed (a new epoch).
        self.flags = _variable.compile_flags(lifted)
        self.epoch = _trainable_epoch[0]
        # The variables held in jax.Refs while tracing: those assigned under a nested JAX
        # transformation (see `_trace`).
        self.refs = refs
        # Whether the call has run once: later calls take JAX's C++ fast path.
        self.warm = False
        # Once warm: the lean call for the current epoch and trace (see `_warm_call`).
        self.call: Callable[[tuple[Any, ...]], Any] | None = None


class _Found:
    """What tracing an entry found, set by the trace."""

    __slots__ = ("unlifted", "written_unlifted", "retrace", "targets", "attributes")

    def __init__(self) -> None:
        # Variables read or assigned that were not lifted (to lift on the next call), and
        # those of them assigned (whose new values the call returns).
        self.unlifted: tuple[Variable, ...] = ()
        self.written_unlifted: tuple[Variable, ...] = ()
        # Set by a trace that found variables assigned under nested transformations
        # without a ref: (variables to lift, variables to hold in refs).
        self.retrace: tuple[tuple[Variable, ...], tuple[Variable, ...]] | None = None
        # Where the compiled call's outputs go: each variable's new array into its
        # ``_value``, then the result into a `_Returned`'s ``value``.
        self.targets: tuple[Variable, ...] = ()
        self.attributes: tuple[str, ...] = ()


class _Returned:
    """Receives a compiled call's result (see `JitFunction._run`)."""

    __slots__ = ("value",)


class JitFunction:
    """A function compiled with `jax.jit` whose variable reads and assignments are lifted.

    Created by `statevar.jit`.
    """

    def __init__(self, fn: Callable, **jit_kwargs: Any):
        for forbidden in ("donate_argnums", "donate_argnames"):
            if forbidden in jit_kwargs:
                raise TypeError(
                    f"statevar.jit does not take {forbidden}: it donates the variables' "
                    "buffers itself; pass arrays you want donated as Variables instead"
                )
        static = jit_kwargs.pop("static_argnums", ())
        static = (static,) if isinstance(static, int) else tuple(static)
        names = jit_kwargs.pop("static_argnames", ())
        names = (names,) if isinstance(names, str) else tuple(names)
        # As jax.jit does: a static argument is static whether passed by position or name.
        try:
            parameters = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            parameters = []
        positional = [
            p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if positional:
            static = tuple(i + len(positional) if i < 0 else i for i in static)
        self._static_argnums = frozenset(
            (*static, *(positional.index(name) for name in names if name in positional))
        )
        self._static_argnames = frozenset(
            (*names, *(positional[i] for i in static if 0 <= i < len(positional)))
        )
        self._fn = fn
        self._jit_kwargs = jit_kwargs
        self._entries: dict[Any, _Entry] = {}
        # For calls whose arguments are arrays, Variables and Modules only: by argument
        # types, the positions of the Variables and Modules and of the arrays; by argument
        # types and the ids of the Variables and Modules, the entry's key and the structures
        # of the Modules when it was made.
        self._plans: dict[tuple[type, ...], tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self._by_state: dict[tuple, tuple[Any, list[Structure]]] = {}
        # The `_by_state` keys of each entry, for `_forget`.
        self._state_keys: dict[Any, set[tuple]] = {}
        self._static_positions_cache: dict[Any, frozenset[int]] = {}
        self._has_static = bool(self._static_argnums or self._static_argnames)
        _wrap(self, fn)
        if not hasattr(self, "__name__"):  # a functools.partial or a callable object
            inner = fn.func if isinstance(fn, functools.partial) else fn
            self.__name__ = getattr(inner, "__name__", type(inner).__name__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the function: the general path, which `jit`'s function takes unless
        an earlier call with the same kind of arguments left an entry it finds directly."""
        if _trace.open_frames and _trace.innermost() is not None:
            # Inside another statevar.jit or statevar.grad: run inline, in its trace.
            return self._fn(*args, **kwargs)
        return self._run(*self._prepare(args, kwargs))

    def lower(self, *args: Any, **kwargs: Any) -> jax.stages.Lowered:
        """Returns JAX's `jax.stages.Lowered` for a call with these arguments, to inspect
        (``.as_text()``, ``.compile().memory_analysis()``); runs nothing, donates nothing.

        Its first argument is the list of the variables' arrays, the second the call's
        array arguments; its outputs are the variables' new values, then the result.

        Raises:
          PlacementError: if variables and arguments are on different sets of devices.
        """
        key, entry, dynamic = self._prepare(args, kwargs)
        arrays = [v._value for v in entry.lifted]
        self._check_devices(entry.lifted, arrays, dynamic)
        return entry.jitted.lower(arrays, dynamic)

    def _check_devices(self, lifted: tuple[Variable, ...], arrays: list, dynamic: tuple) -> None:
        named = [(f"Variable {v.name!r}", a) for v, a in zip(lifted, arrays, strict=True)]
        named += [(f"argument {i}", a) for i, a in enumerate(dynamic)]
        _placement.check_same_devices(f"The statevar.jit function {self.__name__!r}", named)

    def _prepare(self, args: tuple, kwargs: dict) -> tuple[Any, _Entry, tuple[Any, ...]]:
        """Splits a call into the key of its entry, the entry (compiled on first use) and
        its array arguments."""
        leaves, treedef = jax.tree.flatten((args, kwargs), is_leaf=is_state)
        key_parts: list[Any] = [treedef]
        dynamic, arg_variables, fixed, structures = [], [], [], []
        flat = True  # no static argument among the leaves
        for position, leaf in enumerate(leaves):
            if isinstance(leaf, _ARRAY_TYPES) and not self._is_static(treedef, position):
                if isinstance(leaf, Tracer):
                    raise self._under_transformation()
                _CONCRETE_TYPES.add(type(leaf))
                dynamic.append(leaf)
                continue
            if isinstance(leaf, Variable):
                arg_variables.append(leaf)
                key_parts.append((position, id(leaf)))
            elif isinstance(leaf, Node):
                variables, structure = variables_and_structure(leaf)
                structures.append(structure)
                arg_variables.extend(variables)
                # Keyed on the module's variables too, so replacing one retraces.
                key_parts.append((position, id(leaf), tuple(map(id, variables))))
            else:
                key_parts.append((position, _static_key(leaf, self.__name__)))
                flat = False
            fixed.append((position, leaf))
        if not fixed and not kwargs and all(isinstance(a, _ARRAY_TYPES) for a in args):
            key: Any = len(args)
        else:
            key = tuple(key_parts)
        entry = self._entries.get(key)
        if entry is None:
            held = [(position, _reference(leaf)) for position, leaf in fixed]
            entry = self._entries[key] = self._compile((treedef, held, arg_variables), ())
            for _, leaf in fixed:
                if isinstance(leaf, Node):
                    weakref.finalize(leaf, _forget, weakref.ref(self), key)
        if (
            fixed
            and flat
            and not kwargs
            and not self._has_static
            and len(leaves) == len(args)
            and all(map(operator.is_, leaves, args))
        ):
            # Every argument is an array, a Variable or a Module: later calls with the same
            # argument types, Variables and Modules find this entry without flattening or
            # walking (see `jit`), while the Modules' structures are unchanged.
            types = tuple(map(type, args))
            state = tuple(position for position, _ in fixed)
            self._plans[types] = (state, tuple(i for i in range(len(args)) if i not in state))
            state_key = (types, tuple(map(id, map(args.__getitem__, state))))
            previous = self._by_state.get(state_key)
            self._by_state[state_key] = (key, structures)
            self._state_keys.setdefault(key, set()).add(state_key)
            if previous is not None and previous[0] != key:
                self._drop_replaced(previous[0], state_key)
        return key, entry, tuple(dynamic)

    def _drop_replaced(self, key: Any, state_key: tuple) -> None:
        """Drops the entry under ``key`` once no call reaches it through `_by_state`: the
        same arguments now hold other variables (one was replaced in a Module), and the
        old entry would keep the old variables and their buffers alive."""
        state_keys = self._state_keys.get(key)
        if state_keys is not None:
            state_keys.discard(state_key)
            if not state_keys:
                del self._state_keys[key]
                self._entries.pop(key, None)

    def _run(self, key: Any, entry: _Entry, dynamic: tuple[Any, ...]) -> Any:
        """Calls ``entry`` on concrete arguments, donating and replacing the variables' arrays."""
        if entry.epoch != _trainable_epoch[0]:
            if _variable.compile_flags(entry.lifted) != entry.flags:
                entry = self._entries[key] = self._compile(entry.split, entry.extra, entry.refs)
            entry.epoch = _trainable_epoch[0]
        with _update.state_lock:
            arrays = [v._value for v in entry.lifted]
            # One pass in C for the common case: every array held by its variable alone.
            if arrays and max(map(_getrefcount, arrays)) > _SOLE_HOLDER_IN_MAP:
                arrays = _update.copy_shared(arrays)
            found = entry.found
            # The arrays to put back if the call turns out to have been traced; a warm entry
            # lifts every variable it writes, so its own arrays are all of them.
            previous = (
                (*arrays, *(v._value for v in found.written_unlifted))
                if found.written_unlifted
                else arrays
            )
            returned = _Returned()
            if not entry.warm:  # refused before anything is donated
                self._check_devices(entry.lifted, arrays, dynamic)
            try:
                if entry.warm:
                    _store(found, returned, entry.jitted, arrays, dynamic)
                else:
                    # The first call traces, compiles and runs Python code after donating:
                    # hold the signal handlers until the new values are stored.
                    with held_signals():
                        outputs = entry.jitted(arrays, dynamic)
                        if found.targets and isinstance(outputs[0], Tracer):
                            raise self._under_transformation()
                        targets = itertools.chain(found.targets, (returned,))
                        _consume(map(_setattr, targets, found.attributes, outputs))
                    entry.warm = True
            except Exception as error:
                raise self._failed_call(entry.lifted, arrays, error, dynamic) from error
            if found.targets and isinstance(found.targets[0]._value, Tracer):
                # Called inside jax.jit without traced arguments: the whole call was traced
                # (nothing ran, nothing was donated), so every value is a tracer. (A first
                # call checks before storing: `previous` lacks what its trace found.)
                _consume(map(_setattr, found.targets, found.attributes, previous))
                raise self._under_transformation()
            if found.retrace is not None:
                # The trace met variables assigned under nested JAX transformations without
                # a ref: it compiled to a step that gives back every variable unchanged.
                # Trace again with refs for them, and run that.
                unlifted, refs = found.retrace
                entry = self._entries[key] = self._compile(
                    entry.split, (*entry.extra, *unlifted), (*entry.refs, *refs)
                )
                return self._run(key, entry, dynamic)
        result = returned.value
        if found.unlifted:
            # The trace touched variables it could not see beforehand (reads used their
            # current values); lift them from the next call on.
            self._entries[key] = self._compile(
                entry.split, (*entry.extra, *entry.found.unlifted), entry.refs
            )
        elif entry.warm:
            made_for = None if entry.call is None else entry.call.made_for  # type: ignore[attr-defined]
            if made_for is None or made_for[0] != entry.epoch or made_for[1] is not found.targets:
                entry.call = _warm_call(self, key, entry)
        return result

    def _failed_call(
        self, lifted: tuple[Variable, ...], arrays: list, error: Exception, dynamic: tuple = ()
    ) -> Exception:
        """The error to raise when a compiled call failed; no variable has changed."""
        deleted = [v for v, a in zip(lifted, arrays, strict=True) if a.is_deleted()]
        if not deleted:
            try:
                self._check_devices(lifted, arrays, dynamic)
            except PlacementError as refused:
                return refused
            return error
        if str(error).startswith("Array has been deleted") or "has been deleted or donated" in str(
            error
        ):
            # JAX refused the call before running it: the arrays were deleted beforehand.
            return deleted[0]._deleted_error(
                f"The statevar.jit function {self.__name__!r} cannot read"
            )
        return StatevarError(
            f"The statevar.jit function {self.__name__!r} failed after its variables' "
            "buffers were donated; these variables lost their values: "
            f"{', '.join(repr(v.name) for v in deleted)}"
        )

    def _under_transformation(self) -> TraceContextError:
        return TraceContextError(
            f"Cannot call the statevar.jit function {self.__name__!r} inside jax.jit, "
            "jax.grad, jax.vmap or another JAX transformation: the variables it assigns would "
            "keep tracers. Call it outside, or use statevar.jit and statevar.grad throughout."
        )

    def _is_static(self, treedef: Any, position: int) -> bool:
        if not self._has_static:
            return False
        positions = self._static_positions_cache.get(treedef)
        if positions is None:
            positions = self._static_positions_cache[treedef] = self._static_positions(treedef)
        return position in positions

    def _static_positions(self, treedef: Any) -> frozenset[int]:
        args, kwargs = treedef.unflatten(range(treedef.num_leaves))
        static = {i % len(args) for i in self._static_argnums if -len(args) <= i < len(args)}
        positions = [
            leaf for i, arg in enumerate(args) if i in static for leaf in jax.tree.leaves(arg)
        ]
        positions += [
            leaf
            for name, arg in kwargs.items()
            if name in self._static_argnames
            for leaf in jax.tree.leaves(arg)
        ]
        return frozenset(positions)

    def _compile(self, split: tuple, extra: tuple, refs: tuple = ()) -> _Entry:
        treedef, fixed, arg_variables = split
        refs = tuple(dict.fromkeys(refs))
        lifted = tuple(dict.fromkeys([*arg_variables, *closure_variables(self._fn), *extra, *refs]))
        lifted_set = set(lifted)
        fn = self._fn
        # What the trace finds; not the entry itself, which would make a reference cycle
        # (entry -> jitted -> pure -> entry) that only the garbage collector frees.
        found = _Found()

        def pure(arrays: list[jax.Array], dynamic: tuple[Any, ...]) -> Any:
            values = dict(zip(lifted, arrays, strict=True))
            frame = _trace.Frame("jit", values, {v: jax.new_ref(values.pop(v)) for v in refs})
            with frame:
                leaves, remaining, fixed_iter = [], iter(dynamic), iter(fixed)
                next_fixed = next(fixed_iter, None)
                for position in range(treedef.num_leaves):
                    if next_fixed is not None and next_fixed[0] == position:
                        leaves.append(next_fixed[1]())
                        next_fixed = next(fixed_iter, None)
                    else:
                        leaves.append(next(remaining))
                args, kwargs = treedef.unflatten(leaves)
                result = read_variables(fn(*args, **kwargs))
            if frame.wanted_refs:
                # Finish this trace (raising out of it would leave JAX's caches of the nested
                # functions' traces holding its tracers) as a step that changes nothing.
                found.retrace = ((*frame.unlifted, *frame.written), tuple(frame.wanted_refs))
                found.targets = lifted
                found.attributes = ("_value",) * len(lifted) + ("value",)
                return (*arrays, None)
            written = tuple(v for v in frame.written if v not in lifted_set)
            found.unlifted = (*frame.unlifted, *written)
            found.written_unlifted = written
            found.targets = (*lifted, *written)
            found.attributes = ("_value",) * len(found.targets) + ("value",)
            # The variables' values come before the result: XLA gives a donated buffer to
            # the first output of its shape and dtype, which must be the variable's own.
            final = {v: jax.freeze(ref) for v, ref in frame.refs.items()}
            final.update(frame.values)
            return (
                *map(_variable.keep_sharding, found.targets, map(final.get, found.targets)),
                result,
            )

        # keep_unused: a variable the function only writes is still donated and updated in
        # place (JAX would otherwise prune the unread argument and its donation).
        jitted = jax.jit(pure, donate_argnums=0, **{"keep_unused": True, **self._jit_kwargs})
        return _Entry(lifted, jitted, split, extra, refs, found)


def _store(found: _Found, box: _Returned, jitted: Callable, arrays: list, dynamic: tuple) -> None:
    """Calls a warm entry's compiled function, donating ``arrays``, and stores its outputs.

    The compiled call (JAX's C++ fast path) returns the variables' new values, then the
    result; the same C call chain makes the call and stores each output where it belongs
    (each variable's ``_value``, then ``box.value``), so no bytecode (where an exception such
    as KeyboardInterrupt can land) comes between the donation and the stores.
    """
    _consume(
        map(
            _setattr,
            itertools.chain(found.targets, (box,)),
            found.attributes,
            _flatten(map(jitted, (arrays,), (dynamic,))),
        )
    )


def _warm_call(function: JitFunction, key: Any, entry: _Entry) -> Callable[[tuple], Any]:
    """Returns the lean call of a warm entry: the hot path of a compiled step.

    It does what `JitFunction._run` does for a warm entry, with everything fixed between
    calls bound once: the variables, the compiled function and where its outputs go (the
    targets, then a result box reused by every call, read and cleared under the lock). It
    holds neither the entry nor the function (a reference cycle would free them only when
    the garbage collector runs): it refers to the function weakly, and hands the call to
    `_run` when the trainable epoch or the trace changed since it was made (``call.made_for``).
    """
    function_ref = weakref.ref(function)
    lifted, jitted, found = entry.lifted, entry.jitted, entry.found
    made_for = epoch, made_targets = entry.epoch, found.targets
    box = _Returned()
    targets, attributes = (*found.targets, box), found.attributes
    first_target = found.targets[0] if found.targets else None

    def call(dynamic: tuple[Any, ...]) -> Any:
        if _trainable_epoch[0] != epoch or found.targets is not made_targets:
            compiled = function_ref()
            return compiled._run(key, compiled._entries[key], dynamic)  # type: ignore[union-attr]
        # Acquired inside the try, so that an exception landing right after acquiring still
        # releases (see `Variable.assign`).
        try:
            _acquire()
            arrays = [v._value for v in lifted]
            # One pass in C for the common case: every array held by its variable alone.
            if arrays and max(map(_getrefcount, arrays)) > _SOLE_HOLDER_IN_MAP:
                arrays = _update.copy_shared(arrays)
            try:
                # As `_store`, with the targets and the box bound once.
                _consume(
                    map(_setattr, targets, attributes, _flatten(map(jitted, (arrays,), (dynamic,))))
                )
            except Exception as error:
                failed = function_ref()._failed_call  # type: ignore[union-attr]
                raise failed(lifted, arrays, error, dynamic) from error
            result, box.value = box.value, None
            if first_target is not None and isinstance(first_target._value, Tracer):
                # Called inside jax.jit without traced arguments: traced, nothing donated.
                _consume(map(_setattr, found.targets, attributes, arrays))
                raise function_ref()._under_transformation()  # type: ignore[union-attr]
        finally:
            try:
                _release()
            except RuntimeError:
                pass  # acquire itself was interrupted while waiting: nothing to release
        return result

    call.made_for = made_for  # type: ignore[attr-defined]
    return call


def _wrap(wrapper: Any, fn: Any) -> Any:
    """`functools.update_wrapper`, except that ``fn``'s attributes never replace the
    wrapper's own (a callable Module's ``_fn``, say); the others are still exposed."""
    functools.update_wrapper(wrapper, fn, updated=())
    for name, value in getattr(fn, "__dict__", {}).items():
        wrapper.__dict__.setdefault(name, value)
    return wrapper


def _reference(argument: Any) -> Callable[[], Any]:
    """Returns a function giving back a non-array argument when the entry is traced.

    A Module is referenced weakly, so that an entry (with its compiled code and the
    Module's variables) does not keep the Module alive: a compiled method must not keep
    every instance it ran on. When the Module is freed, `_forget` drops the entries keyed on
    its id, before the id can be reused. Anything else (a Variable, a static argument) is
    held: its id is in the entry's key.
    """
    if isinstance(argument, Node):
        return weakref.ref(argument)
    return lambda: argument


def _forget(function_ref: weakref.ref, key: Any) -> None:
    """Drops the entries of a `JitFunction` keyed on a Module that has been freed."""
    function = function_ref()
    if function is None:
        return
    # No iteration over shared dicts: this runs from the garbage collector, possibly in the
    # middle of another call that changes them.
    function._entries.pop(key, None)
    for state_key in function._state_keys.pop(key, ()):
        function._by_state.pop(state_key, None)


def _static_key(leaf: Any, function_name: str) -> Any:
    try:
        hash(leaf)
    except TypeError:
        raise TypeError(
            f"The statevar.jit function {function_name!r} got an argument of type "
            f"{type(leaf).__name__}, which is not an array, Variable or Module and is not "
            "hashable, so it cannot be treated as static. Pass arrays, or a hashable value."
        ) from None
    return (type(leaf), leaf)


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
    variable reached any other way is found while tracing: that first call uses its current
    value and the next call traces once more to lift it. As with ``tf.function``, captured
    variables are bound when the function is traced: rebinding a global name to a new
    Variable afterwards is not seen (pass it as an argument instead).

    Args:
      fn: the function. Its arguments may hold Variables, Modules, arrays and Python
        scalars; anything else is treated as static.
      **jit_kwargs: passed to `jax.jit`, except ``donate_argnums`` and ``donate_argnames``;
        ``static_argnums`` and ``static_argnames`` mark arguments static as in `jax.jit`.

    Returns:
      The compiled function.

    Raises:
      TypeError: if ``donate_argnums`` or ``donate_argnames`` is given.
      TraceContextError: if ``fn`` creates a Variable.
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
    compiled = JitFunction(fn, **jit_kwargs)
    entries, run, general = compiled._entries, compiled._run, compiled.__call__
    plans, by_state = compiled._plans, compiled._by_state
    accepts = _CONCRETE_TYPES.issuperset

    def call(*args: Any, **kwargs: Any) -> Any:
        if not kwargs and not _trace.open_frames:
            types = tuple(map(type, args))
            if accepts(types):
                # Fast path for the common step(x, y): only concrete arrays and scalars, so
                # the key needs no flatten and no argument can be a tracer. Only calls
                # without variables, modules or static arguments are compiled under it.
                entry = entries.get(len(args))
                if entry is not None:
                    warm = entry.call
                    if warm is not None:
                        return warm(args)
                    return run(len(args), entry, args)
            else:
                # Fast path for step(model, x) and methods: arrays, Variables and Modules
                # seen before, as long as the Modules still hold the same objects.
                plan = plans.get(types)
                if plan is not None:
                    state, arrays = plan
                    found = by_state.get((types, tuple(map(id, map(args.__getitem__, state)))))
                    if found is not None and all(s.unchanged() for s in found[1]):
                        key = found[0]
                        entry = entries[key]
                        dynamic = tuple(map(args.__getitem__, arrays))
                        warm = entry.call
                        return run(key, entry, dynamic) if warm is None else warm(dynamic)
        return general(*args, **kwargs)

    if isinstance(fn, types.FunctionType):
        # A plain function gives a plain function: it binds as a method, Python calls it
        # fastest, and a deep copy shares it, as it shares any function.
        call.jit_function, call._jit_kwargs, call.lower = compiled, jit_kwargs, compiled.lower
        compiled_functions.add(call)
        return _wrap(call, fn)
    # A bound method (an Optimizer's, say), a partial or a callable object belongs to an
    # instance: a deep copy of that instance must get a function compiled for the copy.
    wrapper = _wrap(CompiledFunction(call, compiled, jit_kwargs), fn)
    compiled_functions.add(wrapper)
    return wrapper


class CompiledFunction(functools.partial):
    """What `jit` returns for anything but a plain function: a function that binds as a
    method and deep-copies with the instance it belongs to.

    A `functools.partial` of the calling function, which Python calls almost as fast as a
    plain function (much faster than an object's ``__call__``).
    """

    def __new__(
        cls, call: Callable, compiled: JitFunction, jit_kwargs: dict[str, Any]
    ) -> CompiledFunction:
        self = super().__new__(cls, call)
        self.jit_function = compiled
        self.lower = compiled.lower
        self._jit_kwargs = jit_kwargs
        return self

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        return self if instance is None else types.MethodType(self, instance)

    def __copy__(self) -> CompiledFunction:
        return self

    def __deepcopy__(self, memo: dict) -> CompiledFunction:
        # A copy compiles the deep copy of the function: for a bound method (say, an
        # Optimizer's), one bound to the copied object, which updates the copied variables.
        return jit(copy.deepcopy(self.jit_function._fn, memo), **self._jit_kwargs)

    def __repr__(self) -> str:
        return f"<statevar.jit function {self.jit_function.__name__}>"
