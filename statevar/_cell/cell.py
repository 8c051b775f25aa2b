"""What the modules below `Variable` read of a variable, as a type.

`Variable` (`statevar._cell.variable`) imports the copy policy, creation, indexing and the
view, so they cannot import it back; they take their variable typed as a `Cell`, which
`Variable` (and the `View` of one) satisfies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import jax
import numpy as np


class Cell(Protocol):
    """A variable as the modules it is built from see it: its array and what describes it."""

    _value: jax.Array

    @property
    def name(self) -> str: ...

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype: ...

    @property
    def device(self) -> Any: ...

    @property
    def sharding(self) -> jax.sharding.Sharding: ...


class ConstrainedCell(Cell, Protocol):
    """A `Cell` with an optional projection of its new values (a Variable's, not a View's)."""

    @property
    def constraint(self) -> Callable[[jax.Array], jax.Array] | None: ...
