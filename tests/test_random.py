"""statevar.random.Generator: a stateful random generator whose key lives in a variable."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import statevar
from statevar.random import Generator


def key_data(gen):
    return np.asarray(gen.state.value)


def as_numbers(x):
    """A draw as a NumPy array: the raw data of keys, the values of anything else."""
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return np.asarray(x)


DRAWS = {
    "normal": lambda gen: gen.normal((4,)),
    "uniform": lambda gen: gen.uniform((4,)),
    "bernoulli": lambda gen: gen.bernoulli(0.5, (32,)),
    "key": lambda gen: gen.key(),
    "split": lambda gen: gen.split(3),
}


@pytest.mark.parametrize("draw", DRAWS.values(), ids=DRAWS.keys())
def test_the_stream_is_the_same_eagerly_and_compiled_and_new_at_each_step(draw):
    eager, compiled = Generator(seed=7), Generator(seed=7)
    step = statevar.jit(draw)

    eager_draws = [as_numbers(draw(eager)) for _ in range(3)]
    compiled_draws = [as_numbers(step(compiled)) for _ in range(3)]

    for got, expected in zip(compiled_draws, eager_draws, strict=True):
        np.testing.assert_array_equal(got, expected)
    assert not np.array_equal(eager_draws[0], eager_draws[1])
    assert not np.array_equal(eager_draws[1], eager_draws[2])
    np.testing.assert_array_equal(key_data(compiled), key_data(eager))


def test_a_compiled_step_without_a_key_argument_draws_anew_at_each_call():
    gen = Generator(seed=0)

    @statevar.jit
    def noisy(x):
        return x + gen.normal(x.shape)

    first, second = noisy(jnp.zeros(3)), noisy(jnp.zeros(3))
    assert not np.array_equal(first, second)


def test_the_seed_picks_the_stream():
    np.testing.assert_array_equal(Generator(3).normal((4,)), Generator(3).normal((4,)))
    assert not np.array_equal(Generator(3).normal((4,)), Generator(4).normal((4,)))
    np.testing.assert_array_equal(key_data(Generator(3)), jax.random.key_data(jax.random.key(3)))


def test_each_scan_iteration_draws_anew_and_the_key_advances_after_the_step():
    gen, eager = Generator(seed=1), Generator(seed=1)
    traces = []

    @statevar.jit
    def draws(gen):
        traces.append(None)
        return jax.lax.scan(lambda carry, _: (carry, gen.normal((2,))), None, length=3)[1]

    first, second = draws(gen), draws(gen)

    expected = np.stack([eager.normal((2,)) for _ in range(6)])
    np.testing.assert_array_equal(np.concatenate([first, second]), expected)
    assert len({tuple(row) for row in expected}) == 6
    np.testing.assert_array_equal(key_data(gen), key_data(eager))
    assert len(traces) == 1  # the key goes into a ref before it is read: one trace


def test_a_cond_advances_the_key_only_in_the_taken_branch():
    gen, eager = Generator(seed=2), Generator(seed=2)

    @statevar.jit
    def maybe_draw(flag):
        return jax.lax.cond(flag, lambda: gen.uniform((2,)), lambda: jnp.zeros(2))

    before = key_data(gen)
    np.testing.assert_array_equal(maybe_draw(False), np.zeros(2))
    np.testing.assert_array_equal(key_data(gen), before)

    np.testing.assert_array_equal(maybe_draw(True), eager.uniform((2,)))
    np.testing.assert_array_equal(key_data(gen), key_data(eager))


def test_split_gives_one_key_per_element_under_vmap_eagerly_and_compiled():
    gen, eager = Generator(seed=3), Generator(seed=3)

    def per_element(keys, xs):
        return jax.vmap(lambda key, x: x + jax.random.normal(key))(keys, xs)

    @statevar.jit
    def compiled(xs):
        return per_element(gen.split(xs.shape[0]), xs)

    expected = per_element(eager.split(4), jnp.zeros(4))
    got = compiled(jnp.zeros(4))

    np.testing.assert_array_equal(got, expected)
    assert len(set(np.asarray(got).tolist())) == 4
    np.testing.assert_array_equal(key_data(gen), key_data(eager))
    assert gen.split(0).shape == (0,)
    assert not np.array_equal(key_data(gen), key_data(eager))  # split(0) advances too


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_draw_inside_vmap_raises_and_leaves_the_key(compiled):
    gen = Generator(seed=4)

    def per_element(xs):
        return jax.vmap(lambda x: x + gen.normal())(xs)

    before = key_data(gen)
    with pytest.raises(
        statevar.TraceContextError,
        match=r"(?s)Cannot draw from statevar.random.Generator 'state' here.*inside jax.vmap"
        r".*\.split\(n\), one per element for jax.vmap",
    ):
        (statevar.jit(per_element) if compiled else per_element)(jnp.zeros(3))
    np.testing.assert_array_equal(key_data(gen), before)


def test_a_draw_under_plain_jax_jit_raises_with_the_way_out():
    gen = Generator(seed=4)
    before = key_data(gen)

    with pytest.raises(
        statevar.TraceContextError, match=r"(?s)inside jax.jit.*take keys outside with \.key\(\)"
    ):
        jax.jit(lambda: gen.normal())()
    np.testing.assert_array_equal(key_data(gen), before)


def test_a_generator_checkpointed_mid_stream_resumes_identically(tmp_path):
    gen = Generator(seed=5)
    gen.normal((2,))
    gen.key()
    statevar.save(tmp_path / "rng", {"rng": gen})
    expected = [gen.normal((3,)), gen.bernoulli(0.3, (8,)), gen.uniform((2,))]

    resumed = Generator(seed=99)
    restored = statevar.restore(tmp_path / "rng", {"rng": resumed})

    assert restored.restored == ["rng/state"]
    got = [resumed.normal((3,)), resumed.bernoulli(0.3, (8,)), resumed.uniform((2,))]
    for value, want in zip(got, expected, strict=True):
        np.testing.assert_array_equal(value, want)


class Dropout(statevar.Module):
    """A dense layer followed by dropout, drawing its mask from the model's generator."""

    def __init__(self, key, rate):
        self.kernel = statevar.Variable(jax.random.normal(key, (4, 4)))
        self.rng = Generator(seed=0)
        self.rate = rate

    def __call__(self, x, training):
        x = x @ self.kernel
        if not training:
            return x
        keep = self.rng.bernoulli(1.0 - self.rate, x.shape)
        return jnp.where(keep, x / (1.0 - self.rate), 0.0)


def test_a_module_holding_a_generator_trains_and_saves_its_key(tmp_path):
    model = Dropout(jax.random.key(0), rate=0.5)
    optimizer = statevar.Optimizer(optax.sgd(0.1), model)
    assert list(model.named_variables()) == ["kernel", "rng/state"]
    assert [v.name for v in model.trainable_variables] == ["kernel"]
    assert [v.name for v in optimizer.variables] == ["kernel"]

    def loss(x):
        return jnp.sum(model(x, training=True) ** 2)

    @statevar.jit
    def train_step(x):
        value, grads = statevar.value_and_grad(loss, model)(x)
        optimizer.apply(grads)
        return value

    eager = Dropout(jax.random.key(0), rate=0.5)
    eager_grads = statevar.grad(lambda x: jnp.sum(eager(x, training=True) ** 2), eager)(
        jnp.ones((2, 4))
    )
    assert eager_grads["rng/state"] is None
    kernel = model.kernel.numpy()
    first = train_step(jnp.ones((2, 4)))
    expected = kernel - 0.1 * np.asarray(eager_grads["kernel"])
    np.testing.assert_allclose(model.kernel.numpy(), expected, rtol=1e-6)
    np.testing.assert_array_equal(key_data(model.rng), key_data(eager.rng))
    second = train_step(jnp.ones((2, 4)))
    assert first != second

    statevar.save(tmp_path / "model", model)
    fresh = Dropout(jax.random.key(1), rate=0.5)
    statevar.restore(tmp_path / "model", fresh)
    np.testing.assert_array_equal(key_data(fresh.rng), key_data(model.rng))


def test_a_generator_shows_in_summaries_and_reprs(capsys):
    model = Dropout(jax.random.key(0), rate=0.5)
    model.summary()
    out = capsys.readouterr().out
    assert "rng          Generator" in out
    assert "  rng/state  (2,)       uint32   no" in out
    assert repr(model.rng) == "Generator(state=Variable(uint32[2], trainable=False))"


def test_name_names_the_key_variable():
    gen = Generator(seed=0, name="dropout_rng")
    assert gen.state.name == "dropout_rng"
    assert not gen.state.trainable and gen.state.dtype == jnp.uint32


def test_the_checkpoint_case_raises_with_the_way_out_and_the_way_out_works():
    # Dropout in a rematerialized layer: the checkpointed function runs again for the
    # gradient, so a draw there would advance the key twice.
    gen = Generator(seed=6)
    w = statevar.Variable(jnp.ones(8), name="w")

    def drop(h, key=None):
        keep = (
            gen.bernoulli(0.5, h.shape) if key is None else jax.random.bernoulli(key, 0.5, h.shape)
        )
        return jnp.where(keep, 2.0 * h, 0.0)

    @statevar.jit
    def drawn_inside(x):
        return statevar.grad(lambda: jax.checkpoint(drop)(x * w).sum(), w)()

    before = key_data(gen)
    with pytest.raises(
        statevar.TraceContextError,
        match=r"(?s)Cannot draw from statevar.random.Generator 'state' here.*inside "
        r"jax.checkpoint while differentiating.*take keys outside with \.key\(\).*jax.random",
    ):
        drawn_inside(jnp.ones(8))
    np.testing.assert_array_equal(key_data(gen), before)

    @statevar.jit
    def key_drawn_outside(x):
        key = gen.key()
        return statevar.grad(lambda: jax.checkpoint(drop)(x * w, key).sum(), w)()

    grads = np.asarray(key_drawn_outside(jnp.ones(8)))
    assert set(grads.tolist()) == {0.0, 2.0}
    assert not np.array_equal(key_data(gen), before)


def test_a_draw_inside_jax_checkpoint_without_differentiating_advances_the_key():
    gen, eager = Generator(seed=6), Generator(seed=6)

    @statevar.jit
    def rematerialized(x):
        return jax.checkpoint(lambda h: h + gen.normal(h.shape))(x)

    np.testing.assert_array_equal(rematerialized(jnp.zeros(2)), eager.normal((2,)))
    np.testing.assert_array_equal(key_data(gen), key_data(eager))


@pytest.mark.parametrize(
    ("draw", "shape", "dtype"),
    [
        (lambda g: g.normal(), (), jnp.float32),
        (lambda g: g.normal(3), (3,), jnp.float32),
        (lambda g: g.normal((2, 3), jnp.bfloat16), (2, 3), jnp.bfloat16),
        (lambda g: g.normal([2], dtype=jnp.complex64), (2,), jnp.complex64),
        (lambda g: g.normal((np.int64(2), 0)), (2, 0), jnp.float32),
        (lambda g: g.uniform((4,), jnp.float16), (4,), jnp.float16),
        (lambda g: g.bernoulli(), (), jnp.bool_),
        (lambda g: g.bernoulli(jnp.full((2, 3), 0.5)), (2, 3), jnp.bool_),
        (lambda g: g.bernoulli(1, (5,)), (5,), jnp.bool_),
        (lambda g: g.key(), (), None),
        (lambda g: g.split(np.int32(2)), (2,), None),
    ],
)
def test_shapes_and_dtypes(draw, shape, dtype):
    value = draw(Generator(seed=0))
    assert value.shape == shape
    if dtype is None:
        assert jnp.issubdtype(value.dtype, jax.dtypes.prng_key)
    else:
        assert value.dtype == dtype


def test_uniform_bounds_and_bernoulli_probability():
    gen = Generator(seed=8)
    values = np.asarray(gen.uniform((1000,), minval=2.0, maxval=3.0))
    assert values.min() >= 2.0 and values.max() < 3.0
    assert not gen.bernoulli(0.0, (100,)).any()
    assert gen.bernoulli(1.0, (100,)).all()
    # Where p is traced it is not checked, and works.
    assert statevar.jit(lambda p: gen.bernoulli(p, (100,)))(1.0).all()


@pytest.mark.parametrize(
    ("seed", "error", "message"),
    [
        (-1, ValueError, r"non-negative integer below 2\*\*32, got -1"),
        (2**32, ValueError, "got 4294967296"),
        (1.5, TypeError, "to be an integer or a typed key, got float 1.5"),
        (True, TypeError, "got bool True"),
        ("0", TypeError, "got str '0'"),
    ],
)
def test_a_bad_seed_is_refused(seed, error, message):
    with pytest.raises(error, match=f"Expected the seed of a statevar.random.Generator.*{message}"):
        Generator(seed)


def test_a_typed_key_seeds_the_stream_with_its_implementation():
    np.testing.assert_array_equal(
        Generator(jax.random.key(3)).normal((4,)), Generator(3).normal((4,))
    )
    rbg = Generator(jax.random.key(3, impl="rbg"))
    assert rbg.state.shape == (4,) and rbg.state.dtype == jnp.uint32
    first, second = rbg.key(), rbg.key()
    assert str(jax.random.key_impl(first)) == "rbg"
    assert not np.array_equal(jax.random.key_data(first), jax.random.key_data(second))
    assert rbg.normal((2,)).shape == (2,)


@pytest.mark.parametrize(
    ("seed", "error", "message"),
    [
        (jax.random.split(jax.random.key(0), 2), ValueError, r"one key, got keys of shape \(2,\)"),
        (
            jax.random.key_data(jax.random.key(0)),
            TypeError,
            r"got an array of dtype uint32 and shape \(2,\): for raw key data, pass "
            r"jax.random.wrap_key_data\(data\)",
        ),
        (np.zeros(2), TypeError, r"got an array of dtype float64 and shape \(2,\)$"),
    ],
    ids=["two keys", "key data", "floats"],
)
def test_a_bad_key_seed_is_refused(seed, error, message):
    with pytest.raises(error, match=message):
        Generator(seed)


BAD_CALLS = [
    (lambda g: g.normal((2, -1)), ValueError, r"'state'.normal to have non-negative .* \(2, -1\)"),
    (lambda g: g.uniform((2, 1.5)), TypeError, r"'state'.uniform to be a sequence of .* 1.5"),
    (lambda g: g.normal("ab"), TypeError, r"'state'.normal to be a sequence of integers, got 'ab'"),
    (lambda g: g.bernoulli(0.5, (True,)), TypeError, r"'state'.bernoulli to be a sequence"),
    (
        lambda g: g.normal((2,), jnp.int32),
        TypeError,
        r"floating or complex dtype .*normal, got int32",
    ),
    (lambda g: g.uniform((2,), jnp.complex64), TypeError, r"a floating dtype for .*uniform"),
    (lambda g: g.normal((2,), "no such dtype"), TypeError, r"got 'no such dtype'"),
    (lambda g: g.bernoulli(1.5), ValueError, r"p given to .*bernoulli.* between 0 and 1, got 1.5"),
    (lambda g: g.bernoulli(-0.1), ValueError, r"between 0 and 1, got -0.1"),
    (lambda g: g.bernoulli(jnp.array([0.5, jnp.nan])), ValueError, r"got \[0.5 nan\]"),
    (lambda g: g.bernoulli(jnp.full(9, 2.0)), ValueError, "got values outside it"),
    (lambda g: g.bernoulli(True), TypeError, r"a number or a floating array, got dtype bool"),
    (lambda g: g.bernoulli(jnp.ones(2, jnp.int32)), TypeError, r"got dtype int32"),
    (lambda g: g.bernoulli("half"), TypeError, r"a number or a floating array, got str"),
    (lambda g: g.split(-1), ValueError, r"'state'.split to be given a non-negative .* got -1"),
    (lambda g: g.split(2.0), TypeError, r"'state'.split to be given an integer .* float 2.0"),
    (lambda g: g.split(True), TypeError, r"got bool True"),
]


@pytest.mark.parametrize(("call", "error", "message"), BAD_CALLS)
def test_bad_arguments_are_refused_and_leave_the_key(call, error, message):
    gen = Generator(seed=0)
    before = key_data(gen)
    with pytest.raises(error, match=message):
        call(gen)
    np.testing.assert_array_equal(key_data(gen), before)


def test_a_draw_jax_refuses_leaves_the_key():
    gen = Generator(seed=0)
    before = key_data(gen)
    with pytest.raises(ValueError, match="Incompatible shapes for broadcasting"):
        gen.bernoulli(jnp.full(3, 0.5), (2,))
    np.testing.assert_array_equal(key_data(gen), before)


def test_a_generator_created_in_a_compiled_steps_first_call_draws_as_one_made_outside():
    made = {}

    @statevar.jit
    def draw():
        if not made:
            made["gen"] = Generator(seed=3)
        return made["gen"].normal((2,))

    reference = Generator(seed=3)
    for _ in range(3):
        np.testing.assert_array_equal(draw(), reference.normal((2,)))
    np.testing.assert_array_equal(key_data(made["gen"]), key_data(reference))


def test_a_generator_created_where_it_cannot_be_is_named_as_the_generator():
    w = statevar.Variable(1.0, name="w")
    with pytest.raises(
        statevar.TraceContextError,
        match=r"Cannot create a statevar.random.Generator inside statevar.grad: ",
    ):
        statevar.grad(lambda: Generator(seed=0).normal(()) * w, w)()
    with pytest.raises(
        statevar.TraceContextError,
        match=r"Cannot create a statevar.random.Generator \(its Variable 'noise'\) inside "
        r"the statevar.jit function '<lambda>' after its first trace",
    ):
        statevar.jit(lambda: Generator(seed=0, name="noise").normal(()))()
    with pytest.raises(
        statevar.TraceContextError,
        match=r"Cannot create a statevar.random.Generator from a traced value inside a JAX",
    ):
        jax.jit(lambda: Generator(seed=0).normal(()))()


def test_threads_drawing_at_once_never_share_a_key():
    gen, sequential = Generator(seed=9), Generator(seed=9)
    drawn: list[list[tuple[int, ...]]] = [[] for _ in range(4)]
    barrier = threading.Barrier(4)

    def draw(out):
        barrier.wait()
        for _ in range(10):
            out.append(tuple(as_numbers(gen.key()).tolist()))

    threads = [threading.Thread(target=draw, args=(out,)) for out in drawn]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    expected = {tuple(as_numbers(sequential.key()).tolist()) for _ in range(40)}
    assert {key for out in drawn for key in out} == expected
    np.testing.assert_array_equal(key_data(gen), key_data(sequential))
