"""`statevar.grad` and `statevar.value_and_grad`: gradients with respect to variables."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._cell.tree import Node, is_differentiable, is_variable, read_variables, variable_tree
from .._cell.variable import Variable
from .._errors import TraceContextError
from .._tracing import frames as _frames
from .._tracing import jax_internals as _jax_internals
from .._tracing import nesting as _nesting


def value_and_grad(fn: Callable, wrt: Any, has_aux: bool = False) -> Callable:
    """Returns a function computing ``fn`` and its gradient with respect to variables.

    Like ``tf.GradientTape``: ``fn`` reads variables by closure (no arguments needed) or
    takes arguments; the trainable, floating-point variables in ``wrt`` are differentiated
    and every other variable is a constant. Works eagerly and inside `statevar.jit`, with
    JAX's control flow (``lax.cond``, ``lax.scan``, ...) inside ``fn``. ``fn`` may assign
    variables it is not differentiated with respect to (batch-norm statistics, a counter):
    each assignment applies once, after the gradient is computed, and stores its value
    without differentiating through it, as ``tf.GradientTape`` treats ``assign``. No
    buffer is donated during the call; after it every variable holds a concrete array.

    Args:
      fn: a function returning a scalar (or ``(scalar, aux)`` with ``has_aux=True``).
      wrt: a Variable, a Module, or a list, tuple or dict of them.
      has_aux: whether ``fn`` returns ``(value, aux)``.

    Returns:
      A function taking ``fn``'s arguments and returning ``(value, grads)`` (or
      ``((value, aux), grads)``). ``grads`` mirrors ``wrt``: a Module gives a dict keyed by
      variable name; the slot of a non-trainable or integer variable, or of one the loss
      does not reach (unread, read only for ``aux`` or through ``stop_gradient``), holds
      None, as ``tf.GradientTape`` gives. So does every slot when the loss is an integer
      or bool (no gradient flows from it; JAX would raise a ``TypeError``).

    Raises:
      TypeError: if ``wrt`` is not a Variable, Module or container of them, or ``fn``
        returns anything but a real floating-point scalar (first in a pair with
        ``has_aux=True``).
      TraceContextError: if ``fn`` creates a variable, assigns one it is differentiated
        with respect to, or assigns one where JAX cannot carry the update (see
        ``docs/training.md``), or uses a tracer that escaped another transformation.

    Example:
      >>> import statevar
      >>> w = statevar.Variable(3.0)
      >>> counter = statevar.Variable(2.0, trainable=False)
      >>> loss, (dw, dc) = statevar.value_and_grad(lambda: w * w * counter, [w, counter])()
      >>> float(loss), float(dw), dc
      (18.0, 12.0, None)
    """
    variable_tree(wrt, "statevar.grad's wrt")
    # Eager calls only: the variables the function assigned under nested JAX
    # transformations, held in refs from then on (see `statevar._tracing.frames`). Calls in several
    # threads share it: each reads the tuple once and a call that learns more replaces it whole, so
    # no call sees it change while iterating (an update lost to a race only costs another
    # call one more trace).
    learned_refs: list[tuple[Variable, ...]] = [()]

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return _value_and_grad_call(fn, wrt, has_aux, learned_refs, args, kwargs)
        except jax.errors.UnexpectedTracerError as error:
            name = getattr(fn, "__name__", type(fn).__name__)
            raise _frames.escaped_tracer_error(f"The statevar.grad function {name!r}") from error

    return wrapped


def _value_and_grad_call(
    fn: Callable,
    wrt: Any,
    has_aux: bool,
    learned_refs: list[tuple[Variable, ...]],
    args: tuple,
    kwargs: dict,
) -> Any:
    """One call of `value_and_grad`'s function: traces ``fn`` in a grad frame (again, with
    refs, while it assigns under a nested transformation), applies its assignments, and
    returns the value and the gradients, shaped as ``wrt``."""
    tree = variable_tree(wrt, "statevar.grad's wrt")
    leaves, treedef = jax.tree.flatten(tree, is_leaf=is_variable)
    lifted = list(dict.fromkeys(v for v in leaves if is_differentiable(v)))
    outermost = _frames.innermost() is None
    differentiated = frozenset(lifted)
    reached: set[int] = set()

    def make_frame(learned: tuple[Variable, ...]) -> _frames.Frame:
        # Outside statevar.jit, this frame owns the refs; inside, the jit frame does. A
        # variable differentiated now (trainable since) is read as a primal, never a ref.
        refs = {v: jax.new_ref(v._read()) for v in learned if v not in differentiated}
        return _frames.Frame("grad", {}, refs if outermost else {})

    def run(frame: _frames.Frame) -> Any:
        reached.clear()

        def pure(primals: list[jax.Array]) -> Any:
            marked = _jax_internals.reach_probe(primals, _recorder(reached))
            frame.values = dict(zip(lifted, marked, strict=True))
            frame.differentiated = differentiated
            try:
                with frame:
                    out = read_variables(fn(*args, **kwargs))
                # Assignments made at this level come out as values, applied afterwards.
                written = [frame.values[v] for v in frame.written]
            finally:
                frame.values = {}  # the frame outlives the trace: it keeps none of its tracers
            loss, aux = out if has_aux else (out, None)
            _check_loss(fn, loss, has_aux)
            if _is_integer(loss):
                # No gradient flows from an integer target, as in tf.GradientTape: JAX
                # differentiates a float zero of its shape, which reaches no variable.
                return jnp.zeros(jnp.shape(loss)), (aux, written, loss)
            return loss, (aux, written, None)

        primals = [v._read() for v in lifted]
        (loss, (aux, written, integer_loss)), gradients = jax.value_and_grad(pure, has_aux=True)(
            primals
        )
        return (loss if integer_loss is None else integer_loss, (aux, written)), gradients

    out, frame, learned_refs[0] = _frames.trace_with_refs(make_frame, run, learned_refs[0])
    (value, (aux, written)), gradients = out
    _apply_assignments(frame, written, outermost)
    # A variable the loss does not reach gets None, as tf.GradientTape gives.
    by_variable = {v: gradients[i] for i, v in enumerate(lifted) if i in reached}
    grads = treedef.unflatten([by_variable.get(v) for v in leaves])
    if isinstance(wrt, Node):
        # Keep the module's order (JAX rebuilds dicts with sorted keys).
        grads = {name: grads[name] for name in tree}
    return ((value, aux) if has_aux else value), grads


def _check_loss(fn: Callable, loss: Any, has_aux: bool) -> None:
    """Refuses a value `value_and_grad`'s function returned that has no gradient.

    Raises:
      TypeError: unless it is a real floating-point scalar, or an integer or bool (whose
        gradients are None, see `value_and_grad`), naming the function.
    """
    if _is_integer(loss):
        return
    try:
        shape, dtype = jnp.shape(loss), jnp.result_type(loss)
    except TypeError:
        shape, dtype = None, None
    if shape == () and dtype is not None and jnp.issubdtype(dtype, jnp.floating):
        return
    name = getattr(fn, "__name__", type(fn).__name__)
    given = f"{type(loss).__name__} {loss!r:.60}" if shape is None else f"shape {shape} {dtype}"
    raise TypeError(
        f"Cannot differentiate {name!r} with statevar.grad: expected it to return a real "
        f"floating-point scalar (a loss){' first in a (loss, aux) pair' if has_aux else ''}, "
        f"got {given}"
    )


def _apply_assignments(frame: _frames.Frame, written: list[Any], outermost: bool) -> None:
    """Applies, after the gradient, what the differentiated function assigned: the values
    ``written`` at the frame's own level, and what the refs the call wrote hold (a variable
    once written under a nested transformation has a ref in every later call, which may not
    write it).

    Raises:
      TraceContextError: for an assignment in an eager `statevar.grad` inside `jax.vmap`.
    """
    refs = {v: ref for v, ref in frame.refs.items() if v in frame.ref_written}
    if outermost and (frame.written or refs) and _nesting.enclosing_vmap() is not None:
        assigned = next(iter((*frame.written, *refs)))
        raise TraceContextError(
            f"Cannot assign Variable '{assigned.name}' in statevar.grad inside jax.vmap: "
            "the function runs once for the whole batch, while a variable holds one value, "
            "not one per batch element. Return the new values (with has_aux=True) and "
            "assign a reduction of them outside the vmap, or use statevar.jit around it."
        )
    for variable, new in zip(frame.written, written, strict=True):
        variable.assign(new)
    for variable, ref in refs.items():
        variable.assign(jax.freeze(ref))


def _is_integer(loss: Any) -> bool:
    """Whether ``loss`` is a bool or integer scalar or array (a Python one too)."""
    if isinstance(loss, int):
        return True
    dtype = getattr(loss, "dtype", None)
    return isinstance(dtype, np.dtype) and dtype.kind in "biu"


def _recorder(reached: set[int]) -> Callable[[list[bool]], None]:
    """What the reach probe of one call reports to: it adds the indices of the primals the
    loss reached to ``reached`` (see `jax_internals.reach_probe`). A new one each call, so
    that the backward passes of nested calls (a `statevar.grad` inside another's function)
    record into their own sets."""

    def record(flags: list[bool]) -> None:
        reached.update(index for index, flag in enumerate(flags) if flag)

    return record


def grad(fn: Callable, wrt: Any) -> Callable:
    """Returns a function computing the gradient of ``fn`` with respect to variables.

    See `value_and_grad`, of which this returns only the gradients.

    Example:
      >>> import statevar
      >>> w = statevar.Variable([1.0, 2.0])
      >>> statevar.grad(lambda: (w * w).sum(), w)()
      Array([2., 4.], dtype=float32)
    """
    value_and_gradient = value_and_grad(fn, wrt)

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return value_and_gradient(*args, **kwargs)[1]

    return wrapped
