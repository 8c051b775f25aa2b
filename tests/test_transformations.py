"""JAX's own transformations (cond, scan, loops, checkpoint, vmap, grad) inside statevar.jit
and statevar.grad: exactly what the same Python gives run eagerly step by step."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statevar


def _identity(fn):
    return fn


def _none(*_):
    return None


def _counted(fn, traces):
    def wrapper(*args):
        traces.append(None)
        return fn(*args)

    return wrapper


@pytest.mark.parametrize("flag", [False, True])
def test_only_the_taken_cond_branch_assigns(flag):
    w = statevar.Variable(0.0, name="w")

    @statevar.jit
    def step(flag):
        def yes():
            w.assign(1.0)

        jax.lax.cond(flag, yes, lambda: None)

    step(flag)
    assert float(w) == (1.0 if flag else 0.0)


def test_a_cond_branch_returning_a_value_and_assigning():
    w = statevar.Variable(2.0, name="w")
    count = statevar.Variable(0, trainable=False, name="count")

    def double(x):
        w.assign(w * x)
        count.assign_add(1)
        return w.value + 1.0

    def halve(x):
        w.assign(w / x)
        return w.value - 1.0

    step = statevar.jit(lambda flag, x: jax.lax.cond(flag, double, halve, x))
    results = [step(True, 3.0), step(False, 2.0), step(True, 0.5)]
    # The same Python, eagerly: 2 * 3 = 6, 6 / 2 = 3, 3 * 0.5 = 1.5.
    assert [float(r) for r in results] == [7.0, 2.0, 2.5]
    assert (float(w), int(count)) == (1.5, 2)


def test_switch_applies_only_the_selected_branch():
    v = statevar.Variable(0.0, name="v")

    def branch(value):
        def assign():
            v.assign(value)

        return assign

    step = statevar.jit(lambda i: jax.lax.switch(i, [branch(10.0), branch(20.0), lambda: None]))
    seen = []
    for i in (1, 2, 0, 2):
        step(i)
        seen.append(float(v))
    assert seen == [20.0, 20.0, 10.0, 10.0]


def _scan_body(w, total):
    def body(carry, x):
        w.assign(w * 2.0 + x)
        total.assign_add(w.value)
        return carry + w.value, w.value * 3.0

    return body


def test_scan_threads_every_assignment_bit_identically_to_the_eager_loop():
    xs = jnp.linspace(-1.0, 1.0, 7)
    compiled_w, compiled_total = statevar.Variable(0.3), statevar.Variable(0.0)
    carry, ys = statevar.jit(
        lambda xs: jax.lax.scan(_scan_body(compiled_w, compiled_total), 0.5, xs)
    )(xs)

    eager_w, eager_total = statevar.Variable(0.3), statevar.Variable(0.0)
    body, eager_carry, eager_ys = _scan_body(eager_w, eager_total), jnp.float32(0.5), []
    for x in xs:
        eager_carry, y = body(eager_carry, x)
        eager_ys.append(y)

    chex.assert_trees_all_equal(
        (carry, ys, compiled_w.value, compiled_total.value),
        (eager_carry, jnp.stack(eager_ys), eager_w.value, eager_total.value),
    )


@pytest.mark.parametrize("length", [0, 1, 4])
def test_scan_of_any_length_including_zero(length):
    w = statevar.Variable(1.0, name="w")
    step = statevar.jit(
        lambda xs: jax.lax.scan(lambda c, x: (w.assign_add(x), (c, None))[1], 0, xs)
    )
    step(jnp.ones(length))
    assert float(w) == 1.0 + length


@pytest.mark.parametrize("upper", [0, 3])
@pytest.mark.parametrize("static_bounds", [True, False], ids=["static", "dynamic"])
def test_fori_loop_assigns_once_per_step(upper, static_bounds):
    c = statevar.Variable(1, trainable=False, name="c")

    def body(i, carry):
        c.assign(c * 2 + i)
        return carry + c.value

    if static_bounds:
        step = statevar.jit(lambda: jax.lax.fori_loop(0, upper, body, 0))
        result = step()
    else:
        step = statevar.jit(lambda n: jax.lax.fori_loop(0, n, body, 0))
        result = step(jnp.int32(upper))
    expected_c, expected_total = 1, 0
    for i in range(upper):
        expected_c = expected_c * 2 + i
        expected_total += expected_c
    assert (int(result), int(c)) == (expected_total, expected_c)


def test_while_loop_with_the_counter_in_its_carry():
    v = statevar.Variable(0.5, name="v")

    @statevar.jit
    def step(limit):
        def body(i):
            v.assign(v * 2.0)
            return i + 1

        return jax.lax.while_loop(lambda i: i < limit, body, 0)

    assert int(step(3)) == 3 and float(v) == 4.0
    assert int(step(0)) == 0 and float(v) == 4.0


def test_map_reads_and_assigns_in_order():
    v = statevar.Variable(0.0, name="v")
    step = statevar.jit(lambda xs: jax.lax.map(lambda x: v.assign_add(x).value, xs))
    chex.assert_trees_all_equal(step(jnp.arange(4.0)), jnp.array([0.0, 1.0, 3.0, 6.0]))
    assert float(v) == 6.0


def test_checkpoint_reads_variables_under_gradients():
    w = statevar.Variable(3.0, name="w")
    loss = statevar.grad(lambda x: jax.checkpoint(lambda a: jnp.sin(a * w))(x), w)
    for transform in (statevar.jit, _identity):
        assert float(transform(loss)(2.0)) == pytest.approx(2.0 * np.cos(6.0), rel=1e-6)


def test_checkpoint_assigns_once_without_gradients():
    calls = statevar.Variable(0, trainable=False, name="calls")

    def block(a):
        calls.assign_add(1)
        return a * 2.0

    step = statevar.jit(lambda x: jax.checkpoint(block)(x))
    assert (float(step(1.0)), float(step(2.0)), int(calls)) == (2.0, 4.0, 2)


@pytest.mark.parametrize("transform", [statevar.jit, _identity], ids=["jit", "eager"])
def test_assigning_inside_checkpoint_while_differentiating_is_refused(transform):
    w = statevar.Variable(3.0, name="w")
    calls = statevar.Variable(0, trainable=False, name="calls")

    def block(a):
        calls.assign_add(1)
        return jnp.sin(a * w)

    with pytest.raises(
        statevar.TraceContextError,
        match=r"Cannot assign_add to Variable 'calls' inside jax.checkpoint while "
        r"differentiating: .* would apply twice",
    ):
        transform(statevar.grad(lambda x: jax.checkpoint(block)(x), w))(2.0)
    assert int(calls) == 0


def test_nested_jax_jit_assigns():
    v = statevar.Variable(1.0, name="v")
    step = statevar.jit(lambda x: jax.jit(lambda: v.assign(v * x))())
    step(3.0)
    step(2.0)
    assert float(v) == 6.0


def test_vmap_over_a_function_reading_variables():
    w = statevar.Variable([1.0, 2.0], name="w")
    predict = statevar.jit(lambda xs: jax.vmap(lambda x: jnp.dot(x, w))(xs))
    xs = jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    chex.assert_trees_all_equal(predict(xs), xs @ w.value)


def test_plain_jax_grad_inside_jit_stores_the_primal_value():
    seen = statevar.Variable(0.0, trainable=False, name="seen")

    @statevar.jit
    def step(x):
        def loss(a):
            seen.assign(a * 2.0)
            return a * a

        return jax.grad(loss)(x)

    assert float(step(3.0)) == 6.0 and float(seen) == 6.0


_NESTED_ASSIGNMENTS = {
    "cond": lambda v, x: jax.lax.cond(x > 0, lambda: _none(v.assign_add(x)), lambda: None),
    "scan": lambda v, x: jax.lax.scan(lambda c, _: (v.assign_add(x), (c, None))[1], 0, None, 2),
    "fori_loop": lambda v, x: jax.lax.fori_loop(0, 2, lambda i, c: _none(v.assign_add(x)), None),
    "while_loop": lambda v, x: jax.lax.while_loop(
        lambda i: i < 2, lambda i: (v.assign_add(x), i + 1)[1], 0
    ),
    "checkpoint": lambda v, x: jax.checkpoint(lambda: _none(v.assign_add(x)))(),
    "setitem in scan": lambda v, x: jax.lax.scan(
        lambda c, _: (v.__setitem__((), x), (c, None))[1], 0, None, 2
    ),
}
_NESTED_TOTALS = {
    "cond": 6.0,
    "scan": 10.0,
    "fori_loop": 10.0,
    "while_loop": 10.0,
    "setitem in scan": 3.0,
}


@pytest.mark.parametrize("where", list(_NESTED_ASSIGNMENTS))
def test_a_step_assigning_under_a_nested_transformation_traces_once(where):
    chex.clear_trace_counter()  # counted by the function's code, shared by the parameters
    v = statevar.Variable(0.0, name="v")
    assign = _NESTED_ASSIGNMENTS[where]

    @statevar.jit
    @chex.assert_max_traces(n=1)
    def step(x):
        assign(v, x)

    for x in (1.0, -1.0, 2.0, 3.0):
        step(jnp.float32(x))
    # As the Python runs eagerly: each loop twice, the cond for x > 0 only, the rest once;
    # the setitem keeps the last value.
    assert float(v) == _NESTED_TOTALS.get(where, 5.0)


def test_a_read_in_a_loop_before_its_assignment_traces_again_with_a_ref():
    v = statevar.Variable(1.0, name="v")
    traces = []

    @statevar.jit
    @_counted_with(traces)
    def step():
        # The read comes before the assignment in the loop's body: each iteration must
        # read what the one before wrote.
        jax.lax.fori_loop(0, 3, lambda i, c: _none(v.assign(v.value * 2)), None)

    step()
    step()
    assert float(v) == 64.0  # as eagerly: 1 * 2**6
    assert len(traces) == 2  # one trace finds the read, one holds v in a ref from the start


def _counted_with(traces):
    return lambda fn: _counted(fn, traces)


def test_variables_not_assigned_under_nested_transformations_keep_plain_values():
    read_only, assigned_at_top = statevar.Variable(2.0), statevar.Variable(0.0)
    in_scan = statevar.Variable(0.0)

    @statevar.jit
    def step(xs):
        assigned_at_top.assign(read_only * 2)
        jax.lax.scan(lambda c, x: (in_scan.assign_add(x * read_only), (c, None))[1], 0, xs)

    step(jnp.ones(3))
    assert (float(assigned_at_top), float(in_scan)) == (4.0, 6.0)
    (entry,) = step._cache.entries.values()
    assert entry.refs == (in_scan,)


def test_statevar_grad_eagerly_with_nested_assignments():
    w = statevar.Variable(2.0, name="w")
    count = statevar.Variable(0, trainable=False, name="count")

    def loss(x):
        jax.lax.cond(x > 0, lambda: _none(count.assign_add(1)), lambda: None)
        return jax.lax.scan(lambda c, _: (c * w, None), x, None, length=3)[0]

    grad = statevar.grad(loss, w)
    assert float(grad(1.0)) == 12.0  # d(w**3)/dw at 2
    assert float(grad(-1.0)) == -12.0
    assert float(grad(1.0)) == 12.0
    assert int(count) == 2


def _double_until(v, w, limit, runs):
    """A loss whose while_loop ends only through the variable its body writes (the carry
    takes the new value); ``runs`` counts the iterations that ran. A cap keeps a wrong run
    (one without the write) finite."""

    def body(carry):
        jax.debug.callback(lambda: runs.append(None))
        v.assign(v * 2.0)
        return v.value, carry[1] + 1

    jax.lax.while_loop(lambda carry: (carry[0] < limit) & (carry[1] < 50), body, (v.value, 0))
    return w * v


@pytest.mark.parametrize("transform", [statevar.jit, _identity], ids=["jit", "eager"])
def test_a_loop_ending_through_a_variable_it_writes_runs_as_the_python_would(transform):
    # Eagerly JAX runs the loop for real: the first trace must not run it without the write.
    v = statevar.Variable(1.0, trainable=False, name="v")
    w = statevar.Variable(3.0, name="w")
    runs = []

    grad = transform(statevar.grad(lambda: _double_until(v, w, 100.0, runs), w))

    assert float(grad()) == 128.0 and float(v) == 128.0
    assert len(runs) == 7  # 1 -> 128: no run without the write (it would take 50)


@pytest.mark.parametrize("compile", [jax.jit, _identity], ids=["jax.jit", "eager"])
def test_stateless_call_of_a_loop_ending_through_a_variable_it_writes(compile):
    v = statevar.Variable(1.0, trainable=False, name="v")
    w = statevar.Variable(3.0, name="w")

    runs = []
    run = compile(
        lambda start: statevar.stateless_call(lambda: _double_until(v, w, 100.0, runs), v, start)
    )

    result, final = run(jnp.float32(1.0))
    assert (float(result), float(final), float(v)) == (384.0, 128.0, 1.0)
    assert len(runs) == 7


@pytest.mark.parametrize(
    "call",
    [
        lambda loss, v, w: statevar.grad(loss, w)(),
        lambda loss, v, w: statevar.stateless_call(loss, v, jnp.float32(0.0)),
    ],
    ids=["grad", "stateless_call"],
)
def test_an_eager_while_loop_whose_cond_fun_reads_what_its_body_writes_is_refused(call):
    v = statevar.Variable(0.0, trainable=False, name="v")
    w = statevar.Variable(1.0, name="w")

    def loss():
        # The cap only bounds a run that would otherwise never end.
        cond = lambda c: (v.value < 5.0) & (c < 50)  # noqa: E731
        jax.lax.while_loop(cond, lambda c: _none(v.assign_add(1.0)) or c + 1, 0)
        return w * v

    with pytest.raises(statevar.TraceContextError, match=r"Variable 'v' in the body of a"):
        call(loss, v, w)
    assert float(v) == 0.0


def test_a_nested_eager_grad_leaves_a_nested_write_to_the_frame_owning_it():
    # The inner grad is not the frame that makes refs: the outer call traces again.
    w = statevar.Variable(2.0, name="w")
    count = statevar.Variable(0.0, trainable=False, name="count")

    def inner_loss():
        jax.lax.cond(True, lambda: _none(count.assign_add(1.0)), lambda: None)
        return w * w * w

    def inner_grad():
        return statevar.grad(inner_loss, w)()

    gradient, (new_count,) = statevar.stateless_call(inner_grad, [count], [jnp.float32(5.0)])
    assert (float(gradient), float(new_count), float(count)) == (12.0, 6.0, 0.0)

    second = statevar.grad(inner_grad, w)()  # d/dw of 3 w**2
    assert (float(second), float(count)) == (12.0, 1.0)


def test_a_variable_read_in_a_while_cond_fun_and_assigned_in_the_body_is_refused():
    v = statevar.Variable(0.0, name="v")

    @statevar.jit
    def step():
        jax.lax.while_loop(lambda c: v.value < 3.0, lambda c: _none(v.assign_add(1.0)) or c, 0)

    with pytest.raises(
        statevar.TraceContextError,
        match=r"Cannot assign_add to Variable 'v' in the body of a jax.lax.while_loop whose "
        r"cond_fun reads it: .* Carry the value in the loop state",
    ):
        step()
    assert float(v) == 0.0


def test_assigning_inside_vmap_is_refused_and_changes_nothing():
    v = statevar.Variable(1.0, name="v")
    other = statevar.Variable(5.0, name="other")

    @statevar.jit
    def step(xs):
        other.assign(0.0)
        return jax.vmap(lambda x: v.assign(x).value)(xs)

    with pytest.raises(
        statevar.TraceContextError, match=r"Cannot assign to Variable 'v' inside jax.vmap"
    ):
        step(jnp.arange(3.0))
    assert (float(v), float(other)) == (1.0, 5.0)


_REF_READERS = {
    "vmap-of-cond": lambda v, xs: jax.vmap(
        lambda x: jax.lax.cond(x > 0, lambda: v.value * x, lambda: x)
    )(xs),
    "vmap-of-switch": lambda v, xs: jax.vmap(
        lambda x: jax.lax.switch((x + 1).astype(int), [lambda: v.value, lambda: -v.value, _one])
    )(xs),
    "vmap-of-while": lambda v, xs: jax.vmap(
        lambda x: jax.lax.while_loop(lambda c: c < v.value * x, lambda c: c + 1.0, 0.0)
    )(xs),
    "vmap-of-fori-batched": lambda v, xs: jax.vmap(
        lambda x: jax.lax.fori_loop(0, (x + 2).astype(int), lambda i, c: c + v.value, 0.0)
    )(xs),
    "scan-of-vmap-of-cond": lambda v, xs: jax.lax.scan(
        lambda c, _: (
            c + jax.vmap(lambda x: jax.lax.cond(x > 0, lambda: v.value, lambda: x))(xs),
            None,
        ),
        jnp.zeros_like(xs),
        None,
        length=2,
    )[0],
    "cg": lambda v, xs: jax.scipy.sparse.linalg.cg(lambda y: y * v.value, xs)[0],
}


def _one():
    return jnp.float32(1.0)


@pytest.mark.parametrize("reader", _REF_READERS.values(), ids=_REF_READERS.keys())
def test_a_variable_assigned_under_a_cond_reads_inside_vmap_and_solvers_as_any_other(reader):
    # Assigned under a nested transformation, the variable lives in a jax.Ref for the whole
    # step; JAX cannot carry a ref inside vmap of cond, switch or while, or inside
    # custom_linear_solve, so it is read just outside them: the value is the same.
    xs = jnp.arange(-1.0, 3.0)
    held = statevar.Variable(2.0, name="held")
    plain = statevar.Variable(2.0, name="plain")

    @statevar.jit
    def with_ref(xs):
        jax.lax.cond(True, lambda: _none(held.assign(held + 1.0)), lambda: None)
        return reader(held, xs)

    @statevar.jit
    def without(xs):
        plain.assign(plain + 1.0)
        return reader(plain, xs)

    chex.assert_trees_all_close(with_ref(xs), without(xs))
    assert float(held) == float(plain) == 3.0


def test_assigning_inside_custom_linear_solve_is_refused():
    v = statevar.Variable(2.0, name="v")

    def matvec(y):
        v.assign_add(1.0)
        return y * v.value

    @statevar.jit
    def solve(b):
        return jax.scipy.sparse.linalg.cg(matvec, b)[0]

    with pytest.raises(
        statevar.TraceContextError,
        match=r"Cannot assign_add to Variable 'v' inside jax.lax.custom_linear_solve",
    ):
        solve(jnp.ones(3))
    assert float(v) == 2.0


def test_eager_statevar_grad_under_jax_vmap_refuses_its_assignments():
    # The function runs once for the whole batch: one increment would stand for three.
    w = statevar.Variable(2.0, name="w")
    count = statevar.Variable(0, trainable=False, name="count")

    def per_example(x):
        return statevar.grad(lambda: _none(count.assign_add(1)) or (w * x) ** 2, w)()

    with pytest.raises(
        statevar.TraceContextError,
        match=r"Cannot assign Variable 'count' in statevar.grad inside jax.vmap",
    ):
        jax.vmap(per_example)(jnp.arange(3.0))
    assert int(count) == 0
    chex.assert_trees_all_close(
        jax.vmap(lambda x: statevar.grad(lambda: (w * x) ** 2, w)())(jnp.arange(3.0)),
        jnp.array([0.0, 4.0, 16.0]),
    )


def test_stateless_call_under_vmap_refuses_an_assignment_under_a_batched_cond_by_name():
    w = statevar.Variable(2.0, name="w")

    def double_when(x):
        jax.lax.cond(x > 1, lambda: _none(w.assign(w * 2)), lambda: None)
        return w + 1

    xs = jnp.arange(3.0)
    with pytest.raises(
        statevar.TraceContextError,
        match=r"Cannot assign Variable 'w' under jax.lax.cond or switch with a predicate "
        r"batched by jax.vmap: .* jnp.where",
    ):
        jax.vmap(lambda v, x: statevar.stateless_call(double_when, w, v, x))(xs, xs)
    assert float(w) == 2.0


def test_assigning_inside_a_custom_jvp_function_is_refused():
    v = statevar.Variable(1.0, name="v")

    @jax.custom_jvp
    def scaled(a):
        v.assign(a)
        return a * 2.0

    scaled.defjvp(lambda primals, tangents: (scaled(primals[0]), tangents[0] * 2.0))
    with pytest.raises(
        statevar.TraceContextError,
        match=r"Cannot assign to Variable 'v' inside a jax.custom_jvp function",
    ):
        statevar.jit(scaled)(3.0)
    assert float(v) == 1.0


def test_reading_a_ref_held_variable_inside_a_custom_jvp_function_is_refused():
    v = statevar.Variable(1.0, name="v")

    @jax.custom_jvp
    def scaled(a):
        return a * v

    scaled.defjvp(lambda primals, tangents: (scaled(primals[0]), tangents[0]))

    @statevar.jit
    def step(x):
        jax.lax.cond(x > 0, lambda: _none(v.assign(x)), lambda: None)
        return scaled(x)

    with pytest.raises(
        statevar.TraceContextError,
        match=r"Cannot read Variable 'v' inside a jax.custom_jvp function: .* as an argument",
    ):
        step(2.0)
    assert float(v) == 1.0


def test_a_custom_jvp_function_may_read_variables_assigned_only_at_the_top():
    v = statevar.Variable(2.0, name="v")

    @jax.custom_jvp
    def scaled(a):
        return a * v

    scaled.defjvp(lambda primals, tangents: (scaled(primals[0]), tangents[0] * v.value))

    @statevar.jit
    def step(x):
        v.assign_add(1.0)
        return scaled(x)

    assert float(step(2.0)) == 6.0


def test_creating_a_variable_inside_a_nested_transformation_is_refused():
    @statevar.jit
    def step(x):
        return jax.lax.cond(x > 0, lambda: statevar.Variable(1.0, name="made").value, lambda: x)

    with pytest.raises(
        statevar.TraceContextError,
        match=r"Cannot create Variable 'made' under cond inside the statevar.jit function "
        r"'step': .*before the cond",
    ):
        step(1.0)


def test_assigning_a_differentiated_variable_under_a_nested_transformation_is_refused():
    w = statevar.Variable(1.0, name="w")

    def loss():
        jax.lax.cond(True, lambda: _none(w.assign(2.0)), lambda: None)
        return w * w

    for transform in (statevar.jit, _identity):
        with pytest.raises(
            statevar.TraceContextError,
            match=r"Cannot assign to Variable 'w' inside statevar.grad, which differentiates",
        ):
            transform(statevar.grad(loss, w))()
    assert float(w) == 1.0


class _MLP(statevar.Module):
    def __init__(self):
        key_1, key_2 = jax.random.split(jax.random.key(0))
        self.hidden = statevar.Variable(jax.random.normal(key_1, (3, 8)) / 3.0)
        self.output = statevar.Variable(jax.random.normal(key_2, (8, 1)) / 8.0)
        self.step = statevar.Variable(0, trainable=False, name="step")

    def __call__(self, x):
        return jax.nn.relu(x @ self.hidden) @ self.output


def _training(optimizer_fn):
    import optax

    model = _MLP()
    optimizer = statevar.Optimizer(optimizer_fn(optax), model)
    loss_and_grads = statevar.value_and_grad(lambda x, y: jnp.mean((model(x) - y) ** 2), model)

    def train_step(x, y):
        loss, grads = loss_and_grads(x, y)
        optimizer.apply(grads)
        model.step.assign_add(1)
        return loss

    return model, optimizer, train_step


@pytest.mark.parametrize("optimizer_fn", [lambda o: o.sgd(0.1), lambda o: o.adam(0.05)])
def test_a_scan_of_training_steps_equals_separate_calls(optimizer_fn):
    xs = jax.random.normal(jax.random.key(1), (5, 4, 3))
    ys = jnp.sin(xs.sum(-1, keepdims=True))

    model, optimizer, train_step = _training(optimizer_fn)
    one_step = statevar.jit(train_step)
    losses = jnp.stack([one_step(x, y) for x, y in zip(xs, ys, strict=True)])

    scanned_model, scanned_optimizer, scanned_step = _training(optimizer_fn)

    @statevar.jit
    def train_steps(xs, ys):
        return jax.lax.scan(lambda c, batch: (c, scanned_step(*batch)), None, (xs, ys))[1]

    chex.assert_trees_all_equal(train_steps(xs, ys), losses)
    chex.assert_trees_all_equal(
        [v.value for v in (*scanned_model.variables, *scanned_optimizer.state_variables)],
        [v.value for v in (*model.variables, *optimizer.state_variables)],
    )
    assert int(scanned_model.step) == 5


# ------------------------------------------------ a function used again after an assignment

_counter = statevar.Variable(1.0, name="counter")


def _tenfold():
    """Module-level, so that each use in a step is the same function object: JAX caches
    its traces by function and input types."""
    return _counter.value * 10


@pytest.mark.parametrize(
    "use",
    [
        lambda: jax.lax.cond(True, _tenfold, _tenfold),
        lambda: jax.lax.scan(lambda c, _: (c, _tenfold()), 0.0, length=2)[1][0],
        lambda: jax.checkpoint(_tenfold)(),
        lambda: jax.jit(_tenfold)(),
    ],
    ids=["cond", "scan", "checkpoint", "jax.jit"],
)
def test_a_function_used_again_after_an_assignment_reads_the_new_value(use):
    _counter.assign(1.0)

    @statevar.jit
    def step():
        before = use()
        _counter.assign_add(1.0)
        return before, use()

    chex.assert_trees_all_equal(step(), (jnp.array(10.0), jnp.array(20.0)))  # as eagerly


def test_a_gradient_through_a_function_used_again_after_an_assignment():
    w = statevar.Variable(2.0, name="w")
    h = statevar.Variable(1.0, trainable=False, name="h")

    def product():
        return w.value * h.value

    def loss():
        first = jax.lax.cond(True, product, product)
        h.assign(h + 1.0)
        return first + jax.lax.cond(True, product, product)

    assert float(statevar.grad(loss, w)()) == 3.0  # as jax.grad of w*1 + w*2
