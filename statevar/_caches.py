"""Every cache statevar keeps, and `clear_caches`, the one way to empty them all.

A module that keeps a cache registers the function that empties it (`register`), as
equinox's ``_caches.py`` does; `clear_caches` runs them all, then JAX's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import jax

from ._state import STATE

_clearers: list[Callable[[], None]] = []
CachedFunction = TypeVar("CachedFunction", bound=Any)


def register(clear: Callable[[], None]) -> Callable[[], None]:
    """Registers ``clear``, a function emptying one of statevar's caches; returns it."""
    _clearers.append(clear)
    return clear


def register_cached(function: CachedFunction) -> CachedFunction:
    """Registers the `functools.cache` ``function`` (a decorator): its entries are
    cleared with the others."""
    register(function.cache_clear)
    return function


def clear_caches() -> None:
    """Drops every compiled step and compiled update statevar keeps, then clears JAX's caches.

    As `jax.clear_caches` (which it calls) and ``equinox.clear_caches``: memory held by
    compiled code is freed, and everything compiles again on its next use. Each
    `statevar.jit` function traces again on its next call; each variable's next eager update
    runs as a first call, with signal handlers held while JAX compiles it. No variable
    changes and nothing is donated; arrays read earlier stay valid.

    Example:
      >>> import statevar
      >>> v = statevar.Variable(1.0)
      >>> @statevar.jit
      ... def step():
      ...     v.assign_add(1.0)
      >>> step()
      >>> statevar.clear_caches()
      >>> step()  # traced and compiled again
      >>> float(v)
      3.0
    """
    with STATE.update_lock:
        for clear in _clearers:
            clear()
        STATE.forget_compiled_updates()
        jax.clear_caches()
