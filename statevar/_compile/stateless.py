"""Functional access: variables' values as plain pytrees, and calls on substituted values.

`read_values` turns a Module (or any tree of variables) into a pytree of arrays, keyed as
`statevar.grad` keys gradients; `stateless_call` runs a function with such a pytree in
place of the variables' values and returns the new values it assigned, without touching
the variables. Together they let JAX's own transformations (``jax.vmap`` over an ensemble
of parameters, ``jax.jacrev``, ``jax.jit``) and test tools (``chex``) see a model as plain
arrays, as nnx ``split``/``merge`` and Keras ``stateless_call`` do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .._cell.tree import is_variable, read_variables, variable_tree
from .._cell.variable import Variable
from .._errors import DtypeMismatchError, ShapeMismatchError
from .._tracing import frames as _frames


def read_values(target: Any) -> Any:
    """Returns the current values of the variables in ``target``, as a pytree of arrays.

    The tree mirrors ``target`` as `statevar.grad`'s gradients mirror its ``wrt``: a
    Variable gives its array, a Module a dict keyed by its variables' names (their paths in
    the module tree unless given ``name=``), and lists, tuples and dicts keep their
    structure. Names and ``trainable`` flags are not part of the tree, so two models with
    equal values compare equal (``chex.assert_trees_all_close``), and ``jax.tree.map`` pairs
    a Module's values with its gradients. Nothing is copied or donated: each array stays
    valid, unchanged, after later updates of its variable. Inside `statevar.jit` or
    `statevar.grad` the values are the traced ones.

    Args:
      target: a Variable, a Module, an Optimizer, or a list, tuple or dict of them.

    Returns:
      The pytree of the variables' arrays.

    Raises:
      TypeError: if ``target`` is not a Variable, Module or container of them.

    Example:
      >>> import statevar
      >>> class Scale(statevar.Module):
      ...     def __init__(self):
      ...         self.factor = statevar.Variable(2.0)
      ...         self.calls = statevar.Variable(0, trainable=False, name="calls")
      >>> statevar.read_values(Scale())
      {'factor': Array(2., dtype=float32), 'calls': Array(0, dtype=int32)}
    """
    return _map_variables(_read, variable_tree(target, "statevar.read_values's target"))


def stateless_call(
    fn: Callable[..., Any], target: Any, values: Any, *args: Any, **kwargs: Any
) -> tuple[Any, Any]:
    """Calls ``fn(*args, **kwargs)`` with ``values`` in place of ``target``'s variables.

    Like Keras's ``stateless_call``: while ``fn`` runs, each variable of ``target`` reads
    its entry of ``values`` (a pytree shaped as `read_values` gives it), and each
    assignment to one of them updates the values returned instead of the variable. No
    variable changes and no buffer is donated, so the call is a pure function of
    ``values`` and the arguments: ``jax.vmap`` over stacked values runs an ensemble,
    ``jax.jacrev`` differentiates with respect to the values, and ``jax.jit`` compiles it.
    Variables outside ``target`` are read as usual. ``fn`` may use JAX's control flow, as
    in `statevar.jit`; when it assigns under one, it runs a second time.

    Args:
      fn: the function to call.
      target: a Variable, a Module, an Optimizer, or a list, tuple or dict of them.
      values: a pytree of arrays with the structure of ``read_values(target)``, each with
        its variable's shape and dtype (plain arrays, or tracers inside a transformation).
      *args: positional arguments for ``fn``.
      **kwargs: keyword arguments for ``fn``.

    Returns:
      ``(result, new_values)``: what ``fn`` returned (its Variables replaced by their
      values), and the values after ``fn``'s assignments, with the structure of ``values``.

    Raises:
      TypeError: if ``target`` is not a Variable, Module or container of them.
      ValueError: if ``values`` does not have ``target``'s structure.
      ShapeMismatchError: if a value's shape is not its variable's.
      DtypeMismatchError: if a value's dtype is not its variable's.
      TraceContextError: if ``fn`` assigns a variable outside ``target``, creates a
        variable, or assigns one where JAX cannot carry the update.

    Example:
      >>> import jax
      >>> import jax.numpy as jnp
      >>> import statevar
      >>> w = statevar.Variable(3.0)
      >>> def double():
      ...     w.assign(w * 2)
      ...     return w + 1
      >>> statevar.stateless_call(double, w, 10.0)
      (Array(21., dtype=float32), Array(20., dtype=float32))
      >>> w
      <Variable 'Variable' shape=() dtype=float32, numpy=3.0>
      >>> jax.vmap(lambda v: statevar.stateless_call(double, w, v)[0])(jnp.arange(3.0))
      Array([1., 3., 5.], dtype=float32)
    """
    tree = variable_tree(target, "statevar.stateless_call's target")
    variables, treedef = jax.tree.flatten(tree, is_leaf=is_variable)
    try:
        leaves = treedef.flatten_up_to(values)
    except (ValueError, TypeError) as error:
        raise ValueError(
            "Expected statevar.stateless_call's values to have the structure of "
            f"statevar.read_values(target), {treedef}; got {jax.tree.structure(values)} "
            f"instead ({error})"
        ) from None
    given: dict[Variable, Any] = {}
    for variable, leaf in zip(variables, leaves, strict=True):
        given[variable] = _checked(variable, leaf)

    def make_frame(refs: tuple[Variable, ...]) -> _frames.Frame:
        # A dict as a set: membership by identity (`Variable.__eq__` is elementwise).
        held = dict.fromkeys(refs)
        values = {v: value for v, value in given.items() if v not in held}
        return _frames.Frame("stateless", values, {v: jax.new_ref(given[v]) for v in refs})

    def run(frame: _frames.Frame) -> Any:
        with frame:
            return read_variables(fn(*args, **kwargs))

    result, frame, _ = _frames.trace_with_refs(make_frame, run)
    final = dict(frame.values)
    final.update({v: jax.freeze(ref) for v, ref in frame.refs.items()})
    return result, _map_variables(final.__getitem__, tree)


def _map_variables(fn: Callable[[Variable], Any], tree: Any) -> Any:
    """Applies ``fn`` to each Variable of a `variable_tree`, keeping every dict's order
    (``jax.tree.map`` would sort a Module's names)."""
    if isinstance(tree, Variable):
        return fn(tree)
    if isinstance(tree, dict):
        return {key: _map_variables(fn, item) for key, item in tree.items()}
    return type(tree)(_map_variables(fn, item) for item in tree)


def _checked(variable: Variable, value: Any) -> Any:
    """Returns ``value`` as an array after checking it fits ``variable``."""
    array = value if isinstance(value, jax.Array) else jnp.asarray(value)
    if array.shape != variable.shape:
        raise ShapeMismatchError(
            f"Cannot call with a value for Variable '{variable.name}' in "
            f"statevar.stateless_call: shape {array.shape} does not match the variable's "
            f"shape {variable.shape}"
        )
    if array.dtype != variable.dtype:
        raise DtypeMismatchError(
            f"Cannot call with a value for Variable '{variable.name}' in "
            f"statevar.stateless_call: dtype {array.dtype} does not match the variable's "
            f"dtype {variable.dtype}. Pass values as statevar.read_values gives them."
        )
    return array


def _read(variable: Variable) -> Any:
    return variable._read()  # as the variable's class reads it (an on-read one aggregates)
