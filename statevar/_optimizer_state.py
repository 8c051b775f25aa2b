"""How an optax state is laid out and named, for `statevar.Optimizer`'s state variables.

optax builds per-parameter state (Adam's moments, say) with ``tree_map`` over the
parameters, which the Optimizer passes as a dict keyed by their names: each state leaf
under such a dict belongs to one parameter, and is named after it
(``mu/layers/0/kernel``).
"""

from __future__ import annotations

from typing import Any

import jax

# Fields of optax's wrapper states left out of state names when the names stay unique:
# ``optimizer/mu/kernel`` rather than ``optimizer/inner_state/0/mu/kernel``.
_WRAPPER_FIELDS = frozenset({"inner_state", "inner_opt_state", "hyperparams"})


def unique(names: list[str]) -> list[str]:
    """Makes names unique by suffixing repeats: ``w``, ``w_1``, ``w_2``...

    Example:
      >>> from statevar._optimizer_state import unique
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
