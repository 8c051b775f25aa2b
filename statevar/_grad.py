"""`statevar.grad` and `statevar.value_and_grad`: gradients with respect to variables."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from . import _trace
from ._module import Module, _is_variable, variable_tree
from ._variable import Variable


def value_and_grad(fn: Callable, wrt: Any, has_aux: bool = False) -> Callable:
    """Returns a function computing ``fn`` and its gradient with respect to variables.

    Like ``tf.GradientTape``: ``fn`` reads variables by closure (no arguments needed) or
    takes arguments; the trainable, floating-point variables in ``wrt`` are differentiated
    and every other variable is a constant. Works eagerly and inside `statevar.jit`. No
    buffer is donated and no variable changes; after the call every variable holds a
    concrete array.

    Args:
      fn: a function returning a scalar (or ``(scalar, aux)`` with ``has_aux=True``).
      wrt: a Variable, a Module, or a list, tuple or dict of them.
      has_aux: whether ``fn`` returns ``(value, aux)``.

    Returns:
      A function taking ``fn``'s arguments and returning ``(value, grads)`` (or
      ``((value, aux), grads)``). ``grads`` mirrors ``wrt``: a Module gives a dict keyed by
      variable name; the slot of a non-trainable or integer variable holds None, as
      ``tf.GradientTape`` gives.

    Raises:
      TypeError: if ``wrt`` is not a Variable, Module or container of them.
      TraceContextError: if ``fn`` creates or assigns a variable.

    Example:
      >>> import statevar
      >>> w = statevar.Variable(3.0)
      >>> counter = statevar.Variable(2.0, trainable=False)
      >>> loss, (dw, dc) = statevar.value_and_grad(lambda: w * w * counter, [w, counter])()
      >>> float(loss), float(dw), dc
      (18.0, 12.0, None)
    """
    variable_tree(wrt, "statevar.grad's wrt")

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        tree = variable_tree(wrt, "statevar.grad's wrt")
        leaves, treedef = jax.tree.flatten(tree, is_leaf=_is_variable)
        lifted = list(dict.fromkeys(v for v in leaves if is_differentiable(v)))

        def pure(primals: list[jax.Array]) -> Any:
            with _trace.Frame("grad", dict(zip(lifted, primals, strict=True))):
                return read_variables(fn(*args, **kwargs))

        value, gradients = jax.value_and_grad(pure, has_aux=has_aux)([v._read() for v in lifted])
        by_variable = dict(zip(lifted, gradients, strict=True))
        grads = treedef.unflatten([by_variable.get(v) for v in leaves])
        if isinstance(wrt, Module):
            # Keep the module's order (JAX rebuilds dicts with sorted keys).
            grads = {name: grads[name] for name in tree}
        return value, grads

    return wrapped


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


def is_differentiable(v: Variable) -> bool:
    """Whether `statevar.grad` differentiates with respect to ``v``: trainable and inexact."""
    return v.trainable and jnp.issubdtype(v.dtype, jnp.inexact)


def read_variables(tree: Any) -> Any:
    """Replaces every Variable in ``tree`` by its current (possibly traced) value."""
    return jax.tree.map(
        lambda x: x._read() if isinstance(x, Variable) else x, tree, is_leaf=_is_variable
    )
