"""`Optimizer`: an optax gradient transformation that updates variables in place."""

from __future__ import annotations

import operator
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import optax

from . import _trace
from ._grad import is_differentiable
from ._jit import jit
from ._module import _is_variable, variable_tree
from ._variable import Variable


class Optimizer:
    """Applies an `optax.GradientTransformation` to variables, in place.

    The optimizer's state (moments, step counts) lives in non-trainable Variables, so it is
    donated and updated in place like the parameters, and saved with them. `apply` works
    eagerly (as one compiled, donating call) and inside `statevar.jit`.

    Args:
      tx: the optax transformation, e.g. ``optax.adam(1e-3)``.
      variables: a Variable, a Module, or a list, tuple or dict of them; the trainable,
        floating-point ones are optimized. Gradients passed to `apply` mirror this
        structure, as `statevar.grad` gives them for the same ``wrt``.
      name: the prefix of the state variables' names (``"optimizer/0"``, ...); give two
        optimizers saved in one checkpoint different names.

    Raises:
      TypeError: if ``tx`` is not an optax transformation, ``variables`` holds anything
        but Variables and Modules, or ``name`` is not a str.

    Example:
      >>> import optax, statevar
      >>> w = statevar.Variable([1.0, 2.0])
      >>> opt = statevar.Optimizer(optax.sgd(0.5), w)
      >>> opt.apply(statevar.grad(lambda: (w * w).sum(), w)())
      >>> w
      <Variable 'Variable' shape=(2,) dtype=float32, numpy=array([0., 0.], dtype=float32)>
    """

    def __init__(
        self, tx: optax.GradientTransformation, variables: Any, *, name: str = "optimizer"
    ):
        if not (hasattr(tx, "init") and hasattr(tx, "update")):
            raise TypeError(
                f"Expected an optax.GradientTransformation such as optax.adam(1e-3), got "
                f"{type(tx).__name__}"
            )
        if not isinstance(name, str):
            raise TypeError(f"Expected the Optimizer's name to be a str, got {type(name).__name__}")
        self._tx = tx
        leaves, self._treedef = jax.tree.flatten(
            variable_tree(variables, "the Optimizer's variables"), is_leaf=_is_variable
        )
        self._leaves = tuple(leaves)
        self._params = tuple(dict.fromkeys(v for v in leaves if is_differentiable(v)))
        state = tx.init([v.value for v in self._params])
        state_leaves, self._state_treedef = jax.tree.flatten(state)
        self._state = tuple(
            Variable(leaf, trainable=False, name=f"{name}/{i}")
            for i, leaf in enumerate(state_leaves)
        )
        self._compiled_apply = jit(self._apply_traced)
        # The structure of gradients with every optimized variable's slot filled: such
        # gradients are checked in one pass (see `_check`). None when a variable occurs twice.
        params = set(self._params)
        slots = [v for v in leaves if v in params]
        self._full_structure = (
            jax.tree.structure(
                self._treedef.unflatten([0 if v in params else None for v in leaves])
            )
            if slots == list(self._params)
            else None
        )
        self._shapes = [v.shape for v in self._params]
        # The variables `apply` has warned about getting no gradient for.
        self._warned_no_gradient: set[Variable] = set()

    @property
    def variables(self) -> tuple[Variable, ...]:
        """The variables this optimizer updates."""
        return self._params

    @property
    def state_variables(self) -> tuple[Variable, ...]:
        """The non-trainable variables holding the optimizer's state."""
        return self._state

    def _statevar_variables(self) -> tuple[Variable, ...]:
        return (*self._params, *self._state)

    def apply(self, grads: Any) -> None:
        """Updates the variables in place from ``grads``.

        Donates the variables' and the state's buffers when nothing else holds them;
        arrays read earlier stay valid.

        Args:
          grads: gradients mirroring the ``variables`` given at construction, as
            `statevar.grad` returns them; None (a non-trainable slot, or a variable the
            loss did not read) leaves that variable and its own optimizer state (Adam's
            moments, for example) unchanged. The first time an optimized variable gets
            None, a warning names it.

        Raises:
          ValueError: if ``grads`` is structured differently or a gradient's shape does not
            match its variable's.
          TypeError: if a gradient is not an array.
        """
        flat = self._check(grads)
        missing = [v for v, g in zip(self._params, flat, strict=True) if g is None]
        unwarned = [v for v in missing if v not in self._warned_no_gradient]
        if unwarned:
            self._warned_no_gradient.update(unwarned)
            warnings.warn(
                f"Optimizer got no gradient for {', '.join(repr(v.name) for v in unwarned)}: "
                "the loss does not read these variables, so they and their optimizer state "
                "are left unchanged",
                UserWarning,
                stacklevel=2,
            )
        if _trace.innermost() is not None:
            self._apply_traced(*flat)
        else:
            # Arrays as separate arguments take statevar.jit's fast path for array calls.
            self._compiled_apply(*flat)

    def _check(self, grads: Any) -> list[Any]:
        """Returns the gradient of each optimized variable (None where none was given)."""
        if self._full_structure is not None:
            # The common case, checked in C: every optimized variable has an array gradient
            # of its shape, and every other slot holds None.
            leaves, structure = jax.tree.flatten(grads)
            if structure == self._full_structure:
                try:
                    shapes = list(map(_shape_of, leaves))
                except AttributeError:
                    shapes = None
                if shapes == self._shapes:
                    return leaves
        return self._check_each(grads)

    def _check_each(self, grads: Any) -> list[Any]:
        leaves, treedef = jax.tree.flatten(grads, is_leaf=lambda x: x is None or _is_variable(x))
        if treedef != self._treedef:
            raise ValueError(
                f"Expected gradients structured like the optimizer's variables, "
                f"{self._treedef}, got {treedef}"
            )
        by_variable: dict[Variable, Any] = {}
        params = set(self._params)
        for variable, gradient in zip(self._leaves, leaves, strict=True):
            if gradient is None:
                continue
            if variable not in params:
                raise ValueError(
                    f"Got a gradient for Variable '{variable.name}', which this optimizer does "
                    "not update: it was not trainable (or not floating-point) when the "
                    "Optimizer was created. Create the Optimizer after setting trainable=True."
                )
            if not hasattr(gradient, "shape"):
                raise TypeError(
                    f"Expected an array gradient for Variable '{variable.name}', got "
                    f"{type(gradient).__name__}"
                )
            if tuple(gradient.shape) != variable.shape:
                raise ValueError(
                    f"Gradient for Variable '{variable.name}' has shape {tuple(gradient.shape)}, "
                    f"expected the variable's shape {variable.shape}"
                )
            by_variable[variable] = gradient
        return [by_variable.get(v) for v in self._params]

    def _apply_traced(self, *grads: Any) -> None:
        params = [v.value for v in self._params]
        state = self._state_treedef.unflatten([s.value for s in self._state])
        filled = [jnp.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]
        updates, new_state = self._tx.update(filled, state, params)
        missing = {i for i, g in enumerate(grads) if g is None}
        if missing:
            new_state = _keep_state_of(missing, len(params), state, new_state)
        new_params = optax.apply_updates(params, updates)
        for variable, gradient, new in zip(self._params, grads, new_params, strict=True):
            if gradient is not None:
                variable.assign(new)
        for variable, new in zip(self._state, jax.tree.leaves(new_state), strict=True):
            variable.assign(new)


_shape_of = operator.attrgetter("shape")


def _keep_state_of(indices: set[int], count: int, old: Any, new: Any) -> Any:
    """Returns ``new`` with the old per-parameter state of the parameters at ``indices``.

    Optax keeps per-parameter state (Adam's moments) in trees shaped like the parameters,
    here a list of ``count`` arrays; shared state (a step count) is taken from ``new``.
    """

    def is_per_parameter(x: Any) -> bool:
        return isinstance(x, list) and len(x) == count

    def select(old: Any, new: Any) -> Any:
        if is_per_parameter(old):
            pairs = enumerate(zip(old, new, strict=True))
            return [kept if i in indices else updated for i, (kept, updated) in pairs]
        return new

    return jax.tree.map(select, old, new, is_leaf=is_per_parameter)
