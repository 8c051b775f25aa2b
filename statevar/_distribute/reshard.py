"""`statevar.reshard`: moving a model's variables onto a mesh by rules on their names."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

from .._cell import placement as _placement
from .._cell.tree import iter_variables
from .._cell.variable import Variable
from . import on_read as _on_read


def reshard(
    target: Any,
    rules: Sequence[_placement.Rule] | None = None,
    *,
    mesh: jax.sharding.Mesh | None = None,
) -> dict[str, jax.sharding.Sharding]:
    """Moves every variable of ``target`` onto a mesh, sharded by rules on their names.

    Each variable takes the spec of the first rule whose regex matches its name
    (`re.search`; a Module's variables are named by their paths, ``"layers/0/kernel"``, an
    Optimizer's state by the Optimizer's name and theirs, ``"optimizer/mu/layers/0/kernel"``,
    so one rule shards a parameter and its state alike); a variable no rule matches is
    replicated. Every spec is checked against its variable before any variable moves. Values
    are copied onto their new shardings: nothing is donated, so arrays read earlier stay
    valid. Compiled functions reading the variables trace again.

    Args:
      target: a Variable, Module, Optimizer, or a list, tuple or dict of them.
      rules: ``(regex, spec)`` pairs as `statevar.mesh` takes them: a PartitionSpec, a
        tuple of axis names, None for replicated, a Sharding, or a callable
        ``(name, shape) -> spec``.
      mesh: the mesh; defaults to the innermost `statevar.mesh` scope's.

    Returns:
      Each variable's name and its new sharding (variables that share a name, as two
      Modules' ``"kernel"`` in a list, share one entry).

    Raises:
      PlacementError: if there is no mesh, or a spec does not fit its variable (an axis the
        mesh lacks, a dimension the axis does not divide, a spec longer than the rank).
      TypeError: if ``target`` holds anything else, or a rule is malformed.
      ValueError: if two variables share a name and a callable spec shards them
        differently.

    Example:
      >>> import jax
      >>> import statevar
      >>> from jax.sharding import PartitionSpec as P
      >>> class Dense(statevar.Module):
      ...     def __init__(self):
      ...         self.kernel = statevar.Variable(jax.numpy.zeros((3, 8)))
      ...         self.bias = statevar.Variable(jax.numpy.zeros(8))
      >>> layer = Dense()
      >>> devices = jax.make_mesh((len(jax.devices()),), ("model",))
      >>> placed = statevar.reshard(layer, [("kernel", P(None, "model"))], mesh=devices)
      >>> placed["kernel"].spec, placed["bias"].spec
      (P(None, 'model'), P())
    """
    planned, by_name = _plan(target, _placement.compile_rules(rules), _mesh_for(mesh))
    for variable, (_, sharding) in planned.items():
        if variable.sharding != sharding:
            variable.reshard(sharding)
    return by_name


def _mesh_for(mesh: Any) -> jax.sharding.Mesh:
    """``mesh``, or the innermost `statevar.mesh` scope's.

    Raises:
      PlacementError: if there is neither.
      TypeError: if ``mesh`` is not a Mesh.
    """
    if mesh is None:
        scope = _placement.current_mesh()
        if scope is None:
            raise _placement.PlacementError(
                "statevar.reshard needs a mesh: pass mesh=, or call it inside "
                "`with statevar.mesh(mesh):`"
            )
        return scope.mesh
    if not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(f"Expected mesh= to be a jax.sharding.Mesh, got {type(mesh).__name__}")
    return mesh


def _plan(
    target: Any, compiled: Any, mesh: jax.sharding.Mesh
) -> tuple[dict[Variable, tuple[str, jax.sharding.Sharding]], dict[str, jax.sharding.Sharding]]:
    """Where each variable of ``target`` goes, by the rules for its name, and the sharding
    of each name; checks everything before any variable moves.

    Raises:
      ValueError: if two variables of one name would be sharded differently.
      PlacementError: if a sharding does not fit its variable.
    """
    # By variable: two variables may share a name (two Modules' "kernel"); each moves, by
    # the rules for its name.
    planned: dict[Variable, tuple[str, jax.sharding.Sharding]] = {}
    by_name: dict[str, jax.sharding.Sharding] = {}
    for name, variable in iter_variables(target, "the target of statevar.reshard"):
        if variable in planned:
            continue
        _, spec = _placement.rule_spec(compiled, name)
        if callable(spec) and not isinstance(spec, jax.sharding.Sharding):
            spec = spec(name, variable.shape)
        sharding = _placement.resolve_sharding(
            spec, variable.shape, f"Cannot reshard Variable {name!r}", mesh
        )
        if variable.synchronization == "on_read":  # its replicas take the mesh's first axis
            _on_read.layout(f"Cannot reshard Variable {name!r}", sharding, variable.aggregation)
        if by_name.setdefault(name, sharding) != sharding:
            raise ValueError(
                f"Two variables in the target of statevar.reshard have the name {name!r} "
                f"and would be sharded differently ({getattr(by_name[name], 'spec', '?')} "
                f"and {getattr(sharding, 'spec', '?')}, for their shapes); give them "
                "distinct name= values or "
                "hold them in distinct Modules under a dict's keys"
            )
        planned[variable] = (name, sharding)
    return planned, by_name
