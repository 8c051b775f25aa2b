"""GPU placement: run where a GPU exists, skipped elsewhere (see conftest.py)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statevar

pytestmark = pytest.mark.gpu


def test_a_variable_placed_on_the_gpu_stays_there_and_updates_in_place():
    v = statevar.Variable(jnp.zeros(1024), device="gpu:0")
    assert v.device == jax.devices("gpu")[0]
    v.assign_add(1.0)
    pointer = v.value.unsafe_buffer_pointer()
    v.assign_add(1.0)
    v.assign_sub(jnp.ones(1024))
    v[0] = 5.0
    assert v.device == jax.devices("gpu")[0]
    assert v.value.unsafe_buffer_pointer() == pointer
    assert float(v[1]) == 1.0 and float(v[0]) == 5.0


def test_variables_on_the_cpu_multiplied_on_the_gpu():
    with statevar.device("cpu:0"):
        a = statevar.Variable([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
        b = statevar.Variable([[1.0, 2.0, 3.0]])
    with statevar.device("gpu:0"):
        k = a * b
    assert k.devices() == {jax.devices("gpu")[0]}
    assert a.device.platform == "cpu" and b.device.platform == "cpu"
    np.testing.assert_allclose(np.asarray(k), [[1.0, 4.0, 9.0], [4.0, 10.0, 18.0]])


def test_a_compiled_step_on_the_gpu_donates_and_keeps_earlier_reads():
    w = statevar.Variable(jnp.zeros(1024), device="gpu:0")

    @statevar.jit
    def step():
        w.assign_add(1.0)

    step()
    pointer = w.value.unsafe_buffer_pointer()
    step()
    assert w.value.unsafe_buffer_pointer() == pointer
    held = w.value
    step()
    chex.assert_trees_all_close(held, jnp.full(1024, 2.0))
    chex.assert_tree_is_on_device(w.value, device=jax.devices("gpu")[0])


def test_a_checkpoint_restores_onto_the_variables_gpu(tmp_path):
    w = statevar.Variable([1.0, 2.0], name="w", device="gpu:0")
    statevar.save(tmp_path / "checkpoint", w)
    w.assign([0.0, 0.0])
    statevar.restore(tmp_path / "checkpoint", w)
    assert w.device == jax.devices("gpu")[0]
    np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])
