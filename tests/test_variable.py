"""Tests of `statevar.Variable` as a value: creation, dtypes, array behaviour, names, repr,
hashing, copying and use inside plain JAX transformations."""

import contextlib
import copy
import operator
import re
from unittest import mock

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import statevar
from statevar._cell import creation as _creation

# ----------------------------------------------------------------------- creation and dtype


@pytest.mark.parametrize(
    ("initial_value", "expected_dtype"),
    [
        (1, jnp.int32),
        (1.0, jnp.float32),
        (True, jnp.bool_),
        (1 + 2j, jnp.complex64),
        ([1, 2], jnp.int32),
        ([1.0, 2.0], jnp.float32),
        ([[True, False]], jnp.bool_),
        (np.float64(1.5), jnp.float32),
        (np.arange(3, dtype=np.int16), jnp.int16),
        (jnp.ones(2, jnp.bfloat16), jnp.bfloat16),
    ],
)
def test_dtype_is_inferred_as_jax_infers_it(initial_value, expected_dtype):
    v = statevar.Variable(initial_value)

    assert v.dtype == expected_dtype
    assert v.dtype == jnp.asarray(initial_value).dtype


@pytest.mark.parametrize(
    ("initial_value", "dtype", "expected"),
    [
        (1, jnp.float32, np.float32(1.0)),
        ([1, 2], "float16", np.array([1.0, 2.0], np.float16)),
        (1.0, jnp.bfloat16, jnp.bfloat16(1.0)),
        (2.0, jnp.complex64, np.complex64(2.0)),
        ([False, True], jnp.bool_, np.array([False, True])),
        (np.array([1, 2], np.int64), jnp.int8, np.array([1, 2], np.int8)),
    ],
)
def test_dtype_argument_overrides_inference(initial_value, dtype, expected):
    v = statevar.Variable(initial_value, dtype=dtype)

    assert v.dtype == jnp.dtype(dtype)
    np.testing.assert_array_equal(np.asarray(v), expected)


@pytest.mark.parametrize(
    ("initial_value", "dtype", "match"),
    [
        (1.5, jnp.int32, r"Variable 'v': a value of dtype float cannot be converted safely"),
        ([1.0, 2.5], jnp.int32, r"floating into integer"),
        ([0, 3], jnp.bool_, r"integer into bool"),
        (1 + 2j, jnp.float32, r"complex into floating"),
        (300, jnp.int8, r"Variable 'v': a value of dtype int \(300\) is out of range for the"),
        ([1, 300], jnp.int8, r"Variable 'v': .*\[  1, 300\].* is out of range for the"),
        (2**40, None, r"Variable 'v': .*\(1099511627776\) is out of range .* dtype int32"),
        (1e300, None, r"Variable 'v': .*float \(1e\+300\) is out of range .* dtype float32"),
        ([1.0, 7e4], jnp.float16, r"Variable 'v': .*\(70000.0\) is out of range .* float16"),
    ],
)
def test_dtype_argument_refuses_lossy_conversions(initial_value, dtype, match):
    with pytest.raises(statevar.DtypeMismatchError, match=match):
        statevar.Variable(initial_value, dtype=dtype, name="v")


def test_floats_that_round_to_the_largest_value_infinities_and_nans_are_kept():
    v = statevar.Variable([65519.0, np.inf, -np.inf, np.nan], dtype=jnp.float16, name="v")
    np.testing.assert_array_equal(v.numpy(), np.array([65504, np.inf, -np.inf, np.nan], np.float16))

    v.assign(np.array([-65519.0, np.inf, 1.0, np.nan]))
    np.testing.assert_array_equal(v.numpy(), np.array([-65504, np.inf, 1, np.nan], np.float16))


def test_python_scalars_give_a_strongly_typed_value():
    v = statevar.Variable(1.0)

    assert not v.value.weak_type
    # A weakly typed float32 would let a float16 operand decide the result dtype.
    assert (v + jnp.float16(1.0)).dtype == jnp.float32


def test_shape_ndim_and_size_describe_the_value():
    v = statevar.Variable(np.zeros((2, 3, 4), np.float32))

    assert v.shape == (2, 3, 4)
    assert v.ndim == 3
    assert v.size == 24
    assert len(v) == 2


def test_creation_from_a_jax_array_copies_it():
    source = jnp.arange(4.0)

    v = statevar.Variable(source)
    v.assign_add(1.0)

    assert v.value.unsafe_buffer_pointer() != source.unsafe_buffer_pointer()
    assert not source.is_deleted()
    chex.assert_trees_all_close(source, jnp.arange(4.0))
    chex.assert_trees_all_close(v.value, jnp.arange(4.0) + 1)


def test_creation_from_a_deleted_array_raises_value_error():
    source = jnp.arange(4.0)
    source.delete()

    with pytest.raises(
        ValueError,
        match=r"Cannot create Variable 'w': the value is a float32\[4\] array that has been",
    ):
        statevar.Variable(source, name="w")


def test_creation_from_a_variable_copies_it():
    original = statevar.Variable([1.0, 2.0])

    duplicate = statevar.Variable(original)
    assert duplicate.value.unsafe_buffer_pointer() != original.value.unsafe_buffer_pointer()

    original.assign([10.0, 20.0])
    chex.assert_trees_all_close(duplicate.value, jnp.array([1.0, 2.0]))
    duplicate.assign_add(1.0)
    chex.assert_trees_all_close(original.value, jnp.array([10.0, 20.0]))
    chex.assert_trees_all_close(duplicate.value, jnp.array([2.0, 3.0]))


def test_creation_from_a_numpy_array_copies_it():
    source = np.arange(3.0, dtype=np.float32)

    v = statevar.Variable(source)
    source[0] = 100.0

    chex.assert_trees_all_close(v.value, jnp.arange(3.0))


def test_a_callable_initial_value_is_called_once_eagerly_as_tf_variable_calls_it():
    rng = np.random.default_rng(0)
    expected = np.random.default_rng(0).normal(size=2).astype(np.float32)

    seeded = statevar.Variable(lambda: rng.normal(size=2))
    concrete = statevar.Variable(lambda: jnp.ones(2) * float(jnp.sqrt(4.0)))

    chex.assert_trees_all_equal(seeded.numpy(), expected)  # the first draw: called once
    chex.assert_trees_all_equal(concrete.numpy(), np.full(2, 2.0, np.float32))


def test_what_an_initial_value_callable_raises_reaches_the_caller_naming_the_variable():
    with pytest.raises(KeyError, match="'k'") as raised:
        statevar.Variable(lambda: {}["k"], name="w")

    assert raised.value.__notes__ == ["(raised by the initial value callable of Variable 'w')"]


@pytest.mark.parametrize(
    ("initial_value", "match"),
    [
        ("abc", r"Cannot create Variable 'bad' from str 'abc'"),
        (None, r"Cannot create Variable 'bad' from NoneType None"),
        (object(), r"Cannot create Variable 'bad' from object"),
        (["abc", "def"], r"Cannot create Variable 'bad' from list"),
        ([[1.0], [1.0, 2.0]], r"Cannot create Variable 'bad' from list .*inhomogeneous"),
    ],
)
def test_non_numeric_initial_value_raises_type_error(initial_value, match):
    with pytest.raises(TypeError, match=match) as info:
        statevar.Variable(initial_value, name="bad")

    assert isinstance(info.value, statevar.DtypeMismatchError)


@pytest.mark.parametrize(
    "initial_value",
    [jax.random.key(0), np.zeros((2,), dtype=jax.dtypes.float0)],
    ids=["prng_key", "float0"],
)
def test_non_numeric_dtype_raises_type_error(initial_value):
    with pytest.raises(
        statevar.DtypeMismatchError,
        match=r"Cannot create Variable 'k' with dtype .*: expected a bool, integer, floating or",
    ):
        statevar.Variable(initial_value, name="k")


def test_a_typed_prng_key_is_refused_with_the_way_to_hold_its_data():
    key = jax.random.key(0)
    with pytest.raises(
        statevar.DtypeMismatchError,
        match=r"key<fry>.*Variable\(jax.random.key_data\(key\)\), and use "
        r"jax.random.wrap_key_data\(variable.value\)",
    ):
        statevar.Variable(key, name="k")

    held = statevar.Variable(jax.random.key_data(key), name="k")
    held.assign(jax.random.key_data(jax.random.split(jax.random.wrap_key_data(held.value))[0]))
    assert jax.random.wrap_key_data(held.value).dtype == key.dtype


@pytest.mark.parametrize("name", [3, b"w", ["w"]])
def test_name_that_is_not_a_string_raises_type_error(name):
    with pytest.raises(TypeError, match=r"Expected the Variable's name to be a str, got"):
        statevar.Variable(1.0, name=name)


# ----------------------------------------------------------------------- works where an array does

_MATRIX = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)

_OPERATIONS = {
    "add": lambda x: x + 1.5,
    "sub": lambda x: x - 1.5,
    "mul": lambda x: x * 3.0,
    "truediv": lambda x: x / 2.0,
    "floordiv": lambda x: x // 2.0,
    "mod": lambda x: x % 3.0,
    "pow": lambda x: x**2,
    "matmul": lambda x: x @ _MATRIX,
    "neg": lambda x: -x,
    "pos": lambda x: +x,
    "abs": lambda x: abs(x - 2.5),
    "radd": lambda x: 1.5 + x,
    "rsub": lambda x: 2 - x,
    "rmul": lambda x: 3.0 * x,
    "rtruediv": lambda x: 2.0 / x,
    "rfloordiv": lambda x: 7.0 // x,
    "rmod": lambda x: 7.0 % x,
    "rpow": lambda x: 2.0**x,
    "rmatmul": lambda x: _MATRIX @ x,
    "eq": lambda x: x == 2.0,
    "ne": lambda x: x != 2.0,
    "lt": lambda x: x < 2.5,
    "le": lambda x: x <= 2.0,
    "gt": lambda x: x > 2.5,
    "ge": lambda x: x >= 2.0,
    "radd_numpy": lambda x: np.ones((2, 2), np.float32) + x,
    "argmax": lambda x: jnp.argmax(x, axis=1),
    "reshape": lambda x: jnp.reshape(x, (1, 4)),
    "jnp_add": lambda x: jnp.add(x, x),
    "jnp_matmul": lambda x: jnp.matmul(x, x),
    "jnp_exp": lambda x: jnp.exp(x),
    "jnp_sum": lambda x: jnp.sum(x, axis=0),
    "getitem": lambda x: x[1, ::-1],
    "jit": lambda x: jax.jit(lambda a: a * 2.0 + 1.0)(x),
}


@pytest.mark.parametrize("operation", _OPERATIONS.values(), ids=_OPERATIONS.keys())
def test_variable_computes_like_the_array_it_holds(operation):
    v = statevar.Variable(_MATRIX)

    result = operation(v)

    assert isinstance(result, jax.Array)
    chex.assert_trees_all_close(result, operation(jnp.asarray(_MATRIX)))


@pytest.mark.parametrize(
    "operation",
    [
        operator.and_,
        operator.or_,
        operator.xor,
        lambda a, b: b & a,
        lambda a, b: b | a,
        lambda a, b: b ^ a,
    ],
    ids=["and", "or", "xor", "rand", "ror", "rxor"],
)
def test_bitwise_operators(operation):
    v = statevar.Variable([1, 2, 6])

    result = operation(v, 2)

    assert isinstance(result, jax.Array)
    np.testing.assert_array_equal(result, operation(np.array([1, 2, 6], np.int32), 2))


def test_binary_operators_between_two_variables():
    a = statevar.Variable([1.0, 2.0])
    b = statevar.Variable([3.0, 5.0])

    chex.assert_trees_all_close(a * b, jnp.array([3.0, 10.0]))
    chex.assert_trees_all_close(b - a, jnp.array([2.0, 3.0]))
    chex.assert_trees_all_close(a @ b, jnp.array(13.0))
    np.testing.assert_array_equal(a < b, [True, True])


def test_an_operand_an_array_does_not_take_gets_its_turn_as_against_an_array():
    v = statevar.Variable(2.5)
    array = jnp.asarray(2.5)

    for other in (None, pytest.approx(2.5), mock.ANY, "text"):
        assert (v == other) == (array == other)
        assert (v != other) == (array != other)
    assert v == pytest.approx(2.5)  # as pytest users write it
    with pytest.raises(TypeError, match=r"unsupported operand type\(s\) for \+"):
        v + ["text"]  # a list no array can hold: refused as against an array
    with pytest.raises(TypeError, match=r"'<' not supported"):
        v < "text"  # noqa: B015


def test_python_lists_and_tuples_are_operands_in_both_orders_as_in_tensorflow():
    """Deliberately unlike a jax.Array, which refuses lists: TensorFlow converts them."""
    w = statevar.Variable([[1.0], [2.0], [3.0]])
    v = statevar.Variable([1.0, 2.0])
    chex.assert_trees_all_close([[1.0, 2.0, 3.0]] @ w, jnp.array([[14.0]]))
    chex.assert_trees_all_close(v @ [[1.0], [1.0]], jnp.array([3.0]))
    chex.assert_trees_all_close(v + [1.0, 1.0], jnp.array([2.0, 3.0]))
    chex.assert_trees_all_close([1.0, 1.0] - v, jnp.array([0.0, -1.0]))
    chex.assert_trees_all_close((2.0, 2.0) * v, jnp.array([2.0, 4.0]))
    chex.assert_trees_all_close(v / (2.0, 4.0), jnp.array([0.5, 0.5]))
    np.testing.assert_array_equal(v == [1.0, 0.0], [True, False])
    np.testing.assert_array_equal(v < (2, 2), [True, False])
    with pytest.raises(TypeError, match=r"unsupported operand type\(s\) for \+"):
        jnp.asarray([1.0, 2.0]) + [1.0, 1.0]  # a jax.Array refuses them

    @statevar.jit
    def step():
        v.assign(v * [2.0, 3.0])
        return [1.0, 1.0] + v

    chex.assert_trees_all_close(step(), jnp.array([3.0, 7.0]))


def test_jax_lax_and_indexing_an_array_by_a_variable_need_its_value():
    """JAX no longer converts an object through ``__jax_array__`` where it takes an array's
    abstract value (the README's known limits): pinned, so that a JAX that does again is
    noticed."""
    step = statevar.Variable(2)
    schedule = jnp.arange(10.0)

    with pytest.raises(ValueError, match=r"__jax_array__\(\) during abstractification"):
        schedule[step]
    with pytest.raises(ValueError, match=r"__jax_array__\(\) during abstractification"):
        jax.lax.exp(statevar.Variable(1.0))
    assert float(schedule[step.value]) == 2.0
    chex.assert_trees_all_close(jax.lax.exp(statevar.Variable(1.0).value), jnp.exp(1.0))
    assert float(jnp.take(schedule, step)) == 2.0  # jnp functions take it directly


def test_jax_nn_functions_built_on_lax_need_the_value_as_the_readme_says():
    """The README's known limits: ``jax.nn.sigmoid`` (``lax.logistic``) refuses a Variable,
    as it refuses flax nnx's, while ``relu``, ``softmax``, ``gelu`` and ``tanh`` take one."""
    from flax import nnx

    v = statevar.Variable([[1.0, -2.0]])
    array = v.value
    for function in (jax.nn.relu, jax.nn.softmax, jax.nn.gelu, jnp.tanh, jax.nn.tanh):
        chex.assert_trees_all_close(function(v), function(array))
    with pytest.raises(ValueError, match=r"__jax_array__\(\) during abstractification"):
        jax.nn.sigmoid(v)
    with pytest.raises(ValueError, match=r"__jax_array__\(\) during abstractification"):
        jax.nn.sigmoid(nnx.Param(array))
    chex.assert_trees_all_close(jax.nn.sigmoid(v.value), jax.nn.sigmoid(array))


def test_operators_on_what_jax_device_get_makes_of_a_variable_follow_jax():
    fetched = jax.device_get(statevar.Variable(jnp.array([1, 2], jnp.int8)))

    added = fetched + 200  # as a jax.Array of int8 does: wraps, where NumPy would raise
    halves = fetched + 1.5

    assert isinstance(added, jax.Array) and added.dtype == jnp.int8
    assert isinstance(halves, jax.Array) and halves.dtype == jnp.float32
    assert (fetched == None) is False  # noqa: E711


def test_invert_of_a_boolean_variable():
    np.testing.assert_array_equal(~statevar.Variable([True, False]), [False, True])


def test_numpy_conversion_gives_the_value():
    v = statevar.Variable(_MATRIX)

    for array in (np.asarray(v), np.array(v), v.numpy()):
        assert isinstance(array, np.ndarray)
        assert array.dtype == np.float32
        np.testing.assert_array_equal(array, _MATRIX)
    assert np.asarray(v, dtype=np.float64).dtype == np.float64


def test_numpy_method_returns_an_independent_copy():
    v = statevar.Variable([1.0, 2.0])

    array = v.numpy()
    array[0] = 50.0

    chex.assert_trees_all_close(v.value, jnp.array([1.0, 2.0]))


@pytest.mark.parametrize(
    ("convert", "expected"),
    [(float, 2.5), (int, 2), (complex, 2.5 + 0j), (bool, True)],
)
def test_scalar_conversions(convert, expected):
    value = 2 if convert is int else 2.5

    assert convert(statevar.Variable(value)) == expected


def test_scalar_variable_works_as_an_index():
    assert [10, 20, 30][statevar.Variable(2)] == 30


@pytest.mark.parametrize(
    ("index", "error", "match"),
    [
        (5, IndexError, r"\[5\]: index 5 is out of bounds for axis 0 with size 3"),
        (np.int64(5), IndexError, r"\[np.int64\(5\)\]: index 5 is out of bounds for axis 0"),
        (-4, IndexError, r"\[-4\]: index -4 is out of bounds for axis 0 with size 3"),
        ((0, 2), IndexError, r"\[\(0, 2\)\]: index 2 is out of bounds for axis 1 with size 2"),
        (np.array([0, 3]), IndexError, r"\[array\(\[0, 3\]\)\]: index 3 is out of bounds"),
        (
            slice(None, None, 0),
            ValueError,
            r"\[slice\(None, None, 0\)\]: slice step cannot be zero",
        ),
    ],
)
def test_reading_out_of_range_is_refused_as_writing_is(index, error, match):
    # A jax.Array clamps (table[5] would read row 2); tf.Variable and NumPy refuse.
    table = statevar.Variable(np.arange(6.0).reshape(3, 2), name="table")
    with pytest.raises(
        error,
        match=r"Cannot read Variable 'table'" + match + r".*\(the variable's shape is \(3, 2\)\)",
    ):
        table[index]
    with pytest.raises(error, match=r"Cannot set Variable 'table'" + match):
        table[index] = 0.0
    chex.assert_trees_all_equal(table[-3], jnp.array([0.0, 1.0]))
    chex.assert_trees_all_equal(table[1:10, -1], jnp.array([3.0, 5.0]))  # slices clip


@pytest.mark.parametrize(
    ("index", "error", "given"),
    [
        ("x", TypeError, r"\['x'\]: .*string indexing"),
        (1.0, TypeError, r"\[1.0\]: .*integer or boolean type"),
        (jnp.array(1.5), TypeError, r"\[Array\(1.5.*integer or boolean type"),
        ({}, IndexError, r"\[\{\}\]: .*only integers"),
        ((0, object()), IndexError, r"\[\(0, <object .*only integers"),
    ],
)
def test_an_index_of_a_kind_jax_refuses_is_named(index, error, given):
    # JAX's own message names no variable (and, for a str, says "JAX").
    table = statevar.Variable(np.arange(6.0).reshape(3, 2), name="table")
    with pytest.raises(
        error,
        match=r"Cannot read Variable 'table'" + given + r".*the variable's shape is \(3, 2\)",
    ) as caught:
        table[index]
    assert "expected an index of integers, slices" in str(caught.value)
    chex.assert_trees_all_equal(table.value, jnp.arange(6.0).reshape(3, 2))


@pytest.mark.parametrize(
    ("convert", "kind"), [(int, "int"), (float, "float"), (complex, "complex")]
)
def test_converting_a_variable_of_several_elements_to_a_python_number_is_named(convert, kind):
    v = statevar.Variable([1.0, 2.0], name="pair")
    with pytest.raises(
        TypeError,
        match=rf"Cannot convert Variable 'pair' to a Python {kind}: expected shape \(\), got "
        r"shape \(2,\)",
    ):
        convert(v)
    with pytest.raises(TypeError, match=r"Variable 'pair' to a Python int"):
        [10, 20, 30][v]  # __index__
    assert convert(v[1]) == 2 and int(statevar.Variable(3)) == 3


def test_truth_and_iteration_of_a_variable_that_has_none_are_named():
    with pytest.raises(
        ValueError, match=r"truth value of Variable 'pair' \(shape \(2,\)\) is ambiguous"
    ):
        bool(statevar.Variable([1.0, 2.0], name="pair"))
    with pytest.raises(TypeError, match=r"Cannot iterate over unsized Variable 'one'"):
        iter(statevar.Variable(1.0, name="one"))
    assert bool(statevar.Variable([1.0])) and list(statevar.Variable([1, 2])) == [1, 2]


def test_reading_out_of_range_inside_a_compiled_step_is_refused_as_it_traces():
    table = statevar.Variable(np.arange(6.0).reshape(3, 2), name="table")

    @statevar.jit
    def row(i):
        return table[i] + table[5]

    with pytest.raises(IndexError, match=r"Cannot read Variable 'table'\[5\]"):
        row(0)


def test_iteration_yields_rows():
    rows = list(statevar.Variable(_MATRIX))

    assert len(rows) == 2
    chex.assert_trees_all_close(rows[1], jnp.array([3.0, 4.0]))


def test_variable_is_accepted_by_plain_jax_jit():
    v = statevar.Variable([1.0, 2.0, 3.0])

    @jax.jit
    def total(x):
        return jnp.sum(x * x)

    chex.assert_trees_all_close(total(v), jnp.array(14.0))
    v.assign([0.0, 0.0, 2.0])
    chex.assert_trees_all_close(total(v), jnp.array(4.0))


def test_plain_jax_jit_sees_a_closed_over_variable_read_only():
    v = statevar.Variable([1.0, 2.0])

    result = jax.jit(lambda x: v * x)(3.0)

    chex.assert_trees_all_close(result, jnp.array([3.0, 6.0]))
    chex.assert_trees_all_close(v.value, jnp.array([1.0, 2.0]))


@pytest.mark.parametrize("how", ["a view given to statevar.jit", "jax.jit inside statevar.jit"])
def test_updating_a_traced_view_inside_statevar_jit_says_it_is_a_view(how):
    v = statevar.Variable(1.0, name="v")
    if how == "a view given to statevar.jit":
        call = lambda: statevar.jit(lambda x: x.assign(0.0))(jax.tree.map(lambda x: x, v))  # noqa: E731
    else:
        call = lambda: statevar.jit(lambda: jax.jit(lambda x: x.assign(0.0))(v))()  # noqa: E731
    with pytest.raises(
        TypeError,
        match=r"Cannot assign to Variable 'v': this is a read-only view of its value.*Inside "
        r"statevar.jit, update the Variable itself",
    ):
        call()
    assert float(v) == 1.0


def test_variable_flattens_to_its_value():
    v = statevar.Variable([1.0, 2.0])

    (leaf,) = jax.tree.leaves(v)

    chex.assert_trees_all_close(leaf, jnp.array([1.0, 2.0]))


@pytest.mark.parametrize(
    "make_view",
    [lambda v: jax.tree.map(lambda x: x * 2, v), jax.device_get],
    ids=["tree_map", "device_get"],
)
def test_a_tree_function_result_is_a_read_only_view(make_view):
    v = statevar.Variable([1.0, 2.0], name="w")
    view = make_view(v)

    assert not isinstance(view, statevar.Variable) and view.name == "w"
    for update in (
        lambda: view.assign([3.0, 4.0]),
        lambda: view.assign_add(1.0),
        lambda: view.__setitem__(0, 5.0),
    ):
        with pytest.raises(TypeError, match=r"Variable 'w': this is a read-only view made by"):
            update()
    copied = statevar.Variable(view)  # an independent Variable, also from a NumPy view
    copied.assign_add(1.0)
    assert isinstance(copy.deepcopy(view), type(view))
    np.testing.assert_array_equal(np.asarray(view), make_view(v))
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(copied.numpy(), np.asarray(make_view(v)) + 1)


def test_what_jax_makes_of_a_variable_is_not_a_variable():
    v = statevar.Variable([1.0, 2.0], name="w")

    def loss(w):
        return jnp.sum(w.value**2)

    mapped = jax.tree.map(lambda x: x, v)
    gradient = jax.grad(loss)(v)

    assert not isinstance(mapped, statevar.Variable)
    assert not isinstance(gradient, statevar.Variable)
    assert gradient.name == "w"
    np.testing.assert_array_equal(np.asarray(gradient), [2.0, 4.0])
    np.testing.assert_array_equal(mapped + 1, [2.0, 3.0])


def test_a_view_made_inside_statevar_jit_reads_its_traced_value_on_every_call():
    w1, w2 = statevar.Variable(jnp.ones(3)), statevar.Variable(jnp.ones(2))

    @statevar.jit
    def step(x):
        squares = jax.tree.map(lambda p: jnp.sum(p**2), [w1, w2])
        w1.assign_sub(0.1 * x)
        return sum(jax.tree.leaves(squares))

    results = [float(step(1.0)) for _ in range(3)]

    np.testing.assert_allclose(results, [5.0, 2 + 3 * 0.9**2, 2 + 3 * 0.8**2], rtol=1e-6)


def test_a_view_passed_to_statevar_jit_is_read_as_its_array():
    v = statevar.Variable([1.0, 2.0])
    total = statevar.Variable(0.0)
    traces = []

    @statevar.jit
    def accumulate(snapshot):
        traces.append(type(snapshot).__name__)
        total.assign_add(jnp.sum(snapshot.value))

    accumulate(jax.tree.map(lambda x: x * 10, v))
    accumulate(jax.tree.map(lambda x: x * 100, v))
    accumulate(jax.device_get(v))

    assert float(total) == 333.0
    assert traces == ["View"]  # one trace: a view is passed as its array, not lifted
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])


@pytest.mark.parametrize(
    ("use", "what"),
    [
        (lambda view, path: statevar.grad(lambda: view.value.sum(), view)(), "statevar.grad's wrt"),
        (lambda view, path: statevar.Optimizer(optax.sgd(0.1), [view]), "the Optimizer's"),
        (lambda view, path: statevar.save(path / "c", [view]), "the checkpoint target"),
        (lambda view, path: statevar.restore(path / "saved", [view]), "the checkpoint target"),
    ],
    ids=["grad", "optimizer", "save", "restore"],
)
def test_a_view_is_refused_where_a_variable_is_needed(tmp_path, use, what):
    v = statevar.Variable([1.0, 2.0], name="w")
    statevar.save(tmp_path / "saved", [v])
    view = jax.tree.map(lambda x: x * 2, v)

    with pytest.raises(TypeError, match=rf"Expected {what}.* got a read-only view of Variable 'w'"):
        use(view, tmp_path)

    np.testing.assert_array_equal(np.asarray(view), [2.0, 4.0])


def test_a_view_held_by_a_module_is_not_one_of_its_variables():
    class Holder(statevar.Module):
        def __init__(self, source):
            self.w = statevar.Variable([1.0])
            self.snapshot = jax.device_get(source)

    holder = Holder(statevar.Variable([5.0]))
    duplicate = copy.deepcopy(holder)

    assert holder.variables == (holder.w,)
    assert list(holder.named_variables()) == ["w"]
    assert list(duplicate.named_variables()) == ["w"]  # the copied view is still a view
    np.testing.assert_array_equal(np.asarray(duplicate.snapshot), [5.0])


def test_views_are_pytrees_like_variables():
    v = statevar.Variable([1.0, 2.0])
    view = jax.device_get(v)
    inner = jax.jit(lambda p: p * 2)

    chex.assert_trees_all_close(jax.jit(lambda p: p + 1)(view), jnp.array([2.0, 3.0]))
    chex.assert_trees_all_close(jax.jit(lambda p: inner(p))(v), jnp.array([2.0, 4.0]))
    assert jax.tree.leaves(view)[0] is view.value


# ----------------------------------------------------------------------- shape is fixed


@pytest.mark.parametrize(
    "update",
    [
        lambda v: v.assign(5.0),
        lambda v: v.assign(jnp.ones((1, 3))),
        lambda v: v.assign_add(jnp.ones(3)),
        lambda v: v.assign_sub(np.ones((2, 1))),
        lambda v: v.__setitem__(0, 1.0),
        lambda v: v.__setitem__((slice(None), 1), [7.0, 8.0]),
    ],
    ids=["assign_scalar", "assign_row", "assign_add_row", "assign_sub_column", "setitem", "slice"],
)
def test_no_update_changes_the_shape(update):
    v = statevar.Variable(np.zeros((2, 3), np.float32))

    update(v)

    assert v.shape == (2, 3)
    chex.assert_shape(v.value, (2, 3))


def test_jnp_reshape_returns_a_new_array_and_leaves_the_variable_alone():
    v = statevar.Variable([1.0, 2.0, 3.0, 4.0])

    reshaped = jnp.reshape(v, (2, 2))

    chex.assert_shape(reshaped, (2, 2))
    assert v.shape == (4,)
    chex.assert_shape(v.value, (4,))


def test_len_of_a_scalar_raises_type_error():
    with pytest.raises(TypeError, match=r"len\(\) of unsized Variable 's' \(shape \(\)\)"):
        len(statevar.Variable(1.0, name="s"))


# ----------------------------------------------------------------------- names and repr


def test_default_name_is_variable():
    assert statevar.Variable(1.0).name == "Variable"


def test_name_argument_sets_the_name():
    assert statevar.Variable(1.0, name="weights").name == "weights"


def test_two_variables_may_share_a_name():
    a = statevar.Variable(1.0, name="Mark")
    b = statevar.Variable(2.0, name="Mark")

    assert a.name == b.name == "Mark"
    assert a is not b
    chex.assert_trees_all_close((a.value, b.value), (jnp.array(1.0), jnp.array(2.0)))


@pytest.mark.parametrize(
    ("variable", "expected"),
    [
        (
            lambda: statevar.Variable([[1.0, 2.0], [3.0, 4.0]], name="Mark"),
            "<Variable 'Mark' shape=(2, 2) dtype=float32, numpy=\n"
            "array([[1., 2.],\n"
            "       [3., 4.]], dtype=float32)>",
        ),
        (
            lambda: statevar.Variable(45.2, name="my_variable"),
            "<Variable 'my_variable' shape=() dtype=float32, numpy=45.20000076293945>",
        ),
        (
            lambda: statevar.Variable([False, False, False, True]),
            "<Variable 'Variable' shape=(4,) dtype=bool, "
            "numpy=array([False, False, False,  True])>",
        ),
        (
            lambda: statevar.Variable([5 + 4j, 6 + 1j]),
            "<Variable 'Variable' shape=(2,) dtype=complex64, "
            "numpy=array([5.+4.j, 6.+1.j], dtype=complex64)>",
        ),
        (
            lambda: statevar.Variable(1),
            "<Variable 'Variable' shape=() dtype=int32, numpy=1>",
        ),
        (
            lambda: statevar.Variable([1.0, 2.0], name="v").assign_add([1.0, 1.0]),
            "<Variable 'v' shape=(2,) dtype=float32, numpy=array([2., 3.], dtype=float32)>",
        ),
    ],
    ids=["matrix", "scalar", "bool", "complex", "int_scalar", "after_update"],
)
def test_repr_matches_tensorflow(variable, expected):
    assert repr(variable()) == expected


def test_repr_of_what_jax_tree_functions_make_of_a_variable_shows_it():
    w = statevar.Variable(jnp.ones((3, 2)), name="w")

    shapes = jax.tree.map(lambda x: x.shape, {"w": w})
    fetched = jax.device_get(w)

    assert repr(shapes["w"]) == "<Variable 'w' value=(3, 2)>"
    assert shapes["w"] == (3, 2)
    assert repr(fetched).startswith("<Variable 'w' shape=(3, 2) dtype=float32, numpy=\narray(")


def test_repr_of_a_variable_traced_by_jax_jit_does_not_raise():
    v = statevar.Variable([1.0, 2.0], name="traced")
    seen = []

    @jax.jit
    def describe(x):
        seen.append(repr(x))
        return x * 1.0

    describe(v)

    assert seen[0].startswith("<Variable 'traced' shape=(2,) dtype=float32, numpy=")


# ----------------------------------------------------------------------- Python protocols


def test_hash_is_by_identity():
    a = statevar.Variable([1.0, 2.0])
    b = statevar.Variable([1.0, 2.0])

    table = {a: "a", b: "b"}
    a.assign([5.0, 6.0])

    assert table[a] == "a" and table[b] == "b"
    assert len({a, b, a}) == 2
    assert hash(a) == hash(a) != hash(b)


def test_equality_is_elementwise():
    a = statevar.Variable([1.0, 2.0, 3.0])
    b = statevar.Variable([1.0, 0.0, 3.0])

    np.testing.assert_array_equal(a == b, [True, False, True])
    np.testing.assert_array_equal(a != b, [False, True, False])
    np.testing.assert_array_equal(a == 2.0, [False, True, False])


def test_bool_of_a_scalar_is_its_truth_value():
    assert bool(statevar.Variable(1.0))
    assert not statevar.Variable(0)


def test_bool_of_a_non_scalar_raises():
    with pytest.raises(ValueError, match="ambiguous"):
        bool(statevar.Variable([1.0, 2.0]))


def test_deepcopy_is_independent():
    original = statevar.Variable([1.0, 2.0], name="w", trainable=False, device="cpu:2")

    duplicate = copy.deepcopy(original)

    assert duplicate is not original
    assert duplicate.name == "w"
    assert duplicate.trainable is False
    assert duplicate.dtype == original.dtype and duplicate.shape == original.shape
    assert duplicate.device == original.device
    assert duplicate.value.unsafe_buffer_pointer() != original.value.unsafe_buffer_pointer()
    duplicate.assign([7.0, 8.0])
    original.assign_add(1.0)
    chex.assert_trees_all_close(original.value, jnp.array([2.0, 3.0]))
    chex.assert_trees_all_close(duplicate.value, jnp.array([7.0, 8.0]))


def test_a_shallow_copy_is_the_variable_itself_as_for_tf_variable():
    v = statevar.Variable([1.0, 2.0], name="w")
    holder = statevar.Module()
    holder.w = v

    assert copy.copy(v) is v
    copy.copy(v).assign_add(1.0)
    chex.assert_trees_all_close(v.value, jnp.array([2.0, 3.0]))
    assert copy.copy(holder).w is v  # a shallow copy of a Module shares its variables


def test_deepcopy_of_a_structure_holding_a_variable_keeps_sharing_within_it():
    v = statevar.Variable(1.0)

    first, second = copy.deepcopy([v, v])

    assert first is second
    assert first is not v


# ----------------------------------------------------------------------- trainable


@pytest.mark.parametrize("trainable", [True, False])
def test_trainable_is_set_at_creation(trainable):
    assert statevar.Variable(1.0, trainable=trainable).trainable is trainable


def test_trainable_defaults_to_true_and_can_be_changed():
    v = statevar.Variable(1.0)
    assert v.trainable is True

    v.trainable = False
    assert v.trainable is False
    v.trainable = True
    assert v.trainable is True


def test_trainable_takes_numpy_bools_as_python_bools():
    v = statevar.Variable(1.0, trainable=np.bool_(False))
    assert v.trainable is False
    v.trainable = np.bool_(True)
    assert v.trainable is True


@pytest.mark.parametrize(
    "flag", ["no", 1, 0.0, jnp.array(True)], ids=["str", "int", "float", "array"]
)
def test_trainable_refuses_what_is_not_a_bool(flag):
    with pytest.raises(
        TypeError, match=r"Cannot create Variable 'w' with trainable=.*expected True"
    ):
        statevar.Variable(1.0, trainable=flag, name="w")
    v = statevar.Variable(1.0, trainable=False, name="w")
    with pytest.raises(TypeError, match=r"Cannot set Variable 'w'.trainable to .*expected True"):
        v.trainable = flag
    assert v.trainable is False
    with pytest.raises(TypeError, match=r"Variable 'w'.trainable to NoneType"):
        v.trainable = None


# ----------------------------------------------------------------------- plain JAX transformations


@pytest.mark.parametrize(
    "transform",
    [jax.jit, jax.grad, jax.vmap],
    ids=["jit", "grad", "vmap"],
)
def test_creating_a_variable_from_a_tracer_raises(transform):
    def make(x):
        return statevar.Variable(x, name="inner").value.sum()

    with pytest.raises(
        statevar.TraceContextError,
        match=r"Cannot create Variable 'inner' from a traced value inside a JAX transformation",
    ):
        transform(make)(jnp.ones(()) if transform is not jax.vmap else jnp.ones(3))


def test_an_unknown_dtype_is_refused():
    with pytest.raises(
        statevar.DtypeMismatchError, match="Cannot create Variable 'v' with dtype 'banana'"
    ):
        statevar.Variable(1.0, dtype="banana", name="v")


# --------------------------------------------------------------- dtype= at creation


@pytest.mark.parametrize(
    "source, dtype, shown",
    [
        (lambda: jnp.array([300, 1]), jnp.int8, "from 1 to 300"),
        (lambda: jnp.array([-1, 1]), jnp.uint8, "from -1 to 1"),
        (lambda: statevar.Variable(jnp.array(40000, jnp.int32)), jnp.int16, "from 40000"),
        (lambda: np.array([300, 1]), jnp.int8, "out of range"),
        (lambda: 40000, jnp.int16, "out of range"),
    ],
    ids=["device-int8", "device-uint8", "variable-int16", "host-int8", "python-int16"],
)
def test_dtype_at_creation_refuses_integers_out_of_range_by_name(source, dtype, shown):
    with pytest.raises(statevar.DtypeMismatchError, match=f"Cannot create Variable 'w'.*{shown}"):
        statevar.Variable(source(), dtype=dtype, name="w")


@pytest.mark.parametrize(
    "source", [lambda: jnp.array([100, -100]), lambda: np.array([100, -100]), lambda: [100, -100]]
)
def test_dtype_at_creation_converts_integers_in_range_exactly(source):
    v = statevar.Variable(source(), dtype=jnp.int8)
    assert v.dtype == jnp.int8
    np.testing.assert_array_equal(v.numpy(), [100, -100])


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.uint8, jnp.bool_, jnp.bfloat16])
def test_an_empty_list_takes_the_variables_dtype_as_jnp_asarray_does(dtype):
    created = statevar.Variable([], dtype=dtype)
    v = statevar.Variable(jnp.zeros((2, 0), dtype))

    v.assign([[], []])

    assert created.dtype == dtype and created.shape == (0,)
    assert v.dtype == dtype and v.shape == (2, 0)


def test_dtype_at_creation_follows_the_rules_of_assign():
    # The same value is refused at creation exactly when assign refuses it.
    for value in (jnp.array([1.5]), jnp.array([300]), jnp.array([True])):
        target = statevar.Variable(jnp.zeros(1, jnp.int8), name="w")
        try:
            target.assign(value)
            refused_by_assign = False
        except TypeError:
            refused_by_assign = True
        try:
            statevar.Variable(value, dtype=jnp.int8, name="w")
            refused_at_creation = False
        except TypeError:
            refused_at_creation = True
        assert refused_at_creation == refused_by_assign, value


@pytest.mark.parametrize(
    "source, dtype, shown",
    [
        (lambda: np.array([2**40, 7]), jnp.int64, r"dtype int64 .* out of range .* int32"),
        (lambda: np.array([2**40, 7]), None, r"dtype int64 .* out of range .* int32"),
        (lambda: jnp.array([4_000_000_000], jnp.uint32), jnp.int64, "from 4000000000"),
        (lambda: np.array([2**64 - 1], np.uint64), np.uint64, r"out of range .* uint32"),
    ],
    ids=["host-int64-dtype", "host-int64-inferred", "device-uint32-to-int64", "host-uint64"],
)
def test_64_bit_integers_at_creation_are_checked_against_the_dtype_jax_stores(source, dtype, shown):
    # With x64 off JAX stores int64 as int32 (and uint64 as uint32), wrapping larger values:
    # the range is checked against the dtype the variable will have, as assign does.
    assert not jax.config.jax_enable_x64
    warned = (
        pytest.warns(UserWarning, match=r"Variable 'w' was given dtype (u?)int64")
        if dtype is not None
        else contextlib.nullcontext()
    )
    with (
        warned,
        pytest.raises(statevar.DtypeMismatchError, match=f"Cannot create Variable 'w': .*{shown}"),
    ):
        statevar.Variable(source(), dtype=dtype, name="w")


def test_64_bit_integers_in_range_are_created_exactly():
    with pytest.warns(UserWarning, match=r"given dtype int64, which JAX does not store"):
        v = statevar.Variable(np.array([2**31 - 1, -(2**31)]), dtype=jnp.int64)

    assert v.dtype == jnp.int32
    np.testing.assert_array_equal(v.numpy(), [2**31 - 1, -(2**31)])


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.complex128, jnp.uint64])
def test_a_64_bit_dtype_jax_does_not_store_warns_as_jnp_array_does(dtype):
    stored = jax.dtypes.canonicalize_dtype(dtype)
    with pytest.warns(
        UserWarning,
        match=rf"Variable 'w' was given dtype {jnp.dtype(dtype)}, which JAX does not store "
        rf"without the jax_enable_x64 configuration option: it holds {stored}",
    ):
        v = statevar.Variable(1, dtype=dtype, name="w")

    assert v.dtype == stored


@pytest.mark.parametrize("dtype", [float, int, complex])
def test_pythons_own_types_as_dtype_are_jaxs_defaults_without_a_warning(dtype):
    v = statevar.Variable(1, dtype=dtype)  # the suite turns any warning into an error

    assert v.dtype == jax.dtypes.canonicalize_dtype(dtype) == jnp.asarray(1, dtype).dtype


@pytest.mark.parametrize(
    "value, dtype",
    [(2**31, jnp.float16), (70000, jnp.float16), ("7", jnp.int32), (np.array(["7"]), jnp.int32)],
    ids=["int-overflowing-float16", "int32-overflowing-float16", "str", "str-array"],
)
def test_creation_refuses_what_assign_refuses_with_the_same_message(value, dtype):
    target = statevar.Variable(jnp.zeros(np.shape(value), dtype), name="w")
    with pytest.raises(statevar.DtypeMismatchError) as by_assign:
        target.assign(value)
    with pytest.raises(statevar.DtypeMismatchError) as at_creation:
        statevar.Variable(value, dtype=dtype, name="w")

    assert str(at_creation.value) == str(by_assign.value).replace(
        "Cannot assign to", "Cannot create"
    )


@pytest.mark.parametrize("on_read", [False, True], ids=["variable", "on_read"])
def test_setting_or_deleting_value_is_refused_with_the_method_to_call(on_read):
    if on_read:
        mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])
        with statevar.mesh(mesh):
            v = statevar.Variable(1.0, synchronization="on_read", aggregation="sum", name="w")
    else:
        v = statevar.Variable(1.0, name="w")
    match = r"Cannot set Variable 'w' by assigning to .value: .*\.assign\(new_value\)"
    with pytest.raises(AttributeError, match=match):
        v.value = 2.0
    with pytest.raises(AttributeError, match=match):
        del v.value
    assert float(v) == 1.0


# --------------------------------------------------------------- arrays deleted outside


def _donated_elsewhere():
    v = statevar.Variable(jnp.arange(4.0), name="w")
    jax.jit(lambda x: x * 2, donate_argnums=0)(v)
    return v


def test_reading_a_variable_donated_outside_statevar_names_it_and_says_how_to_restore():
    v = _donated_elsewhere()
    for read in (lambda: v.value, lambda: v.numpy(), lambda: v + 1, lambda: float(v[0])):
        with pytest.raises(ValueError, match=r"Variable 'w'.*donated or deleted outside.*assign"):
            read()
    assert "deleted outside statevar" in repr(v)


def test_assign_restores_a_variable_deleted_outside_statevar():
    v = _donated_elsewhere()
    other = statevar.Variable(jnp.ones(4), name="other")
    v.assign([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0, 3.0, 4.0])
    assert v.dtype == jnp.float32 and v.device == other.device
    assert not v.value.committed  # as it was created, placed nowhere
    v.assign_add(1.0)  # and updates work again, in place
    np.testing.assert_array_equal(v.numpy(), [2.0, 3.0, 4.0, 5.0])
    np.testing.assert_array_equal(other.numpy(), np.ones(4))


def test_the_array_that_restores_a_deleted_variable_stays_valid_after_its_updates():
    v = _donated_elsewhere()
    source = jnp.arange(4.0) * 10  # of the variable's dtype and shape: nothing to convert
    v.assign(source)
    v.assign_add(1.0)  # donates the variable's buffer, which must not be the source's

    assert not source.is_deleted()
    np.testing.assert_array_equal(source, [0.0, 10.0, 20.0, 30.0])
    np.testing.assert_array_equal(v.numpy(), [1.0, 11.0, 21.0, 31.0])


@pytest.mark.parametrize(
    "update",
    [lambda v: v.assign_add(1.0), lambda v: v.assign_sub(1.0)],
    ids=["assign_add", "assign_sub"],
)
def test_updates_that_need_the_lost_value_are_refused_by_name(update):
    v = _donated_elsewhere()
    with pytest.raises(ValueError, match=r"Cannot assign_\w+ to Variable 'w'.*assign\(new_value\)"):
        update(v)
    v.assign(jnp.zeros(4))
    update(v)


def test_a_compiled_step_reading_a_deleted_variable_names_it_and_changes_nothing():
    v = _donated_elsewhere()
    u = statevar.Variable(jnp.ones(4), name="u")

    @statevar.jit
    def step():
        u.assign_add(v.value)

    with pytest.raises(ValueError, match=r"'step' cannot read Variable 'w'.*outside statevar"):
        step()
    np.testing.assert_array_equal(u.numpy(), np.ones(4))
    v.assign(jnp.ones(4))
    step()
    np.testing.assert_array_equal(u.numpy(), np.full(4, 2.0))


@pytest.mark.parametrize("warm", [False, True], ids=["first-call", "warm-call"])
def test_a_compiled_step_reading_a_deleted_array_someone_else_holds_names_the_variable(warm):
    v = statevar.Variable(jnp.arange(4.0), name="w")
    u = statevar.Variable(jnp.ones(4), name="u")

    @statevar.jit
    def step():
        u.assign_add(v.value)

    if warm:
        step()
    held = v.value  # shared: the step would copy it rather than donate it
    jax.jit(lambda x: x * 2, donate_argnums=0)(held)

    with pytest.raises(ValueError, match=r"'step' cannot read Variable 'w'.*outside statevar"):
        step()
    assert not u.value.is_deleted()


def test_a_variable_lost_by_a_failing_step_says_so_until_restored():
    a = statevar.Variable(jnp.ones(3), name="a")
    failing = [False]

    def callback(x):
        if failing[0]:
            raise RuntimeError("callback failed")
        return np.asarray(x)

    @statevar.jit
    def step(x):
        a.assign(a + jax.pure_callback(callback, jax.ShapeDtypeStruct((3,), jnp.float32), x))

    step(jnp.ones(3))
    failing[0] = True
    with pytest.raises(statevar.StatevarError, match=r"lost their values: 'a'"):
        step(jnp.ones(3))

    lost = r"its array was donated to the statevar.jit function 'step', which failed"
    with pytest.raises(ValueError, match=f"Cannot read Variable 'a': {lost}"):
        a.numpy()
    failing[0] = False
    with pytest.raises(ValueError, match=f"'step' cannot read Variable 'a': {lost}"):
        step(jnp.ones(3))
    a.assign(jnp.zeros(3))
    step(jnp.ones(3))
    np.testing.assert_array_equal(a.numpy(), np.ones(3))
    jax.jit(lambda x: x, donate_argnums=0)(a)
    with pytest.raises(ValueError, match="donated or deleted outside statevar"):
        a.numpy()


def test_a_failing_step_does_not_count_a_copied_variable_as_lost():
    # b's array is held by a read taken earlier, so the step was given a copy of it.
    a = statevar.Variable(jnp.ones(3), name="a")
    b = statevar.Variable(jnp.ones(3), name="b")

    def callback(x):
        raise RuntimeError("callback failed")

    @statevar.jit
    def step(x):
        a.assign_add(1.0)
        b.assign_add(1.0)
        jax.debug.callback(callback, x)

    snapshot = b.value
    with pytest.raises(statevar.StatevarError, match=r"lost their values: 'a'$"):
        step(1.0)
    np.testing.assert_array_equal(b.numpy(), np.ones(3))
    np.testing.assert_array_equal(snapshot, np.ones(3))


# --------------------------------------------------------------- in-place operators


@pytest.mark.parametrize(
    "statement, hint",
    [
        ("v += 1", r"v.assign_add\(x\)"),
        ("v -= 1", r"v.assign_sub\(x\)"),
        ("v *= 2", r"v.assign\(v \* x\)"),
        ("v /= 2", r"v.assign\(v / x\)"),
        ("v //= 2", r"v.assign\(v // x\)"),
        ("v %= 2", r"v.assign\(v % x\)"),
        ("v **= 2", r"v.assign\(v \*\* x\)"),
        ("v @= jnp.eye(2)", r"v.assign\(v @ x\)"),
    ],
)
def test_in_place_operators_raise_naming_the_method_and_leave_the_variable(statement, hint):
    v = statevar.Variable(jnp.ones((2, 2)), name="w")
    scope = {"v": v, "jnp": jnp}
    with pytest.raises(TypeError, match=rf"Cannot use .*= on Variable 'w'.*{hint}"):
        exec(statement, scope)
    assert scope["v"] is v
    np.testing.assert_array_equal(v.numpy(), np.ones((2, 2)))


def test_an_in_place_operator_on_a_module_attribute_keeps_the_modules_variable():
    class Counter(statevar.Module):
        def __init__(self):
            self.step = statevar.Variable(0, name="step")

    counter = Counter()
    variable = counter.step
    with pytest.raises(TypeError, match="Variable 'step'.*assign_add"):
        counter.step += 1
    assert counter.step is variable and int(counter.step) == 0

    @statevar.jit
    def compiled():
        counter.step += 1

    with pytest.raises(TypeError, match="Variable 'step'.*assign_add"):
        compiled()
    assert counter.step is variable and int(counter.step) == 0


def test_an_in_place_operator_on_a_view_rebinds_like_an_array():
    view = jax.tree.map(lambda x: x, statevar.Variable(jnp.ones(2)))
    view += 1
    np.testing.assert_array_equal(view, [2.0, 2.0])


# --------------------------------------------------------------- numeric protocols


def test_python_numeric_protocols_of_jax_arrays():
    v = statevar.Variable(2.6, name="w")
    assert round(v) == round(jnp.float32(2.6)) == 3
    assert float(round(v, 1)) == pytest.approx(2.6)
    quotient, remainder = divmod(v, 1.0)
    assert float(quotient) == 2.0 and float(remainder) == pytest.approx(0.6, abs=1e-6)
    assert float(divmod(5.0, statevar.Variable(2.0))[0]) == 2.0
    bits = statevar.Variable(jnp.array([1, 2], jnp.int32))
    np.testing.assert_array_equal(bits << 1, [2, 4])
    np.testing.assert_array_equal(8 >> bits, [4, 2])
    np.testing.assert_array_equal(1 << bits, [2, 4])
    np.testing.assert_array_equal(bits >> 1, [0, 1])
    assert 2 in bits and 5 not in bits
    np.testing.assert_array_equal(np.from_dlpack(statevar.Variable([1.0, 2.0])), [1.0, 2.0])
    assert bits.__array_namespace__() is jnp


def test_format_spec_formats_a_0d_value_as_a_jax_array_does():
    loss = statevar.Variable(0.25, name="loss")
    assert f"{loss:.3f}" == f"{jnp.float32(0.25):.3f}" == "0.250"
    assert f"{statevar.Variable(7, name='step'):>4}" == "   7"
    assert f"{loss}" == str(loss)
    with pytest.raises(TypeError, match=r"Cannot format Variable 'w' with '.3f': it has shape"):
        f"{statevar.Variable([1.0, 2.0], name='w'):.3f}"


# --------------------------------------------------------------------------- sizes at creation


@pytest.mark.parametrize(
    ("view", "dtype", "needs"),
    [
        (np.broadcast_to(np.int64(1), (2**20, 2**20)), "int32", "4,398,046,511,104 bytes"),
        (np.broadcast_to(np.float32(1), (2**41,)), "float32", "8,796,093,022,208 bytes"),
    ],
    ids=["2**40 int64 elements", "8 TiB of float32"],
)
def test_a_value_too_large_for_memory_is_refused_from_its_shape_alone(view, dtype, needs):
    # A broadcast view holds one element: its 2**40 are never read, converted or copied.
    with pytest.raises(
        statevar.OutOfMemoryError,
        match=rf"Cannot create Variable 'huge' of shape {re.escape(str(view.shape))} and dtype "
        rf"{dtype}: it needs {needs} \(.* TiB\), more than the memory of this host",
    ) as caught:
        statevar.Variable(view, name="huge")
    assert isinstance(caught.value, MemoryError) and "Nothing was allocated" in str(caught.value)


def test_a_broadcast_view_is_range_checked_and_converted_by_its_distinct_elements():
    view = np.broadcast_to(np.arange(3, dtype=np.int64)[:, None], (3, 1000))
    v = statevar.Variable(view, name="rows")
    assert (v.shape, v.dtype) == ((3, 1000), jnp.int32)
    chex.assert_trees_all_equal(v.value, jnp.broadcast_to(jnp.arange(3)[:, None], (3, 1000)))
    with pytest.raises(statevar.DtypeMismatchError, match="out of range for the variable's dtype"):
        statevar.Variable(np.broadcast_to(np.int64(2**40), (1000, 1000)), name="wide")
    with pytest.raises(statevar.DtypeMismatchError, match=r"\(1e\+300\) is out of range"):
        statevar.Variable(np.broadcast_to(np.float64(1e300), (1000, 1000)), name="far")
    v.assign(np.broadcast_to(np.int64(-5), (3, 1000)))
    assert int(v.value.sum()) == -15000


@pytest.fixture
def one_mib_host(monkeypatch):
    """A host (and so every CPU device) of 1 MiB."""
    monkeypatch.setattr(_creation, "host_memory", lambda: 2**20)


def test_each_devices_shard_is_checked_against_its_memory(one_mib_host):
    devices = np.array(jax.devices()[:4])
    sharding = jax.sharding.NamedSharding(jax.sharding.Mesh(devices, ("x",)), P("x"))
    # 2 MiB, of 512 KiB on each of 4 devices: computed on the device, it fits.
    spread = statevar.Variable(jnp.zeros(2**19), sharding=sharding, name="spread")
    assert spread.sharding == sharding
    with pytest.raises(
        statevar.OutOfMemoryError,
        match=r"Variable 'whole' of shape \(524288,\) and dtype float32: it needs 2,097,152 "
        r"bytes \(2.0 MiB\), more than the memory of this host, which holds .* spread it over",
    ):
        statevar.Variable(jnp.zeros(2**19), name="whole")
    with pytest.raises(
        statevar.OutOfMemoryError,
        match=r"8,388,608 bytes \(8.0 MiB\) \(2,097,152 bytes on each of its devices\), more than",
    ):
        statevar.Variable(jnp.zeros(2**21), sharding=sharding, name="wide")
    with pytest.raises(
        statevar.OutOfMemoryError,
        match=r"more than the memory of this host, where it is converted first .* initializer",
    ):
        statevar.Variable(np.zeros(2**19, np.float32), sharding=sharding, name="numpy")
    with pytest.raises(statevar.OutOfMemoryError, match=r"Variable 'made' .* each of its devices"):
        statevar.Variable(lambda: jnp.zeros(2**21), sharding=sharding, name="made")


def test_a_device_reporting_its_memory_is_checked_against_its_allocators_limit():
    class Accelerator:
        platform = "gpu"

        def memory_stats(self):
            return {"bytes_limit": 1000, "bytes_in_use": 10}

        def __str__(self):
            return "cuda:0"

    class Silent:
        platform = "tpu"

        def memory_stats(self):
            return None

    assert _creation.device_memory(Accelerator()) == (1000, "the memory of cuda:0")
    assert _creation.device_memory(Silent()) is None  # nothing known: nothing refused
    with pytest.raises(statevar.OutOfMemoryError, match=r"needs 4,000 bytes .* cuda:0 \(1,000"):
        _creation.check_size("w", (1000,), np.float32, Accelerator(), on_host=False)
    _creation.check_size("w", (250,), np.float32, Accelerator(), on_host=False)


def test_memory_that_is_not_free_now_is_named_too(monkeypatch):
    def exhausted(*args):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 4096")

    monkeypatch.setattr(_creation, "_placed_copy", exhausted)
    with pytest.raises(
        statevar.OutOfMemoryError,
        match=r"Variable 'w' of shape \(1024,\) and dtype float32: its 4,096 bytes do not fit "
        r"in the memory free on the host or on its device now \(RESOURCE_EXHAUSTED",
    ):
        statevar.Variable(np.zeros(1024, np.float32), name="w")
