"""Functional access: `statevar.read_values` and `statevar.stateless_call`."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import statevar


class Dense(statevar.Module):
    def __init__(self, key, n_in, n_out, name=None):
        self.kernel = statevar.Variable(
            jax.random.normal(key, (n_in, n_out)), name=name and f"{name}/kernel"
        )
        self.bias = statevar.Variable(jnp.zeros(n_out), name=name and f"{name}/bias")

    def __call__(self, x):
        return x @ self.kernel + self.bias


class Model(statevar.Module):
    def __init__(self, seed=0, trainable_bias=True):
        key_1, key_2 = jax.random.split(jax.random.key(seed))
        self.layers = [Dense(key_1, 3, 4), Dense(key_2, 4, 1)]
        self.layers[1].bias.trainable = trainable_bias
        self.calls = statevar.Variable(0, trainable=False, name="calls")

    def __call__(self, x):
        self.calls.assign_add(1)
        return self.layers[1](jnp.tanh(self.layers[0](x)))


X = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)


def test_read_values_gives_arrays_keyed_by_name_in_module_order():
    model = Model()

    values = statevar.read_values(model)

    assert list(values) == list(model.named_variables())
    assert all(type(v) is type(model.calls.value) for v in values.values())
    chex.assert_trees_all_equal(values["layers/0/kernel"], model.layers[0].kernel.value)


def test_read_values_keeps_containers_and_stays_valid_after_updates():
    w, b = statevar.Variable([1.0, 2.0]), statevar.Variable(3.0)

    values = statevar.read_values({"w": w, "pair": (b, [w])})
    w.assign_add(1.0)

    assert isinstance(values["pair"], tuple) and isinstance(values["pair"][1], list)
    chex.assert_trees_all_equal(
        values, {"w": jnp.array([1.0, 2.0]), "pair": (3.0, [jnp.array([1.0, 2.0])])}
    )


def test_read_values_refuses_what_is_not_variables():
    with pytest.raises(TypeError, match=r"read_values's target .* got int at \[1\]"):
        statevar.read_values([statevar.Variable(1.0), 2])


def test_chex_compares_values_regardless_of_names_and_trainable_flags():
    a = Model(seed=0)
    b = Model(seed=0, trainable_bias=False)
    b.layers[0].kernel.assign(a.layers[0].kernel + 1e-7)

    chex.assert_trees_all_close(statevar.read_values(a), statevar.read_values(b))
    chex.assert_trees_all_close(statevar.read_values(statevar.Variable(3.0, name="x")), 3.0)
    chex.assert_tree_all_finite(statevar.read_values(a))
    b.layers[0].kernel.assign(a.layers[0].kernel)
    b.layers[1].bias.assign([1.0])
    with pytest.raises(AssertionError, match="differ in leaves 'layers/1/bias'"):
        chex.assert_trees_all_equal(statevar.read_values(a), statevar.read_values(b))
    b.layers[1].bias.assign([np.nan])
    with pytest.raises(AssertionError, match="finite"):
        chex.assert_tree_all_finite(statevar.read_values(b))


def test_tree_map_pairs_values_with_gradients():
    model = Model()
    grads = statevar.grad(lambda: jnp.sum(model(X) ** 2), model)()

    stepped = jax.tree.map(
        lambda p, g: p if g is None else p - 0.1 * g, statevar.read_values(model), grads
    )

    assert grads["calls"] is None
    chex.assert_trees_all_close(
        stepped["layers/0/kernel"], model.layers[0].kernel - 0.1 * grads["layers/0/kernel"]
    )
    chex.assert_trees_all_equal(stepped["calls"], model.calls.value)


def test_stateless_call_uses_the_values_and_changes_no_variable():
    model = Model()
    before = statevar.read_values(model)
    other = statevar.read_values(Model(seed=1))

    result, after = statevar.stateless_call(model, model, other, X)

    chex.assert_trees_all_equal(statevar.read_values(model), before)
    expected = Model(seed=1)(X)
    chex.assert_trees_all_close(result, expected)
    assert list(after) == list(before)
    chex.assert_trees_all_equal(after["calls"], 1)
    chex.assert_trees_all_equal(after["layers/0/kernel"], other["layers/0/kernel"])


def test_stateless_call_under_vmap_runs_an_ensemble():
    model = Model()
    members = [statevar.read_values(Model(seed=seed)) for seed in range(3)]
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *members)

    outputs = jax.vmap(lambda values: statevar.stateless_call(model, model, values, X)[0])(stacked)

    for i, values in enumerate(members):
        chex.assert_trees_all_close(
            outputs[i], statevar.stateless_call(model, model, values, X)[0], rtol=1e-6
        )
    assert int(model.calls) == 0


def test_stateless_call_under_jacrev_matches_statevar_grad():
    model = Model()

    def loss(values):
        return jnp.sum(statevar.stateless_call(model, model, values, X)[0] ** 2)

    values = statevar.read_values(model)
    trainable = {name: v for name, v in values.items() if name != "calls"}
    jacobian = jax.jacrev(lambda t: loss({**t, "calls": values["calls"]}))(trainable)
    grads = statevar.grad(lambda: jnp.sum(model(X) ** 2), model)()

    chex.assert_trees_all_close(jacobian, {k: grads[k] for k in trainable}, rtol=1e-6)


@pytest.mark.parametrize("compile", [jax.jit, lambda fn: fn])
def test_stateless_call_carries_assignments_under_control_flow(compile):
    counter = statevar.Variable(0.0)

    def add_ten():
        counter.assign_add(10.0)

    def count(n, flag):
        jax.lax.fori_loop(0, n, lambda i, c: (counter.assign_add(1.0), c)[1], 0)
        jax.lax.cond(flag, add_ten, lambda: None)
        return counter.value

    run = compile(lambda v, n, flag: statevar.stateless_call(count, counter, v, n, flag))

    chex.assert_trees_all_equal(run(1.0, 3, False), (4.0, 4.0))
    chex.assert_trees_all_equal(run(1.0, 0, True), (11.0, 11.0))
    assert float(counter) == 0.0


@pytest.mark.parametrize(
    "first, second",
    [(1.0, 1.0), (jnp.ones(3), jnp.ones(3))],
    ids=["equal-scalars", "vectors"],
)
def test_stateless_call_tells_variables_apart_by_identity_not_value(first, second):
    # Several target variables, one assigned under a cond: none may be compared by value.
    a = statevar.Variable(first, name="a")
    b = statevar.Variable(second, trainable=False, name="b")

    def fn():
        jax.lax.cond(True, lambda: (b.assign(b + a), None)[1], lambda: None)
        return a * 1.0

    result, (new_a, new_b) = statevar.stateless_call(fn, [a, b], [a.value * 10, b.value * 20])

    chex.assert_trees_all_equal(result, a.value * 10)
    chex.assert_trees_all_equal(new_a, a.value * 10)
    chex.assert_trees_all_equal(new_b, b.value * 30)


def test_stateless_call_inside_statevar_jit_and_grad():
    model = Model()
    values = statevar.read_values(Model(seed=1))

    @statevar.jit
    def step(values):
        model.calls.assign_add(5)
        result, new = statevar.stateless_call(model, model, values, X)
        return result, new["calls"]

    result, calls = step(values)
    chex.assert_trees_all_close(result, Model(seed=1)(X))
    assert int(calls) == 1 and int(model.calls) == 5

    grads = statevar.grad(
        lambda: jnp.sum(statevar.stateless_call(model, model, values, X)[0]) * model.calls,
        model.calls,
    )()
    assert grads is None


def test_stateless_call_refuses_a_mismatched_structure_and_leaves_values_alone():
    model = Model()
    values = statevar.read_values(model)
    del values["calls"]

    with pytest.raises(ValueError, match="structure of statevar.read_values"):
        statevar.stateless_call(model, model, values, X)


def test_stateless_call_refuses_wrong_shapes_and_dtypes_naming_the_variable():
    w = statevar.Variable([1.0, 2.0], name="w")

    with pytest.raises(statevar.ShapeMismatchError, match=r"'w'.*shape \(3,\).*\(2,\)"):
        statevar.stateless_call(lambda: w + 1, w, jnp.zeros(3))
    with pytest.raises(statevar.DtypeMismatchError, match=r"'w'.*dtype int32.*float32"):
        statevar.stateless_call(lambda: w + 1, w, jnp.zeros(2, jnp.int32))


def test_stateless_call_refuses_assigning_a_variable_outside_its_target():
    w, other = statevar.Variable(1.0), statevar.Variable(0.0, name="other")

    def fn():
        other.assign(w * 2)

    with pytest.raises(statevar.TraceContextError, match="'other' inside statevar.stateless"):
        statevar.stateless_call(fn, w, 5.0)
    with pytest.raises(statevar.TraceContextError, match="'other' inside statevar.stateless"):
        statevar.stateless_call(lambda: jax.lax.cond(True, fn, lambda: None), w, 5.0)
    assert float(other) == 0.0


def test_stateless_call_refuses_creating_a_variable():
    w = statevar.Variable(1.0)

    with pytest.raises(statevar.TraceContextError, match="'made' inside statevar.stateless"):
        statevar.stateless_call(lambda: statevar.Variable(w + 1, name="made"), w, 2.0)


def test_stateless_call_with_an_optimizer_trains_a_copy_of_the_values():
    model = Model()
    optimizer = statevar.Optimizer(optax.sgd(0.1), model)
    target = [model, optimizer.state_variables]

    def step():
        grads = statevar.grad(lambda: jnp.sum(model(X) ** 2), model)()
        optimizer.apply(grads)

    before = statevar.read_values(target)
    _, after = statevar.stateless_call(step, target, before)
    step()

    # Equal to rounding: the call runs the update op by op, step() compiles it, and XLA may
    # fuse the arithmetic differently (one ulp apart on jax 0.12.1).
    chex.assert_trees_all_close(after, statevar.read_values(target), rtol=1e-6, atol=0)
    assert not np.allclose(after[0]["layers/0/kernel"], before[0]["layers/0/kernel"])
