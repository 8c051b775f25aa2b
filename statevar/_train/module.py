"""`Module`: a container that finds the Variables and sub-Modules its attributes hold."""

from __future__ import annotations

import re
from typing import Any, TextIO

import numpy as np

from .._cell.tree import LOOKED_AT, Node, label, named_variables, walk
from .._cell.variable import Variable
from .._state import STATE
from .pytree import register_module
from .summary import module_repr, summary


class Module(Node):
    """Base class for models and layers, in the manner of ``tf.Module``.

    A Module finds the Variables and sub-Modules held in its attributes, including inside
    lists, tuples and dicts, in attribute order. Each variable created without a ``name=``
    is known by its path in the module tree (``"layers/0/kernel"``); a variable with an
    explicit name is known by that name. These names key gradients, summaries and
    checkpoints.

    A Module is known by its ``name``, as a ``tf.Module`` is: ``name=`` given to its
    ``__init__``, else its class name in snake case (``Dense`` is ``"dense"``). A subclass
    need not call ``super().__init__`` (it is then known by its class name); one that takes
    a name passes it on: ``super().__init__(name=name)``. A name given shows in its repr
    and its `summary`.

    A Module is a pytree, as flax nnx's and equinox's are: its leaves are the arrays of the
    variables it holds, and of its plain array attributes, once each in attribute order;
    its other attributes are static. ``jax.tree.map(f, model)`` and
    ``jax.grad(loss)(model)`` return a new Module of the same class (its ``__init__`` not
    called) whose variables are read-only views of the results, known by the same names;
    the original is untouched. Under plain ``jax.jit``, ``jax.grad`` or ``jax.vmap`` a
    Module argument reads as in eager code, and assigning to it raises
    `statevar.TraceContextError`: `statevar.jit` is the way to update it. Plain
    ``jax.grad`` differentiates every variable; `statevar.grad` follows the ``trainable``
    flags. As in any pytree, ``jax.grad`` of a Module holding an integer variable (a step
    counter, a `statevar.random.Generator`'s key) needs ``allow_int=True``.

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
      >>> Model().name, statevar.Module(name="encoder").name
      ('model', 'encoder')
    """

    def __init__(self, name: str | None = None) -> None:
        """Makes a Module known by ``name`` (see `Module`).

        Args:
          name: a valid Python identifier, or None for the class name in snake case.

        Raises:
          TypeError: if ``name`` is neither a str nor None.
          ValueError: if ``name`` is not a valid Python identifier.
        """
        if name is not None:
            self.name = name

    @property
    def name(self) -> str:
        """The name given to ``__init__`` (or set), else the class name in snake case."""
        given = vars(self).get("_module_name")
        return given if given is not None else snake_case(type(self).__name__)

    @name.setter
    def name(self, name: str) -> None:
        if not isinstance(name, str):
            raise TypeError(
                f"Expected the name of Module {type(self).__name__} to be a str, got "
                f"{type(name).__name__} {name!r}"
            )
        if not name.isidentifier():
            raise ValueError(
                f"Cannot name Module {type(self).__name__} {name!r}: a Module's name must be "
                "a valid Python identifier (letters, digits and underscores, not starting "
                "with a digit), as tf.Module requires"
            )
        vars(self)["_module_name"] = name

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
        register_module(cls)

    def _walk(self, paths: bool = True) -> list[tuple[str, Variable | Node]]:
        """Returns ``(path, item)`` for every Variable and Module below this one, once each,
        in attribute order (see `_tree.walk`). With paths, each unnamed variable found is
        known by its path from here (see `_tree.label`)."""
        found, _ = walk(self, paths=paths)
        if paths:
            for path, item in found:
                if isinstance(item, Variable):
                    label(item, path)
        return found

    def __setattr__(self, name: str, value: Any) -> None:
        existed = name in self.__dict__
        old = self.__dict__.get(name)
        super().__setattr__(name, value)
        if old is not value or not existed:
            if not existed or isinstance(value, LOOKED_AT) or isinstance(old, LOOKED_AT):
                STATE.record_attribute_change()  # see `Structure`
            if existed:
                # A compiled step traced before may read what was there: see
                # `ProcessState.stale`.
                _record_change(old, value)
        if isinstance(value, LOOKED_AT):
            # Unnamed variables are known by their path as soon as they are assigned: a
            # layer's by "kernel", then by "layers/0/kernel" once the model holds the layer.
            found, reached_self = walk(self, ((name, value),))
            if not reached_self:  # a back-reference to a Module holding this one: no paths
                for path, item in found:
                    if isinstance(item, Variable):
                        label(item, path)

    def __delattr__(self, name: str) -> None:
        old = self.__dict__.get(name)
        super().__delattr__(name)
        STATE.record_attribute_change()  # see `Structure`
        _record_change(old, None)

    def named_variables(self) -> dict[str, Variable]:
        """Returns every variable by its name: its explicit ``name=``, else its path.

        Raises:
          ValueError: if two variables would have the same name.
        """
        return named_variables(self)

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
            if isinstance(item, Variable):
                item.trainable = enabled
            else:
                vars(item)["_module_trainable"] = enabled

    def summary(self, *, file: TextIO | None = None) -> None:
        """Prints a table of this Module's variables; see `statevar.summary`."""
        summary(self, file=file)

    def __repr__(self) -> str:
        return module_repr(self)

    def _statevar_variables(self) -> tuple[Variable, ...]:
        return self.variables


register_module(Module)


_CAMEL_TO_SNAKE = re.compile(r"((?<=[a-z0-9])[A-Z]|(?!^)[A-Z](?=[a-z]))")


def snake_case(class_name: str) -> str:
    """Returns a class name in snake case, as ``tf.Module`` names a Module by default
    (by the same rule: ``Conv2D`` gives ``conv2_d``).

    Example:
      >>> from statevar._train.module import snake_case
      >>> snake_case("Dense"), snake_case("MLPBlock"), snake_case("Conv2D")
      ('dense', 'mlp_block', 'conv2_d')
    """
    return _CAMEL_TO_SNAKE.sub(r"_\1", class_name).lower()


def _record_change(old: Any, new: Any) -> None:
    """Records, for compiled steps, that a Module attribute held ``old`` and now holds
    ``new``: the variables it let go of, or variables where it held none (see
    `ProcessState.record_structure_change`). Setting an attribute to what holds the same
    variables (a new list of them) changes nothing."""
    before = _variables_in(old)
    after = _variables_in(new)
    let_go = [variable for key, variable in before.items() if key not in after]
    added = not before and bool(after)
    if let_go or added:
        STATE.record_structure_change(let_go, added)


def _variables_in(value: Any) -> dict[int, Variable]:
    """The variables ``value`` holds, by id: itself, those below it if it is a Node or an
    Optimizer (``_statevar_variables``), and those in lists, tuples and dicts, at any
    depth."""
    found: dict[int, Variable] = {}
    # It looks into what `walk` looks at, and an Optimizer (``_statevar_variables``).
    if not isinstance(value, LOOKED_AT) and not hasattr(type(value), "_statevar_variables"):
        return found  # a counter counting, a flag flipping: nothing to look into
    pending: list[Any] = [value]
    seen: set[int] = set()
    while pending:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, Variable):
            found[id(item)] = item
        elif isinstance(item, Node):
            pending.extend(vars(item).values())
        elif hasattr(type(item), "_statevar_variables"):
            pending.extend(item._statevar_variables())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item.values())
    return found
