"""Trees of state: the Variables that Modules, Optimizers, lists, tuples and dicts hold.

One walker, `walk`, looks into a `Node` (the base of `statevar.Module`) and everything its
attributes hold; everything else that needs a tree's variables builds on it:

- `iter_variables`: ``(name, Variable)`` for any target, the names that key checkpoints
  and an Optimizer's state (`named_targets` adds where each was found, for messages);
- `variable_tree`: a target as a pytree whose leaves are Variables (grad's ``wrt``, an
  Optimizer's variables);
- `variables_and_structure`: a Module's variables and a `Structure` that tells cheaply
  whether walking it again would find the same ones (a compiled step's fast path).

The predicates beside them are small and documented, as flax's ``filterlib``. The walker is
iterative, and nothing here makes a reference cycle (a recursive closure would): a tree's
objects are freed as soon as the last reference to them goes, not when the garbage
collector runs.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

from ._variable import Variable
from ._view import Readable, View

CONTAINERS = (list, tuple, dict)


class Node:
    """The base of objects whose attributes `walk` looks into: `statevar.Module`."""


# ----------------------------------------------------------------------------- predicates


def is_variable(x: Any) -> bool:
    """Whether ``x`` is a Variable (or a read-only view of one): a leaf of a variable tree."""
    return isinstance(x, Readable)


def is_state(x: Any) -> bool:
    """Whether ``x`` is state that `statevar.jit` lifts: a Variable or a Node (a view, a
    snapshot of a value, is passed as its array)."""
    return isinstance(x, (Variable, Node))


def is_differentiable(v: Variable) -> bool:
    """Whether `statevar.grad` differentiates with respect to ``v``: trainable and inexact."""
    return v.trainable and jnp.issubdtype(v.dtype, jnp.inexact)


def has_named_variables(x: Any) -> bool:
    """Whether ``x`` names its own variables (an Optimizer: ``_statevar_named_variables``
    returns its own name and its variables by name)."""
    return hasattr(type(x), "_statevar_named_variables")


def read_variables(tree: Any) -> Any:
    """Replaces every Variable in ``tree`` by its current (possibly traced) value."""
    return jax.tree.map(
        lambda x: x._read() if isinstance(x, Readable) else x, tree, is_leaf=is_variable
    )


# ----------------------------------------------------------------------------- the walker


def walk(
    root: Node,
    items: tuple | None = None,
    *,
    paths: bool = True,
    containers: list[Any] | None = None,
) -> tuple[list[tuple[str, Variable | Node]], bool]:
    """Finds every Variable and Node below ``root``, once each, depth first in attribute order.

    Args:
      root: where the walk starts.
      items: the ``(key, value)`` pairs to walk instead of all of ``root``'s attributes
        (one attribute being set, say).
      paths: whether to build each item's path (``"layers/0/kernel"``); without, every path
        is ``""`` (faster).
      containers: if given, gets ``(container, its attribute dict for a Node, the values
        walked)`` for each Node, list, tuple and dict looked into. The values are a
        snapshot taken before walking them, so the record matches the walk even if another
        thread changes the container meanwhile.

    Returns:
      ``(path, item)`` pairs in the order found, and whether the walk came back to
      ``root`` (a back-reference from below).
    """
    namespace = vars(root) if items is None else None
    if items is None:
        items = tuple(namespace.items())  # type: ignore[union-attr]
    seen: set[int] = {id(root)}
    found: list[tuple[str, Variable | Node]] = []
    reached_root = False
    # Iterators over the containers being walked, innermost last: resuming the one on top
    # continues where it was left to look into a child.
    stack = [_entries(root, namespace, items, "", paths, containers)]
    while stack:
        for path, obj in stack[-1]:
            # A view (a snapshot of a value) is none of these: not one of the tree's variables.
            if isinstance(obj, Variable):
                if id(obj) not in seen:
                    seen.add(id(obj))
                    found.append((path, obj))
            elif isinstance(obj, Node):
                if obj is root:
                    reached_root = True
                elif id(obj) not in seen:
                    seen.add(id(obj))
                    found.append((path, obj))
                    attributes = vars(obj)
                    prefix = path + "/" if paths else ""
                    child = tuple(attributes.items())
                    stack.append(_entries(obj, attributes, child, prefix, paths, containers))
                    break
            elif isinstance(obj, CONTAINERS) and id(obj) not in seen:
                seen.add(id(obj))  # once each: a container may hold itself
                child = tuple(obj.items() if isinstance(obj, dict) else enumerate(obj))
                stack.append(_entries(obj, None, child, path + "/", paths, containers))
                break
        else:
            stack.pop()
    return found, reached_root


def _entries(
    container: Any,
    namespace: Any,
    entries: tuple,
    prefix: str,
    paths: bool,
    containers: list[Any] | None,
) -> Iterator[tuple[str, Any]]:
    """Records ``container`` (see `walk`) and returns an iterator of its ``(path, value)``."""
    if containers is not None:
        containers.append((container, namespace, tuple(item for _, item in entries)))
    if paths:
        return ((f"{prefix}{key}", item) for key, item in entries)
    return (("", item) for _, item in entries)


def named_variables(node: Node) -> dict[str, Variable]:
    """Returns every variable below ``node`` by its name: its explicit ``name=``, else its
    path from ``node``.

    Each unnamed variable found is known by its path from here (see `label`).

    Raises:
      ValueError: if two variables would have the same name.
    """
    named: dict[str, Variable] = {}
    paths: dict[str, str] = {}
    for path, item in walk(node)[0]:
        if not isinstance(item, Variable):
            continue
        label(item, path)
        key = item._name if item._name is not None else path
        if key in named:
            raise ValueError(
                f"Two variables in {type(node).__name__} have the name {key!r} (at "
                f"{paths[key]!r} and {path!r}); give them distinct name= values"
            )
        named[key], paths[key] = item, path
    return named


def label(variable: Variable, path: str) -> None:
    """Lets an unnamed variable be known by ``path``, unless it is known by a longer one:
    the path from a Module further out, which holds the Module that gave the shorter."""
    if variable._name is None:
        known = variable._path
        if known is None or path.count("/") > known.count("/"):
            variable._set_path(path)


# ----------------------------------------------------------------------------- targets


def named_targets(target: Any, what: str) -> list[tuple[str, Variable, str]]:
    """Returns ``(name, variable, where)`` for every variable in ``target``, in order.

    The names key checkpoints and an Optimizer's state. A Node's variables are named as
    `named_variables` names them, an Optimizer's by its name and theirs
    (``optimizer/mu/kernel``), a Variable by its ``name``. Dict keys namespace what they
    hold: under ``{"generator": G}`` a variable of G is ``generator/kernel``; a Variable
    right under a key is named by the key, and an Optimizer right under a key by the key
    in place of its own name. Lists and tuples add nothing. ``where`` says where in
    ``target`` the variable was found, for messages. Names may repeat: callers decide.

    Raises:
      TypeError: if ``target`` holds anything but Variables, Modules, Optimizers, lists,
        tuples and dicts, or holds a read-only view.
    """
    found: list[tuple[str, Variable, str]] = []
    # (object, name prefix, whether right under a dict key, where), next to visit last.
    pending: list[tuple[Any, str, bool, str]] = [(target, "", False, "")]
    while pending:
        obj, prefix, keyed, where = pending.pop()
        if isinstance(obj, Variable):
            found.append(
                (prefix[:-1] if keyed else prefix + obj.name, obj, where or "the top level")
            )
        elif isinstance(obj, Node):
            for key, variable in named_variables(obj).items():
                found.append((prefix + key, variable, f"{where or type(obj).__name__}/{key}"))
        elif has_named_variables(obj):
            own, named = obj._statevar_named_variables()
            base = prefix if keyed else f"{prefix}{own}/"
            for key, variable in named.items():
                found.append((base + key, variable, f"{where or type(obj).__name__}/{key}"))
        elif isinstance(obj, (list, tuple)):
            pending += reversed(
                [(item, prefix, False, f"{where}[{i}]") for i, item in enumerate(obj)]
            )
        elif isinstance(obj, dict):
            pending += reversed(
                [(item, f"{prefix}{key}/", True, f"{where}[{key!r}]") for key, item in obj.items()]
            )
        else:
            raise target_error(obj, what, where or "the top level")
    return found


def iter_variables(target: Any, what: str = "the target") -> Iterator[tuple[str, Variable]]:
    """Yields ``(name, variable)`` for every variable in ``target`` (see `named_targets`).

    Raises:
      TypeError: as `named_targets`.
    """
    for name, variable, _ in named_targets(target, what):
        yield name, variable


def variable_tree(target: Any, what: str) -> Any:
    """Returns ``target`` as a pytree whose leaves are Variables.

    A Variable stays a Variable, a Node becomes a dict keyed by its variables' names, and
    lists, tuples and dicts keep their structure (Nodes inside them become dicts too).

    Args:
      target: a Variable, a Module, or a list, tuple or dict of them.
      what: how the caller names ``target`` in messages (e.g. ``"statevar.grad's wrt"``).

    Raises:
      TypeError: if anything else is found, naming what and where.
    """

    return _variable_tree(target, "", what)


def _variable_tree(obj: Any, path: str, what: str) -> Any:
    if isinstance(obj, Variable):
        return obj
    if isinstance(obj, Node):
        return named_variables(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_variable_tree(item, f"{path}[{i}]", what) for i, item in enumerate(obj))
    if isinstance(obj, dict):
        return {key: _variable_tree(item, f"{path}[{key!r}]", what) for key, item in obj.items()}
    where = path or "the top level"
    raise not_a_variable(
        obj,
        what,
        where,
        f"Expected {what} to be a Variable, a Module, or a list, tuple or dict of them; "
        f"got {type(obj).__name__} at {where}",
    )


# ----------------------------------------------------------------------------- errors


def not_a_variable(obj: Any, what: str, where: str, message: str) -> TypeError:
    """The error for ``obj``, found at ``where`` in ``what`` where a Variable is needed.

    A read-only `View` gets its own message, naming the variable to pass instead; anything
    else gets ``message``.
    """
    if isinstance(obj, View):
        return TypeError(
            f"Expected {what} to hold Variables; got a read-only view of Variable "
            f"'{obj.name}' (made by a JAX tree function such as jax.tree.map or "
            f"jax.device_get) at {where}. Pass the Variable itself."
        )
    return TypeError(message)


def target_error(obj: Any, what: str, where: str) -> TypeError:
    """The error for ``obj`` at ``where`` in a target of `named_targets` (a checkpoint's,
    an Optimizer's), which holds only Variables, Modules, Optimizers and containers."""
    return not_a_variable(
        obj,
        what,
        where,
        f"Expected {what} to be a Variable, a Module, an Optimizer, or a list, tuple or "
        f"dict of them; got {type(obj).__name__} at {where}",
    )


# ----------------------------------------------------------------------------- structure


class Structure:
    """The containers a Node's variables were found through, and what each held.

    `unchanged` tells, in one pass over those containers, whether walking the Node again
    would find the same variables in the same order: `statevar.jit` checks it instead of
    walking a Module argument on every call.
    """

    __slots__ = ("_records",)

    def __init__(self, containers: list[tuple[Any, Any, tuple]]):
        """``containers``: what `walk` recorded."""
        records = []
        for container, namespace, held in containers:
            owner = None
            if namespace is not None:
                # A Node is checked through its attribute dict, which could be replaced
                # wholesale; the weak reference lets the Node be freed.
                owner, live = weakref.ref(container), namespace.values()
            else:
                live = container.values() if isinstance(container, dict) else container
            # Each record keeps the objects whose ids it compares (the values walked), so
            # that no new object can take one of those ids while the record exists.
            records.append((owner, namespace, live, tuple(map(id, held)), held))
        self._records = records

    def unchanged(self) -> bool:
        """Whether every container still holds the same objects, in the same order."""
        for owner, namespace, live, ids, _ in self._records:
            if owner is not None and getattr(owner(), "__dict__", None) is not namespace:
                return False
            if tuple(map(id, live)) != ids:
                return False
        return True


def variables_and_structure(node: Node) -> tuple[tuple[Variable, ...], Structure]:
    """Returns the variables below ``node`` and the `Structure` they were found through."""
    containers: list[Any] = []
    found, _ = walk(node, paths=False, containers=containers)
    return tuple(item for _, item in found if isinstance(item, Variable)), Structure(containers)
