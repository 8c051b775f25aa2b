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

import operator
import weakref
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

from .._state import STATE
from .variable import Variable
from .view import Readable, View

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
      containers: if given, gets ``(container, whether it is a Node, the keys walked, the
        values walked, the index of its parent's record or -1, its position among the
        parent's values)``
        for each Node, list, tuple and dict looked into, in the order looked into. The
        values are a snapshot taken before walking them, so the record matches the walk
        even if another thread changes the container meanwhile.

    Returns:
      ``(path, item)`` pairs in the order found, and whether the walk came back to
      ``root`` (a back-reference from below).
    """
    if items is None:
        items = tuple(vars(root).items())
    seen: set[int] = {id(root)}
    found: list[tuple[str, Variable | Node]] = []
    reached_root = False
    # The containers being walked, innermost last: (an iterator over its numbered values,
    # the index of its record). Resuming the one on top continues where it was left to look
    # into a child.
    stack = [_entries(root, True, items, "", paths, containers, -1, 0)]
    while stack:
        values, record = stack[-1]
        for position, (path, obj) in values:
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
                    child = tuple(vars(obj).items())
                    prefix = path + "/" if paths else ""
                    stack.append(
                        _entries(obj, True, child, prefix, paths, containers, record, position)
                    )
                    break
            elif isinstance(obj, CONTAINERS) and id(obj) not in seen:
                seen.add(id(obj))  # once each: a container may hold itself
                child = tuple(obj.items() if isinstance(obj, dict) else enumerate(obj))
                prefix = path + "/"
                stack.append(
                    _entries(obj, False, child, prefix, paths, containers, record, position)
                )
                break
        else:
            stack.pop()
    return found, reached_root


def _entries(
    container: Any,
    is_node: bool,
    entries: tuple,
    prefix: str,
    paths: bool,
    containers: list[Any] | None,
    parent: int,
    position: int,
) -> tuple[Iterator[tuple[int, tuple[str, Any]]], int]:
    """Records ``container`` (see `walk`); returns an iterator of its numbered
    ``(path, value)`` pairs and the index of its record (-1 when not recording)."""
    record = -1
    if containers is not None:
        record = len(containers)
        keys = tuple(key for key, _ in entries)
        values = tuple(item for _, item in entries)
        containers.append((container, is_node, keys, values, parent, position))
    if paths:
        return enumerate((f"{prefix}{key}", item) for key, item in entries), record
    return enumerate(("", item) for _, item in entries), record


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

    A Variable stays a Variable, a Node becomes a dict keyed by its variables' names, an
    Optimizer a dict of its state variables keyed as a checkpoint keys them under its name
    (``"iterations"``, ``"mu/kernel"``), and lists, tuples and dicts keep their structure
    (Nodes and Optimizers inside them become dicts too).

    Args:
      target: a Variable, a Module, an Optimizer, or a list, tuple or dict of them.
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
    if has_named_variables(obj):  # an Optimizer: its state variables, as `save` keys them
        return obj._state_by_name()[1]
    if isinstance(obj, (list, tuple)):
        return type(obj)(_variable_tree(item, f"{path}[{i}]", what) for i, item in enumerate(obj))
    if isinstance(obj, dict):
        return {key: _variable_tree(item, f"{path}[{key!r}]", what) for key, item in obj.items()}
    where = path or "the top level"
    raise not_a_variable(
        obj,
        what,
        where,
        f"Expected {what} to be a Variable, a Module, an Optimizer, or a list, tuple or "
        f"dict of them; got {type(obj).__name__} at {where}",
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
    """How a Node's variables were found: what each container looked into held.

    `unchanged` tells, without walking the Node again, whether a walk would find the same
    variables in the same order: `statevar.jit` checks it instead of walking a Module
    argument on every call, and an Optimizer before every update. It holds no Module and
    no container: a Module is freed when nothing else holds it, even if something below
    refers back to it. It holds the variables of a container of variables only (what
    it serves holds them too).

    Two checks, by what can have changed:

    - While `ProcessState.attribute_epoch` has not moved, no Module attribute that held or
      holds a variable, a Module or a container was set or deleted, and no attribute was
      added: only the lists, tuples and dicts can have changed, in place. Those are
      compared (`_containers_match`), and the Modules on the way to them only by identity.
    - Otherwise, every container is compared, from the Node down (`_matches`); when all
      still match, the structure takes the epoch it was compared in.

    A container of variables only is compared by identity with the variables it held; any
    other by the ids and types of the values it holds now against those it held. An id can
    be taken again only by an object of another type (caught by the types), a Node (caught
    by the weak reference its record holds), a container (whose values are compared in
    turn) or an object the walk does not look at; the variables themselves are held by what
    the structure serves (a compiled entry, an Optimizer). Only the ids of what the walk
    looks at (variables, Nodes, containers) are compared: a Python counter or an array
    attribute that changes every step changes no variable found, and its type still shows
    one that became a variable or a container.
    """

    __slots__ = ("_root", "_epoch")

    def __init__(self, containers: list[tuple[Any, bool, tuple, tuple, int, int]], epoch: int):
        """``containers``: what `walk` recorded, the Node walked first; ``epoch``: the
        `ProcessState.attribute_epoch` read before the walk."""
        records: list[_Record] = []
        names: list[tuple] = []  # each record's keys: a Node's children are found by name
        for container, is_node, keys, values, parent, position in containers:
            record = _Record(container, is_node, values)
            records.append(record)
            names.append(keys)
            if parent >= 0:
                above = records[parent]
                key = names[parent][position] if above.owner is not None else position
                above.children.append((position, key, record))
        for record in reversed(records):  # every child after its parent
            record.holds_container = record.owner is None or any(
                child.holds_container for _, _, child in record.children
            )
        self._root = records[0]
        self._epoch = epoch

    def unchanged(self) -> bool:
        """Whether every container still holds the same objects, in the same order."""
        root = self._root.owner() if self._root.owner is not None else None
        if root is None:
            return False
        epoch = STATE.attribute_epoch
        if epoch == self._epoch:
            return _containers_match(self._root, root)
        if not _matches(self._root, root):
            return False
        self._epoch = epoch  # a later change moves the epoch past it
        return True


class _Record:
    """One container of a `Structure`: the variables it held if it held only variables, else
    the types of the values it held and the ids of those the walk looks at (at ``watched``,
    or all of them when ``watched`` is None); the records
    of the containers among them it was looked into through (by position, and by
    attribute name below a Node), and a weak reference to it if it is a Node."""

    __slots__ = (
        "owner",
        "watched",
        "ids",
        "types",
        "children",
        "holds_container",
        "variables",
    )

    def __init__(self, container: Any, is_node: bool, values: tuple):
        self.owner = weakref.ref(container) if is_node else None
        self.children: list[tuple[int, Any, _Record]] = []
        # A list, tuple or dict of variables only (a Module's list of parameters) is compared
        # by identity with the variables themselves, which it holds: alive, none can share
        # an id with another object, and no id or type need be compared.
        all_variables = not is_node and all(type(value) is Variable for value in values)
        self.variables = values if all_variables else None
        self.watched: tuple[int, ...] | None = None
        self.ids: tuple[int, ...] = ()
        self.types: tuple[type, ...] = ()
        if not all_variables:
            watched = tuple(i for i, v in enumerate(values) if isinstance(v, LOOKED_AT))
            self.watched = None if len(watched) == len(values) else watched
            self.ids = _watched_ids(values, self.watched)
            self.types = tuple(map(type, values))
        self.holds_container = False  # whether a list, tuple or dict is at or below it


_is = operator.is_
# What `walk` looks at: the values whose ids a `Structure` compares (a value of another type
# is none of these while its type stays), and a Module attribute holding one of which, when
# set, moves `ProcessState.attribute_epoch`.
LOOKED_AT = (Variable, Node, *CONTAINERS)


def _watched_ids(values: tuple, watched: tuple[int, ...] | None) -> tuple[int, ...]:
    """The ids of ``values`` at the positions ``watched`` (all of them for None)."""
    return tuple(map(id, values if watched is None else map(values.__getitem__, watched)))


def _values(record: _Record, container: Any) -> tuple | None:
    """The values ``container`` holds now, if it holds what ``record`` says it held; else
    None."""
    if record.owner is not None:
        values = tuple(vars(container).values())
    elif isinstance(container, dict):
        values = tuple(container.values())
    else:
        values = tuple(container)
    if record.variables is not None:
        held = record.variables
        return values if len(values) == len(held) and all(map(_is, values, held)) else None
    if (
        tuple(map(type, values)) != record.types
        or _watched_ids(values, record.watched) != record.ids
    ):
        return None
    return values


def _matches(record: _Record, container: Any) -> bool:
    """Whether ``container`` holds what ``record`` says it held, and so on below it (an
    explicit stack, not recursion: a tree may be deeper than Python's recursion limit)."""
    pending = [(record, container)]
    while pending:
        record, container = pending.pop()
        if record.owner is not None and record.owner() is not container:
            return False  # another Node, perhaps at the address of a freed one
        values = _values(record, container)
        if values is None:
            return False
        pending += [(child, values[position]) for position, _, child in record.children]
    return True


def _containers_match(record: _Record, node: Any) -> bool:
    """`_matches` while no Module attribute it watches changed: the Nodes' attributes hold
    what they held, so only the containers below are compared, and the Nodes on the way
    only by identity (a container may now hold another Node at a freed one's address).

    Runs before every eager update of an Optimizer: written as loops, it makes no Python
    call but `_values` for each container."""
    pending = [(record, node)]
    while pending:
        record, container = pending.pop()
        if record.owner is not None:
            if record.owner() is not container:
                return False
            attributes = vars(container)
            for _, key, child in record.children:
                if child.holds_container:
                    pending.append((child, attributes.get(key)))
            continue
        values = _values(record, container)
        if values is None:
            return False
        for position, _, child in record.children:
            pending.append((child, values[position]))
    return True


def variables_and_structure(node: Node) -> tuple[tuple[Variable, ...], Structure]:
    """Returns the variables below ``node`` and the `Structure` they were found through."""
    containers: list[Any] = []
    epoch = STATE.attribute_epoch  # read first: a change during the walk moves it
    found, _ = walk(node, paths=False, containers=containers)
    variables = tuple(item for _, item in found if isinstance(item, Variable))
    return variables, Structure(containers, epoch)
