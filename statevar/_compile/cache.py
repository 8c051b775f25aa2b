"""The compiled forms of one `statevar.jit` function, and how a call finds its own.

An `Entry` is one compiled form: the variables it lifts into the trace (in order) and its
`jax.jit` of the pure function (`_pure_step`). Tracing an entry returns what the trace
`Found`; the compiled step takes the variables' arrays and the call's array arguments and
returns every lifted variable's new array, then the result.

A `Cache` owns every entry of one function: it makes them (`Cache.prepare`), replaces them
when a trace finds more to lift (`Cache.retrace`) and brings them up to date
(`Cache.current`), and keeps the indexes that let a call find its entry without flattening
its arguments (`split_call` splits any other). Its invariants:

- ``entries[key]`` is the entry for calls split to ``key`` (see `split_call`).
- A Module in a key is held weakly (see `reference`); when it is freed, `Cache.forget`
  drops the entries keyed on it and their fast-path indexes, before its id can be reused.
- ``by_state[state_key] = (key, structures)`` only while ``entries[key]`` exists, and
  ``state_keys[key]`` holds every state key pointing at ``key``.
- For calls with Modules, ``latest[identity]`` is the key of the one entry kept for the
  same arguments whatever variables their Modules hold (`track`): replacing a Module's
  variable drops the entry that lifted the old one.
- Nothing here refers back to the `Step` but weakly, and no entry refers to itself: an
  entry and what it lifts are freed as soon as the cache lets go of them.
"""

from __future__ import annotations

import contextlib
import operator
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np
from jax import lax

from .._cell import copies as _copies
from .._cell import kernels as _kernels
from .._cell import lifted as _lifted
from .._cell import placement as _placement
from .._cell import variable as _variable
from .._cell.convert import Tracer
from .._cell.tree import (
    Node,
    Structure,
    has_named_variables,
    is_state,
    read_variables,
    variables_and_structure,
)
from .._cell.variable import Variable
from .._errors import TraceContextError
from .._state import STATE
from .._tracing import frames as _frames
from .closure import closure_variables

_ARRAY_TYPES = (jax.Array, np.ndarray, np.generic, bool, int, float, complex)
# The exact types of the concrete (non-tracer) array arguments `statevar.jit` has seen: its
# fast path accepts arguments of these types only. It starts with the NumPy and Python ones
# (not bool: a Python bool argument is static, see `split_call`); no tracer type is ever in.
CONCRETE_ARGUMENT_TYPES: set[type] = {np.ndarray, int, float, complex}


class Found:
    """What one trace of an entry found beyond the variables it lifted.

    Attributes:
      unlifted: variables the function read or assigned that the entry did not lift.
      wanted_refs: variables assigned under a nested JAX transformation (cond, scan, ...)
        that the entry did not hold in a `jax.Ref` and the trace could not move into one
        (see `_frames._lift_into_ref`).
      lifted_refs: variables the trace moved into a `jax.Ref` as it went (no trace again).
      eager: the trace ran under `jax.ensure_compile_time_eval` to create variables (see
        `_frames.Creation`): traced again for the compiled program.

    Any of unlifted, wanted_refs and eager makes the trace a step that gives every variable
    back unchanged: the caller compiles an entry lifting them (`needs_retrace`) and runs
    that instead.
    """

    __slots__ = ("unlifted", "wanted_refs", "lifted_refs", "eager")

    def __init__(
        self,
        unlifted: tuple[Variable, ...],
        wanted_refs: tuple[Variable, ...],
        lifted_refs: tuple[Variable, ...] = (),
        eager: bool = False,
    ):
        self.unlifted = unlifted
        self.wanted_refs = wanted_refs
        self.lifted_refs = lifted_refs
        self.eager = eager

    @property
    def needs_retrace(self) -> bool:
        return bool(self.unlifted or self.wanted_refs or self.eager)


class Traced:
    """Receives the `Found` of the latest trace of an entry's pure function (JAX traces it
    inside `Entry.trace`, or again inside a call with new argument shapes)."""

    __slots__ = ("found",)

    def __init__(self) -> None:
        self.found: Found | None = None


class Entry:
    """One compiled form of a function: the variables it lifts and its `jax.jit`.

    Attributes:
      lifted: the variables whose arrays the step takes (donated) and returns, in order.
      refs: those held in `jax.Ref`s while tracing (assigned under nested transformations).
      split: how the call's arguments were split: ``(treedef, held, arg_variables)``.
      extra: variables lifted because an earlier trace found them (see `Found`).
      jitted: the `jax.jit` of the pure function.
      flags: `_lifted.compile_flags` of ``lifted`` when traced; checked again whenever
        a trainable flag or a sharding changed anywhere (a new ``epoch``).
      structure: `ProcessState.structure_epoch` when made: a Module that let go of a variable
        the entry lifts since makes a new entry, traced again (see `ProcessState.stale`).
      warm: whether the entry has run, its step compiled by JAX for its arguments: a call
        takes the warm call (see `statevar._compile.step.Step`). Cleared by a call given a committed
        argument while ``uncommitted``.
      uncommitted: whether a lifted variable held an uncommitted array when the entry
        became warm (such a call runs as a first call, which commits it).
      traced: receives what the latest trace found (see `last_found`).
      refused: the lifted variables whose donation JAX refused when it lowered the step
        (no output could take the buffer, or the platform does not donate), by index, with
        the cause (see `_copies.refused`).
    """

    __slots__ = (
        "lifted",
        "refs",
        "split",
        "extra",
        "jitted",
        "flags",
        "epoch",
        "structure",
        "warm",
        "uncommitted",
        "refused",
        "traced",
        "unshared",
    )

    def __init__(
        self,
        fn: Callable,
        split: tuple,
        lifted: tuple[Variable, ...],
        extra: tuple[Variable, ...],
        refs: tuple[Variable, ...],
        jit_kwargs: dict[str, Any],
        creation: _frames.Creation,
    ):
        self.lifted, self.refs, self.split, self.extra = lifted, refs, split, extra
        self.traced = Traced()
        pure = _pure_step(fn, split, lifted, refs, self.traced, creation)
        self.jitted = jax.jit(pure, donate_argnums=0, **jit_kwargs)
        self.flags = _lifted.compile_flags(lifted)
        self.epoch = STATE.compile_epoch
        self.structure = STATE.structure_epoch
        self.warm = False
        self.uncommitted = False
        # The sum of the arrays' reference counts in `sys.getrefcount` by `map` when no
        # other object holds any (see `_kernels.SOLE_HOLDER_IN_MAP`).
        self.unshared = _kernels.SOLE_HOLDER_IN_MAP * len(lifted)
        self.refused: dict[int, str] = {}

    def commit_lifted(
        self, dynamic: tuple[Any, ...], replaced: list[tuple[Variable, jax.Array]]
    ) -> None:
        """Before a first call given a committed argument or lifting a committed variable,
        commits each lifted variable that holds an uncommitted array (see `Variable`) to its
        own device, by a copy; appends each variable and the array it held to ``replaced``,
        for `uncommit` to put back if the call is refused before it runs.

        The compiled step's outputs would be committed anyway (JAX commits what it computes
        from a committed array), and a variable committed only by them would make the next
        call compile again. Committing starts a compile epoch for the other steps lifting
        the variable; this entry, about to be traced and compiled for the committed arrays,
        takes it as its own. Call it under `ProcessState.update_lock`, after the placement
        check.
        """
        lifted = self.lifted
        if not any(map(_placement.is_committed, dynamic)) and not any(
            v._value.committed for v in lifted
        ):
            return
        uncommitted = [v for v in lifted if not v._value.committed and not v._value.is_deleted()]
        for variable in uncommitted:
            replaced.append((variable, variable._value))
            variable._replace_array(_placement.put(variable._value, variable._value.sharding))
        if uncommitted and _lifted.compile_flags(lifted) == self.flags:
            self.epoch = STATE.compile_epoch

    def trace(self, arrays: list[jax.Array], dynamic: tuple[Any, ...]) -> Found:
        """Traces the step for these arguments (JAX keeps the trace for the call that
        follows) and returns what it found. Runs nothing and donates nothing."""
        self.jitted.trace(arrays, dynamic)
        found = self.traced.found
        assert found is not None  # set by every trace of the pure function
        return found

    def lowered(self, lower: Callable[[], Any], arrays: list[jax.Array]) -> Any:
        """Runs ``lower``, a lowering of the step for ``arrays`` (JAX keeps it for the call
        that follows, and warns of a refused donation only the first time), and records in
        `refused` the variables whose donation JAX refuses; returns what it returned. Every
        lowering of an entry goes through here, under `ProcessState.update_lock` (the
        warning filters it sets to catch JAX's warning are process state)."""
        lowered, refusal = _copies.lower_checked(lower)
        if refusal is not None:
            self.refused = _copies.refused(refusal, arrays)
        return lowered

    def check_donations(self, arrays: list[jax.Array], dynamic: tuple, action: str) -> None:
        """Before the first call for these arguments, lowers the step (JAX keeps the
        lowering for the call) and applies the copy policy to each variable whose donation
        it refuses: the step would copy it. Runs nothing and donates nothing.

        Raises:
          CopyError: under the copy policy ``"raise"``.
        """
        self.lowered(lambda: self.jitted.lower(arrays, dynamic), arrays)
        if self.refused:
            indices = sorted(self.refused)
            _copies.check_many(
                [self.lifted[i] for i in indices],
                [arrays[i].nbytes for i in indices],
                [self.refused[i] for i in indices],
                action,
            )

    @property
    def last_found(self) -> Found | None:
        """What the latest trace found: JAX traces again, inside a call, for new shapes."""
        return self.traced.found


def uncommit(replaced: list[tuple[Variable, jax.Array]]) -> None:
    """Puts back the uncommitted arrays `Entry.commit_lifted` replaced (a refused call
    leaves every variable as it was, placed nowhere included); the copies were never
    donated. Starts a new compile epoch, as committing did."""
    for variable, array in reversed(replaced):
        variable._replace_array(array)


def _pure_step(
    fn: Callable,
    split: tuple,
    lifted: tuple[Variable, ...],
    refs: tuple[Variable, ...],
    traced: Traced,
    creation: _frames.Creation,
) -> Callable:
    """Returns the pure function an entry compiles: ``(arrays, dynamic) -> (*new arrays of
    the lifted variables, result)``, reporting what each trace found to ``traced``. The
    function's first trace may create variables (see `_frames.Creation`)."""
    treedef, held, _ = split

    def pure(arrays: list[jax.Array], dynamic: tuple[Any, ...]) -> Any:
        values = dict(zip(lifted, arrays, strict=True))
        frame = _frames.Frame("jit", values, {v: jax.new_ref(values.pop(v)) for v in refs})
        frame.creation = creation
        eager = creation.open and creation.eager
        with frame:
            args, kwargs = treedef.unflatten(_merge(treedef.num_leaves, held, dynamic))
            with jax.ensure_compile_time_eval() if eager else contextlib.nullcontext():
                result = fn(*args, **kwargs)
            result = read_variables(result)
        _check_result(fn, result)
        creation.open = False  # a trace completed: later ones create nothing
        lifted_set = set(lifted)
        unlifted = (*frame.unlifted, *(v for v in frame.written if v not in lifted_set))
        traced.found = Found(
            tuple(dict.fromkeys(unlifted)),
            tuple(frame.wanted_refs),
            tuple(frame.lifted_refs),
            eager,
        )
        if traced.found.needs_retrace:
            # Finish this trace (raising out of it would leave JAX's caches of the nested
            # functions' traces holding its tracers) as a step that changes nothing.
            return (*arrays, None)
        final = {v: jax.freeze(ref) for v, ref in frame.refs.items()}
        final.update(frame.values)
        # The variables' values come before the result: XLA gives a donated buffer to the
        # first output of its shape and dtype, which must be the variable's own.
        read = frame.given_read.keys() | set(refs)
        return (
            *(
                _returned(v, old, final[v], written_through=v not in read)
                for v, old in zip(lifted, arrays, strict=True)
            ),
            result,
        )

    return pure


def _returned(variable: Variable, old: Any, new: Any, written_through: bool) -> Any:
    """A lifted variable's new value as the step returns it: pinned to the variable's
    sharding and, if ``written_through`` (the step never read the variable's old value),
    written through its old buffer.

    Writing through (a full-size ``dynamic_update_slice``, which XLA folds away) makes the
    step use the old value, so JAX keeps the argument and its donation: a variable the
    step only writes is updated in place. JAX's ``keep_unused=True`` would keep it too, but
    from JAX 0.11 on a step compiled with it stays cached after it is dropped. Variables
    the step read need nothing (they stay as cheap to trace as before).
    """
    new = _variable.keep_sharding(variable, new)
    if new is old or not written_through:
        return new
    return _variable.keep_sharding(variable, lax.dynamic_update_slice(old, new, (0,) * old.ndim))


_RESULT_TYPES = (jax.Array, np.ndarray, np.generic, int, float, complex)


def _check_result(fn: Callable, result: Any) -> None:
    """Refuses a result JAX cannot return from a compiled function, naming the function
    and where in the result (JAX's own error names statevar's inner function).

    Raises:
      TypeError: for a leaf that is not an array or a number (a Module, say).
    """
    # A Module or Optimizer is a pytree, but a step's variables are not its results.
    holds_state = lambda x: isinstance(x, Node) or has_named_variables(x)  # noqa: E731
    for path, leaf in jax.tree.leaves_with_path(result, is_leaf=holds_state):
        if not isinstance(leaf, _RESULT_TYPES):
            name = getattr(fn, "__name__", type(fn).__name__)
            place = f" at {jax.tree_util.keystr(path)}" if path else ""
            hint = (
                ": its variables stay where they are, to read after the call"
                if holds_state(leaf)
                else ""
            )
            raise TypeError(
                f"The statevar.jit function {name!r} returned a {type(leaf).__name__}{place}; "
                f"a compiled function returns arrays and numbers{hint}"
            )


def _merge(count: int, held: list[tuple[int, Callable[[], Any]]], dynamic: tuple) -> list:
    """The ``count`` leaves of a call: each held argument at its position (``held`` is in
    position order), the array arguments filling the rest in order."""
    leaves, remaining, held_iter = [], iter(dynamic), iter(held)
    next_held = next(held_iter, None)
    for position in range(count):
        if next_held is not None and next_held[0] == position:
            leaves.append(next_held[1]())
            next_held = next(held_iter, None)
        else:
            leaves.append(next(remaining))
    return leaves


def stale(lifted: tuple[Variable, ...], traced_in: int) -> bool:
    """Whether an entry traced in structure epoch ``traced_in``, lifting ``lifted``, may
    read what a Module no longer holds (see `ProcessState.record_structure_change`)."""
    if traced_in == STATE.structure_epoch:
        return False
    if STATE.state_added > traced_in:
        return True
    for variable in lifted:
        record = STATE.replaced.get(id(variable))
        if record is not None and record[0]() is variable and record[1] > traced_in:
            return True
    return False


def reference(argument: Any) -> Callable[[], Any]:
    """Returns a function giving back a non-array argument when the entry is traced.

    A Module is referenced weakly, so that an entry (with its compiled code and the
    Module's variables) does not keep the Module alive: a compiled method must not keep
    every instance it ran on. When the Module is freed, `Cache.forget` drops the entries
    keyed on its id, before the id can be reused. Anything else (a Variable, a static
    argument) is held: its id is in the entry's key.
    """
    if isinstance(argument, Node):
        return weakref.ref(argument)
    return lambda: argument


class Cache:
    """Every entry of one compiled function, by key, and the fast indexes into them (see
    the module's docstring for the invariants)."""

    __slots__ = (
        "fn",
        "jit_kwargs",
        "creation",
        "entries",
        "plans",
        "by_state",
        "state_keys",
        "latest",
        "identities",
        "finalizers",
        "__weakref__",
    )

    def __init__(self, fn: Callable, jit_kwargs: dict[str, Any], creation: _frames.Creation):
        # What every entry compiles: the function, `jax.jit`'s options, and whether its
        # traces may still create variables.
        self.fn, self.jit_kwargs, self.creation = fn, jit_kwargs, creation
        self.entries: dict[Any, Entry] = {}
        # For calls whose arguments are arrays, Variables and Modules only: by argument
        # types, the positions of the Variables and Modules and of the arrays; by argument
        # types and the ids of the Variables and Modules, the entry's key and the
        # structures of the Modules when it was made.
        self.plans: dict[tuple[type, ...], tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self.by_state: dict[tuple, tuple[Any, list[Structure]]] = {}
        self.state_keys: dict[Any, set[tuple]] = {}
        # For calls with Modules: by the call's key without the ids of the Modules'
        # variables, the key of its latest entry (see `track`).
        self.latest: dict[Any, Any] = {}
        self.identities: dict[Any, Any] = {}  # the reverse of ``latest``
        # The finalizers of the Modules in each key (see `add`), detached when it is dropped.
        self.finalizers: dict[Any, list[weakref.finalize]] = {}

    def prepare(
        self, args: tuple, kwargs: dict, is_static: Callable, name: str, may_index: bool
    ) -> tuple[Any, Entry, tuple[Any, ...]]:
        """Splits a call (see `split_call`); returns the key of its entry, the entry (made
        on first use) and its array arguments. Indexes it for `find` if ``may_index``."""
        split = split_call(args, kwargs, is_static, name)
        entry = self.entries.get(split.key)
        if entry is None:
            held = [(position, reference(leaf)) for position, leaf in split.fixed]
            entry = self.compile((split.treedef, held, split.variables), (), ())
            modules = [leaf for _, leaf in split.fixed if isinstance(leaf, Node)]
            self.add(split.key, entry, modules)
        if split.identity is not None:
            self.track(split.identity, split.key)
        if split.indexable and may_index:
            state = tuple(position for position, _ in split.fixed)
            self.index(args, state, split.key, split.structures)
        return split.key, entry, split.dynamic

    def compile(self, split: tuple, extra: tuple, refs: tuple) -> Entry:
        """Makes an entry (traced on its first call) for calls split into ``split``:
        ``(treedef, held arguments, argument variables)``. It lifts the argument variables,
        those the function reaches through its closure, ``extra`` and ``refs`` (held in
        `jax.Ref`s while tracing)."""
        _, _, arg_variables = split
        refs = tuple(dict.fromkeys(refs))
        closure = closure_variables(self.fn)
        lifted = tuple(dict.fromkeys([*arg_variables, *closure, *extra, *refs]))
        return Entry(self.fn, split, lifted, extra, refs, self.jit_kwargs, self.creation)

    def retrace(self, key: Any, entry: Entry, found: Found) -> Entry:
        """Replaces ``entry`` with one lifting what its trace found (see `Found`)."""
        extra = (*entry.extra, *found.unlifted)
        new = self.compile(entry.split, extra, (*entry.refs, *found.wanted_refs))
        self.entries[key] = new
        return new

    def current(self, key: Any, entry: Entry) -> Entry:
        """``entry`` as a call needs it now: made again if, since it was, a Module let go of
        a variable it lifts or a trainable flag or sharding changed (a new compile epoch);
        traced again lifting more if JAX's latest trace found more."""
        if entry.epoch != STATE.compile_epoch:
            if stale(entry.lifted, entry.structure):
                # A Module let go of a variable this step lifted (or came to hold variables
                # where it held none): traced again from scratch, so that the trace reaches
                # what the Modules hold now (what earlier traces found, `extra`, may be
                # what was replaced).
                entry = self.compile(entry.split, (), ())
                self.entries[key] = entry
            elif _lifted.compile_flags(entry.lifted) != entry.flags:
                entry = self.compile(entry.split, entry.extra, entry.refs)
                self.entries[key] = entry
            else:
                entry.epoch, entry.warm = STATE.compile_epoch, False
        found = entry.last_found
        if found is not None and found.needs_retrace:
            entry = self.retrace(key, entry, found)  # JAX traced it again for new shapes
        return entry

    def add(self, key: Any, entry: Entry, modules: list[Node]) -> None:
        """Stores a new entry; ``modules`` are the Modules in its key, held weakly."""
        self.entries[key] = entry
        if modules:
            self.finalizers[key] = [
                weakref.finalize(module, _forget, weakref.ref(self), key) for module in modules
            ]

    def index(
        self, args: tuple, state: tuple[int, ...], key: Any, structures: list[Structure]
    ) -> None:
        """Lets later calls with the same argument types, Variables and Modules (at the
        positions ``state``) find the entry under ``key`` without flattening or walking.

        A call that found another key for the same state (a Module's variable was
        replaced) has had `track` drop that key's entry and indexes first."""
        types = tuple(map(type, args))
        self.plans[types] = (state, tuple(i for i in range(len(args)) if i not in state))
        state_key = (types, tuple(map(id, map(args.__getitem__, state))))
        self.by_state[state_key] = (key, structures)
        self.state_keys.setdefault(key, set()).add(state_key)

    def track(self, identity: Any, key: Any) -> None:
        """Drops the entry a call with the same arguments but other variables in its
        Modules made before (one was replaced): it would keep the old variables and their
        buffers alive, and no call reaches it any more but by putting them back."""
        previous = self.latest.get(identity)
        if previous != key:
            if previous is not None:
                self.forget(previous)
            self.latest[identity], self.identities[key] = key, identity

    def find(self, types: tuple[type, ...], args: tuple) -> tuple[Any, Entry | None, tuple]:
        """The key, entry and array arguments of a call (its arguments ``args``, of types
        ``types``) indexed before, if its Modules still hold the same objects; else
        ``(None, None, ())``."""
        plan = self.plans.get(types)
        if plan is None:
            return _NOT_FOUND
        state, arrays = plan
        indexed = self.by_state.get((types, tuple(map(id, map(args.__getitem__, state)))))
        if indexed is None or not all(s.unchanged() for s in indexed[1]):
            return _NOT_FOUND
        key = indexed[0]
        return key, self.entries[key], tuple(map(args.__getitem__, arrays))

    def clear(self) -> None:
        """Drops every entry and index (see `statevar.clear_caches`)."""
        for key in list(self.entries):
            self.forget(key)
        self.plans.clear()

    def forget(self, key: Any) -> None:
        """Drops the entry under ``key`` and its indexes: a Module in the key was freed, or
        the entry was replaced (see `track` and `index`)."""
        # No iteration over shared dicts: this runs from a finalizer, possibly in the middle
        # of another call that changes them.
        self.entries.pop(key, None)
        for state_key in self.state_keys.pop(key, ()):
            self.by_state.pop(state_key, None)
        identity = self.identities.pop(key, None)
        if identity is not None and self.latest.get(identity) == key:
            del self.latest[identity]
        for finalizer in self.finalizers.pop(key, ()):
            finalizer.detach()  # a no-op for the one running now


_NOT_FOUND: tuple[Any, Entry | None, tuple] = (None, None, ())


def _forget(cache_ref: weakref.ref, key: Any) -> None:
    cache = cache_ref()
    if cache is not None:
        cache.forget(key)


class Split(NamedTuple):
    """A call split by `split_call`."""

    key: Any  # the entry's key: the tree structure, static arguments, ids of the state
    treedef: Any  # the tree structure of ``(args, kwargs)``
    dynamic: tuple[Any, ...]  # the array arguments, in order
    variables: list[Variable]  # the Variables in the arguments and in their Modules
    fixed: list[tuple[int, Any]]  # every other leaf, by position: Variables, Modules, static
    structures: list[Structure]  # how each Module argument's variables were found
    indexable: bool  # every argument an array, a bool, a Variable or a Module (`Cache.index`)
    identity: Any  # the key without the ids of the Modules' variables (see `Cache.track`)


def split_call(
    args: tuple, kwargs: dict, is_static: Callable[[Any, int], bool], name: str
) -> Split:
    """Splits a call's arguments into its entry's key, its array arguments and its state.

    Arrays and numbers are dynamic (unless marked static), Python bools static; Variables
    and Modules are state, keyed by id (a Module also by the ids of its variables, so
    replacing one retraces); anything else is static, keyed by value.

    Raises:
      TypeError: if a static argument is not hashable.
      TraceContextError: if an argument is a tracer (a call inside a JAX transformation).
    """
    # An Optimizer, a pytree of its state, is passed as it is (static, by identity).
    leaves, treedef = jax.tree.flatten(
        (args, kwargs), is_leaf=lambda x: is_state(x) or has_named_variables(x)
    )
    key_parts: list[Any] = [treedef]
    identity_parts: list[Any] = [treedef]
    dynamic, variables, fixed, structures = [], [], [], []
    flat = True  # no static argument among the leaves
    for position, leaf in enumerate(leaves):
        # A Python bool is static, as tf.function and equinox keep it: `if training:`
        # works, each value its own trace. Other numbers are traced, as jax.jit does.
        if (
            isinstance(leaf, _ARRAY_TYPES)
            and leaf.__class__ is not bool
            and not is_static(treedef, position)
        ):
            if isinstance(leaf, Tracer):
                raise under_transformation(name)
            CONCRETE_ARGUMENT_TYPES.add(type(leaf))
            dynamic.append(leaf)
            continue
        if isinstance(leaf, Variable):
            variables.append(leaf)
            key_parts.append((position, id(leaf)))
            identity_parts.append(key_parts[-1])
        elif isinstance(leaf, Node):
            module_variables, structure = variables_and_structure(leaf)
            structures.append(structure)
            variables.extend(module_variables)
            key_parts.append((position, id(leaf), tuple(map(id, module_variables))))
            identity_parts.append((position, id(leaf)))
        elif leaf.__class__ is bool:
            # Static, and one of two singletons: found by identity, as a Variable is, on
            # the fast path of calls indexed by their arguments (`Cache.index`).
            key_parts.append((position, leaf))
            identity_parts.append(key_parts[-1])
        else:
            key_parts.append((position, _static_key(leaf, name)))
            identity_parts.append(key_parts[-1])
            flat = False
        fixed.append((position, leaf))
    if not fixed and not kwargs and all(isinstance(a, _ARRAY_TYPES) for a in args):
        key: Any = len(args)  # the key of `jit`'s fast path for arrays only
    else:
        key = tuple(key_parts)
    indexable = (
        bool(fixed)
        and flat
        and not kwargs
        and len(leaves) == len(args)
        and all(map(operator.is_, leaves, args))
    )
    identity = tuple(identity_parts) if structures else None
    return Split(key, treedef, tuple(dynamic), variables, fixed, structures, indexable, identity)


def under_transformation(name: str) -> TraceContextError:
    return TraceContextError(
        f"Cannot call the statevar.jit function {name!r} inside jax.jit, "
        "jax.grad, jax.vmap or another JAX transformation: it runs as a compiled step of "
        "its own, which reads and assigns variables outside any transformation. Call it "
        f"outside, or use statevar.jit and statevar.grad throughout. To read variables "
        f"under jax.grad or jax.vmap, call the Python function itself ({name}.__wrapped__), "
        "or statevar.stateless_call with it."
    )


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
