"""statevar.grad and statevar.value_and_grad."""

import threading

import chex
import jax
import jax.numpy as jnp
import pytest

import statevar
from statevar._tracing import frames as _frames
from statevar._tracing import jax_internals as _jax_internals


class Linear(statevar.Module):
    def __init__(self):
        self.kernel = statevar.Variable([[1.0, -2.0], [0.5, 3.0]])
        self.bias = statevar.Variable([0.1, -0.1])
        self.calls = statevar.Variable(0, trainable=False)

    def __call__(self, x):
        return x @ self.kernel + self.bias


def _pure_loss(kernel, bias, x):
    return jnp.sum((x @ kernel + bias) ** 2)


X = jnp.array([[1.0, 2.0], [3.0, -1.0]])


def test_tape_example_trainable_versus_not():
    w = statevar.Variable(3.0)
    nt = statevar.Variable(2.0, trainable=False)
    dw, dnt = statevar.grad(lambda: w * w * nt, [w, nt])()
    chex.assert_trees_all_close(dw, 12.0)
    assert dnt is None


def test_module_gradients_equal_jax_grad_of_the_pure_function():
    model = Linear()
    grads = statevar.grad(lambda x: jnp.sum(model(x) ** 2), model)(X)
    expected_kernel, expected_bias = jax.grad(_pure_loss, argnums=(0, 1))(
        model.kernel.value, model.bias.value, X
    )
    assert set(grads) == {"kernel", "bias", "calls"}
    chex.assert_trees_all_close(grads["kernel"], expected_kernel)
    chex.assert_trees_all_close(grads["bias"], expected_bias)
    assert grads["calls"] is None  # non-trainable (and integer)


@pytest.mark.parametrize("structure", ["variable", "list", "tuple", "dict"])
def test_gradients_mirror_the_structure_of_wrt(structure):
    model = Linear()
    wrt = {
        "variable": model.kernel,
        "list": [model.kernel, model.bias],
        "tuple": (model.kernel, model.bias),
        "dict": {"k": model.kernel, "b": model.bias},
    }[structure]
    grads = statevar.grad(lambda: jnp.sum(model(X) ** 2), wrt)()
    expected = jax.grad(_pure_loss, argnums=(0, 1))(model.kernel.value, model.bias.value, X)
    if structure == "variable":
        chex.assert_trees_all_close(grads, expected[0])
    elif structure == "dict":
        chex.assert_trees_all_close(grads, {"k": expected[0], "b": expected[1]})
    else:
        assert type(grads) is type(wrt)
        chex.assert_trees_all_close(tuple(grads), expected)


def test_value_and_grad_with_aux_and_arguments():
    w = statevar.Variable([1.0, 2.0])

    def loss(scale):
        value = jnp.sum(w.value**2) * scale
        return value, {"norm": jnp.linalg.norm(w.value)}

    (value, aux), dw = statevar.value_and_grad(loss, w, has_aux=True)(3.0)
    chex.assert_trees_all_close(value, 15.0)
    chex.assert_trees_all_close(aux["norm"], jnp.sqrt(5.0))
    chex.assert_trees_all_close(dw, jnp.array([6.0, 12.0]))


def test_the_same_variable_twice_gets_the_full_gradient_in_both_slots():
    w = statevar.Variable(2.0)
    first, second = statevar.grad(lambda: w * w, [w, w])()
    chex.assert_trees_all_close((first, second), (4.0, 4.0))


def test_freezing_later_makes_the_slot_none():
    w = statevar.Variable(2.0)
    w.trainable = False
    assert statevar.grad(lambda: w * w, w)() is None


@pytest.mark.parametrize("transform", [lambda f: f, statevar.jit], ids=["eager", "jit"])
def test_a_variable_assigned_under_cond_while_frozen_gets_its_gradient_once_trainable(
    transform,
):
    # The first calls learn to hold `w` in a ref (assigned under a cond); once trainable it
    # is differentiated, not read from that ref.
    w = statevar.Variable(3.0, trainable=False)
    calibrating = [True]

    def loss():
        if calibrating[0]:
            jax.lax.cond(True, lambda: (w.assign(w + 1.0), None)[1], lambda: None)
        return w * w

    value_and_grad = transform(statevar.value_and_grad(loss, w))
    value, grad = value_and_grad()
    assert grad is None and float(value) == 16.0 and float(w) == 4.0
    w.trainable, calibrating[0] = True, False

    value, grad = value_and_grad()

    chex.assert_trees_all_close((value, grad), (16.0, 8.0))


def _reads_u_unused(w, u):
    _ = u.value + 0.0
    return w * w, None


_UNREACHING = {
    "unread": lambda w, u: (w * w, None),
    "read-unused": _reads_u_unused,
    "aux-only": lambda w, u: (w * w, {"u": u * 1.0}),
    "stop-gradient": lambda w, u: (w * w + jax.lax.stop_gradient(u), None),
}


@pytest.mark.parametrize("transform", [lambda f: f, statevar.jit], ids=["eager", "jit"])
@pytest.mark.parametrize("loss", _UNREACHING.values(), ids=_UNREACHING.keys())
def test_a_variable_the_loss_does_not_reach_gets_none(loss, transform):
    w = statevar.Variable(3.0, name="w")
    u = statevar.Variable(5.0, name="u")

    (_, _), (dw, du) = transform(
        statevar.value_and_grad(lambda: loss(w, u), [w, u], has_aux=True)
    )()

    assert float(dw) == 6.0
    assert du is None


@pytest.mark.parametrize("transform", [lambda f: f, statevar.jit], ids=["eager", "jit"])
def test_which_variables_the_loss_reaches_is_learned_over_many_variables(transform):
    variables = [statevar.Variable(float(i), name=f"v{i}") for i in range(96)]

    def loss():  # every third variable unread, every third read only through stop_gradient
        read = [v * v for i, v in enumerate(variables) if i % 3 == 0]
        blocked = [jax.lax.stop_gradient(v) for i, v in enumerate(variables) if i % 3 == 1]
        return sum(read) + sum(blocked)

    grads = transform(statevar.grad(loss, variables))()

    for i, gradient in enumerate(grads):
        assert (gradient is None) == (i % 3 != 0), i
        assert gradient is None or float(gradient) == 2.0 * i


def test_which_variables_are_reached_is_learned_again_each_call():
    # The same structure each call, but a Python branch on a value picks what is read.
    a, b = statevar.Variable(2.0, name="a"), statevar.Variable(3.0, name="b")
    grad = statevar.grad(lambda x: a * x if x > 0 else b * x, [a, b])

    assert [None if g is None else float(g) for g in grad(jnp.float32(5.0))] == [5.0, None]
    assert [None if g is None else float(g) for g in grad(jnp.float32(-5.0))] == [None, -5.0]
    assert [None if g is None else float(g) for g in grad(jnp.float32(1.0))] == [1.0, None]


@pytest.mark.parametrize("transform", [lambda f: f, statevar.jit], ids=["eager", "jit"])
def test_nested_grads_each_learn_what_their_own_loss_reaches(transform):
    a = statevar.Variable(2.0, name="a")
    b = statevar.Variable(3.0, name="b")
    c = statevar.Variable(5.0, name="c")
    inner = []

    def outer_loss():
        db, dc = statevar.grad(lambda: b * b, [b, c])()  # reaches b only
        inner.append(dc)
        return a * db  # 2ab: reaches a and b, not c

    da, db, dc = transform(statevar.grad(outer_loss, [a, b, c]))()

    assert inner[-1] is None
    assert (float(da), float(db), dc) == (6.0, 4.0, None)


_INTEGER_TARGETS = {
    "int variable": lambda n, w: n * n,
    "bool": lambda n, w: w > 1.0,
    "float cast to int": lambda n, w: (w * 2.0).astype(jnp.int32) + n,
    "python int": lambda n, w: 3,
}


@pytest.mark.parametrize("transform", [lambda f: f, statevar.jit], ids=["eager", "jit"])
@pytest.mark.parametrize("target", _INTEGER_TARGETS.values(), ids=_INTEGER_TARGETS.keys())
def test_an_integer_target_gives_none_in_every_slot(target, transform):
    # As tf.GradientTape gives; JAX's grad raises a TypeError for an integer output.
    n = statevar.Variable(3, name="n")
    w = statevar.Variable(2.0, name="w")
    expected = target(n.value, w.value)

    grads = transform(statevar.grad(lambda: target(n, w), [n, w]))()
    value, value_grads = transform(
        statevar.value_and_grad(lambda: target(n, w), {"n": n, "w": w})
    )()
    (aux_value, aux), aux_grads = transform(
        statevar.value_and_grad(lambda: (target(n, w), w * 1.0), w, has_aux=True)
    )()

    assert grads == [None, None]
    assert value_grads == {"n": None, "w": None}
    assert aux_grads is None
    for got in (value, aux_value):
        assert jnp.asarray(got).dtype == jnp.asarray(expected).dtype
        assert got == expected
    assert float(aux) == 2.0


def test_an_integer_target_of_an_integer_variable_alone_gives_none():
    x = statevar.Variable(3, name="x")
    assert statevar.grad(lambda: x * x, x)() is None


def test_a_variable_reaching_the_loss_with_a_zero_gradient_gets_zero_not_none():
    w = statevar.Variable(0.0, name="w")
    assert float(statevar.grad(lambda: w * w, w)()) == 0.0


def test_variables_hold_concrete_arrays_after_the_call():
    model = Linear()
    statevar.grad(lambda: jnp.sum(model(X)), model)()
    for variable in model.variables:
        assert not isinstance(variable.value, jax.core.Tracer)
        assert not isinstance(variable.value, jax.core.Tracer)


def test_grad_does_not_change_variables():
    model = Linear()
    before = [v.numpy() for v in model.variables]
    statevar.grad(lambda: jnp.sum(model(X)), model)()
    chex.assert_trees_all_equal([v.numpy() for v in model.variables], before)


@pytest.mark.parametrize("bad", [3.0, "kernel", [statevar.Variable(1.0), 2.0], {"a": None}])
def test_wrt_must_be_variables(bad):
    with pytest.raises(
        TypeError,
        match="Expected statevar.grad.s wrt to be a Variable, a Module, an Optimizer, or a list",
    ):
        statevar.grad(lambda: 0.0, bad)


@pytest.mark.parametrize("transform", [statevar.jit, lambda fn: fn], ids=["jit", "eager"])
def test_assigning_a_differentiated_variable_inside_grad_is_refused(transform):
    w = statevar.Variable(1.0, name="w")
    counter = statevar.Variable(0, trainable=False, name="counter")

    def loss():
        counter.assign_add(1)
        w.assign_add(1.0)
        return w * w

    with pytest.raises(
        statevar.TraceContextError,
        match="Cannot assign_add to Variable 'w' inside statevar.grad, which differentiates",
    ):
        transform(statevar.grad(loss, w))()
    assert (float(w), int(counter)) == (1.0, 0)
    assert not isinstance(counter.value, jax.core.Tracer)


@pytest.mark.parametrize("transform", [statevar.jit, lambda fn: fn], ids=["jit", "eager"])
def test_non_trainable_variables_assigned_in_the_forward_pass_update_once(transform):
    w = statevar.Variable(2.0, name="w")
    calls = statevar.Variable(0, trainable=False, name="calls")
    last_input = statevar.Variable(0.0, trainable=False, name="last_input")

    def loss(x):
        calls.assign_add(1)
        last_input.assign(x * w)  # stores the value; not differentiated through
        return w * x * last_input

    step = transform(statevar.value_and_grad(loss, [w, calls]))
    value, (dw, dcalls) = step(3.0)
    # Only the direct dependence on w counts: d(w * x * c)/dw = x * c with c = 6.
    assert (float(value), float(dw), dcalls) == (36.0, 18.0, None)
    assert (int(calls), float(last_input)) == (1, 6.0)
    step(1.0)
    assert (int(calls), float(last_input)) == (2, 2.0)


class BatchNorm(statevar.Module):
    def __init__(self, features):
        self.scale = statevar.Variable(jnp.ones(features))
        self.mean = statevar.Variable(jnp.zeros(features), trainable=False)
        self.var = statevar.Variable(jnp.ones(features), trainable=False)

    def __call__(self, x, momentum=0.9):
        mean, var = x.mean(0), x.var(0)
        self.mean.assign(momentum * self.mean + (1 - momentum) * mean)
        self.var.assign(momentum * self.var + (1 - momentum) * var)
        return (x - mean) / jnp.sqrt(var + 1e-5) * self.scale


def _pure_batch_norm_step(scale, mean, var, x, momentum=0.9):
    def loss(scale):
        batch_mean, batch_var = x.mean(0), x.var(0)
        y = (x - batch_mean) / jnp.sqrt(batch_var + 1e-5) * scale
        stats = (
            momentum * mean + (1 - momentum) * batch_mean,
            momentum * var + (1 - momentum) * batch_var,
        )
        return jnp.sum(y**3), stats

    (value, (mean, var)), grad = jax.value_and_grad(loss, has_aux=True)(scale)
    return value, scale - 0.1 * grad, mean, var


@pytest.mark.parametrize("transform", [statevar.jit, lambda fn: fn], ids=["jit", "eager"])
def test_batch_norm_statistics_match_the_same_model_in_pure_jax(transform):
    model = BatchNorm(3)
    loss_and_grads = statevar.value_and_grad(lambda x: jnp.sum(model(x) ** 3), model)

    @transform
    def step(x):
        value, grads = loss_and_grads(x)
        model.scale.assign_sub(0.1 * grads["scale"])
        return value

    scale, mean, var = jnp.ones(3), jnp.zeros(3), jnp.ones(3)
    pure_step = (
        jax.jit(_pure_batch_norm_step) if transform is statevar.jit else _pure_batch_norm_step
    )
    for seed in range(3):
        x = jax.random.normal(jax.random.key(seed), (8, 3)) * (seed + 1.0)
        value = step(x)
        expected, scale, mean, var = pure_step(scale, mean, var, x)
        chex.assert_trees_all_equal(value, expected)
    chex.assert_trees_all_equal(
        (model.scale.value, model.mean.value, model.var.value), (scale, mean, var)
    )


@pytest.mark.parametrize(
    ("loss", "given"),
    [
        (lambda w: w.value * jnp.ones(3), r"shape \(3,\) float32"),
        (lambda w: "loss", "str 'loss'"),
        (lambda w: jnp.complex64(1), r"shape \(\) complex64"),
    ],
    ids=["a vector", "a str", "a complex number"],
)
@pytest.mark.parametrize("transform", [statevar.grad, statevar.value_and_grad])
def test_a_loss_that_has_no_gradient_is_refused_by_name(loss, given, transform):
    w = statevar.Variable(2.0, name="w")

    def objective():
        return loss(w)

    with pytest.raises(
        TypeError,
        match=r"Cannot differentiate 'objective' with statevar.grad: expected it to return a "
        r"real floating-point scalar \(a loss\), got " + given,
    ):
        transform(objective, w)()
    if transform is statevar.value_and_grad:
        with pytest.raises(TypeError, match=r"\(a loss\) first in a \(loss, aux\) pair"):
            transform(lambda: (loss(w), None), w, has_aux=True)()
    assert float(w) == 2.0


def test_creating_a_variable_inside_grad_is_refused():
    w = statevar.Variable(1.0)

    def loss():
        statevar.Variable(0.0, name="scratch")
        return w * w

    with pytest.raises(
        statevar.TraceContextError,
        match=r"Cannot create Variable 'scratch' inside statevar.grad: .*runs its function "
        r"anew at each call.*a statevar.jit step may create variables in its first trace",
    ) as refused:
        statevar.grad(loss, w)()
    assert "requires" not in str(refused.value)


def test_plain_jax_grad_assigning_a_variable_is_a_clear_error():
    w = statevar.Variable(1.0, name="w")

    def loss(x):
        w.assign(x)
        return x * x

    with pytest.raises(
        statevar.TraceContextError, match="Cannot assign to Variable 'w' inside jax.jit, jax.grad"
    ):
        jax.grad(loss)(2.0)
    assert float(w) == 1.0


def test_module_gradients_keep_the_module_order():
    model = Linear()
    grads = statevar.grad(lambda: jnp.sum(model(X)), model)()
    assert list(grads) == list(model.named_variables()) == ["kernel", "bias", "calls"]


def test_a_function_may_return_a_variable():
    w = statevar.Variable(3.0)
    value, grad = statevar.value_and_grad(lambda: w, w)()
    chex.assert_trees_all_close((value, grad), (3.0, 1.0))


def test_threads_sharing_one_gradient_function_learn_its_refs_safely():
    # Each thread's first call may learn that `seen` needs a ref (it is assigned under
    # lax.cond) while other threads iterate over what was learned.
    w = statevar.Variable(2.0)
    seen = statevar.Variable(0.0, trainable=False, name="seen")

    def mark():
        seen.assign(1.0)

    def loss(flag):
        jax.lax.cond(flag, mark, lambda: None)
        return w * w

    gradient = statevar.grad(loss, w)
    results, errors = [], []

    def work():
        try:
            results.extend(float(gradient(True)) for _ in range(5))
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert results == [4.0] * 20
    assert float(seen) == 1.0


def test_a_gradient_under_vmap_after_a_call_that_assigned_under_a_cond():
    w = statevar.Variable(jnp.array([1.0, 2.0]), name="w")
    count = statevar.Variable(0, trainable=False, name="count")

    def bump():
        count.assign_add(1)

    def loss(x, training=False):
        if training:
            jax.lax.cond(x.sum() > 0, bump, lambda: None)
        return jnp.sin(x @ w.value)

    gradient = statevar.grad(loss, w)
    per_example = jax.vmap(gradient)
    xs = jnp.array([[1.0, 0.5], [0.3, -1.0]])
    before = per_example(xs)
    gradient(xs[0], training=True)  # count lives in a ref in this gradient's later calls

    chex.assert_trees_all_close(per_example(xs), before)  # this path assigns nothing
    assert int(count) == 1


@pytest.mark.parametrize("transform", [lambda f: f, statevar.jit], ids=["eager", "jit"])
def test_a_grad_keeps_no_tracer_once_its_trace_ends(transform):
    # jax.checking_leaks finds none (jax 0.12 checks the traces of differentiation), and
    # the frame the function ran in holds no traced value afterwards, on every JAX.
    w = statevar.Variable(2.0, name="w")
    count = statevar.Variable(0, trainable=False, name="count")
    frames = []

    def loss():
        frames.append(_frames.innermost())
        count.assign_add(1)
        return w * w, w * 3.0

    with jax.checking_leaks():
        (value, aux), dw = transform(statevar.value_and_grad(loss, w, has_aux=True))()

    assert (float(value), float(aux), float(dw), int(count)) == (4.0, 6.0, 4.0, 1)
    assert frames[-1].kind == "grad" and frames[-1].values == {}


# ---------------------------------------------------------------- the reach probe's paths
# `statevar.grad` learns what its loss reaches from the backward pass of a probe of two
# primitives (`jax_internals.reach_probe`). JAX takes one of three paths through it: the
# probe's own linearization rule (direct linearization, the default), the JVP rule when no
# rule fits the installed JAX, and JVP then partial evaluation when direct linearization is
# off. Each must learn the same.


@pytest.fixture(params=["own rule", "jvp rule", "jvp then partial eval"])
def probe_path(request, monkeypatch):
    if request.param == "jvp rule":
        table = _jax_internals._ad_internals.primitive_linearizations
        monkeypatch.delitem(table, _jax_internals._PROBE)
    elif request.param == "jvp then partial eval":
        before = jax.config.jax_use_direct_linearize
        jax.config.update("jax_use_direct_linearize", False)
        request.addfinalizer(lambda: jax.config.update("jax_use_direct_linearize", before))
    return request.param


@pytest.mark.parametrize("transform", [lambda f: f, statevar.jit], ids=["eager", "jit"])
def test_each_path_through_the_probe_learns_what_the_loss_reaches(probe_path, transform):
    a, b, c = (statevar.Variable(v, name=n) for v, n in ((2.0, "a"), (3.0, "b"), (5.0, "c")))

    def loss():  # reaches a; reads b only through stop_gradient; never reads c
        return a * a + jax.lax.stop_gradient(b)

    da, db, dc = transform(statevar.grad(loss, [a, b, c]))()

    assert (float(da), db, dc) == (4.0, None, None)


def test_each_path_through_the_probe_serves_nested_grads(probe_path):
    a, b, c = (statevar.Variable(v, name=n) for v, n in ((2.0, "a"), (3.0, "b"), (5.0, "c")))
    inner = []

    def outer_loss():
        db, dc = statevar.grad(lambda: b * b, [b, c])()
        inner.append(dc)
        return a * db

    da, db, dc = statevar.grad(outer_loss, [a, b, c])()

    assert (float(da), float(db), dc, inner[-1]) == (6.0, 4.0, None, None)


def test_forward_mode_through_an_eager_grad_matches_the_pure_function():
    # jax.jvp and jax.vmap around statevar.grad: the probe runs under their traces.
    w = statevar.Variable(1.5, name="w")

    def slope(x):
        return statevar.grad(lambda: jnp.sin(w * x) * x, w)()

    def pure_slope(x):
        return jax.grad(lambda w: jnp.sin(w * x) * x)(1.5)

    x = jnp.float32(0.7)
    chex.assert_trees_all_close(jax.jvp(slope, (x,), (1.0,)), jax.jvp(pure_slope, (x,), (1.0,)))
    xs = jnp.array([0.1, 0.7, -2.0])
    chex.assert_trees_all_close(jax.vmap(slope)(xs), jax.vmap(pure_slope)(xs))
    chex.assert_trees_all_close(jax.jit(jax.grad(slope))(x), jax.grad(pure_slope)(x), rtol=1e-5)


def test_the_probe_has_its_own_linearization_on_the_jax_the_suite_runs_on():
    # Without it, each eager grad pays JAX's fallback: tracing the probe's JVP rule to a
    # jaxpr. A JAX that changed how rules are called shows here, not as a silent slowdown.
    assert _jax_internals.LINEARIZATION_PROTOCOL in (4, 5)
    table = _jax_internals._ad_internals.primitive_linearizations
    assert table[_jax_internals._PROBE] is _jax_internals._probe_linearization


def test_a_jax_whose_linearization_rules_take_another_form_gets_none(monkeypatch):
    class LinearizeTrace:
        def process_primitive(self, primitive, tracers, params):
            primal_out, tangent_out = primitive, tracers  # no residuals, no linearized map
            return primal_out, tangent_out

    monkeypatch.setattr(_jax_internals._ad_internals, "LinearizeTrace", LinearizeTrace)
    assert _jax_internals._linearization_protocol() is None
    monkeypatch.delattr(_jax_internals._ad_internals, "LinearizeTrace")
    assert _jax_internals._linearization_protocol() is None


def test_the_probe_is_the_identity_outside_differentiation():
    # Eagerly, under jit and under vmap, where no backward pass runs: no report, same values.
    reports = []
    x, y = jnp.arange(3.0), jnp.float32(2.0)

    def probed(x, y):
        return _jax_internals.reach_probe([x, y], reports.append)

    for run in (probed, jax.jit(probed)):
        chex.assert_trees_all_equal(run(x, y), [x, y], strict=True)
    batched = jax.vmap(probed, in_axes=(0, None), out_axes=[0, None])(x, y)
    chex.assert_trees_all_equal(batched, [x, y], strict=True)
    assert _jax_internals.reach_probe([], reports.append) == []
    assert reports == []
