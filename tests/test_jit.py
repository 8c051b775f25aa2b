"""statevar.jit: reading and assigning variables in compiled functions."""

import copy
import functools
import gc
import inspect
import pickle
import sys
import threading
import weakref

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
        self.steps = statevar.Variable(0, trainable=False)

    def __call__(self, x):
        return x @ self.kernel + self.bias


X = jnp.array([[1.0, 2.0], [3.0, -1.0]])


def _identity(fn):
    return fn


@pytest.mark.parametrize("transform", [statevar.jit, _identity], ids=["jit", "eager"])
def test_closure_step_reads_and_assigns(transform):
    model = Linear()

    @transform
    def step(x):
        loss, grads = statevar.value_and_grad(lambda: jnp.sum(model(x) ** 2), model)()
        model.kernel.assign_sub(0.01 * grads["kernel"])
        model.bias.assign_sub(0.01 * grads["bias"])
        model.steps.assign_add(1)
        return loss

    losses = [float(step(X)) for _ in range(3)]
    assert int(model.steps) == 3
    assert losses[2] < losses[1] < losses[0]
    # Same numbers as the pure-JAX computation.
    kernel, bias = jnp.array([[1.0, -2.0], [0.5, 3.0]]), jnp.array([0.1, -0.1])
    for _ in range(3):
        gk, gb = jax.grad(lambda k, b: jnp.sum((X @ k + b) ** 2), argnums=(0, 1))(kernel, bias)
        kernel, bias = kernel - 0.01 * gk, bias - 0.01 * gb
    chex.assert_trees_all_close((model.kernel.value, model.bias.value), (kernel, bias), rtol=1e-6)


def test_jit_and_eager_agree_on_an_optimizer_step():
    import optax

    results = []
    for transform in (statevar.jit, _identity):
        model = Linear()
        opt = statevar.Optimizer(optax.adam(0.1), model)

        def step(x, model=model, opt=opt):
            loss, grads = statevar.value_and_grad(lambda: jnp.sum(model(x) ** 2), model)()
            opt.apply(grads)
            return loss

        step = transform(step)
        losses = [step(X) for _ in range(4)]
        results.append((losses, [v.value for v in model.variables]))
    chex.assert_trees_all_close(results[0], results[1], rtol=1e-5)


def test_no_retrace_on_later_calls():
    model = Linear()

    @statevar.jit
    @chex.assert_max_traces(n=1)
    def step(x):
        model.steps.assign_add(1)
        model.kernel.assign(model.kernel.value * 0.5)
        return model(x)

    for _ in range(5):
        step(X)
    assert int(model.steps) == 5


def test_retraces_when_a_shape_changes_and_only_then():
    traces = []
    total = statevar.Variable(0.0)

    @statevar.jit
    def accumulate(x):
        traces.append(x.shape)
        total.assign_add(x.sum())

    accumulate(jnp.ones(3))
    accumulate(jnp.ones(3))
    accumulate(jnp.ones(4))
    accumulate(jnp.ones(4))
    assert traces == [(3,), (4,)]
    assert float(total) == 14.0


def test_a_python_bool_argument_is_static_each_value_traced_once():
    model = Linear()
    dropped = statevar.Variable(0)

    @statevar.jit
    @chex.assert_max_traces(n=2)  # one trace per value of `training`
    def step(x, training):
        if training:  # a Python bool, not a tracer
            dropped.assign_add(1)
        return model(x).sum()

    for training in (True, False, True, False, True):
        step(X, training)
    # True and False do not share a compiled step, on the warm path either.
    assert int(dropped) == 3


def test_a_bool_beside_a_module_argument_finds_the_trace_of_its_value():
    model = Linear()
    traced = []

    @statevar.jit
    def step(m, x, training):
        traced.append(training)
        return m(x).sum() * (2.0 if training else 1.0)

    doubled, plain = float(step(model, X, True)), float(step(model, X, False))
    assert doubled == 2 * plain
    for _ in range(3):  # warm calls, found by argument identity: each value its own entry
        assert float(step(model, X, True)) == doubled
        assert float(step(model, X, False)) == plain
    assert traced == [True, False]


def test_a_bool_nested_in_an_argument_is_static_too():
    total = statevar.Variable(0.0)

    @statevar.jit
    def step(x, options):
        total.assign_add(x * 2 if options["double"] else x)

    step(1.0, {"double": True})
    step(1.0, {"double": False})
    assert float(total) == 3.0


def test_an_int_step_counter_is_traced_and_does_not_retrace():
    total = statevar.Variable(0)

    @statevar.jit
    @chex.assert_max_traces(n=1)
    def step(count):
        total.assign_add(count)

    for count in range(5):
        step(count)  # unlike tf.function, which traces again for each Python number
    assert int(total) == 10


def test_variables_passed_as_arguments_directly_in_containers_and_in_modules():
    a, b = statevar.Variable(1.0), statevar.Variable(2.0)
    model = Linear()

    @statevar.jit
    @chex.assert_max_traces(n=1)
    def step(pair, named, module):
        pair[0].assign_add(1.0)
        named["b"].assign(named["b"].value * 10)
        module.steps.assign_add(2)
        return pair[1].value + 1

    for _ in range(2):
        out = step([a, b], {"b": b}, model)
    assert float(a) == 3.0 and float(b) == 200.0 and int(model.steps) == 4
    chex.assert_trees_all_close(out, 201.0)  # reads see the assignment made just before


def test_a_compiled_method_binds_its_instance():
    traces = []

    class Counter(statevar.Module):
        def __init__(self, start):
            self.count = statevar.Variable(start)

        @statevar.jit
        def step(self, x):
            traces.append(None)
            self.count.assign_add(x)
            return self.count.value * 2

    first, second = Counter(0.0), Counter(10.0)
    for _ in range(3):
        first.step(1.0)
    out = second.step(jnp.float32(1.0))

    assert (float(first.count), float(second.count)) == (3.0, 11.0)
    chex.assert_trees_all_close(out, 22.0)
    assert len(traces) == 2  # once per instance, not per call
    assert Counter.step.__name__ == "step"


class _Counter(statevar.Module):
    def __init__(self):
        self.count = statevar.Variable(0.0)
        self.step = statevar.jit(self._step)  # compiled per instance, as a bound method

    def _step(self, x):
        self.count.assign_add(x)


def test_a_compiled_function_looks_like_the_function_it_compiles():
    def step(x: jax.Array, scale: float = 2.0) -> jax.Array:
        """Doubles."""
        return x * scale

    compiled = statevar.jit(step)

    assert (compiled.__name__, compiled.__doc__) == ("step", "Doubles.")
    assert inspect.signature(compiled) == inspect.signature(step)
    assert repr(compiled) == "<statevar.jit function step>"
    assert copy.copy(compiled) is compiled
    assert copy.deepcopy(compiled) is compiled  # shared by copies, as a function is
    bound = statevar.jit(_Counter()._step)
    assert copy.deepcopy(bound) is not bound  # compiles the copy (see the test below)


@statevar.jit
def _doubled(x):
    return x * 2


def test_a_compiled_function_pickles_by_reference_as_a_function_does():
    assert pickle.loads(pickle.dumps(_doubled)) is _doubled
    assert float(_doubled(2.0)) == 4.0


def test_a_compiled_method_binds_to_its_instance():
    class Scaler:
        def __init__(self, factor: float):
            self.factor = factor

        @statevar.jit
        def scale(self, x):
            return x * self.factor

    assert float(Scaler(3.0).scale(2.0)) == 6.0
    assert float(Scaler(5.0).scale(2.0)) == 10.0
    assert isinstance(Scaler.scale, statevar._compile.step.Step)  # unbound on the class


def test_a_deep_copy_of_a_module_holding_a_compiled_method_updates_the_copy():
    original = _Counter()
    original.step(1.0)

    duplicate = copy.deepcopy(original)
    duplicate.step(10.0)
    original.step(1.0)

    assert (float(original.count), float(duplicate.count)) == (2.0, 11.0)


def test_a_compiled_method_does_not_keep_its_instances_alive():
    class Model(statevar.Module):
        def __init__(self):
            self.w = statevar.Variable(jnp.zeros(1024))

        @statevar.jit
        def step(self, x):
            self.w.assign_add(x)

    kept = Model()
    variables = []
    # With the garbage collector off: a freed Module, its compiled entries and their
    # variables must go by reference counting alone, at once (no reference cycle).
    gc.disable()
    try:
        for _ in range(3):
            model = Model()
            model.step(1.0)
            model.step(1.0)
            variables.append(weakref.ref(model.w))
            del model
            assert variables[-1]() is None
        kept.step(1.0)
    finally:
        gc.enable()
    assert len(Model.step._cache.entries) == 1  # only the live instance's
    kept.step(1.0)
    assert float(kept.w[0]) == 2.0


def test_copies_of_a_module_argument_are_walked_for_themselves():
    @statevar.jit
    def bump_all(net):
        for variable in net.variables:
            variable.assign_add(1.0)

    net = _Net()
    bump_all(net)
    shallow, deep = copy.copy(net), copy.deepcopy(net)
    shallow.first = _Block(50.0)  # a new attribute dict: the original is unchanged
    bump_all(shallow)
    bump_all(deep)

    assert (float(net.first.w), float(shallow.first.w), float(deep.first.w)) == (1.0, 51.0, 2.0)
    assert float(net.blocks[0].w) == 12.0  # shared with the shallow copy: bumped twice


def test_compiled_static_and_class_methods():
    class Scaler:
        factor = 3.0
        total = statevar.Variable(0.0)

        @statevar.jit
        @staticmethod
        def double(x):
            return x * 2

        @statevar.jit
        @classmethod
        def add_scaled(cls, x):
            cls.total.assign_add(cls.factor * x)
            return cls.total.value

    assert float(Scaler().double(3.0)) == 6.0 and float(Scaler.double(4.0)) == 8.0
    Scaler.add_scaled(1.0)
    assert float(Scaler().add_scaled(1.0)) == 6.0


def test_a_global_that_raises_on_attribute_access_does_not_break_compiling():
    class Strict:
        def __getattr__(self, name):
            raise KeyError(name)

    total = statevar.Variable(0.0)
    namespace = {"strict": Strict(), "total": total}
    exec("def step(x):\n    strict\n    total.assign_add(x)\n", namespace)

    statevar.jit(namespace["step"])(1.0)

    assert float(total) == 1.0


def test_compiling_a_callable_object_keeps_the_objects_attributes_apart():
    class Scale(statevar.Module):
        def __init__(self):
            self.factor = statevar.Variable(2.0)
            self._fn = lambda x: x * 100  # an attribute a wrapper must not pick up

        def __call__(self, x):
            return x * self.factor

    compiled = statevar.jit(Scale())

    def tagged(x):
        return x

    tagged.registry_tag = "metrics"

    assert float(compiled(3.0)) == 6.0
    assert statevar.jit(tagged).registry_tag == "metrics"  # as jax.jit exposes it
    assert float(copy.deepcopy(statevar.jit(compiled, static_argnums=1))(3.0)) == 6.0


def test_a_compiled_partial_is_named_after_its_function_in_errors():
    def scaled(factor, items):
        return factor * sum(items)

    compiled = statevar.jit(functools.partial(scaled, 2.0))

    with pytest.raises(TypeError, match=r"The statevar.jit function 'scaled' got an argument"):
        compiled([{1}])
    assert repr(compiled) == "<statevar.jit function scaled>"


def test_different_variables_passed_in_the_same_slot_each_get_their_update():
    @statevar.jit
    def bump(v):
        v.assign_add(1.0)

    first, second = statevar.Variable(0.0), statevar.Variable(10.0)
    bump(first)
    bump(second)
    bump(first)
    assert (float(first), float(second)) == (2.0, 11.0)


def test_buffers_are_donated_and_earlier_reads_stay_valid():
    w = statevar.Variable(jnp.zeros(1024))

    @statevar.jit
    def step():
        w.assign_add(1.0)

    step()
    pointer = w.value.unsafe_buffer_pointer()
    step()
    assert w.value.unsafe_buffer_pointer() == pointer  # donated: updated in place
    held = w.value
    step()
    assert not held.is_deleted()
    chex.assert_trees_all_close(held, jnp.full(1024, 2.0))
    chex.assert_trees_all_close(w.value, jnp.full(1024, 3.0))


def test_returning_a_variable_returns_its_value():
    v = statevar.Variable([1.0, 2.0])

    @statevar.jit
    def step():
        v.assign_add(1.0)
        return v

    out = step()
    assert isinstance(out, jax.Array)
    chex.assert_trees_all_close(out, jnp.array([2.0, 3.0]))


def test_a_variable_found_only_while_tracing_is_lifted_on_the_next_call():
    class Holder:  # a plain object: statevar cannot see inside before tracing
        def __init__(self):
            self.v = statevar.Variable(1.0)

    holder = Holder()
    traces = []

    def read():
        return holder.v.value

    hidden = {"get": read}

    @statevar.jit
    def step():
        traces.append(1)
        return hidden["get"]() * 2

    results = []
    for value in (1.0, 5.0, 7.0, 9.0):
        holder.v.assign(value)
        results.append(float(step()))
    assert results == [2.0, 10.0, 14.0, 18.0]  # never a stale value
    assert len(traces) == 2  # traced once more to lift holder.v, then never again


@pytest.mark.parametrize(
    "static", [{"static_argnums": 1}, {"static_argnums": -1}, {"static_argnames": "repeats"}]
)
def test_static_arguments_by_position_or_name(static):
    total = statevar.Variable(0.0)

    def add(x, repeats):
        for _ in range(repeats):  # Python control flow: needs a concrete int
            total.assign_add(x)

    add = statevar.jit(add, **static)
    add(jnp.float32(1.0), 2)
    add(jnp.float32(1.0), repeats=3)
    assert float(total) == 5.0


def test_unhashable_non_array_arguments_are_refused():
    class Config:
        __hash__ = None

    @statevar.jit
    def step(config, x):
        return x

    with pytest.raises(TypeError, match="got an argument of type Config, which is not an array"):
        step(Config(), 1.0)


def test_replacing_a_variable_in_a_module_argument_retraces():
    class Holder(statevar.Module):
        def __init__(self):
            self.w = statevar.Variable(1.0)

    @statevar.jit
    def bump(module):
        module.w.assign_add(1.0)

    holder = Holder()
    bump(holder)
    old = holder.w
    holder.w = statevar.Variable(100.0)
    bump(holder)
    assert (float(old), float(holder.w)) == (2.0, 101.0)


class _Dense(statevar.Module):
    def __init__(self):
        self.kernel = statevar.Variable(jnp.ones((2, 1)), name="kernel")

    def __call__(self, x):
        return x @ self.kernel


def test_a_variable_a_closure_module_replaced_is_seen_as_eagerly():
    model = _Dense()
    x = jnp.ones((1, 2))

    @statevar.jit
    def forward_and_bump():
        model.kernel.assign_add(1.0)
        return model(x)

    forward_and_bump()
    old = weakref.ref(model.kernel)
    gc.disable()  # freed by reference counting alone
    try:
        model.kernel = statevar.Variable(jnp.full((2, 1), 5.0))
        result = forward_and_bump()
        assert old() is None  # not kept alive by the step traced before
    finally:
        gc.enable()
    chex.assert_trees_all_equal(result, jnp.array([[12.0]]))
    chex.assert_trees_all_equal(model.kernel.value, jnp.full((2, 1), 6.0))


def test_a_module_argument_whose_counter_counts_each_call_is_found_without_a_new_walk(
    monkeypatch,
):
    # A Python counter on the Module changes no variable found: warm calls are found by
    # the Module's structure (`Cache.find`), never split again; a replaced variable is seen.
    class Counted(statevar.Module):
        def __init__(self):
            self.kernel = statevar.Variable(jnp.ones((2, 1)))
            self.calls = 0

    model = Counted()

    @statevar.jit
    def step(model, x):
        model.kernel.assign_add(x.sum())
        return model.kernel.value

    step(model, jnp.ones(2))
    cache_type = type(step._cache)
    prepare, splits = cache_type.prepare, []

    def counted(cache, *args, **kwargs):
        splits.append(args)
        return prepare(cache, *args, **kwargs)

    monkeypatch.setattr(cache_type, "prepare", counted)
    for _ in range(3):
        model.calls += 1
        step(model, jnp.ones(2))
    assert splits == []
    chex.assert_trees_all_equal(model.kernel.value, jnp.full((2, 1), 9.0))

    model.kernel = statevar.Variable(jnp.zeros((2, 1)))
    chex.assert_trees_all_equal(step(model, jnp.ones(2)), jnp.full((2, 1), 2.0))
    assert len(splits) == 1


def test_a_sub_module_a_closure_module_replaced_is_seen_as_eagerly():
    class Net(statevar.Module):
        def __init__(self):
            self.layers = [_Dense()]

    net = Net()
    x = jnp.ones((1, 2))
    step = statevar.jit(lambda: net.layers[0](x))
    step()

    net.layers = [_Dense(), _Dense()]
    net.layers[0].kernel.assign(jnp.full((2, 1), 3.0))

    chex.assert_trees_all_equal(step(), jnp.array([[6.0]]))


def test_an_optimizer_in_a_compiled_step_refuses_a_replaced_variable_as_eagerly():
    model = _Dense()
    opt = statevar.Optimizer(optax.sgd(0.1), model)
    loss_and_grads = statevar.value_and_grad(lambda: jnp.sum(model(jnp.ones((4, 2)))), model)

    @statevar.jit
    def train_step():
        loss, grads = loss_and_grads()
        opt.apply(grads)
        return loss

    train_step()
    replaced = model.kernel
    model.kernel = statevar.Variable(jnp.full((2, 1), 5.0), name="kernel")
    before = [v.value for v in (replaced, model.kernel, *opt.state_variables)]

    with pytest.raises(ValueError, match=r"no longer holds the variables it optimizes at 'kernel'"):
        train_step()
    chex.assert_trees_all_equal(
        [v.value for v in (replaced, model.kernel, *opt.state_variables)], before
    )


def test_setting_a_module_attribute_that_lets_go_of_no_variable_traces_nothing_again():
    model = _Dense()
    model.scale = 2.0
    model.params = [model.kernel]
    traces = []

    @statevar.jit
    def step(x):
        traces.append(1)
        model.params = [model.kernel]  # while tracing, too: the same variable, a new list
        return model(x) * model.scale  # the scale is baked in, as with tf.function

    step(jnp.ones((1, 2)))
    step(jnp.ones((3, 2)))  # a new shape: traced again, once
    model.scale = 3.0
    model.note = jnp.ones(3)
    model.kernel = model.kernel  # the same variable
    model.params = (model.kernel,)
    for _ in range(3):
        step(jnp.ones((1, 2)))
        step(jnp.ones((3, 2)))

    assert len(traces) == 2


def test_a_replacement_retraces_only_the_steps_that_lifted_what_was_replaced():
    model, other = _Dense(), _Dense()
    traces = {"model": 0, "other": 0}

    @statevar.jit
    def uses_model():
        traces["model"] += 1
        return model(jnp.ones((1, 2)))

    @statevar.jit
    def uses_other():
        traces["other"] += 1
        return other(jnp.ones((1, 2)))

    uses_model(), uses_other()
    model.kernel = statevar.Variable(jnp.full((2, 1), 2.0))
    results = uses_model(), uses_other()

    assert traces == {"model": 2, "other": 1}
    chex.assert_trees_all_equal(results, (jnp.array([[4.0]]), jnp.array([[2.0]])))


def test_an_optimizer_a_closure_module_replaced_is_seen_as_eagerly():
    def run(step_of):
        model = _Dense()
        model.opt = statevar.Optimizer(optax.sgd(0.1), model)

        def step():
            grads = statevar.grad(lambda: jnp.sum(model(jnp.ones((1, 2)))), model)()
            model.opt.apply(grads)

        step = step_of(step)
        step(), step()
        old = model.opt
        model.opt = statevar.Optimizer(optax.sgd(0.1), model)
        step()
        return int(old.iterations), int(model.opt.iterations)

    assert run(statevar.jit) == run(lambda step: step) == (2, 1)


def test_an_attribute_that_held_no_variable_coming_to_hold_one_is_seen_as_eagerly():
    model = _Dense()
    model.bias = None

    @statevar.jit
    def step():
        out = model(jnp.ones((1, 2)))
        return out if model.bias is None else out + model.bias

    step()
    model.bias = statevar.Variable(100.0)

    chex.assert_trees_all_equal(step(), jnp.array([[102.0]]))


def test_deleting_a_variable_a_compiled_step_read_is_seen_as_eagerly():
    model = _Dense()
    model.bias = statevar.Variable(1.0)
    step = statevar.jit(lambda: model.bias + 1.0)
    step()

    del model.bias

    with pytest.raises(AttributeError, match="bias"):
        step()


class _Block(statevar.Module):
    def __init__(self, start):
        self.w = statevar.Variable(start)


class _Net(statevar.Module):
    def __init__(self):
        self.first = _Block(0.0)
        self.blocks = [_Block(10.0)]
        self.by_name = {"a": _Block(20.0)}


def _bump_all(net):
    for variable in net.variables:
        variable.assign_add(1.0)


class _SteppedNet(_Net):
    bump = statevar.jit(_bump_all)


def _replace_attribute(net):
    net.first.w = statevar.Variable(100.0)
    return net.first.w


def _replace_list_item(net):
    net.blocks[0] = _Block(200.0)
    return net.blocks[0].w


def _append_to_list(net):
    net.blocks.append(_Block(300.0))
    return net.blocks[1].w


def _replace_dict_item(net):
    net.by_name["a"] = _Block(400.0)
    return net.by_name["a"].w


def _add_attribute(net):
    net.extra = statevar.Variable(500.0)
    return net.extra


def _replace_submodule(net):
    net.first = _Block(600.0)
    return net.first.w


def _replace_attribute_dict(net):
    net.__dict__ = {**vars(net), "first": _Block(700.0)}
    return net.first.w


@pytest.mark.parametrize(
    "change",
    [
        _replace_attribute,
        _replace_list_item,
        _append_to_list,
        _replace_dict_item,
        _add_attribute,
        _replace_submodule,
        _replace_attribute_dict,
    ],
)
@pytest.mark.parametrize("form", ["argument", "method"])
def test_a_changed_module_argument_is_walked_again_on_the_next_call(form, change):
    # Repeated calls with the same Module skip walking it while nothing it holds changed;
    # any change is seen by the next call, which updates the variables the Module now holds.
    if form == "method":
        net = _SteppedNet()
        call = net.bump
    else:
        net, compiled = _Net(), statevar.jit(_bump_all)
        call = lambda: compiled(net)  # noqa: E731
    call()
    call()
    old = {v: float(v) for v in net.variables}

    new = change(net)
    start = float(new)
    call()

    held = set(net.variables)
    assert float(new) == start + 1
    for variable, value in old.items():
        assert float(variable) == (value + 1 if variable in held else value)


def test_a_replaced_variable_is_not_kept_alive_by_the_old_compiled_entry():
    net = _Net()

    @statevar.jit
    def bump(model, x):
        model.first.w.assign_add(x)

    bump(net, 1.0)
    old = weakref.ref(net.first.w)
    gc.disable()  # freed by reference counting alone
    try:
        net.first.w = statevar.Variable(10.0)
        bump(net, 1.0)
        assert old() is None
    finally:
        gc.enable()
    assert len(bump._cache.entries) == 1 and float(net.first.w) == 11.0


def test_an_unchanged_module_argument_is_not_walked_again(monkeypatch):
    net = _Net()

    @statevar.jit
    def bump(model, x):
        model.first.w.assign_add(x)

    bump(net, 1.0)
    walks = []
    real = statevar._cell.tree.walk
    monkeypatch.setattr(
        statevar._cell.tree, "walk", lambda root, *a, **k: walks.append(root) or real(root, *a, **k)
    )
    bump(net, 1.0)
    bump(net, 2.0)
    assert walks == [] and float(net.first.w) == 4.0


def test_a_list_argument_holding_one_array_is_not_mistaken_for_the_array():
    net = _Net()

    @statevar.jit
    def bump(model, xs):
        model.first.w.assign_add(xs[0])

    for _ in range(3):
        bump(net, [jnp.float32(1.0)])
    assert float(net.first.w) == 3.0


def test_toggling_an_unrelated_flag_does_not_retrace():
    w = statevar.Variable(1.0)
    unrelated = statevar.Variable(1.0)
    traces = []

    @statevar.jit
    def step():
        traces.append(1)
        return statevar.grad(lambda: w * w, w)()

    step()
    for _ in range(3):
        unrelated.trainable = not unrelated.trainable
        step()
    assert len(traces) == 1


def test_calling_under_jax_grad_or_vmap_is_refused_and_leaves_variables_intact():
    a = statevar.Variable(0.0, name="a")
    b = statevar.Variable(0.0, name="b")

    @statevar.jit
    def step(x):
        a.assign_add(x)
        b.assign(x * 2)
        return x * 3

    for transform in (jax.grad, jax.vmap):
        argument = jnp.ones(2) if transform is jax.vmap else 3.0
        with pytest.raises(statevar.TraceContextError, match="inside jax.jit, jax.grad, jax.vmap"):
            transform(step)(argument)
    for variable in (a, b):
        assert not isinstance(variable.value, jax.core.Tracer)
        assert not variable.value.is_deleted() and float(variable) == 0.0


def test_a_failure_after_donation_names_the_variables_that_lost_their_values():
    v = statevar.Variable(1.0, name="v")

    def fail(x):
        raise RuntimeError("boom")

    @statevar.jit
    def step():
        v.assign_add(1.0)
        return jax.pure_callback(fail, jax.ShapeDtypeStruct((), jnp.float32), v.value)

    with pytest.raises(
        statevar.StatevarError, match="failed after its variables' buffers were donated.*'v'"
    ):
        step()


def test_threads_calling_a_compiled_step_and_reading_never_see_a_deleted_array():
    import threading

    v = statevar.Variable(0.0)

    @statevar.jit
    def step():
        v.assign_add(1.0)

    step()
    errors = []

    def run(work):
        try:
            for _ in range(300):
                work()
        except Exception as error:  # collected and asserted below
            errors.append(error)

    workers = [threading.Thread(target=run, args=(step,)) for _ in range(2)]
    workers.append(threading.Thread(target=run, args=(lambda: v.assign_add(1.0),)))
    workers.append(threading.Thread(target=run, args=(lambda: float(v.value),)))
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
    assert float(v) == 1.0 + 900.0


def test_non_array_arguments_are_static():
    v = statevar.Variable(2.0)

    @statevar.jit
    def apply(fn, x):
        return fn(x) * v.value

    assert float(apply(jnp.square, 3.0)) == 18.0
    assert float(apply(jnp.negative, 3.0)) == -6.0


def test_nested_statevar_jit_runs_inline():
    v = statevar.Variable(0.0)

    @statevar.jit
    def inner():
        v.assign_add(1.0)

    @statevar.jit
    def outer():
        inner()
        inner()

    outer()
    assert float(v) == 2.0


def test_a_wrapper_of_a_compiled_function_is_followed_for_its_own_variables():
    inner_total, outer_total = statevar.Variable(0.0), statevar.Variable(0.0)
    traces = []

    @statevar.jit
    def inner(x):
        inner_total.assign_add(x)

    @functools.wraps(inner)  # copies the compiled function's attributes
    def logged(x):
        outer_total.assign_add(x)
        inner(x)

    @statevar.jit
    def step(x):
        traces.append(None)
        logged(x)

    for _ in range(3):
        step(1.0)

    assert (float(inner_total), float(outer_total), len(traces)) == (3.0, 3.0, 1)


class LazyDense(statevar.Module):
    """Keras-style: the kernel's shape comes from the first input."""

    def __init__(self, units):
        self.units = units
        self.kernel = None
        self.bias = None
        self.builds = 0

    def __call__(self, x):
        if self.kernel is None:
            self.bias = statevar.Variable(jnp.zeros(self.units), name="bias")
            init = jax.random.normal(jax.random.key(0), (x.shape[-1], self.units))
            self.kernel = statevar.Variable(init * 0.1, name="kernel")
            self.builds += 1  # counts the variables made (a trace may stop before)
        return x @ self.kernel + self.bias


def _plain_sgd_losses(x, y, steps):
    kernel = jax.random.normal(jax.random.key(0), (x.shape[-1], 2)) * 0.1
    bias, losses = jnp.zeros(2), []
    for _ in range(steps):
        loss, (dk, db) = jax.value_and_grad(
            lambda k, b: jnp.mean((x @ k + b - y) ** 2), argnums=(0, 1)
        )(kernel, bias)
        kernel, bias = kernel - 0.1 * dk, bias - 0.1 * db
        losses.append(float(loss))
    return losses, kernel


def test_a_module_built_on_its_first_call_trains_under_jit_as_tf_function_allows():
    model = LazyDense(2)
    traces = []

    @statevar.jit
    def step(x, y):
        traces.append(None)
        model(x)  # builds on the first call: statevar.grad creates nothing
        loss, grads = statevar.value_and_grad(lambda: jnp.mean((model(x) - y) ** 2), model)()
        for variable in model.trainable_variables:
            variable.assign_sub(0.1 * grads[variable.name])
        return loss

    x, y = jnp.ones((4, 3)), jnp.zeros((4, 2))
    losses = [float(step(x, y)) for _ in range(4)]
    first_call_traces = len(traces)
    expected, kernel = _plain_sgd_losses(x, y, 4)
    chex.assert_trees_all_close(losses, expected, rtol=1e-5)
    chex.assert_trees_all_close(model.kernel.value, kernel, rtol=1e-5)
    assert model.builds == 1  # created once, though the first call traced more than once
    assert first_call_traces == 3  # stopped at the creation, created, then the step's own
    assert [v.name for v in model.variables] == ["kernel", "bias"]
    # Later calls reuse them, lifted and donated like any variable.
    (arrays, _), _ = step.lower(x, y).args_info
    assert [(a.shape, a.donated) for a in arrays] == [((3, 2), True), ((2,), True)]


def test_a_module_argument_built_on_its_first_call_is_created_once():
    model = LazyDense(2)

    @statevar.jit
    def predict(model, x):
        return model(x)

    first = predict(model, jnp.ones((1, 3)))
    model.bias.assign([1.0, 1.0])
    second = predict(model, jnp.ones((1, 3)))
    chex.assert_trees_all_close(second, first + 1.0)
    assert model.builds == 1


def test_variables_made_from_concrete_values_or_initializers_in_a_first_trace():
    made = {}

    @statevar.jit
    def count(x):
        if not made:
            made["total"] = statevar.Variable(np.zeros(2, np.float32), name="total")
            made["calls"] = statevar.Variable(lambda: jnp.zeros((), jnp.int32), name="calls")
        made["total"].assign_add(x)
        made["calls"].assign_add(1)
        return made["total"].value

    count(jnp.ones(2))
    chex.assert_trees_all_close(count(jnp.ones(2)), jnp.array([2.0, 2.0]))
    assert int(made["calls"]) == 2 and not made["total"].value.is_deleted()


def test_a_variable_created_on_every_call_is_refused_when_traced_again():
    @statevar.jit
    def every_call(x):
        return statevar.Variable(jnp.zeros(2), name="fresh") + x

    with pytest.raises(
        statevar.TraceContextError,
        match=r"Cannot create Variable 'fresh' inside the statevar.jit function 'every_call' "
        r"after its first trace: .*as tf.function does.*function creates a variable on "
        r"every call",
    ):
        every_call(jnp.ones(2))


def test_a_variable_created_for_a_new_input_signature_is_refused():
    made = {}

    @statevar.jit
    def per_shape(x):
        if x.shape not in made:
            made[x.shape] = statevar.Variable(jnp.zeros(x.shape), name=f"total{len(made)}")
        made[x.shape].assign_add(x)
        return made[x.shape].value

    per_shape(jnp.ones(2))
    with pytest.raises(
        statevar.TraceContextError,
        match=r"Cannot create Variable 'total1' inside the statevar.jit function 'per_shape' "
        r"after its first trace: .*a new input signature",
    ):
        per_shape(jnp.ones(3))
    assert list(made) == [(2,)]  # no half-made variable
    chex.assert_trees_all_close(per_shape(jnp.ones(2)), jnp.array([2.0, 2.0]))


def test_a_variable_created_from_a_traced_value_is_refused():
    made = {}
    total = statevar.Variable(1.0, name="total")

    @statevar.jit
    def from_argument(x):
        made["doubled"] = statevar.Variable(x * 2, name="doubled")
        total.assign_add(1.0)

    with pytest.raises(
        statevar.TraceContextError,
        match=r"Cannot create Variable 'doubled' inside the statevar.jit function "
        r"'from_argument' from a traced value: .*depends on the step's arguments",
    ):
        from_argument(jnp.ones(2))
    assert made == {} and float(total) == 1.0


def test_a_variable_created_under_lax_cond_in_a_first_trace_is_refused():
    made = {}

    @statevar.jit
    def in_cond(x):
        def branch(x):
            made["flag"] = statevar.Variable(1.0, name="flag")
            return x

        return jax.lax.cond(x.sum() > 0, branch, lambda x: x, x)

    with pytest.raises(
        statevar.TraceContextError,
        match=r"Cannot create Variable 'flag' under cond inside the statevar.jit function "
        r"'in_cond': .*whether or not it runs.*before the cond",
    ):
        in_cond(jnp.ones(2))
    assert made == {}


def test_donate_argnums_is_refused():
    with pytest.raises(TypeError, match="statevar.jit does not take donate_argnums"):
        statevar.jit(lambda x: x, donate_argnums=0)


@pytest.mark.parametrize("keyword", ["in_shardings", "out_shardings"])
def test_shardings_for_the_compiled_step_are_refused(keyword):
    # jax.jit's would apply to the step's own arguments and outputs, not the function's.
    with pytest.raises(TypeError, match=f"statevar.jit does not take {keyword}: variables"):
        statevar.jit(lambda x: x, **{keyword: None})


@pytest.mark.parametrize(
    ("keyword", "value", "given"),
    [
        ("static_argnums", "a", "static_argnums to be an int or a sequence of them, got str"),
        ("static_argnums", [0, "b"], r"static_argnums .* got list \[0, .b.\]"),
        ("static_argnames", 3, "static_argnames to be a str or a sequence of them, got int"),
    ],
)
def test_static_arguments_of_the_wrong_kind_are_refused_by_name(keyword, value, given):
    def scale(x, factor):
        return x * factor

    with pytest.raises(
        TypeError, match=f"Cannot compile 'scale' with statevar.jit: expected {given}"
    ):
        statevar.jit(scale, **{keyword: value})


def _escaped_tracer():
    """A tracer kept by a side effect after its jax.jit finished."""
    kept = []
    jax.jit(lambda: kept.append(jnp.full(3, 2.0)))()
    return kept[0]


@pytest.mark.parametrize(
    "update",
    [
        lambda v, leaked: v.assign(leaked),
        lambda v, leaked: v.assign_add(leaked),
        lambda v, leaked: v.__setitem__(0, leaked[1]),
    ],
    ids=["assign", "assign_add", "setitem of a value computed from it"],
)
@pytest.mark.parametrize("transform", ["jit", "grad"])
def test_an_escaped_tracer_assigned_in_a_step_is_a_trace_context_error(update, transform):
    # Eagerly the same assignment is a TraceContextError; JAX's own error names no variable.
    v = statevar.Variable(jnp.arange(3.0), name="weights")
    w = statevar.Variable(1.0, name="w")
    leaked = _escaped_tracer()
    with pytest.raises(statevar.TraceContextError, match="Cannot assign to Variable 'weights'"):
        v.assign(leaked)

    def body():
        update(v, leaked)
        return w * w

    step = statevar.jit(body) if transform == "jit" else statevar.grad(body, w)
    with pytest.raises(
        statevar.TraceContextError, match="escaped the JAX transformation"
    ) as caught:
        step()
    # The variable is named where the value assigned is the escaped tracer itself; a value
    # computed from one is found only as the step's trace ends, naming the step.
    message = str(caught.value)
    assert "Variable 'weights'" in message or "'body' used a tracer" in message, message
    chex.assert_trees_all_equal(v.value, jnp.arange(3.0))
    v.assign_add(1.0)  # and it still updates
    chex.assert_trees_all_equal(v.value, jnp.arange(1.0, 4.0))


def test_plain_jax_jit_assigning_a_variable_is_a_clear_error_and_keeps_the_value():
    v = statevar.Variable([1.0, 2.0], name="weights")

    @jax.jit
    def bad(x):
        v.assign(x)
        return x

    with pytest.raises(
        statevar.TraceContextError, match="Cannot assign to Variable 'weights' inside jax.jit"
    ):
        bad(jnp.zeros(2))
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])
    assert not isinstance(v.value, jax.core.Tracer)


def test_plain_jax_jit_on_a_variable_argument_is_read_only():
    v = statevar.Variable([1.0, 2.0], name="weights")

    @jax.jit
    def bad(var):
        var.assign_add(1.0)
        return var.value

    with pytest.raises(
        statevar.TraceContextError, match="Cannot assign_add to Variable 'weights' inside jax.jit"
    ):
        bad(v)
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])
    chex.assert_trees_all_close(jax.jit(lambda var: var * 2)(v), jnp.array([2.0, 4.0]))


def test_an_array_and_a_one_element_tuple_are_different_calls():
    @statevar.jit
    def first(x):
        return x[0] if isinstance(x, tuple) else x * 10

    assert float(first(jnp.float32(1.0))) == 10.0
    assert float(first((jnp.float32(1.0),))) == 1.0
    assert float(first(jnp.float32(2.0))) == 20.0


def test_changing_trainable_takes_effect_in_compiled_gradients():
    w = statevar.Variable(1.0, name="w")
    b = statevar.Variable(1.0, name="b")

    @statevar.jit
    def gradients():
        return statevar.grad(lambda: w * w + b, [w, b])()

    assert [float(g) for g in gradients()] == [2.0, 1.0]
    b.trainable = False
    dw, db = gradients()
    assert (float(dw), db) == (2.0, None)
    b.trainable = True
    assert [float(g) for g in gradients()] == [2.0, 1.0]


def test_calling_a_statevar_jit_function_inside_jax_jit_is_a_clear_error():
    v = statevar.Variable(0.0, name="v")

    @statevar.jit
    def bump(x):
        v.assign_add(x)

    with pytest.raises(
        statevar.TraceContextError,
        match="Cannot call the statevar.jit function 'bump' inside jax.jit",
    ):
        jax.jit(bump)(1.0)
    assert float(v) == 0.0 and not isinstance(v.value, jax.core.Tracer)


@pytest.mark.parametrize("transform", [jax.vmap, jax.grad], ids=["vmap", "grad"])
def test_a_compiled_function_that_only_reads_says_how_to_read_under_a_transformation(
    transform,
):
    w = statevar.Variable([1.0, 2.0], name="w")

    @statevar.jit
    def predict(x):
        return jnp.sum(w * x)

    x = jnp.ones((3, 2)) if transform is jax.vmap else jnp.ones(2)
    with pytest.raises(
        statevar.TraceContextError,
        match=r"'predict' inside jax.jit, jax.grad, jax.vmap .* it runs as a compiled step of "
        r"its own.* call the Python function itself \(predict.__wrapped__\)",
    ):
        transform(predict)(x)
    # The way the message gives.
    chex.assert_trees_all_close(
        transform(predict.__wrapped__)(x), transform(lambda x: jnp.sum(w.value * x))(x)
    )


def test_a_variable_only_assigned_and_found_while_tracing_gets_its_value():
    class Holder:  # a plain object: statevar cannot see inside before tracing
        def __init__(self):
            self.v = statevar.Variable(0.0)

    holder = Holder()
    hidden = {"holder": holder}
    traces = []

    @statevar.jit
    def write(x):
        traces.append(1)
        hidden["holder"].v.assign(x)

    for value in (1.0, 2.0, 3.0):
        write(jnp.float32(value))
        assert float(holder.v) == value
    assert len(traces) == 2


def test_a_variable_the_step_only_writes_is_updated_in_place():
    # JAX prunes an argument the function never reads, and its donation with it, unless
    # the step keeps unused arguments: the new value would then take a fresh buffer.
    written = statevar.Variable(jnp.zeros(4096))
    read = statevar.Variable(jnp.ones(4096))

    @statevar.jit
    def step(x):
        written.assign(read * x)

    step(2.0)
    pointer = written.value.unsafe_buffer_pointer()
    step(3.0)

    # The old array was alive (held by the variable) until the call returned, so a copy
    # could not have reused its address: the same pointer means its buffer was donated.
    assert written.value.unsafe_buffer_pointer() == pointer
    chex.assert_trees_all_equal(written.value, jnp.full(4096, 3.0))


def test_a_dropped_step_lets_go_of_its_compiled_program():
    # A step made, called once and dropped leaves nothing cached: JAX's caches of its
    # trace, lowering and executable die with it. Its closed-over constant lives in the
    # compiled program, so it is freed exactly when the program is. (On JAX 0.11 and later,
    # a step compiled with keep_unused=True stayed cached forever.)
    w = statevar.Variable(jnp.ones(4), name="w")

    def make_call_and_drop():
        constant = jnp.arange(4.0) * 3

        @statevar.jit
        def step(x):
            w.assign(x * constant)  # written, never read: still donated

        step(jnp.ones(4))
        return weakref.ref(constant)

    constants = [make_call_and_drop() for _ in range(3)]
    gc.collect()
    assert [c() for c in constants] == [None, None, None]
    chex.assert_trees_all_equal(w.value, jnp.arange(4.0) * 3)


def test_a_warm_step_called_with_new_shapes_keeps_updating():
    # The same entry serves every shape of an array argument: JAX traces it again inside
    # the warm call, and the lean call made for the earlier trace hands over to the new one.
    total = statevar.Variable(0.0)

    @statevar.jit
    def add(x):
        total.assign_add(x.sum())
        return x * 2

    add(jnp.ones(3))
    add(jnp.ones(3))
    chex.assert_trees_all_equal(add(jnp.ones(5)), jnp.full(5, 2.0))
    add(jnp.ones(5))
    add(jnp.ones(3))
    assert float(total) == 19.0


@pytest.mark.parametrize("warm", [False, True])
def test_a_step_called_inside_jax_jit_keeps_variables_read_earlier_intact(warm):
    v = statevar.Variable(1.0)

    @statevar.jit
    def increment():
        v.assign_add(1.0)

    if warm:
        increment()
    kept = v.value  # an earlier read: the step copies the array instead of donating it
    with pytest.raises(statevar.TraceContextError, match="'increment' inside jax.jit"):
        jax.jit(lambda: increment())()
    assert float(v) == float(kept) == (2.0 if warm else 1.0)
    increment()
    assert float(v) == float(kept) + 1.0


def test_a_warm_step_is_not_run_again_when_another_thread_traces_it_meanwhile(monkeypatch):
    # Another thread's call with new shapes traces again, finding a variable to lift, right
    # after this thread's call released the lock: this call ran once and is done.
    count = statevar.Variable(0.0)
    hidden = statevar.Variable(0.0)
    reachable: dict = {}

    @statevar.jit
    def step(x):
        count.assign_add(1.0)
        if x.shape[0] == 3:
            reachable["hidden"].assign_add(1.0)  # reached only while tracing
        return x

    step(jnp.ones(2))
    step(jnp.ones(2))
    reachable["hidden"] = hidden
    release = statevar._compile.step._release
    other = threading.Thread(target=lambda: step(jnp.ones(3)))

    def release_then_let_the_other_thread_run():
        release()
        if threading.current_thread() is threading.main_thread() and not other.is_alive():
            if other.ident is None:
                other.start()
                other.join()

    monkeypatch.setattr(statevar._compile.step, "_release", release_then_let_the_other_thread_run)
    step(jnp.ones(2))
    monkeypatch.undo()
    assert float(count) == 4.0 and float(hidden) == 1.0


def test_a_freed_compiled_function_frees_its_closure_variables_at_once():
    def make():
        v = statevar.Variable(jnp.ones(1000))

        @statevar.jit
        def add(x):
            v.assign_add(x)

        add(1.0)
        return weakref.ref(v), weakref.ref(add)

    gc.disable()  # by reference counting alone: finding the closure makes no cycle
    try:
        variable, function = make()
        assert function() is None and variable() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("refers_back", ["child holds its parent", "a bound method"])
def test_a_module_that_refers_back_to_itself_is_freed_after_a_compiled_step(
    refers_back, collect_garbage
):
    class Child(statevar.Module):
        def __init__(self):
            self.w = statevar.Variable(jnp.zeros(4))

    class Model(statevar.Module):
        def __init__(self):
            self.child = Child()
            if refers_back == "child holds its parent":
                self.child.parent = self
            else:
                self.activation = self.relu

        def relu(self, x):
            return jax.nn.relu(x)

    @statevar.jit
    def step(model, x):
        model.child.w.assign_add(x)

    model = Model()
    step(model, 1.0)
    step(model, 1.0)  # the fast path, through the structure of the Module
    freed = weakref.ref(model)
    variable = weakref.ref(model.child.w)
    del model
    collect_garbage()  # the Module refers back to itself: only the collector frees that cycle
    assert freed() is None and variable() is None
    assert step._cache.entries == {}


def test_replacing_a_module_variable_drops_the_old_entry_for_calls_with_keywords():
    @statevar.jit
    def bump(model, *, x):
        model.first.w.assign_add(x)

    net = _Net()
    replaced = []
    for _ in range(3):
        bump(net, x=1.0)
        replaced.append(weakref.ref(net.first.w))
        net.first.w = statevar.Variable(10.0)
    bump(net, x=1.0)
    # One entry, for the variables the Module holds now; the replaced ones are freed.
    assert len(bump._cache.entries) == 1 and float(net.first.w) == 11.0
    assert [ref() for ref in replaced] == [None, None, None]


def test_a_module_nested_deeper_than_the_recursion_limit_takes_the_fast_path():
    class Model(statevar.Module):
        def __init__(self):
            self.w = statevar.Variable(1.0)
            nested: list = [self.w]
            for _ in range(sys.getrecursionlimit() + 100):
                nested = [nested]
            self.nested = nested

    @statevar.jit
    def step(model, x):
        model.w.assign_add(x)
        return model.w.value

    model = Model()
    step(model, 1.0)
    assert float(step(model, 1.0)) == 3.0  # the second call checks the structure, unchanged


def test_a_warm_step_runs_no_python_code_while_its_variables_are_donated():
    # Python runs signal handlers (a KeyboardInterrupt) where a function is entered: once
    # warm, a step enters none between donating the variables' arrays and storing the new.
    a = statevar.Variable(jnp.zeros(4), name="a")
    b = statevar.Variable(jnp.zeros(4), name="b")

    @statevar.jit
    def step(x):
        a.assign_add(x.sum())
        b.assign_sub(x.sum())
        return x.sum()

    step(jnp.ones(2))
    entered_while_donated = []

    def profile(frame, event, arg):
        if event == "call" and a._value.is_deleted():
            entered_while_donated.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        for _ in range(3):
            step(jnp.ones(2))
    finally:
        sys.setprofile(None)
    assert entered_while_donated == []
    assert float(a[0]) == 8.0 == -float(b[0])


def test_a_nan_found_under_jax_debug_nans_names_the_variables_that_lost_their_values():
    w = statevar.Variable([1.0, -1.0], name="w")
    steps = statevar.Variable(0, name="steps")

    @statevar.jit
    def step(x):
        steps.assign_add(1)
        w.assign(w * x)
        return jnp.sum(jnp.log(w))

    step(jnp.ones(2))
    # JAX runs the step again to find the NaN, on the buffers the first run was given.
    with (
        jax.debug_nans(True),
        pytest.raises(
            FloatingPointError,
            match=r"'step' gave a NaN or an infinity .* values: '(steps|w)', '(steps|w)'",
        ),
    ):
        step(jnp.ones(2))
    with pytest.raises(ValueError, match=r"Cannot read Variable 'w': .*gave a NaN"):
        w.numpy()
    w.assign([1.0, 2.0])  # as for any lost value, assign restores it
    steps.assign(0)
    chex.assert_trees_all_close(step(jnp.ones(2)), jnp.log(2.0))


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (lambda model: model, r"returned a _Dense; .*: its variables stay where they are"),
        (lambda model: {"a": [1.0, model]}, r"returned a _Dense at \['a'\]\[1\]"),
        (
            lambda model: "text",
            r"returned a str; a compiled function returns arrays and numbers(?!:)",
        ),
    ],
    ids=["a Module", "a Module in a tree", "a str"],
)
def test_a_result_jax_cannot_return_is_refused_naming_the_function(returned, message):
    model = _Dense()

    def step():
        model.kernel.assign_add(1.0)
        return returned(model)

    with pytest.raises(TypeError, match=r"The statevar.jit function 'step' " + message):
        statevar.jit(step)()
    chex.assert_trees_all_equal(model.kernel.value, jnp.ones((2, 1)))  # nothing ran


@pytest.mark.parametrize("transform", ["jit", "grad"])
def test_a_variables_repr_while_tracing_shows_no_numbers_from_before_the_step(transform):
    w = statevar.Variable([1.0, 2.0], name="w")
    shown = []

    def loss():
        shown.append(repr(w))
        return jnp.sum(w * 10.0)

    if transform == "jit":
        statevar.jit(loss)()
    else:
        statevar.grad(loss, [w])()

    assert shown == [
        "<Variable 'w' shape=(2,) dtype=float32, numpy=<traced: print it with jax.debug.print>>"
    ]
    assert (
        repr(w) == "<Variable 'w' shape=(2,) dtype=float32, numpy=array([1., 2.], dtype=float32)>"
    )


def test_a_warm_step_traced_again_for_new_shapes_reads_a_variable_it_did_not_lift():
    class Holder:  # a plain object: statevar cannot see inside before tracing
        pass

    holder = Holder()
    holder.small = statevar.Variable(jnp.ones(3), name="small")
    holder.large = statevar.Variable(jnp.full(4, 2.0), name="large")

    @statevar.jit
    def add(x):
        return x + (holder.large if x.shape[0] == 4 else holder.small)

    add(jnp.ones(3))
    add(jnp.ones(3))  # warm
    for _ in range(2):  # JAX traces the warm call again for the new shape
        chex.assert_trees_all_equal(add(jnp.ones(4)), jnp.full(4, 3.0))


def test_a_debug_callback_in_a_warm_step_may_update_a_variable_the_step_does_not_lift():
    class Holder:
        pass

    holder = Holder()
    holder.seen = statevar.Variable(0.0, name="seen")
    w = statevar.Variable(jnp.zeros(3), name="w")

    def count(total):
        holder.seen.assign_add(float(total))

    @statevar.jit
    def step(x):
        w.assign_add(x)
        jax.debug.callback(count, jnp.sum(x))

    for _ in range(3):
        step(jnp.ones(3))
        jax.effects_barrier()
    assert float(holder.seen) == 9.0
    chex.assert_trees_all_equal(w.value, jnp.full(3, 3.0))


def test_closure_discovery_passes_over_unhashable_values():
    # An array is weakly referenceable but unhashable: asking whether it is a compiled
    # function must answer no, not raise.
    scale = jnp.ones(2)
    w = statevar.Variable(jnp.zeros(2))

    @statevar.jit
    def step():
        w.assign_add(scale)

    step()
    step()

    chex.assert_trees_all_equal(w.value, jnp.full(2, 2.0))
