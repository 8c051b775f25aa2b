"""Modules and Optimizers as pytrees: what plain JAX (``jax.tree.*``, ``jax.jit``,
``jax.grad``, ``jax.vmap``) and chex see of them.

A Module flattens to the arrays of the variables it holds and its plain array attributes,
in attribute order, once each; everything else it holds is static (part of the tree's
structure), a variable's name and ``trainable`` flag too. A Module of Variables and one of
views (what ``jax.grad`` returns) therefore have equal structures, and ``jax.tree.map``
pairs a model with its gradients. Its tree is a graph: a variable held in two places is one
leaf, and a Module referring back to one holding it is a reference, not a loop. The
structure (`_Skeleton`) describes, hashably and comparably, where each leaf sits, so two
models of the same architecture have equal treedefs and ``jax.tree.map`` pairs them.

Unflattening builds a new Module of the same class, without calling its ``__init__``,
holding read-only `View`s of the new leaves where the variables were (each known by the
variable's name or path); the original is untouched. Under ``jax.jit`` or ``jax.grad`` such
a Module reads as in eager code, and assigning to it raises `TraceContextError` (see
`View`).

An Optimizer flattens to its state variables' arrays (those `statevar.save` stores) and
unflattens to a read-only `OptimizerState` of views of the same names.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax
import numpy as np

from .._cell.tree import CONTAINERS, Node
from .._cell.view import Readable, View

# The kinds of `_Skeleton` entries.
_LEAF, _MODULE, _SEEN, _SEQUENCE, _MAPPING, _STATIC = range(6)


class _Static:
    """A static attribute value in a treedef: equal to another holding an equal value of the
    same type (identical, for values whose ``==`` is not a bool, as NumPy arrays'), hashable
    even when the value is not (by its type alone: equal values share a hash)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Static):
            return NotImplemented
        a, b = self.value, other.value
        if a is b:
            return True
        if type(a) is not type(b):
            return False
        try:
            equal = a == b
        except Exception:
            return False
        return equal if isinstance(equal, bool) else False

    def __hash__(self) -> int:
        try:
            return hash((type(self.value), self.value))
        except TypeError:
            return hash(type(self.value))

    def __repr__(self) -> str:
        return repr(self.value)


def _value_of(variable: Readable) -> Any:
    """A variable's one pytree child, as its class flattens it (its current value; an on-read
    variable's aggregate)."""
    (value,), _ = variable.tree_flatten()
    return value


def _metadata(variable: Readable) -> tuple[str | None, bool]:
    """What a view of ``variable`` keeps of it: its explicit name and trainable flag."""
    return variable._name, variable._trainable


def _view(name: str | None, trainable: bool, value: Any, path: str | None) -> View:
    """A read-only view of ``value`` known as the variable it came from: by ``name``, else
    by its ``path``."""
    view = View.tree_unflatten((name, trainable), (value,))
    if name is None and path is not None:
        view._path = path
    return view


def _is_array(value: Any) -> bool:
    """A plain array attribute, a leaf as in equinox: a jax.Array (a tracer too) or NumPy
    array."""
    return isinstance(value, (jax.Array, np.ndarray))


def _flatten_module(
    module: Node, found: dict[str, Readable] | None = None
) -> tuple[list[tuple[Any, Any]], tuple]:
    """Returns ``[(key, child), ...]`` (the arrays of the variables and the plain arrays
    ``module`` holds, once each, in attribute order, keyed by their paths) and the module's
    skeleton. Fills ``found``, if given, with the variables (or views) by name: an explicit
    name, else the path.

    Raises:
      ValueError: if a list, tuple or dict in the module holds itself.
    """
    flattener = _Flattener(type(module).__name__, found)
    skeleton = flattener.describe(module, "")
    return flattener.children, skeleton


class _Flattener:
    """One flatten of a Module (`_flatten_module`). Its steps are methods rather than a
    closure calling itself, which would be a reference cycle holding the arrays until the
    garbage collector ran: the next update of each variable would copy it."""

    def __init__(self, root: str, found: dict[str, Readable] | None):
        self.root = root
        self.found = found
        self.children: list[tuple[Any, Any]] = []
        self.leaf_index: dict[int, int] = {}  # id(variable or array) -> its child's position
        self.module_index: dict[int, int] = {}  # id(Module) -> its order of first visit
        self.open: set[int] = set()  # the containers being described

    def leaf(self, value: Any, child: Any, path: str) -> int:
        position = self.leaf_index.get(id(value))
        if position is None:
            position = self.leaf_index[id(value)] = len(self.children)
            self.children.append((jax.tree_util.GetAttrKey(path), child))
        return position

    def describe(self, value: Any, path: str) -> tuple:
        if isinstance(value, Readable):
            if self.found is not None:
                self.found.setdefault(value._name if value._name is not None else path, value)
            position = self.leaf(value, _value_of(value), path)
            return (_LEAF, position, (*_metadata(value), path))
        if _is_array(value):
            return (_LEAF, self.leaf(value, value, path), None)
        if isinstance(value, Node):
            seen = self.module_index.get(id(value))
            if seen is not None:
                return (_SEEN, seen)
            self.module_index[id(value)] = len(self.module_index)
            prefix = f"{path}/" if path else ""
            attributes = tuple(
                (name, self.describe(item, prefix + name)) for name, item in vars(value).items()
            )
            return (_MODULE, type(value), attributes)
        if isinstance(value, CONTAINERS):
            return self.container(value, path)
        return (_STATIC, _Static(value))

    def container(self, value: Any, path: str) -> tuple:
        """Describes a list, tuple or dict.

        Raises:
          ValueError: if ``value`` holds itself (a pytree has no cycles but a Module's
            back-references).
        """
        if id(value) in self.open:
            raise ValueError(
                f"Cannot flatten {self.root} as a pytree: the {type(value).__name__} at "
                f"{path!r} holds itself. A pytree holds no cycle except a Module referring "
                "back to one holding it."
            )
        self.open.add(id(value))
        items = value.items() if isinstance(value, dict) else enumerate(value)
        described = tuple((key, self.describe(item, f"{path}/{key}")) for key, item in items)
        self.open.discard(id(value))
        if isinstance(value, dict):
            return (_MAPPING, type(value), described)
        return (_SEQUENCE, type(value), tuple(entry for _, entry in described))


def _unflatten_module(skeleton: tuple, leaves: Iterable[Any]) -> Any:
    """Builds the Module ``skeleton`` describes, holding ``leaves`` where its leaves were."""
    return _Builder(tuple(leaves)).build(skeleton)


class _Builder:
    """One unflatten of a Module (`_unflatten_module`); methods, as in `_Flattener`."""

    def __init__(self, children: tuple[Any, ...]):
        self.children = children
        self.modules: list[Any] = []
        self.views: dict[int, View] = {}  # one per variable: a variable held twice is one view

    def build(self, entry: tuple) -> Any:
        kind = entry[0]
        if kind == _LEAF:
            _, position, metadata = entry
            if metadata is None:
                return self.children[position]
            if position not in self.views:
                name, trainable, path = metadata
                self.views[position] = _view(name, trainable, self.children[position], path)
            return self.views[position]
        if kind == _SEEN:
            return self.modules[entry[1]]
        if kind == _MODULE:
            _, cls, attributes = entry
            module = object.__new__(cls)
            self.modules.append(module)
            # Set directly: no path labels or structure changes to record for a new copy.
            vars(module).update((name, self.build(item)) for name, item in attributes)
            return module
        if kind == _SEQUENCE:
            _, cls, items = entry
            values = [self.build(item) for item in items]
            if cls is list or cls is tuple:
                return cls(values)
            return cls(*values) if hasattr(cls, "_fields") else cls(values)  # a namedtuple
        if kind == _MAPPING:
            _, cls, items = entry
            return cls((key, self.build(item)) for key, item in items)
        return entry[1].value


def _module_flatten_with_keys(module: Node) -> tuple[list[tuple[Any, Any]], tuple]:
    return _flatten_module(module)


def _module_flatten(module: Node) -> tuple[list[Any], tuple]:
    children, skeleton = _flatten_module(module)
    return [child for _, child in children], skeleton


def register_module(cls: type) -> None:
    """Registers a Module class as a pytree (JAX looks up a node's exact type)."""
    jax.tree_util.register_pytree_with_keys(
        cls, _module_flatten_with_keys, _unflatten_module, _module_flatten
    )


# ----------------------------------------------------------------------------- Optimizer


class OptimizerState:
    """What JAX's tree functions make of an `Optimizer`: its state variables' new values
    (read-only `View`s, as ``jax.tree.map`` gives them), by name.

    Attributes:
      name: the Optimizer's name.
      variables: ``{name: view}``, the names as `statevar.save` keys the state
        (``"iterations"``, ``"mu/layers/0/kernel"``).

    Example:
      >>> import jax, optax, statevar
      >>> w = statevar.Variable([1.0, 2.0], name="w")
      >>> optimizer = statevar.Optimizer(optax.adam(1e-3), [w])
      >>> shapes = jax.tree.map(lambda x: x.shape, optimizer)
      >>> shapes
      <statevar.OptimizerState 'optimizer': 4 state variables>
      >>> {name: view.value for name, view in shapes.variables.items()}
      {'iterations': (), 'count': (), 'mu/w': (2,), 'nu/w': (2,)}
    """

    def __init__(self, name: str, variables: dict[str, Any]):
        self.name = name
        self.variables = variables

    @property
    def iterations(self) -> Any:
        """The step count's view."""
        return self.variables["iterations"]

    @property
    def state_variables(self) -> tuple[Any, ...]:
        """Every state variable's view, as `Optimizer.state_variables` orders them."""
        return tuple(self.variables.values())

    def __repr__(self) -> str:
        return f"<statevar.OptimizerState {self.name!r}: {len(self.variables)} state variables>"


def _optimizer_children(name: str, named: dict[str, Any]) -> tuple[list[tuple[Any, Any]], tuple]:
    children = [(jax.tree_util.GetAttrKey(key), _value_of(v)) for key, v in named.items()]
    return children, (name, tuple(named), tuple(map(_metadata, named.values())))


def _optimizer_flatten_with_keys(optimizer: Any) -> tuple[list[tuple[Any, Any]], tuple]:
    return _optimizer_children(*optimizer._state_by_name())


def _optimizer_flatten(optimizer: Any) -> tuple[list[Any], tuple]:
    children, aux = _optimizer_children(*optimizer._state_by_name())
    return [child for _, child in children], aux


def _optimizer_unflatten(aux: tuple, children: Iterable[Any]) -> OptimizerState:
    name, keys, metadata = aux
    views = {
        key: _view(explicit, trainable, value, None)
        for key, (explicit, trainable), value in zip(keys, metadata, children, strict=True)
    }
    return OptimizerState(name, views)


def _state_flatten_with_keys(state: OptimizerState) -> tuple[list[tuple[Any, Any]], tuple]:
    return _optimizer_children(state.name, state.variables)


def _state_flatten(state: OptimizerState) -> tuple[list[Any], tuple]:
    children, aux = _optimizer_children(state.name, state.variables)
    return [child for _, child in children], aux


def register_optimizer(cls: type) -> None:
    """Registers an Optimizer class as a pytree of its state variables."""
    jax.tree_util.register_pytree_with_keys(
        cls, _optimizer_flatten_with_keys, _optimizer_unflatten, _optimizer_flatten
    )


jax.tree_util.register_pytree_with_keys(
    OptimizerState, _state_flatten_with_keys, _optimizer_unflatten, _state_flatten
)


# ----------------------------------------------------------------------------- gradients


def named_leaves(module: Node) -> dict[str, Any]:
    """The variables (or their views, in a Module that ``jax.grad`` or ``jax.tree.map``
    made) ``module`` holds, by name: an explicit name, else the path. A gradient Module's
    views are matched to the variables they came from by these names."""
    found: dict[str, Readable] = {}
    _flatten_module(module, found)
    return found


def gradients_by_name(
    grads: Node, optimizer: str, names: tuple[str, ...], params: tuple[Any, ...]
) -> dict[Any, Any]:
    """The gradients a gradient Module holds for an Optimizer's variables ``params``, known
    by ``names``: ``{variable: gradient}``, matched by name (`named_leaves`).

    Raises:
      ValueError: if it holds a gradient for none of them.
    """
    found = named_leaves(grads)
    # A variable frozen since the Optimizer was built keeps its value, as with `statevar.grad`.
    by_variable = {
        variable: found[name]
        for name, variable in zip(names, params, strict=True)
        if found.get(name) is not None and variable.trainable
    }
    if not by_variable:
        raise ValueError(
            f"Expected a gradient {type(grads).__name__} holding gradients for the variables "
            f"Optimizer '{optimizer}' optimizes ({', '.join(names)}); it holds "
            f"{', '.join(found) or 'no variables'}. Take the gradient of the Module the "
            "Optimizer was built for."
        )
    return by_variable
