"""Code written for plain JAX, flax, Keras and chex, run on statevar's Modules, Optimizers
and Variables as written: Modules and Optimizers are pytrees, Keras' ``apply(grads,
variables)``, jax.Array's read methods on a variable."""

import collections
import io

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import statevar


class Dense(statevar.Module):
    def __init__(self, n_in, n_out, activation="relu"):
        self.kernel = statevar.Variable(
            jnp.arange(n_in * n_out, dtype=jnp.float32).reshape(n_in, n_out) / 10
        )
        self.bias = statevar.Variable(jnp.zeros(n_out))
        self.activation = activation

    def __call__(self, x):
        return x @ self.kernel + self.bias


class Model(statevar.Module):
    def __init__(self):
        self.layers = [Dense(2, 3), Dense(3, 1, activation=None)]
        self.step = statevar.Variable(0, trainable=False, name="step")
        self.scale = jnp.float32(2.0)  # a plain array attribute: a leaf, as in equinox
        self.config = {"depth": 2}  # static

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x * self.scale


X = jnp.ones((4, 2))


def loss(model, x=X):
    return jnp.mean(model(x) ** 2)


# ------------------------------------------------------------------ Modules as pytrees


def test_a_modules_leaves_are_its_variables_arrays_and_array_attributes_in_attribute_order():
    model = Model()
    leaves = jax.tree.leaves(model)
    expected = [
        model.layers[0].kernel.value,
        model.layers[0].bias.value,
        model.layers[1].kernel.value,
        model.layers[1].bias.value,
        model.step.value,
        model.scale,
    ]
    assert len(leaves) == len(expected)
    for leaf, value in zip(leaves, expected, strict=True):
        assert leaf is value
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(model)[0]]
    assert paths == [
        ".layers/0/kernel",
        ".layers/0/bias",
        ".layers/1/kernel",
        ".layers/1/bias",
        ".step",
        ".scale",
    ]


def test_tree_map_returns_a_new_module_of_views_and_leaves_the_original_untouched():
    model = Model()
    doubled = jax.tree.map(lambda x: x * 2, model)
    assert type(doubled) is Model and type(doubled.layers[1]) is Dense
    assert doubled.layers[0].activation == "relu" and doubled.config == {"depth": 2}
    kernel = doubled.layers[0].kernel
    assert isinstance(kernel, statevar.Variable) is False
    assert kernel.name == "layers/0/kernel" and doubled.step.name == "step"
    chex.assert_trees_all_close(kernel.value, model.layers[0].kernel.value * 2)
    chex.assert_trees_all_close(model.layers[0].kernel.value, jnp.arange(6.0).reshape(2, 3) / 10)
    # The new Module runs, as the original does.
    chex.assert_trees_all_close(doubled(X), Model()(X) * 0 + doubled(X))
    with pytest.raises(TypeError, match="read-only view"):
        kernel.assign(jnp.zeros((2, 3)))


def test_two_models_of_one_architecture_share_a_structure_and_chex_compares_them():
    a, b = Model(), Model()
    assert jax.tree.structure(a) == jax.tree.structure(b)
    chex.assert_trees_all_close(a, b)
    b.layers[0].bias.assign_add(1.0)
    with pytest.raises(AssertionError):
        chex.assert_trees_all_close(a, b)
    chex.assert_trees_all_equal_structs(a, b)
    differences = jax.tree.map(lambda x, y: jnp.abs(x - y).max(), a, b)
    assert float(differences.layers[0].bias.value) == 1.0


def test_a_shared_variable_is_one_leaf_and_a_back_reference_no_loop():
    layer = Dense(2, 2)

    class Tied(statevar.Module):
        def __init__(self):
            self.encoder = layer
            self.decoder = layer  # the same layer twice
            layer.owner = self  # refers back to the Module holding it

    tied = Tied()
    assert len(jax.tree.leaves(tied)) == 2
    copy = jax.tree.map(lambda x: x + 1, tied)
    assert copy.encoder is copy.decoder and copy.encoder.owner is copy
    chex.assert_trees_all_close(copy.decoder.kernel.value, layer.kernel.value + 1)


def test_containers_keep_their_types_and_static_values():
    Pair = collections.namedtuple("Pair", "first second")

    class Holder(statevar.Module):
        def __init__(self):
            self.pair = Pair(statevar.Variable(1.0), 3)
            self.ordered = collections.OrderedDict(w=statevar.Variable(2.0))
            self.items = (statevar.Variable(3.0), "tag")
            self.table = np.arange(3)  # a NumPy array attribute: a leaf

    rebuilt = jax.tree.map(lambda x: x * 10, Holder())
    assert type(rebuilt.pair) is Pair and rebuilt.pair.second == 3
    assert type(rebuilt.ordered) is collections.OrderedDict
    assert rebuilt.items[1] == "tag" and float(rebuilt.items[0].value) == 30.0
    np.testing.assert_array_equal(rebuilt.table, [0, 10, 20])
    assert float(rebuilt.pair.first.value) == 10.0


def test_plain_jax_jit_grad_and_vmap_take_a_module_argument():
    model = Model()
    expected = loss(model)
    chex.assert_trees_all_close(jax.jit(loss)(model), expected)
    grads = jax.grad(loss, allow_int=True)(model)
    assert type(grads) is Model
    manual = jax.grad(
        lambda k: jnp.mean(((X @ k + 0.0) @ model.layers[1].kernel.value * 2.0) ** 2)
    )(model.layers[0].kernel.value)
    chex.assert_trees_all_close(grads.layers[0].kernel.value, manual, rtol=1e-6)
    # Plain jax.grad differentiates every variable, trainable or not (statevar.grad does not).
    assert grads.step.value.dtype == jax.dtypes.float0
    batched = jax.vmap(lambda m, x: m(x), in_axes=(None, 0))(model, jnp.ones((5, 4, 2)))
    assert batched.shape == (5, 4, 1)


def test_tree_map_pairs_a_model_with_its_gradient_module_for_a_plain_jax_update():
    layer = Dense(2, 3)
    grads = jax.grad(lambda d: jnp.sum(d(X) ** 2))(layer)
    assert jax.tree.structure(grads) == jax.tree.structure(layer)
    updated = jax.tree.map(lambda p, g: p - 0.1 * g, layer, grads)
    chex.assert_trees_all_close(updated.kernel.value, layer.kernel.value - 0.1 * grads.kernel.value)
    statevar.read_values(layer)  # the layer itself is unchanged, and still a Module of Variables
    assert isinstance(layer.kernel, statevar.Variable)


def test_assigning_to_a_module_argument_under_plain_jax_jit_is_refused_by_name():
    model = Model()

    def count(m):
        m.step.assign_add(1)
        return m(X)

    with pytest.raises(statevar.TraceContextError, match="Variable 'step'.*use statevar.jit"):
        jax.jit(count)(model)
    with pytest.raises(statevar.TraceContextError, match="Variable 'layers/0/bias'"):
        jax.grad(lambda m: m.layers[0].bias.assign(jnp.ones(3)), allow_int=True)(model)
    assert int(model.step) == 0
    # statevar.jit still takes the Module and updates it in place.
    statevar.jit(count)(model)
    assert int(model.step) == 1


def test_an_optimizer_applies_a_gradient_module_from_plain_jax_grad_matched_by_path():
    model, reference = Model(), Model()
    optimizer = statevar.Optimizer(optax.sgd(0.1), model)
    grads = jax.grad(loss, allow_int=True)(model)
    optimizer.apply(grads)
    expected = statevar.grad(loss, reference)(reference)
    for name, variable in model.named_variables().items():
        before = reference.named_variables()[name].value
        if name == "step":
            assert int(variable) == 0  # non-trainable: its gradient is ignored
        else:
            chex.assert_trees_all_close(variable.value, before - 0.1 * expected[name], rtol=1e-6)
    optimizer.apply_gradients(grads)  # the Keras name takes it too
    assert int(optimizer.iterations) == 2


def test_a_gradient_module_for_other_variables_is_refused_by_name():
    model = Model()
    optimizer = statevar.Optimizer(optax.sgd(0.1), model)
    other = jax.grad(lambda d: jnp.sum(d(X[:, :2] @ jnp.ones((2, 2)))))(Dense(2, 3))
    before = statevar.read_values(model)
    with pytest.raises(
        ValueError, match="Optimizer 'optimizer' optimizes .*layers/0/kernel.*holds kernel, bias"
    ):
        optimizer.apply(other)
    chex.assert_trees_all_close(statevar.read_values(model), before)


def test_an_optimizer_warns_of_a_gradient_module_missing_a_variable():
    model = Model()
    optimizer = statevar.Optimizer(optax.sgd(0.1), model)
    grads = jax.grad(loss, allow_int=True)(model)
    del grads.layers[1].bias
    with pytest.warns(UserWarning, match="no gradient for 'layers/1/bias'"):
        optimizer.apply(grads)


def test_a_module_under_statevar_jit_and_grad_behaves_as_before():
    model = Model()
    optimizer = statevar.Optimizer(optax.adam(1e-2), model)

    @statevar.jit
    def step(m, x):
        value, grads = statevar.value_and_grad(loss, m)(m, x)
        optimizer.apply(grads)
        m.step.assign_add(1)
        return value

    first = step(model, X)
    assert float(step(model, X)) < float(first)
    assert int(model.step) == 2


# ------------------------------------------------------------------ Optimizer


def test_an_optimizer_is_a_pytree_of_its_state_variables():
    w = statevar.Variable([1.0, 2.0], name="w")
    optimizer = statevar.Optimizer(optax.adam(1e-3), [w])
    leaves = jax.tree.leaves(optimizer)
    assert [v.name for v in optimizer.state_variables] == [
        "optimizer/iterations",
        "optimizer/count",
        "optimizer/mu/w",
        "optimizer/nu/w",
    ]
    assert len(leaves) == 4 and all(
        a is v.value for a, v in zip(leaves, optimizer.state_variables, strict=True)
    )
    shapes = jax.tree.map(lambda x: x.shape, optimizer)
    assert shapes.variables == {"iterations": (), "count": (), "mu/w": (2,), "nu/w": (2,)}
    assert shapes.iterations == () and len(shapes.state_variables) == 4
    assert "OptimizerState 'optimizer': 4 state variables" in repr(shapes)
    other = statevar.Optimizer(optax.adam(1e-3), [statevar.Variable([0.0, 0.0], name="w")])
    chex.assert_trees_all_close(optimizer, other)
    # What tree functions make of two Optimizers pairs up too.
    state, other_state = jax.tree.map(jnp.asarray, optimizer), jax.tree.map(jnp.asarray, other)
    sums = jax.tree.map(lambda a, b: a + b, state, other_state)
    assert sums.variables["mu/w"].name == "optimizer/mu/w"


def test_an_optimizer_goes_where_a_module_goes():
    w = statevar.Variable([1.0, 2.0], name="w")
    optimizer = statevar.Optimizer(optax.adam(1e-3), [w])
    values = statevar.read_values(optimizer)
    assert list(values) == ["iterations", "count", "mu/w", "nu/w"]

    def step():
        optimizer.apply([w.value])
        return optimizer.iterations.value

    count, new = statevar.stateless_call(step, [w, optimizer], statevar.read_values([w, optimizer]))
    assert int(count) == 1 and int(new[1]["iterations"]) == 1
    assert int(optimizer.iterations) == 0  # stateless: nothing changed
    out = io.StringIO()
    statevar.summary(optimizer, file=out)
    text = out.getvalue()
    assert (
        text.startswith("Optimizer\n")
        and "optimizer/mu/w" in text
        and "optimizer/iterations" in text
    )
    unbuilt = statevar.Optimizer(optax.sgd(0.1))
    assert list(statevar.read_values(unbuilt)) == ["iterations"]


def test_keras_apply_takes_gradients_and_variables_in_order():
    a, b = statevar.Variable([1.0], name="a"), statevar.Variable([2.0], name="b")
    optimizer = statevar.Optimizer(optax.sgd(0.5))
    optimizer.apply([jnp.ones(1), jnp.ones(1)], [a, b])  # builds, as Keras' first apply does
    optimizer.apply([jnp.ones(1)], [b])  # any subset
    chex.assert_trees_all_close((a.value, b.value), (jnp.array([0.5]), jnp.array([1.0])))
    assert int(optimizer.iterations) == 2
    with pytest.raises(ValueError, match="got 1 gradients and 2 variables"):
        optimizer.apply([jnp.ones(1)], [a, b])
    chex.assert_trees_all_close((a.value, b.value), (jnp.array([0.5]), jnp.array([1.0])))


# ------------------------------------------------------------------ array methods


def test_a_variable_has_jax_arrays_read_methods_and_none_changes_it():
    v = statevar.Variable([[1.0, -2.0], [3.0, 4.5]], name="w")
    value = v.value
    chex.assert_trees_all_close(v.T, value.T)
    chex.assert_trees_all_close(v.mT, value.mT)
    chex.assert_trees_all_close(v.sum(), value.sum())
    chex.assert_trees_all_close(v.sum(axis=0, keepdims=True), value.sum(axis=0, keepdims=True))
    chex.assert_trees_all_close(v.mean(), value.mean())
    chex.assert_trees_all_close(v.max(axis=1), value.max(axis=1))
    chex.assert_trees_all_close(v.min(), value.min())
    chex.assert_trees_all_close(v.std(), value.std())
    chex.assert_trees_all_close(v.var(), value.var())
    chex.assert_trees_all_close(v.prod(), value.prod())
    assert int(v.argmax()) == 3 and int(v.argmin()) == 1
    assert bool(v.any()) and not bool((v > 0).all()) and not bool(v.all() == 0)
    assert v.astype(jnp.int32).dtype == jnp.int32 and v.dtype == jnp.float32
    assert v.item(3) == 4.5 and v.tolist() == [[1.0, -2.0], [3.0, 4.5]]
    chex.assert_trees_all_close(v.clip(0, 2), value.clip(0, 2))
    chex.assert_trees_all_close(v.round(), value.round())
    chex.assert_trees_all_close(v.cumsum(), value.cumsum())
    chex.assert_trees_all_close(v.cumprod(axis=0), value.cumprod(axis=0))
    chex.assert_trees_all_close(v.dot(jnp.ones(2)), value.dot(jnp.ones(2)))
    z = statevar.Variable([1 + 2j])
    assert complex(z.conj()[0]) == 1 - 2j and float(z.real[0]) == 1.0 and float(z.imag[0]) == 2.0
    assert v.value is value  # nothing was updated
    assert not hasattr(v, "reshape")  # as tf.Variable: jnp.reshape(v, ...) reads it


def test_read_methods_read_the_traced_value_inside_statevar_jit():
    v = statevar.Variable([[1.0, 2.0], [3.0, 4.0]], name="w")

    @statevar.jit
    def step():
        v.assign(v.T * 2)
        return v.sum(), v.mean(axis=0)

    total, mean = step()
    assert float(total) == 20.0
    chex.assert_trees_all_close(mean, jnp.array([3.0, 7.0]))


def test_at_is_refused_with_the_way_to_update_in_place():
    v = statevar.Variable([1.0, 2.0], name="w")
    with pytest.raises(AttributeError, match=r"Variable 'w' has no \.at: .*v\[i\] = x.*v\.assign"):
        v.at[0].set(5.0)
    assert v.numpy().tolist() == [1.0, 2.0]


def test_static_attributes_are_part_of_the_structure_and_jax_jit_retraces_when_they_change():
    class Scaled(statevar.Module):
        def __init__(self, factors):
            self.w = statevar.Variable(jnp.ones(2))
            self.factors = factors  # a set: static, and unhashable in a tuple of leaves

    traces = []

    @jax.jit
    def apply(module):
        traces.append(1)
        return module.w * sum(module.factors)

    chex.assert_trees_all_close(apply(Scaled({1.0, 2.0})), jnp.full(2, 3.0))
    chex.assert_trees_all_close(apply(Scaled({1.0, 2.0})), jnp.full(2, 3.0))  # equal: cached
    chex.assert_trees_all_close(apply(Scaled({4.0})), jnp.full(2, 4.0))
    assert len(traces) == 2
    assert jax.tree.structure(Scaled({1.0})) != jax.tree.structure(Scaled({2.0}))


def test_flattening_a_module_keeps_nothing_alive_so_the_next_update_donates():
    model = Model()
    jax.tree.leaves(model)
    jax.tree.map(lambda x: x, model)
    jax.grad(loss, allow_int=True)(model)
    # No reference cycle holds the arrays until the garbage collector runs: the next update
    # finds each held by its variable alone, and donates it.
    with statevar.copy_policy("raise"):
        model.layers[0].kernel.assign_add(1.0)
        model.step.assign_add(1)


def test_a_container_holding_itself_is_refused_by_path():
    class Loop(statevar.Module):
        def __init__(self):
            self.items = [statevar.Variable(1.0)]
            self.items.append(self.items)

    with pytest.raises(ValueError, match=r"Cannot flatten Loop .* list at 'items/1' holds itself"):
        jax.tree.leaves(Loop())


def test_an_optimizer_passed_to_statevar_jit_is_the_optimizer():
    w = statevar.Variable([1.0, 2.0], name="w")
    optimizer = statevar.Optimizer(optax.sgd(0.5), [w])

    @statevar.jit
    def step(opt, g):
        opt.apply([g])

    step(optimizer, jnp.ones(2))
    step(optimizer, jnp.ones(2))
    chex.assert_trees_all_close(w.value, jnp.array([0.0, 1.0]))
    assert int(optimizer.iterations) == 2


def test_a_gradient_module_leaves_a_variable_frozen_after_the_build_as_it_is():
    model = Model()
    optimizer = statevar.Optimizer(optax.sgd(0.1), model)
    model.layers[0].trainable = False
    frozen = model.layers[0].kernel.numpy()
    optimizer.apply(jax.grad(loss, allow_int=True)(model))
    np.testing.assert_array_equal(model.layers[0].kernel.numpy(), frozen)
    assert not np.array_equal(model.layers[1].kernel.numpy(), Model().layers[1].kernel.numpy())
    assert int(optimizer.iterations) == 1
