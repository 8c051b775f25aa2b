"""`Module`: a container that finds the Variables and sub-Modules its attributes hold."""

from __future__ import annotations

import weakref
from typing import Any

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
        in attribute order; with ``paths=False`` every path is ``""`` (faster). Appends
        ``(container, its attribute dict for a Module, the values walked)`` to
        ``containers``, if given, for each Module, list, tuple and dict it looks into: the
        values are a snapshot taken before walking them, so the record matches the walk
        even if another thread changes the container meanwhile."""
        seen: set[int] = {id(self)}
        found: list[tuple[str, Variable | Module]] = []

        def visit(obj: Any, path: str) -> None:
            if isinstance(obj, View):
                return  # a read-only snapshot of a value, not one of the Module's variables
            if isinstance(obj, Variable):
                if id(obj) not in seen:
                    seen.add(id(obj))
                    found.append((path, obj))
            elif isinstance(obj, Module):
                if id(obj) not in seen:
                    seen.add(id(obj))
                    found.append((path, obj))
                    children(obj, path + "/" if paths else "")
            elif isinstance(obj, (list, tuple, dict)) and id(obj) not in seen:
                seen.add(id(obj))  # once each: a container may hold itself
                items = obj.items() if isinstance(obj, dict) else enumerate(obj)
                walk(obj, None, tuple(items), path + "/")

        def children(module: Module, prefix: str) -> None:
            namespace = vars(module)
            walk(module, namespace, tuple(namespace.items()), prefix)

        def walk(container: Any, namespace: Any, items: tuple, prefix: str) -> None:
            if containers is not None:
                containers.append((container, namespace, tuple(item for _, item in items)))
            for key, item in items:
                visit(item, f"{prefix}{key}" if paths else "")

        children(self, "")
        return found

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
        return tuple(item for _, item in self._walk(paths=False) if isinstance(item, Variable))

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

    def _statevar_variables(self) -> tuple[Variable, ...]:
        return self.variables


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
