"""`Module`: a container that finds the Variables and sub-Modules its attributes hold."""

from __future__ import annotations

import weakref
from typing import Any, TextIO

import numpy as np

from ._variable import Variable, View, refuse_view


class Module:
    """Base class for models and layers, in the manner of ``tf.Module``.

    A Module finds the Variables and sub-Modules held in its attributes, including inside
    lists, tuples and dicts, in attribute order. Each variable created without a ``name=``
    is known by its path in the module tree (``"layers/0/kernel"``); a variable with an
    explicit name is known by that name. These names key gradients, summaries and
    checkpoints.

    Example:
      >>> import statevar
      >>> class Dense(statevar.Module):
      ...     def __init__(self):
      ...         self.kernel = statevar.Variable([[1.0], [2.0]])
      ...         self.bias = statevar.Variable([0.0])
      >>> class Model(statevar.Module):
      ...     def __init__(self):
      ...         self.layers = [Dense(), Dense()]
      ...         self.step = statevar.Variable(0, trainable=False, name="step")
      >>> list(Model().named_variables())
      ['layers/0/kernel', 'layers/0/bias', 'layers/1/kernel', 'layers/1/bias', 'step']
    """

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        named = []
        for base in cls.__mro__:
            slots = base.__dict__.get("__slots__", ())
            named += [
                name
                for name in ((slots,) if isinstance(slots, str) else slots)
                if name not in ("__dict__", "__weakref__")
            ]
        if named:
            raise TypeError(
                f"Module {cls.__name__} has __slots__ {tuple(named)}: a Module finds its "
                "variables among the attributes in its __dict__, so it would miss these. "
                "Remove __slots__ (or slots=True, for a dataclass or attrs class)."
            )

    def _walk(
        self, paths: bool = True, containers: list[Any] | None = None
    ) -> list[tuple[str, Variable | Module]]:
        """Returns ``(path, item)`` for every Variable and Module below this one, once each,
        in attribute order; with ``paths=False`` every path is ``""`` (faster). With paths,
        each unnamed variable found is known by its path from here (see `_label`). Appends
        ``(container, its attribute dict for a Module, the values walked)`` to
        ``containers``, if given, for each Module, list, tuple and dict it looks into: the
        values are a snapshot taken before walking them, so the record matches the walk
        even if another thread changes the container meanwhile."""
        namespace = vars(self)
        found, _ = _walk_items(self, namespace, tuple(namespace.items()), "", paths, containers)
        if paths:
            for path, item in found:
                if isinstance(item, Variable):
                    _label(item, path)
        return found

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if isinstance(value, (Variable, Module, list, tuple, dict)):
            # Unnamed variables are known by their path as soon as they are assigned: a
            # layer's by "kernel", then by "layers/0/kernel" once the model holds the layer.
            found, reached_self = _walk_items(self, None, ((name, value),), "", True, None)
            if not reached_self:  # a back-reference to a Module holding this one: no paths
                for path, item in found:
                    if isinstance(item, Variable):
                        _label(item, path)

    def named_variables(self) -> dict[str, Variable]:
        """Returns every variable by its name: its explicit ``name=``, else its path.

        Raises:
          ValueError: if two variables would have the same name.
        """
        named: dict[str, Variable] = {}
        paths: dict[str, str] = {}
        for path, item in self._walk():
            if not isinstance(item, Variable):
                continue
            key = item._name if item._name is not None else path
            if key in named:
                raise ValueError(
                    f"Two variables in {type(self).__name__} have the name {key!r} (at "
                    f"{paths[key]!r} and {path!r}); give them distinct name= values"
                )
            named[key], paths[key] = item, path
        return named

    @property
    def variables(self) -> tuple[Variable, ...]:
        """Every variable in this module and its sub-modules, in attribute order."""
        return tuple(item for _, item in self._walk() if isinstance(item, Variable))

    @property
    def trainable_variables(self) -> tuple[Variable, ...]:
        """The variables whose ``trainable`` flag is set."""
        return tuple(v for v in self.variables if v.trainable)

    @property
    def non_trainable_variables(self) -> tuple[Variable, ...]:
        """The variables whose ``trainable`` flag is not set."""
        return tuple(v for v in self.variables if not v.trainable)

    @property
    def submodules(self) -> tuple[Module, ...]:
        """Every module below this one (not including itself)."""
        return tuple(item for _, item in self._walk(paths=False) if isinstance(item, Module))

    @property
    def trainable(self) -> bool:
        """Whether this Module was last set trainable (True unless set otherwise).

        Setting it sets the ``trainable`` flag of every variable and sub-Module below this
        one, as Keras's ``layer.trainable`` does: ``False`` freezes the Module, so that
        `statevar.grad` gives None for its variables and an Optimizer leaves them alone.
        A variable's own flag may be changed afterwards (to unfreeze one of them).

        Example:
          >>> import statevar
          >>> class Dense(statevar.Module):
          ...     def __init__(self):
          ...         self.kernel = statevar.Variable([[1.0]])
          >>> class Model(statevar.Module):
          ...     def __init__(self):
          ...         self.backbone, self.head = Dense(), Dense()
          >>> model = Model()
          >>> model.backbone.trainable = False
          >>> [v.name for v in model.trainable_variables]
          ['head/kernel']
        """
        return vars(self).get("_module_trainable", True)

    @trainable.setter
    def trainable(self, enabled: bool) -> None:
        if not isinstance(enabled, (bool, np.bool_)):
            raise TypeError(
                f"Expected {type(self).__name__}.trainable to be set to a bool, got "
                f"{type(enabled).__name__} {enabled!r}"
            )
        enabled = bool(enabled)
        found = self._walk()
        vars(self)["_module_trainable"] = enabled
        for _, item in found:
            if isinstance(item, Module):
                vars(item)["_module_trainable"] = enabled
            else:
                item.trainable = enabled

    def summary(self, *, file: TextIO | None = None) -> None:
        """Prints a table of this Module's variables; see `statevar.summary`."""
        from ._summary import summary

        summary(self, file=file)

    def __repr__(self) -> str:
        from ._summary import module_repr

        return module_repr(self)

    def _statevar_variables(self) -> tuple[Variable, ...]:
        return self.variables


def _walk_items(
    root: Module,
    namespace: Any,
    items: tuple,
    prefix: str,
    paths: bool,
    containers: list[Any] | None,
) -> tuple[list[tuple[str, Variable | Module]], bool]:
    """Walks ``items`` (``(key, value)`` pairs held by ``root``, its attribute dict
    ``namespace`` when those are its attributes); see `Module._walk`. Returns what it found
    and whether it came back to ``root``."""
    seen: set[int] = {id(root)}
    found: list[tuple[str, Variable | Module]] = []
    reached_root = False

    def visit(obj: Any, path: str) -> None:
        nonlocal reached_root
        if isinstance(obj, View):
            return  # a read-only snapshot of a value, not one of the Module's variables
        if isinstance(obj, Variable):
            if id(obj) not in seen:
                seen.add(id(obj))
                found.append((path, obj))
        elif isinstance(obj, Module):
            if obj is root:
                reached_root = True
            elif id(obj) not in seen:
                seen.add(id(obj))
                found.append((path, obj))
                children(obj, path + "/" if paths else "")
        elif isinstance(obj, (list, tuple, dict)) and id(obj) not in seen:
            seen.add(id(obj))  # once each: a container may hold itself
            entries = obj.items() if isinstance(obj, dict) else enumerate(obj)
            walk(obj, None, tuple(entries), path + "/")

    def children(module: Module, prefix: str) -> None:
        attributes = vars(module)
        walk(module, attributes, tuple(attributes.items()), prefix)

    def walk(container: Any, namespace: Any, entries: tuple, prefix: str) -> None:
        if containers is not None:
            containers.append((container, namespace, tuple(item for _, item in entries)))
        for key, item in entries:
            visit(item, f"{prefix}{key}" if paths else "")

    walk(root, namespace, items, prefix)
    return found, reached_root


def _label(variable: Variable, path: str) -> None:
    """Lets an unnamed variable be known by ``path``, unless it is known by a longer one:
    the path from a Module further out, which holds the Module that gave the shorter."""
    if variable._name is None:
        known = variable._path
        if known is None or path.count("/") > known.count("/"):
            variable._path = path


class Structure:
    """The containers a Module's variables were found through, and what each held.

    `unchanged` tells, in one pass over those containers, whether walking the Module again
    would find the same variables in the same order: `statevar.jit` checks it instead of
    walking a Module argument on every call.
    """

    __slots__ = ("_records",)

    def __init__(self, containers: list[tuple[Any, Any, tuple]]):
        """``containers``: what `Module._walk` recorded."""
        records = []
        for container, namespace, held in containers:
            owner = None
            if namespace is not None:
                # A Module is checked through its attribute dict, which could be replaced
                # wholesale; the weak reference lets the Module be freed.
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


def variables_and_structure(module: Module) -> tuple[tuple[Variable, ...], Structure]:
    """Returns ``module.variables`` and the `Structure` they were found through."""
    containers: list[Any] = []
    found = module._walk(paths=False, containers=containers)
    return tuple(item for _, item in found if isinstance(item, Variable)), Structure(containers)


def _is_variable(x: Any) -> bool:
    return isinstance(x, Variable)


def variable_tree(target: Any, what: str) -> Any:
    """Returns ``target`` as a pytree whose leaves are Variables.

    A Variable stays a Variable, a Module becomes a dict keyed by its variables' names, and
    lists, tuples and dicts keep their structure (Modules inside them become dicts too).

    Args:
      target: a Variable, a Module, or a list, tuple or dict of them.
      what: how the caller names ``target`` in messages (e.g. ``"statevar.grad's wrt"``).

    Raises:
      TypeError: if anything else is found, naming what and where.
    """

    def convert(obj: Any, path: str) -> Any:
        if isinstance(obj, Variable):
            refuse_view(obj, what, path or "the top level")
            return obj
        if isinstance(obj, Module):
            return obj.named_variables()
        if isinstance(obj, (list, tuple)):
            return type(obj)(convert(item, f"{path}[{i}]") for i, item in enumerate(obj))
        if isinstance(obj, dict):
            return {key: convert(item, f"{path}[{key!r}]") for key, item in obj.items()}
        raise TypeError(
            f"Expected {what} to be a Variable, a Module, or a list, tuple or dict of them; "
            f"got {type(obj).__name__} at {path or 'the top level'}"
        )

    return convert(target, "")


def named_targets(target: Any, what: str) -> list[tuple[str, Variable, str]]:
    """Returns ``(name, variable, where)`` for every variable in ``target``, in order.

    The names key checkpoints and an Optimizer's state. A Module's variables are named as
    `Module.named_variables` names them, an Optimizer's by its name and theirs
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

    def visit(obj: Any, prefix: str, keyed: bool, where: str) -> None:
        if isinstance(obj, Variable):
            refuse_view(obj, what, where or "the top level")
            found.append(
                (prefix[:-1] if keyed else prefix + obj.name, obj, where or "the top level")
            )
        elif isinstance(obj, Module):
            for key, variable in obj.named_variables().items():
                found.append((prefix + key, variable, f"{where or type(obj).__name__}/{key}"))
        elif hasattr(type(obj), "_statevar_named_variables"):
            own, named = obj._statevar_named_variables()
            base = prefix if keyed else f"{prefix}{own}/"
            for key, variable in named.items():
                found.append((base + key, variable, f"{where or type(obj).__name__}/{key}"))
        elif isinstance(obj, (list, tuple)):
            for i, item in enumerate(obj):
                visit(item, prefix, False, f"{where}[{i}]")
        elif isinstance(obj, dict):
            for key, item in obj.items():
                visit(item, f"{prefix}{key}/", True, f"{where}[{key!r}]")
        else:
            raise TypeError(
                f"Expected {what} to be a Variable, a Module, an Optimizer, or a list, tuple or "
                f"dict of them; got {type(obj).__name__} at {where or 'the top level'}"
            )

    visit(target, "", False, "")
    return found
