"""`statevar.jit`: compile a function that reads and assigns variables."""

from __future__ import annotations

import copy
import functools
import inspect
import itertools
import operator
import sys
import types
from collections.abc import Callable
from typing import Any, cast, overload

import jax

from .. import _caches
from .._cell import kernels as _kernels
from .._cell import placement as _placement
from .._cell import variable as _variable
from .._cell.convert import Tracer
from .._cell.kernels import held_elsewhere
from .._cell.tree import Node
from .._cell.variable import Variable
from .._errors import (
    CopyError,
    PlacementError,
    StatevarError,
    TraceContextError,
    interrupted_update_error,
    release_frames,
)
from .._signals import held_signals
from .._state import STATE
from .._tracing import frames as _frames
from . import memory_report as _memory_report
from .cache import (
    CONCRETE_ARGUMENT_TYPES,
    Cache,
    Entry,
    Found,
    reference,
    split_call,
    uncommit,
    under_transformation,
)
from .closure import closure_variables
from .memory_report import MemoryReport
from .protocol import Compiled, Params, Result

# What `JitFunction._donating_call` returns for a call that JAX traced again and that found
# variables to lift (see `Found`): the first call runs it on an entry lifting them.
_MISS = object()
# Bound once: the warm call runs them on every call.
_acquire, _release = STATE.update_lock.acquire, STATE.update_lock.release
_read_array = operator.attrgetter(_variable.ARRAY_ATTRIBUTE)
_getrefcount = sys.getrefcount
_chain_from, _starmap = itertools.chain.from_iterable, itertools.starmap
_stores, _consume = _variable.stores, _variable.consume
# The types of concrete array arguments seen: `_all_concrete` checks that a call's arguments
# are all of them.
_CONCRETE_TYPES = CONCRETE_ARGUMENT_TYPES
_all_concrete = _CONCRETE_TYPES.issuperset
# `getattr(argument, "committed", False)` for each argument, by `map` (in C).
_COMMITTED, _NOT_COMMITTED = itertools.repeat("committed"), itertools.repeat(False)


class JitFunction:
    """A function compiled with `jax.jit` whose variable reads and assignments are lifted.

    Created by `statevar.jit`, which returns a function calling it. Its `__call__` reads
    top to bottom: the look-up (a call seen before is found by its argument types, any
    other is split by `split_call` into the key of its compiled form, its array arguments
    and its state, and the `Cache` gives the entry for the key, compiling one on first
    use); the warm call of an entry that has run (JAX's C++ fast path serves its step); and
    the first call of any other (`_first_call`, which traces it first). Both run one body,
    `_donating_call`.
    """

    def __init__(self, fn: Callable, **jit_kwargs: Any):
        for forbidden in ("donate_argnums", "donate_argnames"):
            if forbidden in jit_kwargs:
                raise TypeError(
                    f"statevar.jit does not take {forbidden}: it donates the variables' "
                    "buffers itself; pass arrays you want donated as Variables instead"
                )
        for forbidden in ("in_shardings", "out_shardings"):
            if forbidden in jit_kwargs:
                # They would apply to the compiled step's own arguments and outputs (the
                # variables' arrays first), not to the function's.
                raise TypeError(
                    f"statevar.jit does not take {forbidden}: variables keep their own "
                    "shardings. Place arguments with jax.device_put before the call, and "
                    "results with jax.lax.with_sharding_constraint inside the function"
                )
        static = _static_setting(fn, "static_argnums", jit_kwargs.pop("static_argnums", ()))
        names = _static_setting(fn, "static_argnames", jit_kwargs.pop("static_argnames", ()))
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
        self._has_static = bool(self._static_argnums or self._static_argnames)
        self._static_positions_cache: dict[Any, frozenset[int]] = {}
        self._fn = fn
        self._jit_kwargs = jit_kwargs
        self._cache = Cache()
        self._entries = self._cache.entries  # bound once: the look-up reads it on every call
        # Whether its traces may still create variables: its first may (see `_frames.Creation`).
        self._creation = _frames.Creation("")
        # How messages about a call's placement name it, when not as this function (an
        # Optimizer's compiled update is named after the Optimizer).
        self.subject: str | None = None
        _wrap(self, fn)
        if not hasattr(self, "__name__"):  # a functools.partial or a callable object
            inner = fn.func if isinstance(fn, functools.partial) else fn
            self.__name__ = getattr(inner, "__name__", type(inner).__name__)
        self._creation.name = self.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the function: finds the entry for the call's kind of arguments, then runs it
        warm if it has run, else as a first call (`_first_call`)."""
        try:
            # The look-up: the fast paths first, for calls seen before.
            if not kwargs and not STATE.open_trace_frames:
                if _all_concrete(map(type, args)):
                    # step(x, y): only concrete arrays and scalars, so the key needs no
                    # flatten and no argument can be a tracer. Only calls without variables,
                    # modules or static arguments are compiled under it.
                    key = len(args)
                    entry, dynamic = self._entries.get(key), args
                else:
                    # step(model, x) and methods: arrays, Variables and Modules seen before,
                    # as long as the Modules still hold the same objects.
                    key, entry, dynamic = self._cache.find(tuple(map(type, args)), args)
                if entry is None:
                    key, entry, dynamic = self._prepare(args, kwargs)
            elif STATE.open_trace_frames and _frames.innermost() is not None:
                # Inside another statevar.jit or statevar.grad: run inline, in its trace.
                return self._fn(*args, **kwargs)
            else:
                key, entry, dynamic = self._prepare(args, kwargs)
            # The warm call, when the entry has run and nothing it depends on changed (a
            # trainable flag or a sharding somewhere: a new compile epoch).
            if entry.warm and entry.epoch == STATE.compile_epoch:
                if entry.uncommitted and any(map(getattr, dynamic, _COMMITTED, _NOT_COMMITTED)):
                    # A variable placed nowhere, and an argument committed to a device: the
                    # first call checks their devices and commits the variable.
                    entry.warm = False
                else:
                    result = self._donating_call(entry, dynamic)
                    if result is not _MISS:
                        return result
            # The first call: traced (again), then run as the warm call runs.
            return self._first_call(key, self._current(key, entry), dynamic)
        except BaseException as error:
            release_frames(error)  # a kept error keeps no array (see `release_frames`)
            raise

    def lower(self, *args: Any, **kwargs: Any) -> jax.stages.Lowered:
        """Returns JAX's `jax.stages.Lowered` for a call with these arguments, to inspect
        (``.as_text()``, ``.compile().memory_analysis()``); runs nothing, donates nothing.

        Its first argument is the list of the variables' arrays, the second the call's
        array arguments; its outputs are the variables' new values, then the result.

        Raises:
          PlacementError: if variables and arguments are on different sets of devices.
        """
        key, entry, dynamic = self._prepare(args, kwargs)
        entry = self._current(key, entry)
        with STATE.update_lock:  # as a call lowers: a refused donation is recorded
            entry, arrays = self._trace(key, entry, dynamic)
            return entry.lowered(lambda: entry.jitted.lower(arrays, dynamic), arrays)

    def memory_report(self, *args: Any, **kwargs: Any) -> MemoryReport:
        """Reports what a call with these arguments needs, by XLA's plan (see
        `statevar.MemoryReport`). Compiles the step (its calls reuse the compiled program);
        runs nothing, donates nothing. A variable with a read alive shows as copied.

        Raises:
          PlacementError: if variables and arguments are on different sets of devices.
        """
        key, entry, dynamic = self._prepare(args, kwargs)
        entry = self._current(key, entry)
        with STATE.update_lock:  # as a call lowers (see `Entry.lowered`)
            entry, arrays = self._trace(key, entry, dynamic)
            held = held_elsewhere(arrays)  # before anything else holds the arrays
            return _memory_report.build(self.__name__, entry, arrays, held, dynamic)

    @property
    def copy_action(self) -> str:
        """How the copy policy's messages name this function's calls."""
        return f"The statevar.jit function {self.__name__!r}"

    def _prepare(self, args: tuple, kwargs: dict) -> tuple[Any, Entry, tuple[Any, ...]]:
        """Splits a call; returns the key of its entry, the entry (made on first use) and
        its array arguments."""
        split = split_call(args, kwargs, self._is_static, self.__name__)
        entry = self._cache.entries.get(split.key)
        if entry is None:
            held = [(position, reference(leaf)) for position, leaf in split.fixed]
            entry = self._compile((split.treedef, held, split.variables), (), ())
            modules = [leaf for _, leaf in split.fixed if isinstance(leaf, Node)]
            self._cache.add(split.key, entry, modules)
        if split.identity is not None:
            self._cache.track(split.identity, split.key)
        if split.indexable and not self._has_static:
            state = tuple(position for position, _ in split.fixed)
            self._cache.index(args, state, split.key, split.structures)
        return split.key, entry, split.dynamic

    def _compile(self, split: tuple, extra: tuple, refs: tuple) -> Entry:
        """Makes an entry (traced on its first call) for calls split into ``split``:
        ``(treedef, held arguments, argument variables)``. It lifts the argument variables,
        those the function reaches through its closure, ``extra`` and ``refs`` (held in
        `jax.Ref`s while tracing)."""
        _, _, arg_variables = split
        refs = tuple(dict.fromkeys(refs))
        closure = closure_variables(self._fn)
        lifted = tuple(dict.fromkeys([*arg_variables, *closure, *extra, *refs]))
        return Entry(self._fn, split, lifted, extra, refs, self._jit_kwargs, self._creation)

    def _retrace(self, key: Any, entry: Entry, found: Found) -> Entry:
        """Replaces ``entry`` with one lifting what its trace found (see `Found`)."""
        extra = (*entry.extra, *found.unlifted)
        new = self._compile(entry.split, extra, (*entry.refs, *found.wanted_refs))
        self._cache.entries[key] = new
        return new

    def _current(self, key: Any, entry: Entry) -> Entry:
        """``entry`` as a call needs it now: made again if, since it was, a Module let go of
        a variable it lifts or a trainable flag or sharding changed (a new compile epoch);
        traced again lifting more if JAX's latest trace found more."""
        if entry.epoch != STATE.compile_epoch:
            if STATE.stale(entry.lifted, entry.structure):
                # A Module let go of a variable this step lifted (or came to hold variables
                # where it held none): traced again from scratch, so that the trace reaches
                # what the Modules hold now (what earlier traces found, `extra`, may be
                # what was replaced).
                entry = self._compile(entry.split, (), ())
                self._cache.entries[key] = entry
            elif _variable.compile_flags(entry.lifted) != entry.flags:
                entry = self._compile(entry.split, entry.extra, entry.refs)
                self._cache.entries[key] = entry
            else:
                entry.epoch, entry.warm = STATE.compile_epoch, False
        found = entry.last_found
        if found is not None and found.needs_retrace:
            entry = self._retrace(key, entry, found)  # JAX traced it again for new shapes
        return entry

    def _donating_call(self, entry: Entry, dynamic: tuple[Any, ...]) -> Any:
        """Calls ``entry``'s compiled step on the variables' arrays, donated (copies of those
        something else holds: an array read earlier stays valid), and stores every output,
        all or nothing: the body of the warm call and of the first call.

        Returns the step's result, or `_MISS` if JAX traced the step again for new argument
        shapes inside the call and that trace found variables to lift (it gave every
        variable back unchanged): the first call runs it then.

        Raises:
          CopyError: under the copy policy ``"raise"``, before anything is donated.
          StatevarError: in a signal handler that interrupted a donating update (see
            `ProcessState.donating`), or if the step failed after donating.
          TraceContextError: if called inside a JAX transformation without traced arguments.
        """
        lifted = entry.lifted
        # Acquired inside the try, so that an exception landing right after acquiring
        # still releases.
        try:
            _acquire()
            if STATE.donating:
                # The update this signal handler interrupted would store over this step's.
                raise self._interrupted()
            arrays = originals = [*map(_read_array, lifted)]
            traced = entry.traced
            found = traced.found
            # The call, made when the store is consumed; its arguments sit in a list, so
            # that copies of shared arrays can take their place.
            calls = [(arrays, dynamic)]
            outputs = _chain_from(_starmap(entry.jitted, calls))
            stores = _stores(lifted, outputs)
            try:
                # Set while the reference counts are read (see `ProcessState.donating`), and
                # cleared right before the store, with no signal check between: the step may
                # run Python (JAX tracing it for new shapes, a jax.debug.callback) that reads
                # and updates variables it did not lift.
                STATE.donating = True
                if sum(map(_getrefcount, arrays)) > entry.unshared:
                    arrays = _kernels.copy_shared(originals, lifted, self.copy_action)
                    calls[0] = (arrays, dynamic)
                STATE.donating = False
                _consume(stores)
                result = next(outputs)  # the result, after the variables' arrays
            except CopyError:
                raise  # refused before the call: nothing donated, no variable changed
            except Exception as error:
                raise self._failed_call(lifted, arrays, error, dynamic) from error
            finally:
                STATE.donating = False
            # What a trace JAX made inside this call found, read under the lock: another
            # thread's call may trace again once it is released.
            retraced = traced.found
            if (
                lifted
                and lifted[0]._value.__class__ not in _CONCRETE_TYPES  # no tracer type is there
                and isinstance(lifted[0]._value, Tracer)
            ):
                # Called inside jax.jit without traced arguments: the whole call was traced
                # (nothing ran, nothing was donated), so every value is a tracer; so are
                # copies made of shared arrays: put back the variables' own.
                _variable.put_back(lifted, originals)
                raise self._under_transformation()
        finally:
            try:
                _release()
            except RuntimeError:
                pass  # acquire itself was interrupted while waiting: nothing to release
        if retraced is not found and retraced is not None and retraced.needs_retrace:
            return _MISS
        return result

    def _trace(
        self,
        key: Any,
        entry: Entry,
        dynamic: tuple[Any, ...],
        *,
        replaced: list[tuple[Variable, jax.Array]] | None = None,
    ) -> tuple[Entry, list[jax.Array]]:
        """Traces ``entry`` for a call, and again on an entry lifting more while the trace
        finds variables to lift (see `Found`); checks placements before each trace. Runs
        nothing, donates nothing. Given ``replaced`` (a call to run), commits variables
        placed nowhere where the call commits (see `Entry.commit_lifted`, which records
        them in ``replaced``).

        Returns:
          The entry whose trace found nothing more, and the variables' arrays it was traced
          with.
        """

        def attempt(entry: Entry) -> tuple[tuple, Found | None]:
            self._check_devices(entry.lifted, [v._value for v in entry.lifted], dynamic)
            if replaced is not None:
                entry.commit_lifted(dynamic, replaced)
            arrays = [v._value for v in entry.lifted]
            try:
                found = entry.trace(arrays, dynamic)
            except _frames.NeedsEagerTrace:
                # The first trace reached a variable's creation: traced again under
                # jax.ensure_compile_time_eval, which makes every creation of the first call.
                self._creation.eager = True
                found = entry.trace(arrays, dynamic)
            return (arrays, found), found if found.needs_retrace else None

        (arrays, found), entry = _frames.retrace(
            attempt, functools.partial(self._retrace, key), entry
        )
        # Held in refs from the start if the entry is ever compiled again.
        entry.refs = tuple(dict.fromkeys((*entry.refs, *found.lifted_refs)))
        return entry, arrays

    def _first_call(self, key: Any, entry: Entry, dynamic: tuple[Any, ...]) -> Any:
        """Traces ``entry`` (again with more variables lifted, while the trace finds
        some), checks its donations, then runs it as the warm call does, holding signal
        handlers: JAX's first call runs Python code after donating."""
        with STATE.update_lock:
            if STATE.donating:
                # In a signal handler that interrupted a donating update (see
                # `ProcessState.donating`), which would store its result over this step's.
                raise self._interrupted()
            replaced: list[tuple[Variable, jax.Array]] = []
            try:
                entry, arrays = self._trace(key, entry, dynamic, replaced=replaced)
                entry.check_donations(arrays, dynamic, self.copy_action)
                committed = [a.committed for a in arrays]
                del arrays  # the call donates what nothing else holds
                with held_signals():
                    result = self._donating_call(entry, dynamic)
                    # Checked before the signal handlers are back, so that no exception can
                    # leave a variable committed in the epoch it was uncommitted in.
                    lifted = entry.lifted
                    if (
                        lifted
                        and result is not _MISS
                        and any(
                            was is not v._value.committed
                            for was, v in zip(committed, lifted, strict=True)
                        )
                    ):
                        # The step committed what it computed (a sharding constraint, a
                        # committed constant): every compiled step's next call, and each
                        # variable's next eager update, run as first calls.
                        STATE.bump_compile_epoch()
            except BaseException:
                if not any(v._value.is_deleted() for v, _ in replaced):
                    uncommit(replaced)  # nothing donated: every variable as it was
                raise
        if result is _MISS:
            # JAX traced again inside the call, found more to lift, and gave every variable
            # back unchanged.
            return self._first_call(key, self._current(key, entry), dynamic)
        # A refused donation takes no warm call: each call applies the copy policy of its time.
        entry.warm = not entry.refused
        entry.uncommitted = any(not v._value.committed for v in entry.lifted)
        return result

    def _check_devices(self, lifted: tuple[Variable, ...], arrays: list, dynamic: tuple) -> None:
        def name_of(index: int) -> str:
            if index < len(lifted):
                return f"Variable {lifted[index].name!r}"
            return f"argument {index - len(lifted)}"

        subject = self.subject or f"The statevar.jit function {self.__name__!r}"
        # A variable counts as placed on its device even while uncommitted: a compiled step
        # does not move it to its arguments' devices.
        _placement.check_same_devices(subject, [*arrays, *dynamic], name_of, placed=len(lifted))

    def _failed_call(
        self, lifted: tuple[Variable, ...], arrays: list, error: Exception, dynamic: tuple = ()
    ) -> Exception:
        """The error to raise when a compiled call failed; no variable has changed."""
        # A variable's own array: a shared one was copied, and only the copy donated.
        deleted = [
            v
            for v, a in zip(lifted, arrays, strict=True)
            if a.is_deleted() and v._value.is_deleted()
        ]
        if not deleted:
            try:
                self._check_devices(lifted, arrays, dynamic)
            except PlacementError as refused:
                return refused
            if isinstance(error, jax.errors.UnexpectedTracerError):
                return _frames.escaped_tracer_error(f"The statevar.jit function {self.__name__!r}")
            return error
        debugging = jax.config.jax_debug_nans or jax.config.jax_debug_infs  # pyright: ignore[reportAttributeAccessIssue]
        if debugging and _is_deleted_error(error):
            # The step ran and gave a NaN or an infinity: JAX ran it again, operation by
            # operation, to find where, on the buffers the first run had been donated.
            for variable in deleted:
                variable._mark_lost(
                    f"was donated to the statevar.jit function {self.__name__!r}, which "
                    "gave a NaN or an infinity under jax_debug_nans or jax_debug_infs"
                )
            return FloatingPointError(
                f"The statevar.jit function {self.__name__!r} gave a NaN or an infinity "
                "(jax_debug_nans or jax_debug_infs is on). JAX runs the step again to find "
                "where, but the step had been given its variables' buffers (donated), so "
                f"these variables lost their values: {', '.join(repr(v.name) for v in deleted)}. "
                "To find NaNs without losing state, use jax.experimental.checkify in the "
                "step, or run its function without statevar.jit under jax_debug_nans."
            )
        if _is_deleted_error(error):
            # JAX refused the call before running it: the arrays were deleted beforehand.
            return deleted[0]._deleted_error(
                f"The statevar.jit function {self.__name__!r} cannot read"
            )
        for variable in deleted:
            variable._mark_lost(
                f"was donated to the statevar.jit function {self.__name__!r}, which failed"
            )
        return StatevarError(
            f"The statevar.jit function {self.__name__!r} failed after its variables' "
            "buffers were donated; these variables lost their values: "
            f"{', '.join(repr(v.name) for v in deleted)}"
        )

    def _under_transformation(self) -> TraceContextError:
        return under_transformation(self.__name__)

    def _interrupted(self) -> StatevarError:
        """The error for a call made by a signal handler that interrupted a donating update
        (see `ProcessState.donating`)."""
        return interrupted_update_error(f"call the statevar.jit function {self.__name__!r}")

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


def _static_setting(fn: Any, setting: str, value: Any) -> tuple:
    """Returns ``static_argnums`` (ints) or ``static_argnames`` (strs) as a tuple.

    Raises:
      TypeError: for anything but one of them or an iterable of them.
    """
    kind = int if setting == "static_argnums" else str
    if isinstance(value, kind) and not isinstance(value, bool):
        return (value,)
    values = tuple(value) if isinstance(value, (tuple, list, set, frozenset, range)) else None
    if values is None or not all(
        isinstance(item, kind) and not isinstance(item, bool) for item in values
    ):
        name = getattr(fn, "__name__", type(fn).__name__)
        raise TypeError(
            f"Cannot compile {name!r} with statevar.jit: expected {setting} to be "
            f"{'an int' if kind is int else 'a str'} or a sequence of them, got "
            f"{type(value).__name__} {value!r:.60}"
        )
    return values


def _is_deleted_error(error: Exception) -> bool:
    """Whether ``error`` is JAX refusing a deleted array: its Python path's or its C++ fast
    path's message."""
    message = str(error)
    return message.startswith("Array has been deleted") or "has been deleted or donated" in message


def _wrap(wrapper: Any, fn: Any) -> Any:
    """`functools.update_wrapper`, except that ``fn``'s attributes never replace the
    wrapper's own (a callable Module's ``_fn``, say); the others are still exposed."""
    functools.update_wrapper(wrapper, fn, updated=())
    for name, value in getattr(fn, "__dict__", {}).items():
        wrapper.__dict__.setdefault(name, value)
    return wrapper


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
    compiled = JitFunction(fn, **jit_kwargs)
    if isinstance(fn, types.FunctionType):
        return _plain_function(compiled, fn, jit_kwargs)
    # A bound method (an Optimizer's, say), a partial or a callable object belongs to an
    # instance: a deep copy of that instance must get a function compiled for the copy.
    wrapper = _wrap(CompiledFunction(compiled.__call__, compiled, jit_kwargs), fn)
    STATE.compiled_functions.add(wrapper)
    return wrapper


def _plain_function(compiled: JitFunction, fn: Callable, jit_kwargs: dict[str, Any]) -> Any:
    """What `jit` returns for a plain function: a plain function calling ``compiled``. It
    binds as a method, Python calls it fastest, and a deep copy shares it, as it shares any
    function."""
    run = compiled.__call__

    def call(*args: Any, **kwargs: Any) -> Any:
        return run(*args, **kwargs)

    call.jit_function, call._jit_kwargs, call.lower = compiled, jit_kwargs, compiled.lower
    call.memory_report = compiled.memory_report
    STATE.compiled_functions.add(call)
    return _wrap(call, fn)


class CompiledFunction(functools.partial):
    """What `jit` returns for anything but a plain function: a function that binds as a
    method and deep-copies with the instance it belongs to.

    A `functools.partial` of the `JitFunction`'s bound ``__call__``, which Python calls
    almost as fast as a plain function.
    """

    # Set on each instance by `__new__` (a partial has a ``__dict__``), as on the plain
    # functions `jit` returns.
    jit_function: JitFunction
    lower: Callable[..., jax.stages.Lowered]
    memory_report: Callable[..., MemoryReport]
    _jit_kwargs: dict[str, Any]

    def __new__(
        cls, call: Callable, compiled: JitFunction, jit_kwargs: dict[str, Any]
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
