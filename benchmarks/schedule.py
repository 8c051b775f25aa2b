"""The order in which a benchmark's variants take their turns, round after round.

A variant's time depends on what ran just before it: a variant that walks many Python
objects (flax nnx, say) pushes the next one's out of the CPU caches, while a pure-JAX
variant right after its statevar twin finds JAX's dispatch path warm. A rotation
(``order[k:] + order[:k]``) keeps the cyclic order, so a variant follows the same one in
most rounds (statevar, JAX and nnx, in that order: statevar right after nnx in two rounds
of three, JAX in one). `turns` gives a Williams design, the crossover design balanced for
carry-over: every variant runs right after every other equally often, over each whole
cycle of `williams_orders`. See ``benchmarks/README.md`` for what the order did to the
measured ratios.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def williams_orders(count: int) -> list[list[int]]:
    """Orders of ``range(count)`` in which each index comes right after each other index
    equally often: ``count`` orders for an even count, twice as many for an odd one."""
    first, low, high = [0], 1, count - 1
    while len(first) < count:  # 0, 1, n-1, 2, n-2, ...
        if len(first) % 2:
            first.append(low)
            low += 1
        else:
            first.append(high)
            high -= 1
    orders = [[(index + shift) % count for index in first] for shift in range(count)]
    if count % 2:
        orders += [order[::-1] for order in orders]
    return orders


def turns(variants: Iterable[T], rounds: int) -> Iterator[list[T]]:
    """Yields, for each of ``rounds`` rounds, the order in which ``variants`` (a dict's
    keys, say) take turns, cycling through `williams_orders`."""
    listed = list(variants)
    orders = williams_orders(len(listed))
    for round_index in range(rounds):
        yield [listed[index] for index in orders[round_index % len(orders)]]
