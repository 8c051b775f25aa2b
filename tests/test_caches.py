"""`statevar.clear_caches`: every compiled step and compiled update is dropped, and what
compiles again runs as a first call, as safe as the very first."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

import statevar
from statevar._cell import kernels as _kernels
from statevar._distribute import on_read as _on_read


def test_a_compiled_step_traces_again_after_clear_caches():
    v = statevar.Variable(jnp.zeros(3), name="v")
    traces = []

    @statevar.jit
    def step(x):
        traces.append(None)
        v.assign_add(x)
        return v.value.sum()

    step(jnp.ones(3))
    step(jnp.ones(3))
    assert len(traces) == 1
    statevar.clear_caches()
    assert step._cache.entries == {}
    assert float(step(jnp.ones(3))) == 9.0  # the same results, compiled again
    assert len(traces) == 2
    step(jnp.ones(3))
    assert len(traces) == 2  # and warm again


def test_an_eager_update_after_clear_caches_runs_as_a_first_call(first_calls):
    v = statevar.Variable(jnp.zeros(3), name="v")
    one = jnp.ones(3)
    v.assign_add(one)
    v.assign_add(one)
    assert len(first_calls) == 1  # the first donating call held the signal handlers
    statevar.clear_caches()
    v.assign_add(one)  # JAX compiles it again: its Python path runs after donating
    assert len(first_calls) == 2
    v.assign_add(one)
    assert len(first_calls) == 2
    np.testing.assert_array_equal(v.numpy(), np.full(3, 4.0))


def test_clear_caches_empties_the_compiled_updates_of_sharded_and_on_read_variables():
    mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])
    sharded = statevar.Variable(jnp.zeros(4), sharding=NamedSharding(mesh, PartitionSpec("data")))
    sharded.assign_add(1.0)
    with statevar.mesh(mesh):
        on_read = statevar.Variable(jnp.zeros(2), synchronization="on_read", aggregation="sum")
    on_read.assign(jnp.ones(2))
    float(on_read[0])
    assert _kernels.pinned_updates.cache_info().currsize > 0
    statevar.clear_caches()
    assert _kernels.pinned_updates.cache_info().currsize == 0
    assert _on_read.reader.cache_info().currsize == 0
    sharded.assign_add(1.0)
    on_read.assign_add(jnp.ones(2))
    np.testing.assert_array_equal(sharded.numpy(), np.full(4, 2.0))
    np.testing.assert_array_equal(on_read.numpy(), np.full(2, 2.0))


def test_clear_caches_changes_no_variable_and_keeps_earlier_reads_valid():
    v = statevar.Variable(jnp.arange(3.0), name="v")
    read = v.value
    statevar.clear_caches()
    np.testing.assert_array_equal(read, np.arange(3.0))
    np.testing.assert_array_equal(v.numpy(), np.arange(3.0))
