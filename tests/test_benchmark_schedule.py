"""Tests that the benchmarks' variants take turns in a fair order: every variant runs right
after every other equally often, so that none is timed in another's wake more often."""

import collections
import importlib.util
import pathlib

import pytest

_PATH = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "schedule.py"
_SPEC = importlib.util.spec_from_file_location("benchmark_schedule", _PATH)
schedule = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(schedule)
turns, williams_orders = schedule.turns, schedule.williams_orders


@pytest.mark.parametrize("count", range(1, 24))
def test_each_order_runs_every_variant_once(count):
    for order in williams_orders(count):
        assert sorted(order) == list(range(count))


@pytest.mark.parametrize("count", range(2, 24))
def test_every_variant_follows_every_other_equally_often(count):
    orders = williams_orders(count)
    follows = collections.Counter(
        pair for order in orders for pair in zip(order, order[1:], strict=False)
    )
    assert set(follows) == {(a, b) for a in range(count) for b in range(count) if a != b}
    assert len(set(follows.values())) == 1
    assert len(orders) == (count if count % 2 == 0 else 2 * count)


def test_the_variant_listed_first_follows_the_last_no_more_often_than_the_others():
    # A rotation ran "statevar" right after "nnx" in four rounds of six, "jax" in two.
    names = ["statevar", "jax", "nnx"]
    fair = list(turns(names, 6))
    assert sum(order.index("statevar") == order.index("nnx") + 1 for order in fair) == 2
    assert sum(order.index("jax") == order.index("nnx") + 1 for order in fair) == 2


def test_turns_cycle_through_the_orders_for_the_rounds_asked():
    names = ["a", "b", "c"]
    rounds = list(turns(names, 14))
    assert len(rounds) == 14
    assert rounds[:6] == rounds[6:12] == [[names[i] for i in o] for o in williams_orders(3)]
    assert list(turns(names, 0)) == []
