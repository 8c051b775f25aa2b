"""How an optax state is laid out and named, for `statevar.Optimizer`'s state variables.

optax builds per-parameter state (Adam's moments, say) with ``tree_map`` over the
parameters, which the Optimizer passes as a dict keyed by their names: each state leaf
under such a dict belongs to one parameter, and is named after it
(``mu/layers/0/kernel``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.core import Tracer

from .._cell.placement import is_multi_device, replicated
from .._cell.variable import Variable

# The hyperparameter `Optimizer.learning_rate` reads and sets.
LEARNING_RATE = "learning_rate"

# Fields of optax's wrapper states left out of state names when the names stay unique:
# ``optimizer/mu/kernel`` rather than ``optimizer/inner_state/0/mu/kernel``.
_WRAPPER_FIELDS = frozenset({"inner_state", "inner_opt_state", "hyperparams"})


def unique(names: list[str]) -> list[str]:
    """Makes names unique by suffixing repeats: ``w``, ``w_1``, ``w_2``...

    Example:
      >>> from statevar._train.optimizer_state import unique
      >>> unique(["w", "b", "w", "w_1", "w"])
      ['w', 'b', 'w_2', 'w_1', 'w_3']
    """
    taken, unique = set(names), []
    used: set[str] = set()
    for name in names:
        candidate, i = name, 0
        while candidate in used or (candidate != name and candidate in taken):
            i += 1
            candidate = f"{name}_{i}"
        used.add(candidate)
        unique.append(candidate)
    return unique


def _key_name(key: Any, short: bool) -> str | None:
    if isinstance(key, jax.tree_util.SequenceKey):
        return None if short else str(key.idx)
    if isinstance(key, jax.tree_util.GetAttrKey):
        return None if short and key.name in _WRAPPER_FIELDS else key.name
    if isinstance(key, jax.tree_util.DictKey):
        return str(key.key)
    return str(getattr(key, "key", getattr(key, "idx", key)))


def state_layout(state: Any, names: tuple[str, ...]) -> list[tuple[tuple, str | None, tuple]]:
    """Returns, for each leaf of an optax state in flattening order, ``(outer path, the
    parameter it belongs to or None, path inside that parameter's entry)``.

    A parameter's entries are found in the dicts keyed by exactly the parameters' names
    (Adam's ``mu``, say), which optax builds with ``tree_map`` over the parameters.
    """
    keys = set(names)

    def is_per_parameter(x: Any) -> bool:
        return bool(keys) and isinstance(x, dict) and set(x) == keys

    layout = []
    for path, node in jax.tree_util.tree_flatten_with_path(state, is_leaf=is_per_parameter)[0]:
        if is_per_parameter(node):
            for name in sorted(node):
                for inner, _ in jax.tree_util.tree_flatten_with_path(node[name])[0]:
                    layout.append((tuple(path), name, tuple(inner)))
        else:
            layout.append((tuple(path), None, ()))
    return layout


def state_names(layout: list[tuple[tuple, str | None, tuple]]) -> list[str]:
    """Names each state leaf by its path in the state: ``mu/layers/0/kernel``, ``count``.

    Chain positions and wrapper fields are left out where the names stay unique; the leaves
    whose short names collide keep their whole path.
    """

    def join(outer: tuple, owner: str | None, inner: tuple, short: bool) -> str:
        parts = [_key_name(key, short) for key in outer]
        parts += [owner] if owner is not None else []
        parts += [_key_name(key, short) for key in inner]
        return "/".join(part for part in parts if part is not None) or "state"

    short = [join(*leaf, short=True) for leaf in layout]
    names = [
        name if short.count(name) == 1 else join(*leaf, short=False)
        for name, leaf in zip(short, layout, strict=True)
    ]
    if len(set(names)) != len(names) or "iterations" in names:
        names = [f"state/{i}" for i in range(len(layout))]
    return names


def transformation(tx: Any, hyperparameters: dict[str, Any]) -> Any:
    """Returns ``tx``, or ``optax.inject_hyperparams(tx)(**hyperparameters)`` for a factory
    such as ``optax.adam``."""
    if hasattr(tx, "init") and hasattr(tx, "update"):
        if hyperparameters:
            raise TypeError(
                f"Got hyperparameters {sorted(hyperparameters)} with an optax transformation "
                "that is already built; pass them to its factory instead: "
                "Optimizer(optax.adam, learning_rate=1e-3)"
            )
        return tx
    if callable(tx) and hyperparameters:
        factory = cast(Callable[..., optax.GradientTransformation], tx)
        hyperparameters = dict(hyperparameters)
        rate = hyperparameters.get(LEARNING_RATE)
        if type(rate) is int:  # a float from the start, so that it can be set to 0.5 later
            hyperparameters[LEARNING_RATE] = float(rate)
        # optax would hold the hyperparameters in the parameters' dtype: in bfloat16,
        # adam's b2=0.999 rounds to 1.0 and the first step gives NaN. float32 holds them
        # well, and (unlike float64 with x64 on) keeps a float32 model's math in float32.
        dtype = hyperparameters.pop("hyperparam_dtype", jnp.float32)
        built = optax.inject_hyperparams(
            factory, static_args=static_args(hyperparameters), hyperparam_dtype=dtype
        )(**hyperparameters)
        if hasattr(built, "init") and hasattr(built, "update"):
            return built
    raise TypeError(
        "Expected an optax.GradientTransformation such as optax.adam(1e-3), or a factory "
        f"such as optax.adam with its hyperparameters as keywords; got {type(tx).__name__}"
    )


def static_args(hyperparameters: dict[str, Any]) -> tuple[str, ...]:
    """The callable hyperparameters that are not schedules, which `optax.inject_hyperparams`
    would call with the step count: dtypes (``mu_dtype=jnp.bfloat16``) and masks
    (``mask=``, ``weight_decay_mask=``: functions of the parameters)."""
    return tuple(
        name
        for name, value in hyperparameters.items()
        if callable(value) and (isinstance(value, type) or name.endswith("mask"))
    )


def state_placements(
    params: tuple[Variable, ...], owners: tuple[int | None, ...], leaves: list[Any]
) -> list[Any]:
    """Where each state variable goes: a leaf of its parameter's shape takes the parameter's
    sharding; any other leaf (a count, a scalar) is replicated on the parameters' mesh.
    Without a parameter over several devices, a leaf of a placed (committed) parameter
    goes to its device; any other leaf (a count, or the state of a parameter placed
    nowhere) where the placed parameters are when they share one device (`_home`), else
    nowhere (None)."""
    spread = [p.sharding for p in params if is_multi_device(p.sharding)]
    if not spread:
        home = home_of(params)
        return [
            params[owner]._value.sharding
            if owner is not None and params[owner]._value.committed
            else home
            for owner in owners
        ]
    placements = []
    for owner, leaf in zip(owners, leaves, strict=True):
        param = params[owner] if owner is not None else None
        if param is not None and tuple(np.shape(leaf)) == param.shape:
            placements.append(param.sharding)
        else:
            placements.append(replicated(param.sharding if param is not None else spread[0]))
    return placements


def home_of(params: tuple[Variable, ...]) -> jax.sharding.Sharding | None:
    """Where an optimizer's own scalars (its step count) go: the parameters' one placement
    when every placed (committed) parameter shares it, as TensorFlow colocates slots with
    their variables; None (placed nowhere) otherwise."""
    placed = {p._value.sharding for p in params if p._value.committed}
    return placed.pop() if len(placed) == 1 else None


def placed_gradient(gradient: Any, param: Variable) -> Any:
    """A gradient committed elsewhere than its parameter is copied to the parameter's
    sharding, so that the compiled update runs where the parameter lives."""
    if isinstance(gradient, jax.Array) and not isinstance(gradient, Tracer):
        sharding = param._value.sharding
        if gradient.committed and gradient.sharding != sharding:
            if gradient.shape == param.shape:
                return jax.device_put(gradient, sharding)
    return gradient


def is_key(leaf: Any) -> bool:
    """Whether ``leaf`` is a typed PRNG key array (``jax.random.key``)."""
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key)


def check_gradient_dtype(variable: Variable, gradient: Any) -> None:
    """Refuses a gradient that no differentiation gives ``variable``: a bool or integer one
    (optax would cast it silently), or a complex one for a real variable (whose imaginary
    part the update would drop), and the other way round."""
    if jnp.issubdtype(variable.dtype, jnp.complexfloating):
        kind, expected = jnp.complexfloating, "complex"
    else:
        kind, expected = jnp.floating, "real floating-point"
    if not jnp.issubdtype(gradient.dtype, kind):
        raise TypeError(
            f"Expected a {expected} gradient for Variable '{variable.name}' "
            f"({variable.dtype}), got dtype {gradient.dtype}"
        )


def check_gradient_shape(variable: Variable, gradient: Any) -> None:
    """Refuses a gradient of another shape than ``variable``'s: the update would broadcast
    it, or fail inside the transformation with a message naming no variable."""
    if tuple(gradient.shape) != variable.shape:
        raise ValueError(
            f"Gradient for Variable '{variable.name}' has shape {tuple(gradient.shape)}, "
            f"expected the variable's shape {variable.shape}"
        )


def find_learning_rate(layout: list, state: tuple[Variable, ...]) -> tuple[Variable | None, bool]:
    """Finds the outermost injected learning rate among the state variables ``state`` laid
    out as ``layout`` (`state_layout`), and whether a schedule sets it."""
    found = [
        (len(outer), i, outer[:-2])
        for i, (outer, owner, _) in enumerate(layout)
        if owner is None
        and len(outer) >= 2
        and outer[-2] == jax.tree_util.GetAttrKey("hyperparams")
        and outer[-1] == jax.tree_util.DictKey(LEARNING_RATE)
    ]
    if not found:
        return None, False
    _, i, base = min(found, key=lambda item: item[:2])
    schedule = (*base, jax.tree_util.GetAttrKey("hyperparams_states"))
    scheduled = any(
        outer[: len(schedule) + 1] == (*schedule, jax.tree_util.DictKey(LEARNING_RATE))
        for outer, _, _ in layout
    )
    return state[i], scheduled
