"""statevar.Optimizer: optax transformations applied in place."""

import copy

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import statevar


class Linear(statevar.Module):
    def __init__(self):
        self.kernel = statevar.Variable([[1.0, -2.0], [0.5, 3.0]])
        self.bias = statevar.Variable([0.1, -0.1])
        self.steps = statevar.Variable(0, trainable=False, name="steps")

    def __call__(self, x):
        return x @ self.kernel + self.bias


X = jnp.array([[1.0, 2.0], [3.0, -1.0]])


def _pure_adam(steps):
    params = {"bias": jnp.array([0.1, -0.1]), "kernel": jnp.array([[1.0, -2.0], [0.5, 3.0]])}
    tx = optax.adam(0.1)
    state = tx.init(params)
    for _ in range(steps):
        grads = jax.grad(lambda p: jnp.sum((X @ p["kernel"] + p["bias"]) ** 2))(params)
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    return params


@pytest.mark.parametrize("compiled", [True, False], ids=["jit", "eager"])
def test_matches_pure_optax(compiled):
    model = Linear()
    opt = statevar.Optimizer(optax.adam(0.1), model)

    def step(x):
        grads = statevar.grad(lambda: jnp.sum(model(x) ** 2), model)()
        opt.apply(grads)
        model.steps.assign_add(1)

    step = statevar.jit(step) if compiled else step
    for _ in range(3):
        step(X)
    expected = _pure_adam(3)
    chex.assert_trees_all_close(
        {"bias": model.bias.value, "kernel": model.kernel.value}, expected, rtol=1e-5
    )
    assert int(model.steps) == 3  # the non-trainable step counter counts, untouched by adam


def test_state_lives_in_non_trainable_variables_updated_in_place():
    w = statevar.Variable(jnp.ones(256))
    opt = statevar.Optimizer(optax.adam(0.1), w)
    assert opt.variables == (w,)
    assert opt.state_variables and not any(v.trainable for v in opt.state_variables)
    opt.apply(jnp.ones(256))
    pointers = [v._value.unsafe_buffer_pointer() for v in (w, *opt.state_variables)]
    opt.apply(jnp.ones(256))
    assert [v._value.unsafe_buffer_pointer() for v in (w, *opt.state_variables)] == pointers


def test_a_none_gradient_leaves_the_variable_unchanged():
    a, b = statevar.Variable(1.0), statevar.Variable(2.0, name="b")
    opt = statevar.Optimizer(optax.sgd(1.0), [a, b])
    with pytest.warns(UserWarning, match="Optimizer got no gradient for 'b'"):
        opt.apply([jnp.float32(0.5), None])
    assert (float(a), float(b)) == (0.5, 2.0)


@pytest.mark.parametrize("transform", [statevar.jit, lambda fn: fn], ids=["jit", "eager"])
def test_an_unread_variable_and_its_optimizer_state_are_untouched_with_one_warning(transform):
    used = statevar.Variable([1.0, 2.0], name="used")
    unused = statevar.Variable([3.0, 4.0], name="unused")
    opt = statevar.Optimizer(optax.adam(0.1), [used, unused])
    opt.apply([jnp.ones(2), jnp.ones(2)])  # gives the unused variable's moments a value
    moments_before = [v.value for v in opt.state_variables]
    unused_before = unused.value
    step = transform(
        lambda: opt.apply(statevar.grad(lambda: jnp.sum(used * used), [used, unused])())
    )

    with pytest.warns(UserWarning, match="Optimizer got no gradient for 'unused'") as caught:
        step()
        step()
    assert len(caught) == 1
    assert statevar.grad(lambda: jnp.sum(used * used), [used, unused])()[1] is None
    chex.assert_trees_all_equal(unused.value, unused_before)
    # Adam's state: the step count, then the moments of each variable.
    count, mu_used, mu_unused, nu_used, nu_unused = (v.value for v in opt.state_variables)
    chex.assert_trees_all_equal((mu_unused, nu_unused), (moments_before[2], moments_before[4]))
    assert int(count) == 3
    assert not np.array_equal(mu_used, moments_before[1])


def test_gradients_must_mirror_the_variables():
    model = Linear()
    opt = statevar.Optimizer(optax.sgd(0.1), model)
    with pytest.raises(
        ValueError, match="Expected gradients structured like the optimizer's variables"
    ):
        opt.apply([jnp.zeros((2, 2)), jnp.zeros(2)])
    assert float(model.kernel[0, 0]) == 1.0


def test_gradient_shape_must_match():
    w = statevar.Variable([1.0, 2.0], name="w")
    opt = statevar.Optimizer(optax.sgd(0.1), [w])
    with pytest.raises(
        ValueError,
        match=r"Gradient for Variable 'w' has shape \(3,\), expected the variable's shape \(2,\)",
    ):
        opt.apply([jnp.zeros(3)])
    chex.assert_trees_all_close(w.value, jnp.array([1.0, 2.0]))


def test_gradient_must_be_an_array():
    w = statevar.Variable([1.0, 2.0], name="w")
    opt = statevar.Optimizer(optax.sgd(0.1), [w])
    with pytest.raises(TypeError, match="Expected an array gradient for Variable 'w', got str"):
        opt.apply(["oops"])


def test_two_named_optimizers_save_and_restore_in_one_checkpoint(tmp_path):
    a, b = statevar.Variable([1.0, 2.0], name="a"), statevar.Variable([3.0], name="b")
    first = statevar.Optimizer(optax.adam(0.1), a, name="first")
    second = statevar.Optimizer(optax.adam(0.1), b, name="second")
    first.apply(jnp.ones(2))
    second.apply(jnp.ones(1))
    target = [a, b, first.state_variables, second.state_variables]
    variables = [a, b, *first.state_variables, *second.state_variables]
    saved = [v.numpy() for v in variables]

    statevar.save(tmp_path / "both", target)
    first.apply(jnp.ones(2))
    second.apply(jnp.ones(1))
    statevar.restore(tmp_path / "both", target)

    assert [v.name for v in first.state_variables][:2] == ["first/0", "first/1"]
    chex.assert_trees_all_close([v.numpy() for v in variables], saved)


def test_two_unnamed_optimizers_in_one_checkpoint_are_refused_with_the_fix(tmp_path):
    a, b = statevar.Variable([1.0, 2.0], name="a"), statevar.Variable([3.0], name="b")
    first = statevar.Optimizer(optax.adam(0.1), a)
    second = statevar.Optimizer(optax.adam(0.1), b)

    with pytest.raises(
        ValueError, match=r"Two variables .* name 'optimizer/0'.*Optimizer\(\.\.\., name=\.\.\.\)"
    ):
        statevar.save(tmp_path / "both", [a, b, first.state_variables, second.state_variables])


def test_a_deep_copy_of_an_optimizer_updates_the_copied_variables():
    w = statevar.Variable([1.0, 2.0])
    opt = statevar.Optimizer(optax.sgd(0.5), w)
    opt.apply(jnp.ones(2))

    duplicate = copy.deepcopy(opt)
    duplicate.apply(jnp.ones(2))

    chex.assert_trees_all_close(w.value, jnp.array([0.5, 1.5]))
    chex.assert_trees_all_close(duplicate.variables[0].value, jnp.array([0.0, 1.0]))


def test_optimizer_name_must_be_a_string():
    with pytest.raises(TypeError, match="Expected the Optimizer's name to be a str, got int"):
        statevar.Optimizer(optax.sgd(0.1), statevar.Variable(1.0), name=3)


def test_tx_must_be_an_optax_transformation():
    with pytest.raises(TypeError, match="Expected an optax.GradientTransformation"):
        statevar.Optimizer("adam", statevar.Variable(1.0))


def test_variables_must_be_variables():
    with pytest.raises(
        TypeError, match="Expected the Optimizer's variables to be a Variable, a Module"
    ):
        statevar.Optimizer(optax.sgd(0.1), [jnp.ones(2)])


def test_a_gradient_for_a_variable_unfrozen_after_creation_is_refused():
    w = statevar.Variable(1.0, name="w")
    frozen = statevar.Variable(1.0, trainable=False, name="frozen")
    opt = statevar.Optimizer(optax.sgd(0.1), [w, frozen])
    frozen.trainable = True
    grads = statevar.grad(lambda: w * frozen, [w, frozen])()
    with pytest.raises(
        ValueError,
        match="Got a gradient for Variable 'frozen', which this optimizer does not update",
    ):
        opt.apply(grads)
    assert (float(w), float(frozen)) == (1.0, 1.0)
