"""`PerReplica`: one value per replica, for an update of an on-read variable (see
`_on_read`) that changes each replica's value on its own devices."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._cell.convert import Tracer
from .._cell.indexing import read_operand


class PerReplica:
    """Values for the replicas of an on-read variable, one per replica.

    ``v.assign(PerReplica(values))``, ``v.assign_add(PerReplica(deltas))`` and
    ``v.assign_sub(PerReplica(deltas))`` update each replica's value with its own entry, on
    that replica's devices, with no communication between replicas. It is a JAX pytree, so
    it may be built inside `statevar.jit` from traced values, or passed into it.

    Args:
      values: an array whose first dimension indexes the replicas (shape ``(replicas,
        *shape)``, best sharded over the mesh axis of the replicas, as
        ``v.replica_values`` is), or a sequence with one array per replica. Each value
        broadcasts to the variable's shape.

    Raises:
      TypeError: if ``values`` is not an array or a sequence.
      ValueError: if it holds no value (an empty sequence, or a scalar).

    Example:
      >>> import jax
      >>> import jax.numpy as jnp
      >>> import statevar
      >>> with statevar.mesh(jax.make_mesh((len(jax.devices()),), ("data",))):
      ...     seen = statevar.Variable(0, synchronization="on_read", aggregation="sum")
      >>> ones = jnp.ones(seen.replicas, jnp.int32)  # one count per replica
      >>> int(seen.assign_add(statevar.PerReplica(ones))) == seen.replicas
      True
      >>> seen.replica_values.shape == (seen.replicas,)
      True
    """

    __slots__ = ("values",)

    def __init__(self, values: jax.typing.ArrayLike | Sequence[jax.typing.ArrayLike]):
        if isinstance(values, PerReplica):
            values = values.values
        if isinstance(values, list | tuple):
            if not values:
                raise ValueError(
                    "Expected statevar.PerReplica to get one value per replica, got none"
                )
            values = tuple(values)
        elif isinstance(values, jax.Array | np.ndarray):
            if values.ndim == 0:
                raise ValueError(
                    "Expected statevar.PerReplica to get an array whose first dimension indexes "
                    f"the replicas, or a sequence of values, got a scalar {values.dtype} array"
                )
        else:
            raise TypeError(
                "Expected statevar.PerReplica to get an array whose first dimension indexes the "
                f"replicas, or a sequence of values, got {type(values).__name__}"
            )
        #: The values as given: an array of shape ``(replicas, ...)``, or a tuple of values.
        self.values = values

    def __len__(self) -> int:
        """The number of replicas it has values for."""
        return len(self.values)

    def __repr__(self) -> str:
        if isinstance(self.values, tuple):
            return f"PerReplica({len(self.values)} values)"
        return f"PerReplica({self.values.dtype}{list(self.values.shape)})"

    def stacked(self) -> Any:
        """Returns the values as one array of shape ``(replicas, ...)``.

        Raises:
          ValueError: if the values of a sequence have different shapes.
        """
        if not isinstance(self.values, tuple):
            return self.values
        values = [read_operand(v) for v in self.values]
        if any(isinstance(v, Tracer) for v in values):
            return jnp.stack([jnp.asarray(v) for v in values])
        return np.stack([np.asarray(v) for v in values])


def _flatten(per_replica: PerReplica) -> tuple[tuple, bool]:
    values = per_replica.values
    if isinstance(values, tuple):
        return values, True
    return (values,), False


def _unflatten(sequence: bool, children: Any) -> PerReplica:
    # Unchecked: JAX's tree functions put placeholders of any type in its leaves.
    rebuilt = object.__new__(PerReplica)
    rebuilt.values = tuple(children) if sequence else children[0]
    return rebuilt


jax.tree_util.register_pytree_node(PerReplica, _flatten, _unflatten)


# --------------------------------------------------------------------------- layout
