"""The compiled step: the `Step` that `statevar.jit` returns, which does the work of every
call.

`Step.__call__` reads top to bottom: the look-up of the call's compiled form (`Cache`), the
warm call, and the first call, which traces, checks devices and donations, and holds
signal handlers around the same body, `Step._run`. See ``docs/architecture.md``.
"""

from __future__ import annotations

import copy
import functools
import inspect
import itertools
import operator
import sys
import types
from collections.abc import Callable
from typing import Any

import jax

from .._cell import kernels as _kernels
from .._cell import lifted as _lifted
from .._cell import placement as _placement
from .._cell import variable as _variable
from .._cell.convert import Tracer
from .._cell.kernels import held_elsewhere
from .._cell.variable import Variable
from .._errors import (
    CopyError,
    StatevarError,
    TraceContextError,
    interrupted_update_error,
    release_frames,
)
from .._signals import held_signals
from .._state import STATE
from .._tracing import frames as _frames
from .._tracing import jax_internals as _jax_internals
from . import memory_report as _memory_report
from .cache import CONCRETE_ARGUMENT_TYPES, Cache, Entry, Found, uncommit, under_transformation
from .memory_report import MemoryReport

# What `Step._run` returns for a call that JAX traced again and that found
# variables to lift (see `Found`): the first call runs it on an entry lifting them.
_MISS = object()
# Bound once: the warm call runs them on every call.
_acquire, _release = STATE.update_lock.acquire, STATE.update_lock.release
_read_array = operator.attrgetter(_variable.ARRAY_ATTRIBUTE)
_getrefcount = sys.getrefcount
_chain_from, _starmap = itertools.chain.from_iterable, itertools.starmap
_stores, _consume = _lifted.stores, _variable.consume
# The types of concrete array arguments seen: `_all_concrete` checks that a call's arguments
# are all of them.
_CONCRETE_TYPES = CONCRETE_ARGUMENT_TYPES
_all_concrete = _CONCRETE_TYPES.issuperset
# Whether each argument is committed to its devices, by `map` (in C), as
# `getattr(argument, COMMITTED_ATTRIBUTE, False)` (see `jax_internals.COMMITTED_ATTRIBUTE`).
_COMMITTED = itertools.repeat(_jax_internals.COMMITTED_ATTRIBUTE)
_NOT_COMMITTED = itertools.repeat(False)


class Step:
    """A function compiled with `jax.jit` whose variable reads and assignments are lifted.

    What `statevar.jit` returns: it binds as a method, as the function it compiles does,
    and Python calls it with no wrapper in between. Its `__call__` reads
    top to bottom: the look-up (a call seen before is found by its argument types, any
    other is split by `split_call` into the key of its compiled form, its array arguments
    and its state, and the `Cache` gives the entry for the key, compiling one on first
    use); the warm call of an entry that has run (JAX's C++ fast path serves its step); and
    the first call of any other (`_first_call`, which traces it first). Both run one body,
    `_run`.
    """

    def __init__(self, fn: Callable, **jit_kwargs: Any):
        self._options = dict(jit_kwargs)  # as given: a deep copy compiles with them again
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
        self._creation = _frames.Creation("")
        self._cache = Cache(fn, jit_kwargs, self._creation)
        self._entries = self._cache.entries  # bound once: the look-up reads it on every call
        # How messages about a call's placement name it, when not as this function (an
        # Optimizer's compiled update is named after the Optimizer).
        self.subject: str | None = None
        wrap(self, fn)
        if not hasattr(self, "__name__"):  # a functools.partial or a callable object
            inner = fn.func if isinstance(fn, functools.partial) else fn
            self.__name__ = getattr(inner, "__name__", type(inner).__name__)
        self._creation.name = self.__name__
        STATE.compiled_functions.add(self)

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
            elif STATE.open_trace_frames and _frames.innermost() is not None:
                # Inside another statevar.jit or statevar.grad: run inline, in its trace.
                return self._fn(*args, **kwargs)
            else:
                entry = None  # keyword arguments, or a trace open in another thread
            if entry is None:
                key, entry, dynamic = self._cache.prepare(
                    args, kwargs, self._is_static, self.__name__, not self._has_static
                )
            # The warm call, when the entry has run and nothing it depends on changed (a
            # trainable flag or a sharding somewhere: a new compile epoch).
            if entry.warm and entry.epoch == STATE.compile_epoch:
                if entry.uncommitted and any(map(getattr, dynamic, _COMMITTED, _NOT_COMMITTED)):
                    # A variable placed nowhere, and an argument committed to a device: the
                    # first call checks their devices and commits the variable.
                    entry.warm = False
                else:
                    result = self._run(entry, dynamic)
                    if result is not _MISS:
                        return result
            # The first call: traced (again), then run as the warm call runs.
            return self._first_call(key, entry, dynamic)
        except BaseException as error:
            release_frames(error)  # a kept error keeps no array (see `release_frames`)
            raise

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        """Binds as a method, as the function it compiles does."""
        return self if instance is None else types.MethodType(self, instance)

    def __copy__(self) -> Step:
        return self

    def __deepcopy__(self, memo: dict) -> Step:
        """A compiled plain function is shared by copies, as any function is. One compiled
        from a bound method (an Optimizer's, say), a partial or a callable object belongs to
        an instance: the copy compiles the deep copy of it, which updates the copied
        variables."""
        if isinstance(self._fn, types.FunctionType):
            return self
        copied = Step(copy.deepcopy(self._fn, memo), **self._options)
        copied.subject = self.subject  # named as the original
        return copied

    def __repr__(self) -> str:
        return f"<statevar.jit function {self.__name__}>"

    def __reduce__(self) -> str:
        """Pickled by reference, as a function is: by its module and qualified name."""
        return vars(self).get("__qualname__", self.__name__)  # set by `wrap`

    def lower(self, *args: Any, **kwargs: Any) -> jax.stages.Lowered:
        """Returns JAX's `jax.stages.Lowered` for a call with these arguments, to inspect
        (``.as_text()``, ``.compile().memory_analysis()``); runs nothing, donates nothing.

        Its first argument is the list of the variables' arrays, the second the call's
        array arguments; its outputs are the variables' new values, then the result.

        Raises:
          PlacementError: if variables and arguments are on different sets of devices.
        """
        key, entry, dynamic = self._prepare(args, kwargs)
        entry = self._cache.current(key, entry)
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
        entry = self._cache.current(key, entry)
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
        its array arguments (see `Cache.prepare`)."""
        return self._cache.prepare(
            args, kwargs, self._is_static, self.__name__, not self._has_static
        )

    def _run(self, entry: Entry, dynamic: tuple[Any, ...]) -> Any:
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
            try:
                # Set while the reference counts are read and the store is built (see
                # `ProcessState.donating`), and cleared right before the store, with no
                # signal check between: the step may run Python (JAX tracing it for new
                # shapes, a jax.debug.callback) that reads and updates variables it did not
                # lift.
                STATE.donating = True
                if sum(map(_getrefcount, arrays)) > entry.unshared:
                    arrays = _kernels.copy_shared(originals, lifted, self.copy_action)
                # The call, made when the store is consumed.
                outputs = _chain_from(_starmap(entry.jitted, ((arrays, dynamic),)))
                stores = _stores(lifted, outputs)
                STATE.donating = False
                _consume(stores)
                result = next(outputs)  # the result, after the variables' arrays
            except CopyError:
                raise  # refused before the call: nothing donated, no variable changed
            except Exception as error:
                raise _lifted.failed_call_error(
                    self._subject, self.__name__, lifted, arrays, error, dynamic
                ) from error
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
                _lifted.put_back(lifted, originals)
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
            _placement.check_step_devices(
                self._subject, entry.lifted, [v._value for v in entry.lifted], dynamic
            )
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
            attempt, functools.partial(self._cache.retrace, key), entry
        )
        # Held in refs from the start if the entry is ever compiled again.
        entry.refs = tuple(dict.fromkeys((*entry.refs, *found.lifted_refs)))
        return entry, arrays

    def _first_call(self, key: Any, entry: Entry, dynamic: tuple[Any, ...]) -> Any:
        """Traces ``entry`` (again with more variables lifted, while the trace finds
        some), checks its donations, then runs it as the warm call does, holding signal
        handlers: JAX's first call runs Python code after donating."""
        entry = self._cache.current(key, entry)  # brought up to date first
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
                    result = self._run(entry, dynamic)
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
            return self._first_call(key, entry, dynamic)
        # A refused donation takes no warm call: each call applies the copy policy of its time.
        entry.warm = not entry.refused
        entry.uncommitted = any(not v._value.committed for v in entry.lifted)
        return result

    @property
    def _subject(self) -> str:
        """How messages about a call's placement name it."""
        return self.subject or f"The statevar.jit function {self.__name__!r}"

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


def wrap(wrapper: Any, fn: Any) -> Any:
    """`functools.update_wrapper`, except that ``fn``'s attributes never replace the
    wrapper's own (a callable Module's ``_fn``, say); the others are still exposed."""
    functools.update_wrapper(wrapper, fn, updated=())
    for name, value in getattr(fn, "__dict__", {}).items():
        wrapper.__dict__.setdefault(name, value)
    return wrapper
