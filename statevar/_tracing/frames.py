"""Trace frames: where variables live while `statevar.jit` or `statevar.grad` traces.

While a transformation traces a function, the variables it lifts are looked up in a frame
on a per-thread stack instead of in the variables themselves. Reads return the frame's
traced value and writes replace it; the variables' own arrays are never touched, so no
tracer can leak into a variable, and other threads keep seeing concrete arrays.

A frame threads values functionally at its own trace level. JAX's own transformations
traced inside it (``lax.cond``, ``lax.scan``, ``jax.checkpoint``, ...) run at deeper levels,
where a plain value written would leak out of its trace. A variable written at such a level
therefore lives in a `jax.Ref` made by the outermost frame from its value (for
`statevar.jit`, from the donated argument): the refs read and write exactly as the Python
would run step by step (an untaken branch does not write, a loop of zero steps changes
nothing) and compile to the same donated buffers. A `statevar.jit` frame makes the ref
where the first such write (or the read of an update about to write, as ``assign_add``)
happens: at its own level, before the nested transformation, so the trace goes on and a
step traces once (`_lift_into_ref`). Where it cannot (the variable was read as a plain value
earlier in a loop still being traced, which would not see the loop's own writes), the
write is recorded in `Frame.wanted_refs` and dropped, and the frame that owns the trace
traces again with refs from the start (`statevar.grad` and `stateless_call` outside
`statevar.jit`, which may be running JAX's transformations for real, stop at that write:
`NeedsRefs`). Variables never written under a nested transformation stay plain values, so
their compiled code is unchanged.

Frames never defeat JAX's caches: they trace under a context value shared while it is safe
to share (see `_frame_context`), so a warm eager `statevar.grad` compiles nothing and a
dropped compiled step leaves nothing cached behind.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, NoReturn, Protocol, TypeVar, cast

import jax
from jax import lax
from jax.core import Tracer

from .._errors import TraceContextError
from .._state import STATE
from . import jax_internals as _jax_internals
from . import nesting as _nesting

Result = TypeVar("Result")
State = TypeVar("State")


class Lifted(Protocol):
    """A variable as frames see it (`statevar.Variable`, a higher floor): a hashable cell
    known by its name."""

    @property
    def name(self) -> str: ...

    def __hash__(self) -> int: ...


# This thread's stack of open frames (``.stack``), private to this module. How many are open
# in all threads is `ProcessState.open_trace_frames`, which reads and updates test first (the
# eager hot path tests `ProcessState.hot_epoch`, which it keeps off while any frame is open).
_thread_frames = threading.local()


# JAX caches the traces of the functions given to its transformations (a scan's body, a
# cond's branches, a nested jax.jit) by function and input types, with the values they close
# over: a function reading a variable in such a nested trace closes over the frame's value.
# JAX also keys those caches, and its caches of compiled operations, on the values of
# `jax.make_user_context` contexts. Frames trace under a value of this context that they
# share, this thread's `_Generation`, so that eager code under them (an eager
# `statevar.grad`'s operations) finds its compiled operations again, and a dropped step
# leaves no cache entry behind. A generation is spent while a function JAX traced under it,
# closing over a variable's value (a frame's, or one read as it stands), is alive (its
# cache entries live as long as it does): a frame assigning at its own level then moves to
# a new one (a function traced before the assignment, reading the old value, is traced
# again when used after it), and so does the frame around one that closes, and every frame
# opened later. A function made anew for each call (a lambda in the loss) is gone by then:
# the generation goes on.
_frame_context = jax.make_user_context(None)


class _Generation:
    """One value of `_frame_context`, compared by identity (two generations never share a
    cache entry), and the functions JAX traced under it that closed over a frame's value.
    """

    __slots__ = ("_closures", "_unknown")

    def __init__(self) -> None:
        self._closures: dict[int, weakref.ref] = {}
        # A closure JAX traced by a function not found (or not weakly referable).
        self._unknown = False

    def record(self, functions: list[Any], traces: int) -> None:
        """Records the functions of ``traces`` cached traces that closed over a value."""
        if len(functions) < traces:
            self._unknown = True
        for function in functions:
            known = self._closures.get(id(function))
            if known is None or known() is not function:  # (an id a freed one had)
                try:
                    self._closures[id(function)] = weakref.ref(function)
                except TypeError:
                    self._unknown = True

    def spent(self) -> bool:
        """Whether a function that closed over a frame's value under it is still alive."""
        if self._unknown:
            return True
        alive = {key: ref for key, ref in self._closures.items() if ref() is not None}
        self._closures = alive
        return bool(alive)


def _generation() -> _Generation:
    """This thread's current generation (see `_frame_context`): a new one once spent."""
    generation = getattr(_thread_frames, "generation", None)
    if generation is None or generation.spent():
        generation = _thread_frames.generation = _Generation()
    return generation


class Frame:
    """Values of the variables one transformation has lifted, while it traces.

    Attributes:
      kind: ``"jit"``, ``"grad"`` or ``"stateless"`` (`statevar.stateless_call`, whose
        values are those given to it, and which owns every assignment made inside it).
      values: the current traced value of each variable held as a plain value.
      refs: the `jax.Ref` of each variable written under a nested transformation.
      differentiated: the variables a grad frame differentiates (never written).
      written: the variables assigned at the frame's own level.
      unlifted: variables read while tracing that the frame did not lift; their concrete
        values were used (jit frames only).
      wanted_refs: variables written under a nested transformation that have no ref yet:
        the frame traces again with refs for them (outermost frames only).
    """

    def __init__(self, kind: str, values: dict[Any, Any], refs: dict[Any, Any]):
        self.kind = kind
        self.values = values
        self.refs = refs
        self.differentiated: frozenset[Any] = frozenset(values) if kind == "grad" else frozenset()
        self.written: dict[Any, None] = {}
        # The variables whose given value (the one the frame started with) the trace read:
        # a `statevar.jit` step writes the others through their old buffer, which JAX would
        # otherwise prune with its donation (see `statevar._compile.entry._returned`).
        self.given_read: dict[Any, None] = {}
        self.unlifted: dict[Any, None] = {}
        self.wanted_refs: dict[Any, None] = {}
        # The variables moved into refs while the frame traced (see `_lift_into_ref`).
        self.lifted_refs: dict[Any, None] = {}
        # For each variable read as a plain value under a loop's trace, the ids of those
        # loop traces (see `_lift_into_ref`).
        self._loop_reads: dict[Any, set[int]] = {}
        # The variables in `refs` written while the frame traced (the others keep the
        # value they were given).
        self.ref_written: dict[Any, None] = {}
        # Reads under a while_loop's cond_fun: (the trace the loop was called in, variable).
        self._while_reads: list[tuple[Any, Any]] = []
        self._state: Any = None
        self._trace: Any = None
        # The values of the frame context entered (see `_frame_context`), the latest last,
        # and the Python frame that entered this one.
        self._contexts: list[Any] = []
        self._generation: _Generation | None = None
        self._python_frame: Any = None
        # For a statevar.jit frame: whether its trace may create variables (see `Creation`).
        self.creation: Creation | None = None

    def __enter__(self) -> Frame:
        self._python_frame = sys._getframe(1)
        self._enter_generation()
        self._state = _jax_internals.trace_state()
        self._trace = _jax_internals.current_trace()
        _stack().append(self)
        STATE.enter_trace_frame()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        stack = _stack()
        stack.pop()
        self._trace = self._python_frame = self._generation = None
        while self._contexts:
            self._contexts.pop().__exit__(*exc_info)
        if stack:
            # Under a new generation if a function that closed over this frame's values is
            # alive (see `_frame_context`).
            stack[-1]._enter_generation()
        STATE.exit_trace_frame()
        error = exc_info[1]
        if isinstance(error, NotImplementedError) and "vmap-of-cond" in str(error) and self.refs:
            # Under jax.vmap, a cond or switch on a batched predicate runs both branches and
            # selects: JAX cannot do that with a ref's writes.
            names = ", ".join(repr(v.name) for v in self.refs)
            which = "Variable" if len(self.refs) == 1 else "Variables"
            raise TraceContextError(
                f"Cannot assign {which} {names} under jax.lax.cond or switch with a "
                "predicate batched by jax.vmap: both branches run and one is selected per "
                "element, which JAX cannot do with a variable's update. Compute both values "
                "and assign jnp.where(predicate, new, old) outside the cond."
            ) from error

    def _enter_generation(self) -> None:
        """Enters this thread's current generation as the frame context's value, unless it
        is the value entered last (see `_frame_context`)."""
        generation = _generation()
        if generation is self._generation:
            return
        context = _frame_context(generation)
        context.__enter__()
        self._contexts.append(context)
        self._generation = generation


def _stack() -> list[Frame]:
    stack = getattr(_thread_frames, "stack", None)
    if stack is None:
        stack = _thread_frames.stack = []
    return stack


def innermost() -> Frame | None:
    """Returns this thread's innermost frame, or None."""
    stack = getattr(_thread_frames, "stack", None)
    return stack[-1] if stack else None


def is_escaped(value: Any) -> bool:
    """Whether ``value`` is a tracer of no trace running here: one kept by a side effect
    (appended to a list inside ``jax.jit``, say) after its transformation finished. JAX
    refuses it only once the step's trace ends, naming no variable."""
    return isinstance(value, Tracer) and _jax_internals.is_escaped_tracer(value)


def escaped_tracer_error(subject: str) -> TraceContextError:
    """The error for a step (``subject``: ``"The statevar.jit function 'step'"``) that used
    a tracer escaped from the transformation that made it, which JAX found (see
    `is_escaped`); nothing was changed."""
    return TraceContextError(
        f"{subject} used a tracer that escaped the JAX transformation that made it (kept "
        "by a side effect, such as appending to a list inside jax.jit), so it holds no "
        "value; no variable was changed. Return values from transformed functions instead "
        "of saving them."
    )


def read(var: Lifted) -> Any | None:
    """Returns ``var``'s traced value in this thread's frames, or None to read it eagerly.

    A jit frame that has not lifted ``var`` records it as unlifted, so `statevar.jit` can
    lift it on the next trace.

    Raises:
      TraceContextError: if ``var`` lives in a ref and is read where a ref cannot be (a
        `jax.custom_jvp` function).
    """
    stack = getattr(_thread_frames, "stack", None)
    if not stack:
        return None
    for frame in reversed(stack):
        if frame.refs:
            ref = frame.refs.get(var)
            if ref is not None:
                _nesting.check_ref_read(frame, var)
                _note_closure(frame)
                level = _nesting.read_level(frame)
                if level is None:
                    return ref[...]
                with _jax_internals.tracing_at(level):
                    return ref[...]
        value = frame.values.get(var)
        if value is not None:
            if var not in frame.written:
                frame.given_read[var] = None
            if _jax_internals.trace_state() != frame._state:
                _note_nested_read(frame, var)
            return value
    for frame in stack:
        if frame.kind == "jit":
            frame.unlifted[var] = None
            break
    if _jax_internals.trace_state() != stack[-1]._state:
        # Read as its concrete value by a function JAX traces under the frames (and caches,
        # with that value): traced again once the value may have changed.
        _record_closure(stack[0], _nesting.traces_below(stack[0]))
    return None


def write(var: Lifted, value: Any, operation: str) -> None:
    """Records an assignment to ``var`` made while a frame traces.

    At the innermost frame's own level the value replaces the frame's. Under a nested
    transformation it goes into the variable's ref; a variable without one is recorded in
    the owning frame's `Frame.wanted_refs`, and that frame traces again: a `statevar.jit`
    frame finishes its trace with the write dropped, any other stops here (`NeedsRefs`).
    Inside `statevar.grad` the stored value is not differentiated through
    (``stop_gradient``), as TensorFlow's tape treats ``assign``.

    Raises:
      TraceContextError: if ``var`` is being differentiated by `statevar.grad`, or the
        write is under a transformation that cannot carry it out (``jax.vmap``, a
        ``jax.custom_jvp`` function, a while loop whose cond_fun reads ``var``).
    """
    stack = _stack()
    # A `statevar.stateless_call` owns every assignment made inside it: the frames from the
    # innermost stateless one on are those that see this write.
    scope = stack[_innermost_stateless(stack) :]
    for frame in scope:
        if var in frame.differentiated:
            raise TraceContextError(
                f"Cannot {operation} Variable '{var.name}' inside statevar.grad, which "
                "differentiates with respect to it. Make a variable the forward pass updates "
                "(batch-norm statistics, a counter) non-trainable, or return the new value "
                "(with has_aux=True) and assign it after the gradient call."
            )
    for frame in reversed(scope):
        if frame.refs:
            ref = frame.refs.get(var)
            if ref is not None:
                _nesting.check_nested_write(
                    frame, var, operation, has_ref=True, differentiating=_differentiating()
                )
                _note_closure(frame)
                ref[...] = lax.stop_gradient(value)
                frame.ref_written[var] = None
                return
    owner = scope[0]
    if owner.kind == "stateless" and var not in owner.values:
        raise TraceContextError(
            f"Cannot {operation} Variable '{var.name}' inside statevar.stateless_call: it is "
            "not among the call's target variables, and a stateless call changes no "
            "variable. Add it to the target (its new value is then returned)."
        )
    frame = stack[-1]
    if _jax_internals.trace_state() == frame._state:
        if frame.kind == "grad":
            value = lax.stop_gradient(value)
        frame.values[var] = value
        frame.written[var] = None
        # A function JAX traced before, reading the old value, is traced again when used
        # after this (see `_frame_context`).
        frame._enter_generation()
        return
    if _lift_into_ref(stack, var, operation):
        write(var, value, operation)  # now into the ref
        return
    _nesting.check_nested_write(
        owner, var, operation, has_ref=False, differentiating=_differentiating()
    )
    owner.wanted_refs[var] = None
    if owner.kind != "jit":
        # statevar.grad and stateless_call outside statevar.jit may be running JAX's
        # transformations for real: a loop whose end depends on the dropped write would never
        # end. Stop here; the owner traces again with a ref.
        raise NeedsRefs(owner)


def prepare_update(var: Lifted, operation: str) -> None:
    """Called by an update that reads ``var`` to compute its new value (``assign_add``,
    ``v[i] = x``) while a frame traces, before it reads: an update under a nested
    transformation moves ``var`` into a ref first (see `_lift_into_ref`), so that the read
    is the ref's, exact in a loop.

    Raises:
      TraceContextError: as `write` would for the update.
    """
    stack = getattr(_thread_frames, "stack", None)
    if stack:
        _lift_into_ref(stack, var, operation)


def _lift_into_ref(stack: list[Frame], var: Lifted, operation: str) -> bool:
    """Moves ``var`` into a `jax.Ref` made at its `statevar.jit` frame's own level from the
    value it holds there, for a write under a nested transformation; returns whether it did.

    The ref is made where the jit frame's trace stands, before the nested transformation
    (which JAX records once its function is traced), so the step reads and writes it in
    the order the Python runs, and the trace goes on: it is not traced again. Not when the
    variable was read as a plain value in a loop (scan, fori_loop, while_loop) still being
    traced: that read would not see the loop's earlier iterations; the frame traces again
    with the ref from the start (`Frame.wanted_refs`).

    Raises:
      TraceContextError: if the write is under a transformation that cannot carry it out.
    """
    if _jax_internals.trace_state() == stack[-1]._state:
        return False  # at the innermost frame's own level: a plain value
    scope = stack[_innermost_stateless(stack) :]
    owner = scope[0]
    if owner.kind != "jit" or var not in owner.values:
        return False
    for frame in scope:
        if var in frame.refs or var in frame.differentiated:
            return False  # `write` uses the ref, or refuses the write
        if frame is not owner and var in frame.values:
            return False  # an inner frame holds a newer value
    _nesting.check_nested_write(
        owner, var, operation, has_ref=False, differentiating=_differentiating()
    )
    loop_reads = owner._loop_reads.get(var)
    if loop_reads and any(id(trace) in loop_reads for trace in _nesting.traces_below(owner)):
        return False
    if var not in owner.written:
        owner.given_read[var] = None
    with _jax_internals.tracing_at(owner._trace):
        owner.refs[var] = jax.new_ref(owner.values.pop(var))
    owner.lifted_refs[var] = None
    return True


def _note_nested_read(frame: Frame, var: Lifted) -> None:
    """Records a read of ``frame``'s plain value of ``var`` under a nested transformation:
    in a loop's function (see `_lift_into_ref`) or a while loop's cond_fun (see
    `_nesting.check_nested_write`), and as a closure JAX may cache (see `_note_closure`)."""
    traces = _nesting.traces_below(frame)
    for trace in traces:
        traced_for = _jax_internals.transformation_of(trace)
        if traced_for == "while_cond":
            frame._while_reads.append((_jax_internals.enclosing_trace(trace), var))
        if traced_for is not None and traced_for not in _nesting.RUN_ONCE:
            frame._loop_reads.setdefault(var, set()).add(id(trace))
    _record_closure(frame, traces)


class NeedsRefs(Exception):
    """Stops the trace owned by a `statevar.grad` or `statevar.stateless_call` frame (one
    not inside `statevar.jit`'s) at a write under a nested transformation to a variable
    without a ref; that call traces again with refs for the frame's `Frame.wanted_refs`
    (see `trace_with_refs`)."""

    def __init__(self, owner: Frame):
        super().__init__(owner)
        self.owner = owner


def retrace(
    attempt: Callable[[State], tuple[Result, Any]],
    grow: Callable[[State, Any], State],
    state: State,
) -> tuple[Result, State]:
    """The retrace loop, the one statevar has: runs ``attempt(state)``, which traces and
    returns its result and what the trace found missing (falsy when nothing), and again on
    ``grow(state, missing)`` until nothing is missing; returns the last result and state.

    `statevar.jit` grows an entry lifting more variables (`statevar._compile.step`); `statevar.grad`
    and `stateless_call` grow the refs their frames hold (`trace_with_refs`). A result given up is
    released before the next attempt: an array it held would look shared, and be
    copied rather than donated.
    """
    while True:
        result, missing = attempt(state)
        if not missing:
            return result, state
        del result
        state = grow(state, missing)


def trace_with_refs(
    make_frame: Callable[[tuple[Any, ...]], Frame],
    run: Callable[[Frame], Result],
    refs: tuple[Any, ...] = (),
) -> tuple[Result, Frame, tuple[Any, ...]]:
    """Runs ``run`` on a frame ``make_frame(refs)`` holds ``refs`` in refs, and again (see
    `retrace`) on one holding more while the trace writes a variable without a ref under a
    nested transformation (the frame's `Frame.wanted_refs`, or `NeedsRefs` stopping it): for
    `statevar.grad` and `statevar.stateless_call`, whose frames own their refs. (A
    `statevar.jit` frame's trace goes on, and its step traces again, see `statevar._compile.step`.)

    Returns:
      What the last run returned, its frame, and the refs it held.
    """

    def attempt(refs: tuple[Any, ...]) -> tuple[tuple[Any, Frame], tuple[Any, ...]]:
        frame = make_frame(refs)
        try:
            result = run(frame)
        except NeedsRefs as stop:
            if stop.owner is not frame:
                raise  # an enclosing frame owns the write: it traces again
            result = None  # never returned: the frame wants refs
        return (result, frame), tuple(frame.wanted_refs)

    def grow(refs: tuple[Any, ...], wanted: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(dict.fromkeys((*refs, *wanted)))

    (result, frame), refs = retrace(attempt, grow, refs)
    return cast(Result, result), frame, refs


def _note_closure(frame: Frame) -> None:
    """Records the functions JAX is tracing, nested between the current trace and
    ``frame``'s, as closing over ``frame``'s value (see `_frame_context`). Differentiation
    and batching traces are not cached."""
    if _jax_internals.trace_state() != frame._state:
        _record_closure(frame, _nesting.traces_below(frame))


def _record_closure(frame: Frame, traces: list[Any]) -> None:
    cached = sum(map(_jax_internals.is_cached_kind, traces))
    active = _stack()[-1]._generation  # the context value JAX keyed those traces on
    if cached and active is not None:
        active.record(_jax_internals.traced_functions(frame._python_frame), cached)


def _differentiating() -> bool:
    """Whether a `statevar.grad` frame is open in this thread."""
    return any(frame.kind == "grad" for frame in _stack())


def _innermost_stateless(stack: list[Frame]) -> int:
    """The index in ``stack`` of its innermost stateless frame, or 0 if there is none."""
    for index in range(len(stack) - 1, 0, -1):
        if stack[index].kind == "stateless":
            return index
    return 0


class Creation:
    """Whether a `statevar.jit` function's traces may create variables, as ``tf.function``
    lets a function's first trace create them (a Keras-style Module built on its first call,
    a Generator, an Optimizer's state). One per compiled function, shared by its entries.

    A first trace that creates a variable stops there (`NeedsEagerTrace`) and runs again
    under `jax.ensure_compile_time_eval`: values not computed from the step's traced
    arguments are then concrete, and every creation of the first call is made in that one
    trace, once. The trace that follows, for the compiled program, lifts what it created.

    Attributes:
      name: the function's name, for messages.
      open: True until a trace of the function completes: only its first trace creates
        (a trace for a new input signature may not).
      eager: the next trace runs the function under `jax.ensure_compile_time_eval`. A
        trace run so is always traced again, without it, for the compiled program.
    """

    __slots__ = ("name", "open", "eager")

    def __init__(self, name: str) -> None:
        self.name = name
        self.open = True
        self.eager = False


class NeedsEagerTrace(Exception):
    """Stops a `statevar.jit` function's first trace at its first creation of a variable,
    before anything is created: the trace runs again under `jax.ensure_compile_time_eval`
    (see `Creation`)."""


def check_creation(subject: str) -> Frame | None:
    """Checks that ``subject`` (``"Variable 'w'"``, a Generator, an Optimizer's state) may be
    created here: anywhere outside statevar's transformations, and in the first trace of a
    `statevar.jit` function at the step's own level (see `Creation`).

    Returns:
      The `statevar.jit` frame creating it (its initial value is then computed under
      `jax.ensure_compile_time_eval`, see `refuse_traced_initial_value`), or None outside
      any frame.

    Raises:
      NeedsEagerTrace: in a function's first trace not yet run under
        `jax.ensure_compile_time_eval`.
      TraceContextError: inside `statevar.grad` or `stateless_call`; under a JAX
        transformation inside `statevar.jit` (``lax.cond``, ``lax.scan``, ...); in a trace
        of a `statevar.jit` function after its first.
    """
    frame = innermost()
    if frame is None:
        return None
    if frame.kind != "jit":
        where = "statevar.grad" if frame.kind == "grad" else "statevar.stateless_call"
        raise TraceContextError(
            f"Cannot create {subject} inside {where}: a variable holds state across calls, "
            f"and {where} runs its function anew at each call. Create it outside the "
            "function (a statevar.jit step may create variables in its first trace, as "
            "tf.function does, but not inside a gradient)."
        )
    creation = frame.creation
    step = f"the statevar.jit function {creation.name!r}" if creation else "a statevar.jit step"
    nested = _nesting.traces_below(frame)
    if nested:
        transformations = [_jax_internals.transformation_of(t) for t in nested]
        named = next((t for t in transformations if t), "a JAX transformation")
        raise TraceContextError(
            f"Cannot create {subject} under {named} inside {step}: JAX traces a branch or "
            "loop body whether or not it runs, so the variable would exist either way. "
            f"Create it at the step's own level, before the {named.split(' ')[0]}."
        )
    if creation is None or not creation.open:
        raise TraceContextError(
            f"Cannot create {subject} inside {step} after its first trace: a step creates "
            "its variables once, in its first trace, as tf.function does. This trace is for "
            "a new input signature, or the function creates a variable on every call. "
            "Create it on the first call only (if self.kernel is None: ...), or outside "
            "the step."
        )
    if not creation.eager:
        raise NeedsEagerTrace()
    return frame


def refuse_traced_initial_value(frame: Frame, subject: str) -> NoReturn:
    """Refuses a variable's initial value that is traced in ``frame``'s first trace, run
    under `jax.ensure_compile_time_eval`: it depends on the step's traced arguments (or on a
    variable's value in the step).

    Raises:
      TraceContextError: always.
    """
    creation = frame.creation
    step = f"the statevar.jit function {creation.name!r}" if creation else "a statevar.jit step"
    raise TraceContextError(
        f"Cannot create {subject} inside {step} from a traced value: its initial value "
        "depends on the step's arguments or on a variable's value in the step, as "
        "tf.function refuses. Compute it from shapes, constants and keys (for example "
        "jnp.zeros((x.shape[-1], 4))), or create it from those and assign the traced value."
    )


def check_outside(action: str, reason: str) -> None:
    """Refuses ``action`` while a statevar transformation traces, saying ``reason``.

    Raises:
      TraceContextError: if a `statevar.jit`, `statevar.grad` or `stateless_call` frame is
        open.
    """
    frame = innermost()
    if frame is not None:
        where = {"jit": "statevar.jit", "grad": "statevar.grad"}.get(
            frame.kind, "statevar.stateless_call"
        )
        raise TraceContextError(f"Cannot {action} inside {where}: {reason}")
