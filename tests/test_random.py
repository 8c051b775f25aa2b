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
    "normal with mean and stddev": lambda gen: gen.normal((4,), 1.0, jnp.arange(4.0)),
    "truncated_normal": lambda gen: gen.truncated_normal((4,), 2.0, 0.5),
    "uniform": lambda gen: gen.uniform((4,)),
    "uniform integers": lambda gen: gen.uniform((8,), -5, 5, dtype=jnp.int32),
    "uniform_full_int": lambda gen: gen.uniform_full_int((4,), jnp.int32),
    "binomial": lambda gen: gen.binomial((8,), 20, 0.3),
    "bernoulli": lambda gen: gen.bernoulli((32,), 0.5),
    "key": lambda gen: gen.key(),
    "split_keys": lambda gen: gen.split_keys(3),
}


@pytest.mark.parametrize("draw", DRAWS.values(), ids=DRAWS.keys())
def test_the_stream_is_the_same_eagerly_and_compiled_and_new_at_each_step(draw):
    eager, compiled = Generator(seed=7), Generator(seed=7)
    step = statevar.jit(draw)

    eager_draws = [as_numbers(draw(eager)) for _ in range(3)]
    compiled_draws = [as_numbers(step(compiled)) for _ in range(3)]

    for got, expected in zip(compiled_draws, eager_draws, strict=True):
        if np.issubdtype(got.dtype, np.floating):
            # The same bits; the arithmetic on them may round apart by an ulp where XLA
            # fuses it with the step (mean + stddev * z, on jax 0.12.1).
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0)
        else:
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


def test_split_keys_gives_one_key_per_element_under_vmap_eagerly_and_compiled():
    gen, eager = Generator(seed=3), Generator(seed=3)

    def per_element(keys, xs):
        return jax.vmap(lambda key, x: x + jax.random.normal(key))(keys, xs)

    @statevar.jit
    def compiled(xs):
        return per_element(gen.split_keys(xs.shape[0]), xs)

    expected = per_element(eager.split_keys(4), jnp.zeros(4))
    got = compiled(jnp.zeros(4))

    np.testing.assert_array_equal(got, expected)
    assert len(set(np.asarray(got).tolist())) == 4
    np.testing.assert_array_equal(key_data(gen), key_data(eager))
    assert gen.split_keys(0).shape == (0,)
    assert not np.array_equal(key_data(gen), key_data(eager))  # split_keys(0) advances too


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_draw_inside_vmap_raises_and_leaves_the_key(compiled):
    gen = Generator(seed=4)

    def per_element(xs):
        return jax.vmap(lambda x: x + gen.normal())(xs)

    before = key_data(gen)
    with pytest.raises(
        statevar.TraceContextError,
        match=r"(?s)Cannot draw from statevar.random.Generator 'state' here.*inside jax.vmap"
        r".*\.split_keys\(n\), one per element for jax.vmap",
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
    expected = [gen.normal((3,)), gen.bernoulli((8,), 0.3), gen.uniform((2,))]

    resumed = Generator(seed=99)
    restored = statevar.restore(tmp_path / "rng", {"rng": resumed})

    assert restored.restored == ["rng/state"]
    got = [resumed.normal((3,)), resumed.bernoulli((8,), 0.3), resumed.uniform((2,))]
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
        keep = self.rng.bernoulli(x.shape, 1.0 - self.rate)
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
            gen.bernoulli(h.shape, 0.5) if key is None else jax.random.bernoulli(key, 0.5, h.shape)
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
        (lambda g: g.normal((2, 3), dtype=jnp.bfloat16), (2, 3), jnp.bfloat16),
        (lambda g: g.normal((2, 3), 0.0, 1.0, jnp.bfloat16), (2, 3), jnp.bfloat16),
        (lambda g: g.normal([2], dtype=jnp.complex64), (2,), jnp.complex64),
        (lambda g: g.normal((np.int64(2), 0)), (2, 0), jnp.float32),
        (
            lambda g: g.normal((2, 3), mean=np.zeros(3), stddev=jnp.ones((2, 1))),
            (2, 3),
            jnp.float32,
        ),
        (lambda g: g.normal((2,), mean=statevar.Variable([1.0, 2.0])), (2,), jnp.float32),
        (lambda g: g.truncated_normal((3,), dtype=jnp.bfloat16), (3,), jnp.bfloat16),
        (lambda g: g.normal([3], 0.0, 1.0, jnp.float32, name="noise"), (3,), jnp.float32),
        (lambda g: g.truncated_normal(3, name="init"), (3,), jnp.float32),
        (lambda g: g.uniform(3, 0, 4, jnp.int32, "ids"), (3,), jnp.int32),
        (lambda g: g.uniform_full_int(3, jnp.uint8, name="bits"), (3,), jnp.uint8),
        (lambda g: g.binomial(3, 4, 0.5, jnp.int32, name="coin"), (3,), jnp.int32),
        (lambda g: g.uniform((4,), dtype=jnp.float16), (4,), jnp.float16),
        (lambda g: g.uniform((4,), 0, 3, jnp.uint8), (4,), jnp.uint8),
        (lambda g: g.uniform((2,), jnp.zeros(2, jnp.int32), 7, jnp.int32), (2,), jnp.int32),
        (lambda g: g.uniform_full_int((3,)), (3,), jnp.uint32),
        (lambda g: g.uniform_full_int(2, jnp.int16), (2,), jnp.int16),
        (lambda g: g.binomial((3,), 5, 0.5), (3,), jnp.int32),
        (lambda g: g.binomial((2, 3), jnp.full(3, 4.0), 0.5, jnp.float32), (2, 3), jnp.float32),
        (lambda g: g.bernoulli(), (), jnp.bool_),
        (lambda g: g.bernoulli(p=jnp.full((2, 3), 0.5)), (2, 3), jnp.bool_),
        (lambda g: g.bernoulli((5,), 1), (5,), jnp.bool_),
        (lambda g: g.key(), (), None),
        (lambda g: g.split_keys(np.int32(2)), (2,), None),
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
    assert not gen.bernoulli((100,), 0.0).any()
    assert gen.bernoulli((100,), 1.0).all()
    # Where p is traced it is not checked, and works.
    assert statevar.jit(lambda p: gen.bernoulli((100,), p))(1.0).all()


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
            r"got an array of dtype uint32 and shape \(2,\): for raw key data, use "
            r"statevar.random.Generator.from_key\(data\)",
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
    (lambda g: g.normal(None), TypeError, r"'state'.normal to be a sequence of integers, got None"),
    (
        lambda g: g.truncated_normal(jnp.array([2, 3])),
        TypeError,
        r"'state'.truncated_normal to be a sequence of integers, got an array of dtype int32",
    ),
    (lambda g: g.bernoulli((True,)), TypeError, r"'state'.bernoulli to be a sequence"),
    (
        lambda g: g.bernoulli(0.5, (2,)),
        TypeError,
        r"'state'.bernoulli to be a sequence of integers, got 0.5: the shape comes first, as "
        r"in every draw \(bernoulli\(shape, p\)\)",
    ),
    (
        lambda g: g.normal((2,), dtype=jnp.int32),
        TypeError,
        r"floating or complex dtype .*normal, got int32",
    ),
    (
        lambda g: g.normal((2,), jnp.bfloat16),
        TypeError,
        r"mean given to .*'state'.normal to be a number or a numeric array, got the dtype "
        r".*bfloat16.*: pass the dtype by keyword \(dtype=...\)",
    ),
    (lambda g: g.uniform((2,), dtype=jnp.complex64), TypeError, r"floating or integer dtype"),
    (lambda g: g.uniform((2,), dtype=jnp.bool_), TypeError, r"'state'.uniform, got bool"),
    (lambda g: g.normal((2,), dtype="no such dtype"), TypeError, r"got 'no such dtype'"),
    (lambda g: g.truncated_normal((2,), dtype=jnp.complex64), TypeError, r"a floating dtype"),
    (lambda g: g.uniform_full_int((2,), jnp.float32), TypeError, r"an integer dtype for .*got f"),
    (lambda g: g.binomial((2,), 5, 0.5, jnp.bool_), TypeError, r"integer or floating dtype"),
    (
        lambda g: g.uniform((2,), minval=jnp.zeros(3)),
        statevar.ShapeMismatchError,
        r"minval given to statevar.random.Generator 'state'.uniform to broadcast to the shape "
        r"\(2,\), got shape \(3,\)",
    ),
    (lambda g: g.uniform((2,), 0, [1, 2, 3]), statevar.ShapeMismatchError, r"maxval given"),
    (lambda g: g.normal((2, 3), jnp.zeros(2)), statevar.ShapeMismatchError, r"mean given"),
    (lambda g: g.normal((2,), 0.0, jnp.ones(3)), statevar.ShapeMismatchError, r"stddev given"),
    (lambda g: g.truncated_normal((2,), jnp.ones((2, 2))), statevar.ShapeMismatchError, "mean"),
    (lambda g: g.binomial((2,), jnp.ones(3), 0.5), statevar.ShapeMismatchError, r"counts given"),
    (lambda g: g.binomial((2,), 1, jnp.ones(4) / 2), statevar.ShapeMismatchError, r"probs given"),
    (
        lambda g: g.bernoulli((2,), jnp.full(3, 0.5)),
        statevar.ShapeMismatchError,
        r"probability p given to statevar.random.Generator 'state'.bernoulli to broadcast to the "
        r"shape \(2,\), got shape \(3,\)",
    ),
    (
        lambda g: g.uniform((2,), dtype=jnp.int32),
        ValueError,
        r"a maxval for .*'state'.uniform with the integer dtype int32, got None",
    ),
    (
        lambda g: g.uniform((2,), 0.5, 3, jnp.int32),
        TypeError,
        r"minval given to .*uniform to be an integer or an integer array, got float 0.5",
    ),
    (lambda g: g.uniform((2,), 0, 2.5, jnp.int8), TypeError, r"maxval given .* got float 2.5"),
    (
        lambda g: g.uniform((2,), 3, 3, jnp.int32),
        ValueError,
        r"minval < maxval for .*'state'.uniform .* got minval 3 and maxval 3",
    ),
    (
        lambda g: g.uniform((2,), 0, 2**40, jnp.int32),
        ValueError,
        r"maxval given to .*'state'.uniform to be within the range of int32, "
        r"\[-2147483648, 2147483647\], got 1099511627776",
    ),
    (lambda g: g.uniform((2,), -1, 3, jnp.uint8), ValueError, r"minval .* range of uint8"),
    (lambda g: g.uniform((2,), 0, np.array([9, 300]), jnp.uint8), ValueError, r"got \[  9 300\]"),
    (lambda g: g.normal((2,), name=3), TypeError, r"name given to .*'state'.normal to be a str"),
    (lambda g: g.truncated_normal(2, name=b"x"), TypeError, r"name .*truncated_normal .* bytes"),
    (lambda g: g.uniform(2, name=1.0), TypeError, r"name given to .*'state'.uniform to be a str"),
    (lambda g: g.uniform_full_int(2, name=1), TypeError, r"name .*'state'.uniform_full_int"),
    (lambda g: g.binomial(2, 1, 0.5, name=[]), TypeError, r"name .*'state'.binomial .* list"),
    (lambda g: g.uniform((2,), 1j), TypeError, r"minval .* a real number or a real array"),
    (lambda g: g.uniform((2,), maxval="1"), TypeError, r"maxval .* real array, got str"),
    (lambda g: g.normal((2,), stddev=True), TypeError, r"stddev .* got bool True"),
    (lambda g: g.normal((2,), mean=None), TypeError, r"mean .* numeric array, got NoneType"),
    (lambda g: g.truncated_normal((2,), 1j), TypeError, r"mean .* a real number"),
    (lambda g: g.binomial((2,), -1, 0.5), ValueError, r"counts given .* at least 0, got -1"),
    (lambda g: g.binomial((2,), 3, 1.5), ValueError, r"probs given .* between 0 and 1, got 1.5"),
    (lambda g: g.binomial((2,), "3", 0.5), TypeError, r"counts given .* got str"),
    (
        lambda g: g.bernoulli(p=1.5),
        ValueError,
        r"p given to .*bernoulli.* between 0 and 1, got 1.5",
    ),
    (lambda g: g.bernoulli(p=-0.1), ValueError, r"between 0 and 1, got -0.1"),
    (lambda g: g.bernoulli(p=jnp.array([0.5, jnp.nan])), ValueError, r"got \[0.5 nan\]"),
    (lambda g: g.bernoulli(p=jnp.full(9, 2.0)), ValueError, "got values outside it"),
    (lambda g: g.bernoulli(p=True), TypeError, r"a number or a floating array, got bool True"),
    (lambda g: g.bernoulli(p=jnp.ones(2, jnp.int32)), TypeError, r"got an array of dtype int32"),
    (lambda g: g.bernoulli(p="half"), TypeError, r"a number or a floating array, got str"),
    (lambda g: g.split_keys(-1), ValueError, r"'state'.split_keys to be given a non-negative"),
    (lambda g: g.split_keys(2.0), TypeError, r"'state'.split_keys to be given an integer .* 2.0"),
    (lambda g: g.split_keys(True), TypeError, r"got bool True"),
    (lambda g: g.split(-2), ValueError, r"'state'.split to be given a non-negative .* got -2"),
    (lambda g: g.split(jnp.array(2)), TypeError, r"'state'.split to be given an integer number"),
    (
        lambda g: g.skip(-1),
        ValueError,
        r"'state'.skip to be given a non-negative .*2\*\*31, got -1",
    ),
    (lambda g: g.skip(2**31), ValueError, r"below 2\*\*31, got 2147483648"),
    (lambda g: g.skip(1.0), TypeError, r"'state'.skip to be given an integer number of draws"),
    (lambda g: g.skip(jnp.ones(2, jnp.int32)), TypeError, r"got an array of dtype int32 and"),
    (lambda g: g.skip(jnp.array(-3)), ValueError, r"non-negative .* got -3"),
    (lambda g: g.reset_from_seed(-1), ValueError, r"seed of .*'state'.reset_from_seed .* got -1"),
    (lambda g: g.reset_from_seed(2.0), TypeError, r"'state'.reset_from_seed to be an integer"),
    (lambda g: g.reset_from_seed(jax.random.key(0)), TypeError, r"typed key: use .reset\(key\)"),
    (
        lambda g: g.reset(7),
        TypeError,
        r"'state'.reset to be given a typed key or its raw uint32 .* int 7: for a seed, use "
        r"reset_from_seed\(seed\)",
    ),
    (lambda g: g.reset(np.zeros(2, np.int32)), TypeError, r"got an array of dtype int32"),
    (lambda g: g.reset(np.zeros(4, np.uint32)), ValueError, r"data of shape \(2,\) .* \(4,\)"),
    (
        lambda g: g.reset(jax.random.key(0, impl="rbg")),
        ValueError,
        r"a key of implementation 'threefry2x32' for .*'state'.reset, got a key of implementation "
        "'rbg'",
    ),
    (lambda g: g.reset(jax.random.split(jax.random.key(0))), ValueError, r"one key, got keys"),
]


@pytest.mark.parametrize(("call", "error", "message"), BAD_CALLS)
def test_bad_arguments_are_refused_and_leave_the_key(call, error, message):
    gen = Generator(seed=0)
    before = key_data(gen)
    with pytest.raises(error, match=message):
        call(gen)
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


def draws(gen, n=3):
    return [np.asarray(gen.normal((4,))) for _ in range(n)]


def test_the_constructors_give_the_streams_tensorflow_names():
    np.testing.assert_array_equal(draws(Generator.from_seed(3)), draws(Generator(seed=3)))
    key = jax.random.split(jax.random.key(4))[1]
    np.testing.assert_array_equal(draws(Generator.from_key(key)), draws(Generator(key)))
    raw = jax.random.key_data(key)
    np.testing.assert_array_equal(draws(Generator.from_key(raw)), draws(Generator(key)))
    np.testing.assert_array_equal(draws(Generator.from_key(np.asarray(raw))), draws(Generator(key)))

    rbg = Generator.from_seed(3, "rbg", name="rbg_state")
    assert rbg.impl == "rbg" and rbg.state.shape == (4,) and rbg.state.name == "rbg_state"
    np.testing.assert_array_equal(draws(rbg), draws(Generator(jax.random.key(3, impl="rbg"))))
    rbg_data = jax.random.key_data(jax.random.key(5, impl="rbg"))
    from_data = Generator.from_key(rbg_data, impl="rbg")
    np.testing.assert_array_equal(draws(from_data), draws(Generator(jax.random.key(5, impl="rbg"))))
    assert Generator.from_seed(np.uint32(3)).impl == "threefry2x32"
    np.testing.assert_array_equal(draws(Generator(jnp.array(3))), draws(Generator(3)))


def test_from_non_deterministic_state_seeds_from_the_operating_system():
    first, second = (
        Generator.from_non_deterministic_state(),
        Generator.from_non_deterministic_state(),
    )
    assert first.state.dtype == jnp.uint32 and first.state.shape == (2,)
    assert not np.array_equal(key_data(first), key_data(second))
    assert not np.array_equal(first.normal((4,)), second.normal((4,)))
    rbg = Generator.from_non_deterministic_state("rbg", name="os")
    assert rbg.impl == "rbg" and rbg.state.shape == (4,) and rbg.state.name == "os"


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: Generator.from_seed(-1), ValueError, r"seed of .*from_seed .* got -1"),
        (lambda: Generator.from_seed(jax.random.key(0)), TypeError, r"use .*from_key\(key\)"),
        (lambda: Generator.from_seed(0, "nope"), ValueError, r"from_seed: .*\"nope\""),
        (lambda: Generator.from_seed(0, 3), TypeError, r"impl given to .*from_seed to be the"),
        (
            lambda: Generator.from_key(3),
            TypeError,
            r"from_key to be given a typed key .* got int 3: for a seed, use from_seed\(seed\)",
        ),
        (
            lambda: Generator.from_key(np.zeros(2, np.int32)),
            TypeError,
            r"from_key to be given a typed key or its raw uint32 data .* dtype int32",
        ),
        (
            lambda: Generator.from_key(np.zeros(3, np.uint32)),
            ValueError,
            r"from_key to be given key data of shape \(2,\) \(implementation 'threefry2x32'\), "
            r"got shape \(3,\)",
        ),
        (
            lambda: Generator.from_key(jax.random.key(0), impl="rbg"),
            ValueError,
            r"implementation 'rbg' for .*from_key, got a key of implementation 'threefry2x32'",
        ),
        (
            lambda: Generator.from_key(jax.random.split(jax.random.key(0))),
            ValueError,
            r"one key, got keys of shape \(2,\)",
        ),
        (
            lambda: Generator.from_non_deterministic_state("nope"),
            ValueError,
            r"from_non_deterministic_state: unrecognized PRNG implementation",
        ),
    ],
)
def test_bad_constructor_arguments_are_named(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_reset_reset_from_seed_and_skip_move_the_stream_in_place():
    gen = Generator(seed=0)
    state = gen.state
    saved = gen.state.value
    first = draws(gen)
    gen.reset(saved)
    np.testing.assert_array_equal(draws(gen), first)
    np.testing.assert_array_equal(np.asarray(saved), key_data(Generator(seed=0)))  # still valid
    gen.reset(jax.random.key(9))
    np.testing.assert_array_equal(draws(gen), draws(Generator(9)))
    gen.reset_from_seed(11)
    np.testing.assert_array_equal(draws(gen), draws(Generator(11)))
    source = Generator(13)
    gen.reset(source.state)
    np.testing.assert_array_equal(draws(gen), draws(source))
    np.testing.assert_array_equal(draws(Generator.from_key(gen.state)), draws(gen))
    gen.reset_from_seed(jnp.array(11))
    np.testing.assert_array_equal(draws(gen), draws(Generator(11)))

    other = Generator(seed=12)
    other.normal((2,))
    other.key()
    other.uniform((3,))
    gen.reset_from_seed(12)
    gen.skip(3)
    np.testing.assert_array_equal(draws(gen), draws(other))
    gen.skip(0)
    gen.skip(np.int64(2))
    other.key(), other.key()
    np.testing.assert_array_equal(draws(gen), draws(other))
    assert gen.state is state  # in place: the same variable throughout


def test_reset_from_seed_keeps_the_generators_implementation():
    rbg = Generator(jax.random.key(0, impl="rbg"))
    rbg.reset_from_seed(5)
    np.testing.assert_array_equal(draws(rbg), draws(Generator(jax.random.key(5, impl="rbg"))))


def test_a_compiled_step_holding_the_generator_sees_reset_reset_from_seed_and_skip():
    gen = Generator(seed=0)
    traces = []

    @statevar.jit
    def step(x):
        traces.append(None)
        return x + gen.normal((4,))

    zeros = jnp.zeros(4)
    saved = gen.state.value
    first = step(zeros)
    gen.reset(saved)
    np.testing.assert_array_equal(step(zeros), first)
    gen.reset_from_seed(5)
    np.testing.assert_array_equal(step(zeros), Generator(5).normal((4,)))
    gen.reset_from_seed(5)
    gen.skip(2)
    expected = Generator(5)
    expected.skip(2)
    np.testing.assert_array_equal(step(zeros), expected.normal((4,)))
    assert len(traces) == 1


def test_reset_and_skip_inside_a_compiled_step_take_traced_arguments():
    gen = Generator(seed=0)

    @statevar.jit
    def restart(seed, n):
        gen.reset_from_seed(seed)
        gen.skip(n)
        return gen.normal((4,))

    expected = Generator(7)
    expected.skip(3)
    np.testing.assert_array_equal(restart(jnp.array(7), jnp.array(3)), expected.normal((4,)))
    np.testing.assert_array_equal(key_data(gen), key_data(expected))

    @statevar.jit
    def back(data):
        gen.reset(data)
        return gen.normal((4,))

    np.testing.assert_array_equal(back(key_data(Generator(2))), Generator(2).normal((4,)))


def test_reset_under_plain_jax_jit_is_refused_with_the_way_out():
    gen = Generator(seed=0)
    before = key_data(gen)
    with pytest.raises(
        statevar.TraceContextError,
        match=r"(?s)Cannot reset statevar.random.Generator 'state' here, since a reset "
        r"assigns its key.*inside jax.jit.*Reset it outside, or in statevar.jit.",
    ):
        jax.jit(lambda: gen.reset_from_seed(1))()
    with pytest.raises(
        statevar.TraceContextError, match=r"Cannot skip .* since a skip assigns.*Skip it outside"
    ):
        jax.jit(lambda: gen.skip(1))()
    np.testing.assert_array_equal(key_data(gen), before)


def test_split_returns_generators_with_streams_of_their_own():
    gen, reference = Generator(seed=3), Generator(seed=3)
    children = gen.split(3)
    keys = reference.split_keys(3)

    assert [type(child) for child in children] == [Generator] * 3
    np.testing.assert_array_equal(key_data(gen), key_data(reference))  # advanced once
    for child, key in zip(children, keys, strict=True):
        np.testing.assert_array_equal(draws(child), draws(Generator(key)))
    streams = [tuple(np.concatenate(draws(g)).tolist()) for g in (*children, gen)]
    assert len(set(streams)) == 4
    assert gen.split() and len(gen.split()) == 1
    assert gen.split(0) == []
    assert [child.impl for child in Generator(jax.random.key(0, impl="rbg")).split(2)] == [
        "rbg"
    ] * 2


def test_split_places_the_new_generators_as_new_variables_are():
    gen = Generator(seed=3)
    with statevar.device("cpu:2"):
        children = gen.split(2)
    assert [child.state.value.devices() for child in children] == [{jax.devices()[2]}] * 2
    assert gen.state.value.devices() == {jax.devices()[0]}


def test_split_inside_a_compiled_step_is_refused_and_leaves_the_key():
    gen = Generator(seed=3)
    before = key_data(gen)
    with pytest.raises(
        statevar.TraceContextError,
        match=r"Cannot split statevar.random.Generator 'state' inside a compiled step.*"
        r"\.split_keys\(n\)",
    ):
        statevar.jit(lambda: gen.split(2)[0].normal())()
    np.testing.assert_array_equal(key_data(gen), before)


def test_the_draws_follow_tensorflows_definitions():
    gen = Generator(seed=10)
    normal = np.asarray(gen.normal((20000,), mean=3.0, stddev=2.0))
    assert abs(normal.mean() - 3.0) < 0.05 and abs(normal.std() - 2.0) < 0.05
    columns = np.asarray(gen.normal((5000, 2), mean=jnp.array([-10.0, 10.0]), stddev=0.1))
    np.testing.assert_allclose(columns.mean(axis=0), [-10.0, 10.0], atol=0.01)

    truncated = np.asarray(gen.truncated_normal((20000,), mean=1.0, stddev=0.5))
    assert truncated.min() >= 0.0 and truncated.max() <= 2.0
    assert truncated.min() < 0.05 and truncated.max() > 1.95

    floats = np.asarray(gen.uniform((1000,)))
    assert floats.min() >= 0.0 and floats.max() < 1.0  # maxval None means 1
    integers = np.asarray(gen.uniform((1000,), minval=-3, maxval=4, dtype=jnp.int32))
    assert integers.dtype == np.int32 and set(integers.tolist()) == set(range(-3, 4))

    full = np.asarray(gen.uniform_full_int((4000,), jnp.int8))
    assert full.min() == -128 and full.max() == 127
    unsigned = np.asarray(gen.uniform_full_int((4000,), jnp.uint8))
    assert unsigned.min() == 0 and unsigned.max() == 255

    successes = np.asarray(gen.binomial((20000,), counts=10, probs=0.3))
    assert successes.dtype == np.int32 and successes.min() >= 0 and successes.max() <= 10
    assert abs(successes.mean() - 3.0) < 0.05
    assert not gen.binomial((10,), counts=jnp.zeros(10), probs=0.5).any()
    # Python integers beyond int32 are taken as floats where the draw is floating.
    assert gen.normal((2,), mean=2**70).dtype == jnp.float32
    assert (gen.binomial((2,), counts=2**40, probs=0.0) == 0).all()


def test_the_global_generator_is_made_once_from_the_os_unless_set(monkeypatch):
    monkeypatch.setattr(statevar.random, "_global", None)
    first = statevar.random.get_global_generator()
    assert statevar.random.get_global_generator() is first
    assert isinstance(first, Generator)
    monkeypatch.setattr(statevar.random, "_global", None)
    assert not np.array_equal(key_data(statevar.random.get_global_generator()), key_data(first))

    mine = Generator(seed=42)
    statevar.random.set_global_generator(mine)
    assert statevar.random.get_global_generator() is mine
    np.testing.assert_array_equal(
        statevar.random.get_global_generator().normal((3,)), Generator(42).normal((3,))
    )
    with pytest.raises(
        TypeError,
        match=r"set_global_generator to be given a statevar.random.Generator, got int 42",
    ):
        statevar.random.set_global_generator(42)
    assert statevar.random.get_global_generator() is mine


def test_a_restored_generator_continues_its_stream_after_split_reset_and_skip(tmp_path):
    gen = Generator(seed=5)
    gen.split(2)
    gen.reset_from_seed(6)
    gen.skip(4)
    gen.binomial((3,), 5, 0.5)
    statevar.save(tmp_path / "rng", {"rng": gen})
    expected = [gen.truncated_normal((3,)), gen.uniform((3,), 0, 9, jnp.int32)]

    resumed = Generator.from_non_deterministic_state()
    statevar.restore(tmp_path / "rng", {"rng": resumed})
    got = [resumed.truncated_normal((3,)), resumed.uniform((3,), 0, 9, jnp.int32)]
    for value, want in zip(got, expected, strict=True):
        np.testing.assert_array_equal(value, want)
