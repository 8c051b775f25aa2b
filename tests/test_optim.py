"""statevar.Optimizer: optax transformations applied in place."""

import copy
import json

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
    pointers = [v.value.unsafe_buffer_pointer() for v in (w, *opt.state_variables)]
    opt.apply(jnp.ones(256))
    assert [v.value.unsafe_buffer_pointer() for v in (w, *opt.state_variables)] == pointers


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_the_state_of_variables_placed_on_a_device_lives_with_them(compiled):
    # As TensorFlow colocates slots with their variables: the update runs on their device.
    elsewhere = jax.devices("cpu")[1]  # conftest gives eight CPU devices
    w = statevar.Variable(jnp.ones(3), device=elsewhere, name="w")
    b = statevar.Variable(jnp.ones(2), device=elsewhere, name="b")
    opt = statevar.Optimizer(optax.adam(0.1), [w, b])
    apply = statevar.jit(opt.apply) if compiled else opt.apply

    apply([jnp.ones(3), jnp.ones(2)])

    for v in (w, b, *opt.state_variables, opt.iterations):
        assert v.device == elsewhere, v.name
    chex.assert_trees_all_close(w.value, jnp.full(3, 0.9), rtol=1e-5)


def test_the_state_of_variables_placed_nowhere_is_placed_nowhere():
    w = statevar.Variable(jnp.ones(3), name="w")
    opt = statevar.Optimizer(optax.adam(0.1), w)
    opt.apply(jnp.ones(3))
    assert not any(v.value.committed for v in (w, *opt.state_variables, opt.iterations))


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
    before = {v.name: v.value for v in opt.state_variables}
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
    # Adam's state: the shared step count, and the moments of each variable.
    after = {v.name: v.value for v in opt.state_variables}
    for moment in ("optimizer/mu/unused", "optimizer/nu/unused"):
        chex.assert_trees_all_equal(after[moment], before[moment])
    assert int(after["optimizer/count"]) == 3
    assert not np.array_equal(after["optimizer/mu/used"], before["optimizer/mu/used"])


def test_gradients_must_mirror_the_variables():
    model = Linear()
    opt = statevar.Optimizer(optax.sgd(0.1), model)
    with pytest.raises(
        ValueError, match="Expected gradients structured like the optimizer's variables"
    ):
        opt.apply([jnp.zeros((2, 2)), jnp.zeros(2)])
    assert float(model.kernel[0, 0]) == 1.0


@pytest.mark.parametrize(
    "to_gradients",
    [list, lambda grads: [np.asarray(g) for g in grads]],
    ids=["jax arrays", "numpy arrays"],
)
def test_gradients_for_a_list_of_variables_may_be_any_arrays(to_gradients):
    variables = [statevar.Variable([1.0, 2.0]), statevar.Variable([[3.0]])]
    opt = statevar.Optimizer(optax.sgd(0.5), variables)
    grads = [jnp.array([1.0, -1.0]), jnp.array([[2.0]])]
    opt.apply(to_gradients(grads))
    chex.assert_trees_all_close(
        [v.value for v in variables], [jnp.array([0.5, 2.5]), jnp.array([[2.0]])]
    )
    assert int(opt.iterations) == 1


@pytest.mark.parametrize(
    "grads",
    [
        [jnp.zeros(2)],
        [jnp.zeros(2), jnp.zeros((1, 1)), jnp.zeros(1)],
        (jnp.zeros(2), jnp.zeros((1, 1))),
        [jnp.zeros(2), [jnp.zeros(1)]],
    ],
    ids=["too few", "too many", "a tuple", "a nested list"],
)
def test_gradients_for_a_list_of_variables_must_be_a_list_of_as_many(grads):
    variables = [statevar.Variable([1.0, 2.0]), statevar.Variable([[3.0]])]
    opt = statevar.Optimizer(optax.sgd(0.5), variables)
    with pytest.raises(ValueError, match="Expected gradients structured like the optimizer's"):
        opt.apply(grads)
    chex.assert_trees_all_equal(
        [v.value for v in variables], [jnp.array([1.0, 2.0]), jnp.array([[3.0]])]
    )
    assert int(opt.iterations) == 0


@pytest.mark.parametrize("warm", [False, True], ids=["first apply", "after applies"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "in statevar.jit"])
def test_gradient_shape_must_match(warm, compiled):
    # An array gradient takes the fast path, whose shapes are checked as the update traces:
    # refused before anything runs, every variable and the state as they were.
    w = statevar.Variable([1.0, 2.0], name="w")
    opt = statevar.Optimizer(optax.adam(0.1), [w])
    apply = statevar.jit(opt.apply) if compiled else opt.apply
    if warm:
        for _ in range(2):
            apply([jnp.ones(2)])
    before = [v.value for v in (w, *opt.state_variables)]

    with pytest.raises(
        ValueError,
        match=r"Gradient for Variable 'w' has shape \(3,\), expected the variable's shape \(2,\)",
    ):
        apply([jnp.zeros(3)])

    chex.assert_trees_all_equal([v.value for v in (w, *opt.state_variables)], before)
    apply([jnp.ones(2)])  # and the next update runs
    assert int(opt.iterations) == 3 if warm else 1


@pytest.mark.parametrize(
    ("variable_dtype", "gradient", "message"),
    [
        (
            jnp.float32,
            jnp.array([True, False]),
            r"real floating-point gradient for "
            r"Variable 'w' \(float32\), got dtype bool",
        ),
        (jnp.float32, jnp.array([1, 2]), r"real floating-point .* \(float32\), got dtype int32"),
        (jnp.float32, jnp.array([1j, 2j]), r"real floating-point .*, got dtype complex64"),
        (
            jnp.complex64,
            jnp.array([1.0, 2.0]),
            r"complex gradient for Variable 'w' "
            r"\(complex64\), got dtype float32",
        ),
    ],
    ids=["bool", "int", "complex for real", "real for complex"],
)
@pytest.mark.parametrize("call", ["apply", "apply_gradients", "in a compiled step"])
def test_a_gradient_of_another_kind_is_refused_and_changes_nothing(
    variable_dtype, gradient, message, call
):
    w = statevar.Variable(jnp.zeros(2, variable_dtype), name="w")
    opt = statevar.Optimizer(optax.adam(0.1), [w])
    opt.apply([jnp.ones(2, variable_dtype)])  # compiled for the right kind first
    before = [v.value for v in [w, opt.iterations, *opt.state_variables]]

    @statevar.jit
    def step(g):
        opt.apply([g])

    apply = {
        "apply": lambda: opt.apply([gradient]),
        "apply_gradients": lambda: opt.apply_gradients([(gradient, w)]),
        "in a compiled step": lambda: step(gradient),
    }[call]
    with pytest.raises(TypeError, match=f"Expected a {message}"):
        apply()
    chex.assert_trees_all_equal(
        [v.value for v in [w, opt.iterations, *opt.state_variables]], before
    )
    opt.apply([jnp.ones(2, variable_dtype)])
    assert int(opt.iterations) == 2


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

    assert [v.name for v in first.state_variables][:3] == [
        "first/iterations",
        "first/count",
        "first/mu/a",
    ]
    chex.assert_trees_all_close([v.numpy() for v in variables], saved)


def test_two_unnamed_optimizers_in_one_checkpoint_are_refused_with_the_fix(tmp_path):
    a, b = statevar.Variable([1.0, 2.0], name="a"), statevar.Variable([3.0], name="b")
    first = statevar.Optimizer(optax.adam(0.1), a)
    second = statevar.Optimizer(optax.adam(0.1), b)

    with pytest.raises(
        ValueError,
        match=r"Two variables .* name 'optimizer/iterations'.*distinct keys of a dict",
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


def _loss(model):
    return jnp.sum(model(X) ** 2)


@pytest.mark.parametrize("transform", [lambda f: f, statevar.jit], ids=["eager", "jit"])
def test_applying_after_the_module_replaced_an_optimized_variable_is_refused_by_name(transform):
    model = Linear()
    opt = statevar.Optimizer(optax.sgd(0.1), model)
    detached = model.kernel
    model.kernel = statevar.Variable(jnp.ones((2, 2)))

    step = transform(lambda: opt.apply(statevar.grad(lambda: _loss(model), model)()))
    with pytest.raises(ValueError, match=r"Optimizer 'optimizer': the Module .* at 'kernel'"):
        step()

    chex.assert_trees_all_close(model.kernel.value, jnp.ones((2, 2)))
    chex.assert_trees_all_close(detached.value, jnp.array([[1.0, -2.0], [0.5, 3.0]]))
    chex.assert_trees_all_close(model.bias.value, jnp.array([0.1, -0.1]))


def test_replacing_a_variable_the_optimizer_does_not_update_is_fine():
    model = Linear()
    opt = statevar.Optimizer(optax.sgd(0.1), model)
    model.steps = statevar.Variable(5, trainable=False, name="steps")

    for _ in range(2):  # and the Module is watched as it is now
        opt.apply(statevar.grad(lambda: _loss(model), model)())

    assert int(opt.iterations) == 2


def test_a_model_and_its_optimizer_copied_together_watch_each_other():
    model = Linear()
    opt = statevar.Optimizer(optax.sgd(0.1), model)
    model_copy, opt_copy = copy.deepcopy((model, opt))
    model.kernel = statevar.Variable(jnp.ones((2, 2)))  # the original only

    opt_copy.apply(statevar.grad(lambda: _loss(model_copy), model_copy)())
    with pytest.raises(ValueError, match="no longer holds"):
        opt.apply(statevar.grad(lambda: _loss(model), model)())
    model_copy.bias = statevar.Variable([0.0, 0.0])
    with pytest.raises(ValueError, match="at 'bias'"):
        opt_copy.apply(statevar.grad(lambda: _loss(model_copy), model_copy)())


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
        match="Got a gradient for Variable 'frozen', which Optimizer 'optimizer' does not update",
    ):
        opt.apply(grads)
    assert (float(w), float(frozen)) == (1.0, 1.0)


# --------------------------------------------------------------------------- names


def test_state_variables_are_named_after_their_parameters():
    model = Linear()
    opt = statevar.Optimizer(optax.adam(0.1), model)
    assert [v.name for v in opt.state_variables] == [
        "optimizer/iterations",
        "optimizer/count",
        "optimizer/mu/bias",
        "optimizer/mu/kernel",
        "optimizer/nu/bias",
        "optimizer/nu/kernel",
    ]
    assert [v.name for v in opt.variables] == ["bias", "kernel"]


def test_wrapped_and_chained_states_keep_readable_unique_names():
    model = Linear()
    chained = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1, momentum=0.9))
    names = [v.name for v in statevar.Optimizer(chained, model, name="o").state_variables]
    assert names == ["o/iterations", "o/trace/bias", "o/trace/kernel"]

    injected = statevar.Optimizer(optax.adam, model, learning_rate=0.1, name="o")
    names = [v.name for v in injected.state_variables]
    # Two counts (the injector's and Adam's): each keeps its whole path.
    assert names[:3] == ["o/iterations", "o/count", "o/b1"]
    assert "o/inner_state/0/count" in names and "o/learning_rate" in names
    assert "o/mu/kernel" in names

    accumulated = statevar.Optimizer(optax.MultiSteps(optax.sgd(0.1), 2), model, name="o")
    names = [v.name for v in accumulated.state_variables]
    assert names == ["o/iterations", "o/mini_step", "o/gradient_step", "o/acc_grads/bias",
                     "o/acc_grads/kernel"]  # fmt: skip


def test_unnamed_variables_in_a_list_get_unique_names():
    a, b = statevar.Variable(1.0), statevar.Variable(2.0)
    opt = statevar.Optimizer(optax.sgd(0.1, momentum=0.9), [a, b])
    assert [v.name for v in opt.state_variables] == [
        "optimizer/iterations",
        "optimizer/trace/Variable",
        "optimizer/trace/Variable_1",
    ]


def test_adamw_masks_see_the_parameters_by_name():
    model = Linear()
    decay_kernels_only = optax.adamw(
        0.1, weight_decay=0.5, mask=lambda params: {name: name != "bias" for name in params}
    )
    opt = statevar.Optimizer(decay_kernels_only, model)
    zeros = {"kernel": jnp.zeros((2, 2)), "bias": jnp.zeros(2), "steps": None}
    opt.apply(zeros)
    chex.assert_trees_all_close(model.bias.value, jnp.array([0.1, -0.1]))  # not decayed
    chex.assert_trees_all_close(model.kernel.value, 0.95 * jnp.array([[1.0, -2.0], [0.5, 3.0]]))


# --------------------------------------------------------------------------- apply_gradients


@pytest.mark.parametrize("compiled", [True, False], ids=["jit", "eager"])
def test_apply_gradients_builds_lazily_and_matches_pure_optax(compiled):
    model = Linear()
    opt = statevar.Optimizer(optax.adam(0.1))
    assert not opt.built and opt.state_variables == (opt.iterations,)

    def step(x):
        grads = statevar.grad(lambda: jnp.sum(model(x) ** 2), model.trainable_variables)()
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    step(X)  # eagerly: the first call builds the state
    assert opt.built and opt.variables == (model.kernel, model.bias)
    step = statevar.jit(step) if compiled else step
    step(X)
    step(X)
    expected = _pure_adam(3)
    chex.assert_trees_all_close(
        {"bias": model.bias.value, "kernel": model.kernel.value}, expected, rtol=1e-5
    )
    assert int(opt.iterations) == 3


@pytest.mark.parametrize("how", ["apply_gradients", "apply", "jit"])
def test_gradients_accumulated_in_variables_are_applied_as_their_values(how):
    # Keras's gradient accumulation keeps the sums in non-trainable variables.
    w = statevar.Variable([1.0, 2.0], name="w")
    accumulated = statevar.Variable([0.5, -0.5], trainable=False, name="accumulated/w")
    opt = statevar.Optimizer(optax.adam(0.1), [w])
    reference = statevar.Variable([1.0, 2.0], name="reference")
    statevar.Optimizer(optax.adam(0.1), [reference]).apply([jnp.array([0.5, -0.5])])

    def step():
        if how == "apply":
            opt.apply([accumulated])
        else:
            opt.apply_gradients([(accumulated, w)])

    (statevar.jit(step) if how == "jit" else step)()

    chex.assert_trees_all_close(w.value, reference.value)
    chex.assert_trees_all_equal(accumulated.value, jnp.array([0.5, -0.5]))
    assert int(opt.iterations) == 1


def test_a_subset_keeps_the_other_variables_and_their_state():
    a, b = statevar.Variable([1.0], name="a"), statevar.Variable([2.0], name="b")
    opt = statevar.Optimizer(optax.adam(0.1), [a, b])
    opt.apply_gradients([(jnp.ones(1), a), (jnp.ones(1), b)])
    state = {v.name: v.numpy() for v in opt.state_variables}
    before_b = b.numpy()

    opt.apply_gradients([(jnp.ones(1), a)])

    after = {v.name: v.numpy() for v in opt.state_variables}
    assert float(b[0]) == float(before_b[0])
    for name in ("optimizer/mu/b", "optimizer/nu/b"):
        chex.assert_trees_all_equal(after[name], state[name])
    assert not (after["optimizer/mu/a"] == state["optimizer/mu/a"]).all()
    assert int(opt.iterations) == 2 and int(after["optimizer/count"]) == 2


def test_a_none_gradient_in_apply_keeps_the_variables_state():
    a, b = statevar.Variable([1.0], name="a"), statevar.Variable([2.0], name="b")
    opt = statevar.Optimizer(optax.sgd(0.1, momentum=0.9), [a, b])
    opt.apply([jnp.ones(1), jnp.ones(1)])
    with pytest.warns(UserWarning, match="no gradient for 'b'"):
        opt.apply([jnp.ones(1), None])
    trace = {v.name: float(v[0]) for v in opt.state_variables if "trace" in v.name}
    assert trace == {"optimizer/trace/a": pytest.approx(1.9), "optimizer/trace/b": 1.0}


def test_no_gradient_at_all_changes_nothing():
    w = statevar.Variable([1.0], name="w")
    opt = statevar.Optimizer(optax.adam(0.1), w)
    opt.apply_gradients([(None, w)])
    assert int(opt.iterations) == 0 and float(w[0]) == 1.0


BAD_PAIRS = {
    "not a pair": (
        lambda w, v: [jnp.ones(1)],
        TypeError,
        r"Expected \(gradient, variable\) pairs.* got ArrayImpl at position 0",
    ),
    "not a variable": (
        lambda w, v: [(jnp.ones(1), jnp.ones(1))],
        TypeError,
        r"got a ArrayImpl in place of the variable at position 0",
    ),
    "twice": (
        lambda w, v: [(jnp.ones(1), w), (None, w)],
        ValueError,
        r"Variable 'w' appears twice in apply_gradients' pairs",
    ),
    "unknown": (
        lambda w, v: [(jnp.ones(1), v)],
        ValueError,
        r"Got a gradient for Variable 'v', which Optimizer 'optimizer' does not update",
    ),
    "shape": (
        lambda w, v: [(jnp.ones(3), w)],
        ValueError,
        r"Gradient for Variable 'w' has shape \(3,\), expected",
    ),
    "not an array": (
        lambda w, v: [("oops", w)],
        TypeError,
        r"Expected an array gradient for Variable 'w', got str",
    ),
    "not iterable": (
        lambda w, v: 3,
        TypeError,
        r"Expected Optimizer 'optimizer'.apply_gradients to get \(gradient, variable\) "
        r"pairs, .* got int, which is not iterable",
    ),
}


@pytest.mark.parametrize(("pairs", "error", "message"), BAD_PAIRS.values(), ids=list(BAD_PAIRS))
def test_apply_gradients_refuses_bad_pairs_and_changes_nothing(pairs, error, message):
    w, v = statevar.Variable([1.0], name="w"), statevar.Variable([1.0], name="v")
    opt = statevar.Optimizer(optax.sgd(0.1), w)
    with pytest.raises(error, match=message):
        opt.apply_gradients(pairs(w, v))
    assert (float(w[0]), int(opt.iterations)) == (1.0, 0)


def test_apply_gradients_refuses_a_view():
    w = statevar.Variable([1.0], name="w")
    view = jax.tree.map(lambda x: x, w)
    with pytest.raises(TypeError, match=r"read-only view of Variable 'w'.*at position 0"):
        statevar.Optimizer(optax.sgd(0.1)).apply_gradients([(jnp.ones(1), view)])


def test_an_unbuilt_optimizer_says_how_to_build_it():
    opt = statevar.Optimizer(optax.sgd, learning_rate=0.1)
    with pytest.raises(
        ValueError, match=r"Cannot apply gradients with Optimizer 'optimizer'.*build"
    ):
        opt.apply(jnp.ones(1))
    with pytest.raises(ValueError, match="Cannot read the learning rate of Optimizer 'optimizer'"):
        _ = opt.learning_rate
    with pytest.raises(ValueError, match="Cannot set the learning rate of Optimizer 'optimizer'"):
        opt.learning_rate = 0.5
    with pytest.raises(ValueError, match="Cannot save or restore Optimizer 'optimizer'"):
        statevar.save("never_written", opt)


def test_an_optimizer_first_applied_inside_a_compiled_step_builds_there():
    w = statevar.Variable([1.0, 2.0], name="w")
    eager_w = statevar.Variable([1.0, 2.0], name="w")
    opt, eager = statevar.Optimizer(optax.adam(0.1)), statevar.Optimizer(optax.adam(0.1))

    @statevar.jit
    def step(gradient):
        opt.apply_gradients([(gradient, w)])

    for gradient in (jnp.ones(2), jnp.array([0.5, -1.0]), jnp.ones(2)):
        step(gradient)
        eager.apply_gradients([(gradient, eager_w)])
    assert opt.built
    chex.assert_trees_all_close(w.value, eager_w.value)
    chex.assert_trees_all_close(
        [v.value for v in opt.state_variables], [v.value for v in eager.state_variables]
    )
    assert int(opt.iterations) == 3


def test_building_inside_grad_is_refused():
    w = statevar.Variable([1.0], name="w")
    opt = statevar.Optimizer(optax.sgd(0.1))

    def loss():
        opt.build([w])
        return jnp.sum(w * w)

    with pytest.raises(
        statevar.TraceContextError,
        match=r"Cannot create the state of Optimizer 'optimizer' inside statevar.grad",
    ):
        statevar.grad(loss, w)()
    assert not opt.built


def test_building_twice_is_refused():
    opt = statevar.Optimizer(optax.sgd(0.1), statevar.Variable(1.0))
    with pytest.raises(ValueError, match="Optimizer 'optimizer' is already built, for 1 variables"):
        opt.build(statevar.Variable(2.0))


# --------------------------------------------------------------------------- learning rate


def test_the_learning_rate_can_be_set_between_steps_without_retracing():
    w = statevar.Variable([1.0], name="w")
    opt = statevar.Optimizer(optax.sgd, w, learning_rate=0.5)
    traces = []

    @statevar.jit
    def step():
        traces.append(1)
        opt.apply_gradients([(jnp.ones(1), w)])

    step()
    assert float(opt.learning_rate) == 0.5
    opt.learning_rate = 0.25
    step()
    opt.learning_rate.assign(0.125)  # it is a Variable
    step()
    assert float(w[0]) == pytest.approx(1.0 - 0.5 - 0.25 - 0.125)
    assert len(traces) == 1
    assert opt.learning_rate.name == "optimizer/learning_rate"


def test_an_injected_transformation_exposes_its_learning_rate():
    w = statevar.Variable([1.0], name="w")
    opt = statevar.Optimizer(optax.inject_hyperparams(optax.adam)(learning_rate=0.1), w)
    opt.learning_rate = 0.01
    opt.apply(jnp.ones(1))
    assert float(w[0]) == pytest.approx(0.99, rel=1e-4)


def test_a_scheduled_learning_rate_is_read_but_not_set():
    w = statevar.Variable([1.0], name="w")
    schedule = optax.linear_schedule(1.0, 0.0, transition_steps=4)
    opt = statevar.Optimizer(optax.sgd, w, learning_rate=schedule)
    for _ in range(3):
        opt.apply(jnp.ones(1))
    assert float(opt.learning_rate) == 0.5  # the rate of the latest step
    assert float(w[0]) == pytest.approx(1.0 - 1.0 - 0.75 - 0.5)
    with pytest.raises(ValueError, match="Cannot set the learning rate .*: a schedule gives it"):
        opt.learning_rate = 0.1
    assert float(opt.learning_rate) == 0.5


def test_no_injected_learning_rate_says_how_to_get_one():
    opt = statevar.Optimizer(optax.adam(0.1), statevar.Variable(1.0))
    with pytest.raises(AttributeError, match=r"has no learning rate.*Optimizer\(optax.adam, "):
        _ = opt.learning_rate
    assert not hasattr(opt, "learning_rate")


def test_a_bad_learning_rate_is_refused_and_leaves_it_unchanged():
    opt = statevar.Optimizer(optax.sgd, statevar.Variable(1.0), learning_rate=0.5)
    with pytest.raises(ValueError, match=r"Variable 'optimizer/learning_rate'.*shape"):
        opt.learning_rate = [0.1, 0.2]
    assert float(opt.learning_rate) == 0.5


def test_extra_arguments_reach_the_transformation_as_in_optax():
    def plateau():
        return optax.chain(optax.sgd(0.1), optax.contrib.reduce_on_plateau(patience=1))

    w = statevar.Variable(jnp.ones(2), name="w")
    opt = statevar.Optimizer(plateau(), w)
    tx, params = plateau(), jnp.ones(2)
    state = tx.init(params)
    traces = []

    @statevar.jit
    def step(loss):
        traces.append(1)
        opt.apply(jnp.ones(2), value=loss)

    for loss in [1.0, 1.0, 1.0, 1.0, 1.0]:
        step(jnp.asarray(loss))
        updates, state = tx.update(jnp.ones(2), state, params, value=jnp.asarray(loss))
        params = optax.apply_updates(params, updates)
    opt.apply_gradients([(jnp.ones(2), w)], value=jnp.asarray(1.0))  # eagerly, as Keras
    updates, state = tx.update(jnp.ones(2), state, params, value=jnp.asarray(1.0))
    params = optax.apply_updates(params, updates)

    chex.assert_trees_all_close(w.value, params)
    assert len(traces) == 1  # the loss is traced


def test_a_transformation_without_extra_arguments_ignores_them_as_a_chain_does():
    w = statevar.Variable(jnp.ones(2), name="w")
    opt = statevar.Optimizer(optax.sgd(0.5), w)

    opt.apply(jnp.ones(2), value=jnp.asarray(3.0))

    chex.assert_trees_all_close(w.value, jnp.full(2, 0.5))


def test_a_missing_extra_argument_says_how_to_pass_it_and_changes_nothing():
    w = statevar.Variable(jnp.ones(2), name="w")
    opt = statevar.Optimizer(optax.contrib.reduce_on_plateau(), w)

    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'value'") as e:
        opt.apply(jnp.ones(2))

    assert any("optimizer.apply(grads, value=loss)" in note for note in e.value.__notes__)
    chex.assert_trees_all_equal(w.value, jnp.ones(2))
    assert int(opt.iterations) == 0


@pytest.mark.parametrize("given", [{}, {"hyperparam_dtype": jnp.float32}], ids=["default", "given"])
def test_a_bfloat16_model_keeps_its_hyperparameters_in_float32(given):
    # In bfloat16, adam's b2=0.999 would round to 1.0, and the first step give NaN.
    def trained(make):
        w = statevar.Variable(jnp.array([1.0, -2.0, 3.0], jnp.bfloat16), name="w")
        opt = make(w)
        for _ in range(3):
            opt.apply(statevar.grad(lambda: jnp.sum(w.value.astype(jnp.float32) ** 2), w)())
        return w.value, opt

    value, opt = trained(lambda w: statevar.Optimizer(optax.adam, w, learning_rate=0.1, **given))
    expected, _ = trained(
        lambda w: statevar.Optimizer(
            optax.inject_hyperparams(optax.adam, hyperparam_dtype=jnp.float32)(learning_rate=0.1),
            w,
        )
    )
    assert value.dtype == jnp.bfloat16
    chex.assert_tree_all_finite(value)
    chex.assert_trees_all_equal(value, expected)
    assert opt.learning_rate == pytest.approx(0.1)


def test_an_integer_learning_rate_is_a_float_rate_that_can_be_set_later():
    w = statevar.Variable([1.0], name="w")
    opt = statevar.Optimizer(optax.sgd, w, learning_rate=1)

    opt.learning_rate = 0.5
    opt.apply(jnp.ones(1))

    assert opt.learning_rate.dtype == jnp.float32
    assert float(w[0]) == 0.5


@pytest.mark.parametrize(
    ("factory", "hyperparameters"),
    [
        (optax.adamw, {"mask": lambda params: jax.tree.map(lambda p: p.ndim > 1, params)}),
        (optax.lamb, {"mask": lambda params: jax.tree.map(lambda p: True, params)}),
        (optax.adam, {"mu_dtype": jnp.bfloat16}),
        (optax.sgd, {"momentum": 0.9, "nesterov": True}),
    ],
    ids=["adamw mask", "lamb mask", "mu_dtype", "nesterov"],
)
def test_a_factorys_non_schedule_hyperparameters_are_passed_as_they_are(factory, hyperparameters):
    w = statevar.Variable(jnp.ones((2, 2)), name="w")
    opt = statevar.Optimizer(factory, w, learning_rate=0.1, **hyperparameters)
    tx = factory(learning_rate=0.1, **hyperparameters)
    state = tx.init(w.value)
    updates, _ = tx.update(jnp.ones((2, 2)), state, w.value)
    expected = optax.apply_updates(w.value, updates)

    opt.apply(jnp.ones((2, 2)))

    chex.assert_trees_all_close(w.value, expected, rtol=1e-6)
    opt.learning_rate = 0.05  # still a hyperparameter that can be set


@pytest.mark.parametrize(
    ("tx", "hyperparameters", "message"),
    [
        (optax.adam, {}, "or a factory such as optax.adam with its hyperparameters"),
        (optax.adam(0.1), {"learning_rate": 0.1}, r"already built; pass them to its factory"),
    ],
    ids=["factory without hyperparameters", "built with hyperparameters"],
)
def test_hyperparameters_go_with_a_factory(tx, hyperparameters, message):
    with pytest.raises(TypeError, match=message):
        statevar.Optimizer(tx, statevar.Variable(1.0), **hyperparameters)


# --------------------------------------------------------------------------- checkpoints


def test_an_optimizer_is_a_checkpoint_target(tmp_path):
    model = Linear()
    opt = statevar.Optimizer(optax.adam(0.1), model)
    opt.apply(statevar.grad(lambda: jnp.sum(model(X) ** 2), model)())
    statevar.save(tmp_path / "top", [model, opt])
    statevar.save(tmp_path / "keyed", {"model": model, "opt": opt})
    saved = [v.numpy() for v in (*model.variables, *opt.state_variables)]

    def names(directory):
        manifest = json.loads((directory / "statevar_checkpoint.json").read_text())
        return [entry["name"] for entry in manifest["variables"]]

    assert names(tmp_path / "top")[3:6] == [
        "optimizer/iterations", "optimizer/count", "optimizer/mu/bias"
    ]  # fmt: skip
    assert names(tmp_path / "keyed")[:4] == [
        "model/kernel", "model/bias", "model/steps", "opt/iterations"
    ]  # fmt: skip
    targets = {"top": lambda m, o: [m, o], "keyed": lambda m, o: {"model": m, "opt": o}}
    for directory, target in targets.items():
        fresh = Linear()
        fresh_opt = statevar.Optimizer(optax.adam(0.1), fresh)
        statevar.restore(tmp_path / directory, target(fresh, fresh_opt))
        restored = [v.numpy() for v in (*fresh.variables, *fresh_opt.state_variables)]
        chex.assert_trees_all_equal(restored, saved)


@pytest.mark.parametrize("copied", [False, True], ids=["optimizer", "its deep copy"])
def test_parameters_on_different_devices_are_refused_naming_the_optimizer(copied):
    a = statevar.Variable(jnp.ones(4), device="cpu:0", name="a")
    b = statevar.Variable(jnp.ones(4), device="cpu:1", name="b")
    opt = statevar.Optimizer(optax.sgd(0.1), [a, b], name="opt")
    if copied:
        opt = copy.deepcopy(opt)
        a, b = opt.variables

    with pytest.raises(
        statevar.PlacementError,
        match=r"Optimizer 'opt', applying gradients, got variables and arguments on "
        r"different devices: Variable 'a'.* on cpu:0; Variable 'b'.* on cpu:1",
    ):
        opt.apply([jnp.ones(4), jax.device_put(jnp.ones(4), jax.devices()[1])])
    chex.assert_trees_all_equal((a.value, b.value), (jnp.ones(4), jnp.ones(4)))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
def test_a_transformation_whose_state_holds_a_prng_key_matches_optax(compiled, tmp_path):
    # optax.noisy_sgd keeps a typed key in its state: held as its key data.
    tx = optax.noisy_sgd(0.1, key=jax.random.key(3))
    w = statevar.Variable([1.0, 2.0, 3.0], name="w")
    opt = statevar.Optimizer(tx, [w])
    apply = statevar.jit(opt.apply) if compiled else opt.apply
    params, state = {"w": jnp.array([1.0, 2.0, 3.0])}, tx.init({"w": jnp.array([1.0, 2.0, 3.0])})
    grads = jnp.array([0.5, -1.0, 2.0])
    for step in range(3):
        if step == 1:
            statevar.save(tmp_path / "ckpt", opt)
        apply([grads])
        updates, state = tx.update({"w": grads}, state, params)
        params = optax.apply_updates(params, updates)
    chex.assert_trees_all_close(w.value, params["w"])

    # Restored, the key goes on from where it was saved: the same noise again.
    statevar.restore(tmp_path / "ckpt", opt)
    w.assign([1.0, 2.0, 3.0])
    apply([grads])
    after_one = w.numpy()
    w2 = statevar.Variable([1.0, 2.0, 3.0], name="w")
    opt2 = statevar.Optimizer(tx, [w2])
    opt2.apply([grads])
    w2.assign([1.0, 2.0, 3.0])
    opt2.apply([grads])  # the second step's noise, as after the restore
    np.testing.assert_array_equal(after_one, w2.numpy())
    fresh = statevar.Variable([1.0, 2.0, 3.0], name="w")
    statevar.Optimizer(tx, [fresh]).apply([grads])
    assert not np.array_equal(after_one, fresh.numpy())  # the key had moved on


def _clip_unit(x):
    return jnp.clip(x, 0.0, 1.0)


def test_an_optimizer_applies_a_variables_constraint_after_each_update():
    w = statevar.Variable([0.5, -0.5, 2.0], name="w", constraint=_clip_unit)
    free = statevar.Variable([0.5, -0.5, 2.0], name="free")
    assert w.constraint is _clip_unit and free.constraint is None
    optimizer = statevar.Optimizer(optax.sgd(1.0), [w, free])
    optimizer.apply_gradients([(jnp.array([1.0, -1.0, 0.0]), w), (jnp.ones(3), free)])
    chex.assert_trees_all_close(w.value, jnp.array([0.0, 0.5, 1.0]))
    chex.assert_trees_all_close(free.value, jnp.array([-0.5, -1.5, 1.0]))

    @statevar.jit
    def step(gradient):
        optimizer.apply_gradients([(gradient, w)])

    step(jnp.array([-5.0, 0.25, 0.0]))
    chex.assert_trees_all_close(w.value, jnp.array([1.0, 0.25, 1.0]))
    step(jnp.array([5.0, 0.0, 0.0]))
    chex.assert_trees_all_close(w.value, jnp.array([0.0, 0.25, 1.0]))


def test_a_plain_assign_does_not_apply_the_constraint():
    w = statevar.Variable([0.5], name="w", constraint=_clip_unit)
    w.assign([3.0])
    chex.assert_trees_all_close(w.value, jnp.array([3.0]))
    assert copy.deepcopy(w).constraint is _clip_unit


def test_a_constraint_that_changes_the_shape_is_refused_and_changes_nothing():
    w = statevar.Variable([0.5, 0.5], name="w", constraint=jnp.sum)
    optimizer = statevar.Optimizer(optax.sgd(1.0), [w])
    with pytest.raises(ValueError, match=r"constraint of Variable 'w' returned .* shape \(\)"):
        optimizer.apply_gradients([(jnp.ones(2), w)])
    chex.assert_trees_all_close(w.value, jnp.array([0.5, 0.5]))
    assert int(optimizer.iterations) == 0


def test_a_constraint_that_is_not_callable_is_refused():
    match = r"Cannot create Variable 'w' with constraint=1\.0: expected a function"
    with pytest.raises(TypeError, match=match):
        statevar.Variable(1.0, name="w", constraint=1.0)


class _ThreeShapes(statevar.Module):
    def __init__(self):
        self.b = statevar.Variable([1.0, 2.0, 3.0])
        self.a = statevar.Variable([1.0, 2.0])
        self.c = statevar.Variable(1.0)


def test_gradients_in_a_dict_by_path_reach_their_variables_in_any_key_order():
    model = _ThreeShapes()
    opt = statevar.Optimizer(optax.sgd(1.0), model)
    grads = statevar.grad(lambda: model.a.sum() + 2 * model.b.sum() + 3 * model.c, model)()
    assert list(grads) == ["b", "a", "c"]  # the Module's order, not the sorted one

    opt.apply(grads)
    opt.apply({"c": jnp.float32(1.0), "a": jnp.ones(2), "b": jnp.ones(3)})  # reordered

    chex.assert_trees_all_close(model.a.value, jnp.array([-1.0, 0.0]))
    chex.assert_trees_all_close(model.b.value, jnp.array([-2.0, -1.0, 0.0]))
    chex.assert_trees_all_close(model.c.value, jnp.float32(-3.0))


@pytest.mark.parametrize(
    ("grads", "message"),
    [
        (
            {"a": jnp.ones(2), "b": jnp.ones(3), "d": jnp.ones(1)},
            "structured like the optimizer's variables",
        ),
        ({"a": jnp.ones(2), "b": jnp.ones(4), "c": jnp.float32(1.0)}, r"'b' has shape \(4,\)"),
    ],
    ids=["a key the module lacks", "a wrong shape"],
)
def test_a_dict_of_gradients_that_does_not_fit_the_module_is_refused(grads, message):
    model = _ThreeShapes()
    opt = statevar.Optimizer(optax.sgd(1.0), model)
    before = [v.value for v in model.variables]

    with pytest.raises(ValueError, match=message):
        opt.apply(grads)

    chex.assert_trees_all_equal([v.value for v in model.variables], before)


def test_a_variable_in_a_dict_of_gradients_is_applied_as_its_value():
    model = _ThreeShapes()
    opt = statevar.Optimizer(optax.sgd(1.0), model)
    accumulated = statevar.Variable([0.5, 0.5], name="accumulated")

    opt.apply({"a": accumulated, "b": jnp.ones(3), "c": jnp.float32(1.0)})

    chex.assert_trees_all_close(model.a.value, jnp.array([0.5, 1.5]))
    chex.assert_trees_all_close(accumulated.value, jnp.array([0.5, 0.5]))  # not updated
