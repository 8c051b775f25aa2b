"""What a checkpoint holds: the variables of a target, by the names it saves them under."""

from __future__ import annotations

import warnings
from typing import Any

from .._cell.tree import has_named_variables, named_targets
from .._cell.variable import Variable
from .._errors import caller_stacklevel
from .._train.module import Module


def named_variables(target: Any) -> dict[str, Variable]:
    """Returns the target's variables by checkpoint key (see `named_targets`): dict keys
    namespace what they hold, lists and tuples add nothing.

    Warns of an Optimizer a Module holds and the target leaves out.
    """
    found = named_targets(target, "the checkpoint target")
    named: dict[str, Variable] = {}
    where: dict[str, str] = {}
    key_of: dict[int, str] = {}
    for key, variable, path in found:
        if key in named and named[key] is not variable:
            raise ValueError(
                f"Two variables in the checkpoint target have the name {key!r} (at "
                f"{where[key]} and {path}); give them distinct name= values, put them under "
                "distinct keys of a dict ({'generator': G, 'discriminator': D}), or hold "
                "them in a statevar.Module, which names unnamed variables by their path"
            )
        if key_of.get(id(variable), key) != key:
            first = key_of[id(variable)]
            raise ValueError(
                f"One variable appears in the checkpoint target under two names, {first!r} "
                f"(at {where[first]}) and {key!r} (at {path}); include it once"
            )
        named[key], where[key], key_of[id(variable)] = variable, path, key
    _warn_of_optimizers_left_out(target, set(map(id, named.values())))
    return named


def _warn_of_optimizers_left_out(target: Any, included: set[int]) -> None:
    """Warns of each Optimizer a Module in ``target`` holds whose state the checkpoint
    leaves out (``included``: the ids of the variables it holds): a Module's variables are
    its own, not those of an Optimizer kept as its attribute (``self.opt``), and training
    resumed without them would start Adam's moments and the step count afresh."""
    pending: list[tuple[Any, str]] = [(target, "")]
    seen: set[int] = set()
    while pending:
        obj, path = pending.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if has_named_variables(obj):
            # (An Optimizer not built yet has no state to leave out.)
            if path and obj.built and id(obj.iterations) not in included:
                warnings.warn(
                    f"The checkpoint leaves out Optimizer {obj.name!r}, which a Module holds "
                    f"at {path!r}: a Module's variables do not include an Optimizer's state. "
                    "Include the Optimizer in the target as well: "
                    "statevar.save(directory, [model, model.opt])",
                    UserWarning,
                    stacklevel=caller_stacklevel(),
                )
        elif isinstance(obj, Module):
            pending += [(value, f"{path}/{key}".lstrip("/")) for key, value in vars(obj).items()]
        elif isinstance(obj, (list, tuple)) and path:
            pending += [(value, f"{path}/{i}") for i, value in enumerate(obj)]
        elif isinstance(obj, dict) and path:
            pending += [(value, f"{path}/{key}") for key, value in obj.items()]
        elif isinstance(obj, (list, tuple, dict)):  # the target's own containers
            values = obj.values() if isinstance(obj, dict) else obj
            pending += [(value, "") for value in values]
