"""Tests of `assign`, `assign_add`, `assign_sub` and ``v[index] = x``: conversions, errors,
in-place updates, reads taken earlier, threads and plain JAX transformations."""

import contextlib
import sys
import threading

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statevar

# Every update here runs with the C and the pure-Python eager updates.

_UPDATES = {
    "assign": lambda v, x: v.assign(x),
    "assign_add": lambda v, x: v.assign_add(x),
    "assign_sub": lambda v, x: v.assign_sub(x),
    # ``v[...]`` selects the whole variable, so the value rules match the other updates.
    "setitem": lambda v, x: v.__setitem__(Ellipsis, x),
}
_OPERATIONS = list(_UPDATES)
# What `jax.monitoring` reports each time JAX traces a function to jit it.
_JAXPR_TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"


@contextlib.contextmanager
def _counting_traces():
    """Collects the names of the functions JAX traces while the block runs (to jit them):
    an empty list proves nothing was traced again."""
    traced = []

    def listener(event, duration, *, fun_name="", **kwargs):
        if event == _JAXPR_TRACE_EVENT:
            traced.append(fun_name)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield traced
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def _snapshot(v):
    array = v._value
    return {
        "bytes": np.asarray(array).tobytes(),
        "dtype": v.dtype,
        "shape": v.shape,
        "device": v.device,
        "array": array,
    }


def _assert_unchanged(v, before):
    assert v._value is before["array"]
    assert not v.value.is_deleted()
    assert np.asarray(v).tobytes() == before["bytes"]
    assert (v.dtype, v.shape, v.device) == (before["dtype"], before["shape"], before["device"])


# ----------------------------------------------------------------------- results


@pytest.mark.parametrize(
    ("operation", "value", "expected"),
    [
        ("assign", [5.0, 6.0], [5.0, 6.0]),
        ("assign", 7.0, [7.0, 7.0]),
        ("assign_add", [1.0, 10.0], [2.0, 12.0]),
        ("assign_add", 0.5, [1.5, 2.5]),
        ("assign_sub", [1.0, 1.0], [0.0, 1.0]),
        ("assign_sub", jnp.array(2.0), [-1.0, 0.0]),
        ("setitem", 3.0, [3.0, 3.0]),
    ],
)
def test_update_result(operation, value, expected):
    v = statevar.Variable([1.0, 2.0])

    _UPDATES[operation](v, value)

    chex.assert_trees_all_close(v.value, jnp.array(expected))
    assert v.dtype == jnp.float32


@pytest.mark.parametrize("operation", ["assign", "assign_add", "assign_sub"])
def test_update_returns_the_variable(operation):
    v = statevar.Variable(1.0)

    assert getattr(v, operation)(1.0) is v


@pytest.mark.parametrize(
    ("index", "value", "expected"),
    [
        (0, 9.0, [9.0, 2.0, 3.0, 4.0]),
        (-1, 9.0, [1.0, 2.0, 3.0, 9.0]),
        (slice(1, 3), [7.0, 8.0], [1.0, 7.0, 8.0, 4.0]),
        (slice(None, None, 2), 0.0, [0.0, 2.0, 0.0, 4.0]),
        (jnp.array(2), 5.0, [1.0, 2.0, 5.0, 4.0]),
        (np.array([0, 3]), [5.0, 6.0], [5.0, 2.0, 3.0, 6.0]),
        (np.array([True, False, True, False]), 0.0, [0.0, 2.0, 0.0, 4.0]),
        (jnp.array([False, True, True, False]), [5.0, 6.0], [1.0, 5.0, 6.0, 4.0]),
        (np.zeros(4, bool), 9.0, [1.0, 2.0, 3.0, 4.0]),
    ],
    ids=[
        "int",
        "negative",
        "slice",
        "step",
        "jax_int",
        "int_array",
        "numpy_mask",
        "jax_mask",
        "empty_mask",
    ],
)
def test_setitem(index, value, expected):
    v = statevar.Variable([1.0, 2.0, 3.0, 4.0])

    v[index] = value

    chex.assert_trees_all_close(v.value, jnp.array(expected))


@pytest.mark.parametrize(
    "index",
    [True, False, np.True_, np.array(False), jnp.array(True), (0, True), (1, False)],
    ids=["true", "false", "np_true", "np_false_0d", "jax_true_0d", "row_true", "row_false"],
)
def test_setitem_with_a_0d_boolean_selects_everything_or_nothing_as_numpy_does(index):
    v = statevar.Variable(np.arange(6.0, dtype=np.float32).reshape(2, 3))
    expected = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    expected[index if not isinstance(index, jax.Array) else np.asarray(index)] = 9.0

    v[index] = 9.0

    np.testing.assert_array_equal(v.numpy(), expected)


def test_setitem_with_a_0d_boolean_checks_the_value_even_when_it_selects_nothing():
    v = statevar.Variable([1.0, 2.0, 3.0], name="v")
    with pytest.raises(ValueError, match=r"Variable 'v': shape \(2,\) does not match .*\(0, 3\)"):
        v[False] = [1.0, 2.0]
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0, 3.0])


def test_setitem_with_a_traced_boolean_index_names_the_variable_and_the_way_out():
    v = statevar.Variable([1.0, 2.0, 3.0], name="v")

    @statevar.jit
    def step(flag):
        v[flag] = 0.0

    with pytest.raises(IndexError, match=r"Cannot set Variable 'v'\[.*\]: a traced boolean"):
        step(jnp.array(True))
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0, 3.0])


@pytest.mark.parametrize(
    ("index", "error", "match"),
    [
        (lambda i: (i, 0, 0), IndexError, "Too many indices"),
        (lambda i: (slice(None, None, 0), i), ValueError, "slice step cannot be zero"),
    ],
    ids=["too many indices", "slice step of zero"],
)
def test_setitem_with_a_traced_index_refused_by_jax_names_the_variable(index, error, match):
    v = statevar.Variable(np.zeros((3, 2), np.float32), name="v")

    @statevar.jit
    def step(i):
        v[index(i)] = 1.0

    shape = r"\(the variable's shape is \(3, 2\)\)"
    with pytest.raises(error, match=rf"Cannot set Variable 'v'\[.*\]: .*{match}.*{shape}"):
        step(jnp.array(0))
    np.testing.assert_array_equal(v.numpy(), np.zeros((3, 2)))


def test_setitem_with_a_comparison_mask():
    v = statevar.Variable([[1.0, -2.0], [-3.0, 4.0]])

    v[v < 0] = 0.0

    chex.assert_trees_all_close(v.value, jnp.array([[1.0, 0.0], [0.0, 4.0]]))


def test_setitem_in_two_dimensions():
    v = statevar.Variable(np.zeros((2, 3), np.float32))

    v[1, 2] = 5.0
    v[0] = [1.0, 2.0, 3.0]
    v[:, 0] = [7.0, 7.0]

    chex.assert_trees_all_close(v.value, jnp.array([[7.0, 2.0, 3.0], [7.0, 0.0, 5.0]], jnp.float32))


def test_setitem_with_a_variable_as_index():
    v = statevar.Variable([1.0, 2.0, 3.0])

    v[statevar.Variable(1)] = 0.0

    chex.assert_trees_all_close(v.value, jnp.array([1.0, 0.0, 3.0]))


def test_slice_bounds_that_are_variables_are_read_at_each_update():
    v = statevar.Variable(jnp.zeros(6), name="v")
    lo, hi = statevar.Variable(1, name="lo"), statevar.Variable(3, name="hi")

    v[lo:hi] = 1.0
    lo.assign(4)
    hi.assign(6)
    v[lo:hi] = 2.0

    chex.assert_trees_all_equal(v.value, jnp.array([0.0, 1.0, 1.0, 0.0, 2.0, 2.0]))


def test_slice_bounds_may_be_integer_arrays_as_in_numpy():
    v = statevar.Variable(jnp.zeros(4))

    v[jnp.array(1) : jnp.array(3)] = 1.0
    v[np.int64(3) :: np.int8(1)] = 2.0

    chex.assert_trees_all_equal(v.value, jnp.array([0.0, 1.0, 1.0, 2.0]))


@pytest.mark.parametrize(
    "index",
    [[True, False, True, False], ([True, False, True, False],), [0, 2], []],
    ids=["list of bools", "list of bools in a tuple", "list of ints", "empty list"],
)
def test_setitem_takes_a_list_as_numpy_does(index):
    v = statevar.Variable(jnp.zeros(4))
    expected = np.zeros(4, np.float32)
    expected[index] = 9.0

    v[index] = 9.0

    chex.assert_trees_all_equal(v.value, jnp.asarray(expected))


def test_big_endian_numpy_values_and_indices_are_taken_as_jnp_asarray_takes_them():
    created = statevar.Variable(np.array([1, 2], ">i4"))
    v = statevar.Variable(jnp.zeros(3))

    v.assign(np.array([4, 5, 6], ">f4"))
    v.assign_add(np.array([1, 1, 1], ">i2"))
    v[np.array([0], ">i8")] = 9.0

    assert created.dtype == jnp.int32
    chex.assert_trees_all_equal(created.value, jnp.array([1, 2], jnp.int32))
    chex.assert_trees_all_equal(v.value, jnp.array([9.0, 6.0, 7.0]))


def test_a_slice_bound_that_is_not_an_integer_is_refused_by_name():
    v = statevar.Variable(jnp.zeros(4), name="v")

    with pytest.raises(
        TypeError, match=r"Variable 'v'\[.*slice bounds must be integers or None, got 0.5"
    ):
        v[0.5:2] = 1.0
    chex.assert_trees_all_equal(v.value, jnp.zeros(4))


def test_a_traced_slice_bound_is_refused_by_name_with_the_way_out():
    v = statevar.Variable(jnp.zeros(4), name="v")
    lo = statevar.Variable(1, name="lo")

    @statevar.jit
    def step():
        v[lo:3] = 1.0

    with pytest.raises(
        TypeError, match=r"Variable 'v'\[.*a slice bound is traced.*dynamic_update_slice"
    ):
        step()
    chex.assert_trees_all_equal(v.value, jnp.zeros(4))


def test_assign_from_another_variable():
    v = statevar.Variable([1.0, 2.0])
    w = statevar.Variable([3.0, 4.0])

    v.assign(w)
    w.assign_add(1.0)

    chex.assert_trees_all_close(v.value, jnp.array([3.0, 4.0]))
    chex.assert_trees_all_close(w.value, jnp.array([4.0, 5.0]))


@pytest.mark.parametrize(
    ("operation", "expected"),
    [("assign", [1.0, 2.0]), ("assign_add", [2.0, 4.0]), ("assign_sub", [0.0, 0.0])],
)
def test_update_with_the_variable_itself(operation, expected):
    v = statevar.Variable([1.0, 2.0])

    getattr(v, operation)(v)
    v.assign_add(v)

    chex.assert_trees_all_close(v.value, 2 * jnp.array(expected))


def test_setitem_with_a_part_of_the_variable_itself():
    v = statevar.Variable([1.0, 2.0, 3.0])

    v[0:2] = v[1:3]

    chex.assert_trees_all_close(v.value, jnp.array([2.0, 3.0, 3.0]))


# ----------------------------------------------------------------------- dtype conversions


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (3, [3.0, 3.0]),
        ([3, 4], [3.0, 4.0]),
        (np.array([3, 4]), [3.0, 4.0]),
        (jnp.array([3, 4]), [3.0, 4.0]),
        (np.array([3.25, 4.5], np.float64), [3.25, 4.5]),
        (np.float64(2.5), [2.5, 2.5]),
        (np.array([1.0, 2.0], np.float16), [1.0, 2.0]),
        (2**40, [2.0**40, 2.0**40]),
        (np.array([2**40, 1]), [2.0**40, 1.0]),
    ],
    ids=[
        "python_int",
        "int_list",
        "numpy_int64",
        "jax_int32",
        "numpy_float64",
        "numpy_float64_scalar",
        "float16",
        "large_python_int",
        "large_numpy_int64",
    ],
)
@pytest.mark.parametrize("operation", ["assign", "setitem"])
def test_safe_values_are_converted_to_a_float_variable(operation, value, expected):
    v = statevar.Variable([0.0, 0.0], name="f")

    _UPDATES[operation](v, value)

    assert v.dtype == jnp.float32
    chex.assert_trees_all_close(v.value, jnp.array(expected, jnp.float32))


@pytest.mark.parametrize(
    ("initial_value", "value", "expected"),
    [
        (np.zeros(2, np.int32), np.array([1, 2], np.int64), [1, 2]),
        (np.zeros(2, np.int8), 127, [127, 127]),
        (np.zeros(2, np.uint8), [0, 255], [0, 255]),
        (np.zeros(2, np.uint32), 2**32 - 1, [2**32 - 1, 2**32 - 1]),
        (np.zeros(2, np.complex64), 1.5, [1.5, 1.5]),
        (np.zeros(2, np.complex64), [1, 2j], [1, 2j]),
        (np.zeros(2, np.bool_), np.array([True, False]), [True, False]),
    ],
    ids=["int64_into_int32", "int8", "uint8", "uint32", "float_into_complex", "complex", "bool"],
)
def test_safe_values_are_converted_to_other_dtypes(initial_value, value, expected):
    v = statevar.Variable(initial_value)

    v.assign(value)

    assert v.dtype == initial_value.dtype
    np.testing.assert_array_equal(np.asarray(v), np.array(expected, initial_value.dtype))


# (variable's initial value, rejected value, exception, message pattern); the pattern names
# the variable and both dtypes or shapes.
_REJECTED = {
    "float_into_int": (
        [1, 2],
        1.5,
        TypeError,
        r"Variable 'v': a value of dtype float cannot be converted safely to the variable's "
        r"dtype int32 \(floating into integer\)",
    ),
    "float_list_into_int": ([1, 2], [1.5, 2.0], TypeError, r"Variable 'v'.*Python floats.*int32"),
    "float32_into_int": ([1, 2], jnp.array([1.0, 2.0]), TypeError, r"Variable 'v'.*float32.*int32"),
    "complex_into_float": (
        [1.0, 2.0],
        1 + 2j,
        TypeError,
        r"Variable 'v': a value of dtype complex cannot be converted safely to the variable's "
        r"dtype float32",
    ),
    "complex_array_into_float": (
        [1.0, 2.0],
        np.array([1j, 2]),
        TypeError,
        r"Variable 'v'.*complex128.*float32",
    ),
    "bool_into_float": ([1.0, 2.0], True, TypeError, r"Variable 'v'.*bool.*float32"),
    "int_into_bool": ([True, False], 1, TypeError, r"Variable 'v'.*int.*bool"),
    "string": (
        [1.0, 2.0],
        "abc",
        TypeError,
        r"Variable 'v': expected a numeric value convertible to float32, got str 'abc'",
    ),
    "string_list": ([1.0, 2.0], ["a", "b"], TypeError, r"Variable 'v'.*float32, got list"),
    "none": ([1.0, 2.0], None, TypeError, r"Variable 'v'.*float32, got NoneType None"),
    "object": ([1.0, 2.0], object(), TypeError, r"Variable 'v'.*float32, got object"),
    "ragged_list": (
        [1.0, 2.0],
        [[1.0], [2.0, 3.0]],
        TypeError,
        r"Variable 'v': expected a numeric value convertible to float32, got list",
    ),
    "string_array": (
        [1.0, 2.0],
        np.array(["a", "b"]),
        TypeError,
        r"Variable 'v': a value of dtype <U1 cannot be converted safely to the variable's "
        r"dtype float32",
    ),
    "prng_key": ([1, 2], jax.random.key(0), TypeError, r"Variable 'v'.*dtype key<fry>.*int32"),
    "int_out_of_range": (
        [1, 2],
        2**40,
        TypeError,
        r"Variable 'v': a value of dtype int \(1099511627776\) is out of range for the "
        r"variable's dtype int32",
    ),
    "int8_out_of_range": (
        np.array([1, 2], np.int8),
        300,
        TypeError,
        r"Variable 'v'.*int \(300\) is out of range.*int8",
    ),
    "negative_into_uint8": (
        np.array([1, 2], np.uint8),
        -1,
        TypeError,
        r"Variable 'v'.*\(-1\) is out of range.*uint8",
    ),
    "int64_array_out_of_range": (
        [1, 2],
        np.array([2**40, 1]),
        TypeError,
        r"Variable 'v'.*int64.*out of range.*int32",
    ),
    "float_out_of_range": (
        np.array([1, 2], np.float16),
        70000.0,
        TypeError,
        r"Variable 'v': a value of dtype float \(70000.0\) is out of range for the variable's "
        r"dtype float16, whose largest value is 65504: it would become inf",
    ),
    "float_rounding_to_inf_through_float32": (
        np.array([1, 2], np.float16),
        65519.99999999,  # float32 first, as JAX converts it: 65520.0, which float16 makes inf
        TypeError,
        r"Variable 'v': a value of dtype float \(65519.99999999\) is out of range.*float16",
    ),
    "complex_beyond_complex64": (
        np.array([1, 2], np.complex64),
        complex(1.5e308, 1.5e308),
        TypeError,
        r"Variable 'v': a value of dtype complex .* is out of range for the variable's dtype "
        r"complex64",
    ),
    "float64_array_out_of_range": (
        [1.0, 2.0],
        np.array([1.0, -1e40]),
        TypeError,
        r"Variable 'v'.*float64 \(-1e\+40\) is out of range.*float32.*would become -inf",
    ),
    "shape_3": (
        [1.0, 2.0],
        [1.0, 2.0, 3.0],
        ValueError,
        r"Variable 'v': shape \(3,\) does not match the .*shape \(2,\)",
    ),
    "shape_2_1": (
        [1.0, 2.0],
        np.ones((2, 1), np.float32),
        ValueError,
        r"Variable 'v': shape \(2, 1\) does not match the .*shape \(2,\)",
    ),
    "shape_2_2": (
        [1.0, 2.0],
        jnp.ones((2, 2)),
        ValueError,
        r"Variable 'v': shape \(2, 2\) does not match the .*shape \(2,\)",
    ),
    # Zero-byte broadcast views: the shape is refused before any conversion or range scan
    # (converting 2**40 elements would need 4 TiB).
    "huge_float64_view": (
        [1.0, 2.0],
        np.broadcast_to(np.float64(1.0), (2**40,)),
        ValueError,
        r"Variable 'v': shape \(1099511627776,\) does not match the .*shape \(2,\)",
    ),
    "huge_int64_view_into_int32": (
        [1, 2],
        np.broadcast_to(np.int64(2**40), (2**20, 2**20)),
        ValueError,
        r"Variable 'v': shape \(1048576, 1048576\) does not match the .*shape \(2,\)",
    ),
    "ragged_nested_list": (
        [[1.0, 2.0], [3.0, 4.0]],
        [[1.0, 2.0], [3.0]],
        TypeError,
        r"Variable 'v': expected a numeric value .* got list \[\[1.0, 2.0\], \[3.0\]\], which "
        r"is ragged",
    ),
    # Where NumPy's long double is wider than float64 (x86, most ARM Linux).
    **(
        {
            "longdouble_beyond_float64": (
                [1.0, 2.0],
                np.array([1.0, np.longdouble("1e400")], np.longdouble),
                TypeError,
                r"Variable 'v': a value of dtype float\d+ \(1e\+400\) is out of range for "
                r"every dtype JAX holds",
            ),
        }
        if np.dtype(np.longdouble).itemsize > 8
        else {}
    ),
}


@pytest.mark.parametrize("case", _REJECTED.values(), ids=_REJECTED.keys())
@pytest.mark.parametrize("operation", _OPERATIONS)
def test_rejected_update_raises_and_leaves_the_variable_bit_identical(operation, case):
    initial_value, value, error, match = case
    v = statevar.Variable(initial_value, name="v")
    before = _snapshot(v)

    with pytest.raises(error, match=match):
        _UPDATES[operation](v, value)

    _assert_unchanged(v, before)


@pytest.mark.parametrize("operation", _OPERATIONS)
def test_extended_precision_values_are_converted_as_float64_and_complex128(operation):
    # JAX cannot take NumPy's long double: read as the widest dtype it can, then checked
    # as any float64 value.
    v = statevar.Variable([1.0, 2.0], name="v")
    _UPDATES[operation](v, np.array([0.5, 0.25], np.longdouble))
    expected = {"assign": [0.5, 0.25], "assign_add": [1.5, 2.25], "assign_sub": [0.5, 1.75]}
    np.testing.assert_array_equal(v.value, expected.get(operation, [0.5, 0.25]))
    z = statevar.Variable([1j, 2j], name="z")
    _UPDATES[operation](z, np.array([1 + 1j, 2], np.clongdouble))
    assert z.dtype == jnp.complex64


@pytest.mark.skipif(np.dtype(np.longdouble).itemsize <= 8, reason="long double is double here")
def test_a_variable_made_from_long_doubles_holds_jax_floats():
    v = statevar.Variable(np.ones(2, np.longdouble), name="ld")
    assert v.dtype == jnp.float32  # float64 as JAX stores it without x64


def test_a_ragged_value_for_a_mask_names_the_variable():
    v = statevar.Variable([1.0, 2.0], name="v")
    before = _snapshot(v)
    with pytest.raises(TypeError, match=r"Cannot set an item of Variable 'v'.*is ragged"):
        v[np.array([True, False])] = [[1, 2], [3]]
    _assert_unchanged(v, before)


@pytest.mark.parametrize("index", [0, (slice(None),), np.array([True, False])])
def test_an_item_of_a_huge_broadcast_view_is_refused_by_its_shape(index):
    v = statevar.Variable([1.0, 2.0], name="v")
    before = _snapshot(v)
    with pytest.raises(ValueError, match=r"Variable 'v'.*shape \(1099511627776,\) does not"):
        v[index] = np.broadcast_to(np.float64(1.0), (2**40,))
    _assert_unchanged(v, before)


@pytest.mark.parametrize(
    "value",
    [jnp.ones(2, jnp.float32), jnp.ones(2, jnp.int32), jnp.ones(3, jnp.float32)],
    ids=["own_dtype_and_shape", "int32", "shape_3"],
)
@pytest.mark.parametrize("operation", _OPERATIONS)
def test_deleted_array_value_raises_and_leaves_the_variable_bit_identical(operation, value):
    # The first case takes the fast path (an array of the variable's own aval), the others
    # the full conversion; both name the variable.
    v = statevar.Variable([1.0, 2.0], name="v")
    before = _snapshot(v)
    deleted = jnp.array(value, copy=True)
    deleted.delete()

    with pytest.raises(
        ValueError, match=r"Cannot .* Variable 'v': the value is a .* array that has been deleted"
    ):
        _UPDATES[operation](v, deleted)

    _assert_unchanged(v, before)


@pytest.mark.parametrize(
    "index",
    [jnp.array(1), jnp.array([0, 1]), jnp.array([True, False])],
    ids=["scalar", "indices", "mask"],
)
def test_deleted_index_array_raises_and_leaves_the_variable_bit_identical(index):
    v = statevar.Variable([1.0, 2.0], name="v")
    before = _snapshot(v)
    index.delete()

    with pytest.raises(
        ValueError, match=r"Cannot set an item of Variable 'v': the index is a .* array that has"
    ):
        v[index] = 5.0

    _assert_unchanged(v, before)


@pytest.mark.parametrize(
    ("initial_value", "value", "error"),
    [
        ([1, 2], 1.5, statevar.DtypeMismatchError),
        ([1.0, 2.0], [1.0, 2.0, 3.0], statevar.ShapeMismatchError),
    ],
)
def test_rejections_are_statevar_errors(initial_value, value, error):
    v = statevar.Variable(initial_value, name="v")

    with pytest.raises(error, match="Variable 'v'") as info:
        v.assign(value)

    assert isinstance(info.value, statevar.StatevarError)


def test_shape_mismatch_in_setitem_names_the_indexed_part():
    v = statevar.Variable([1.0, 2.0, 3.0], name="v")
    before = _snapshot(v)

    with pytest.raises(
        statevar.ShapeMismatchError,
        match=r"Cannot set an item of Variable 'v': shape \(3,\) does not match the indexed "
        r"part's shape \(2,\)",
    ):
        v[0:2] = [1.0, 2.0, 3.0]

    _assert_unchanged(v, before)


@pytest.mark.parametrize(
    ("index", "match"),
    [
        (3, r"Cannot set Variable 'v'\[3\]: index 3 is out of bounds"),
        (-4, r"Cannot set Variable 'v'\[-4\]: index -4 is out of bounds"),
        (jnp.array(5), r"Cannot set Variable 'v'\[.*\]: index 5 is out of bounds"),
        (np.array([0, 7]), r"Cannot set Variable 'v'\[.*\]: index 7 is out of bounds"),
        ((0, 0), r"Cannot set Variable 'v'\[\(0, 0\)\]: too many indices"),
        (1.5, r"Cannot set Variable 'v'\[1.5\]: only integers, slices"),
        (np.array([True, False]), r"Cannot set Variable 'v'\[.*\]: boolean index did not match"),
    ],
    ids=["past_end", "before_start", "jax_int", "int_array", "too_many", "float", "bad_mask"],
)
def test_setitem_with_a_bad_index_raises_index_error(index, match):
    v = statevar.Variable([1.0, 2.0, 3.0], name="v")
    before = _snapshot(v)

    with pytest.raises(IndexError, match=match):
        v[index] = 0.0

    _assert_unchanged(v, before)


# ----------------------------------------------------------------------- in place, no retrace


_IN_PLACE = {
    "assign": lambda v: v.assign([5.0, 6.0, 7.0]),
    "assign_scalar": lambda v: v.assign(2.0),
    "assign_array": lambda v: v.assign(jnp.arange(3.0)),
    "assign_add": lambda v: v.assign_add(1.0),
    "assign_sub": lambda v: v.assign_sub(jnp.ones(3)),
    "setitem": lambda v: v.__setitem__(1, 9.0),
    "setitem_slice": lambda v: v.__setitem__(slice(0, 2), [3.0, 4.0]),
    "setitem_mask": lambda v: v.__setitem__(np.array([True, False, True]), 0.0),
}


@pytest.mark.parametrize("update", _IN_PLACE.values(), ids=_IN_PLACE.keys())
def test_update_reuses_the_buffer_when_nothing_else_holds_it(update):
    v = statevar.Variable([1.0, 2.0, 3.0])

    for _ in range(3):
        pointer = v.value.unsafe_buffer_pointer()
        update(v)
        assert v.value.unsafe_buffer_pointer() == pointer


def test_in_place_update_gives_the_right_value():
    v = statevar.Variable([1.0, 2.0, 3.0])
    pointer = v.value.unsafe_buffer_pointer()

    v.assign_add(1.0)
    v.assign([0.0, 5.0, 0.0])
    v[2] = 4.0

    assert v.value.unsafe_buffer_pointer() == pointer
    chex.assert_trees_all_close(v.value, jnp.array([0.0, 5.0, 4.0]))


@pytest.mark.parametrize(
    ("operation", "update"),
    [
        ("assign", lambda v, i: v.assign(jnp.full(3, float(i)))),
        ("assign_add", lambda v, i: v.assign_add(1.0)),
        ("assign_sub", lambda v, i: v.assign_sub(np.float32(i))),
        ("setitem", lambda v, i: v.__setitem__(i % 3, float(i))),
    ],
)
def test_repeated_updates_of_the_same_shape_do_not_retrace(operation, update):
    v = statevar.Variable([1.0, 2.0, 3.0])
    update(v, 0)  # traces the donating update
    held = v.value
    update(v, 1)  # traces the copying update, as ``held`` still holds the array
    del held

    held = []
    with _counting_traces() as traces:
        for i in range(2, 12):
            if i % 4 == 0:
                held.append(v.value)
            update(v, i)

    assert traces == []


def test_a_second_variable_of_the_same_shape_does_not_retrace():
    shape = (3, 5, 7)  # of this test alone: JAX caches the traces process-wide
    with _counting_traces() as first:
        statevar.Variable(jnp.zeros(shape, jnp.bfloat16)).assign_add(1.0)
    second = statevar.Variable(jnp.ones(shape, jnp.bfloat16))

    with _counting_traces() as traces:
        second.assign_add(1.0)

    assert first  # the counter sees the first update's trace
    assert traces == []


# ----------------------------------------------------------------------- reads stay valid

_READS = {
    "value": lambda v: v.value,
    "read_value": lambda v: v.read_value(),
    "jnp_asarray": lambda v: jnp.asarray(v),
    "slice": lambda v: v[1:3],
    "getitem": lambda v: v[0],
    "np_asarray": lambda v: np.asarray(v),
    "numpy": lambda v: v.numpy(),
    "arithmetic": lambda v: v + 0.0,
}


@pytest.mark.parametrize("operation", _OPERATIONS)
@pytest.mark.parametrize("read", _READS.values(), ids=_READS.keys())
def test_reads_taken_earlier_survive_later_updates(read, operation):
    v = statevar.Variable([1.0, 2.0, 3.0, 4.0])
    taken = read(v)
    expected = np.array(taken, copy=True)

    for i in range(3):
        _UPDATES[operation](v, float(10 + i))

    if isinstance(taken, jax.Array):
        assert not taken.is_deleted()
    np.testing.assert_array_equal(np.asarray(taken), expected)
    assert float(np.asarray(v)[0]) != float(expected.flat[0])


def test_a_same_device_device_put_aliases_the_buffer_and_the_next_update_deletes_it():
    # A JAX trap statevar cannot see (it counts Python references): device_put onto the
    # array's own device gives another Array over the same buffer. docs/variables.md says
    # to ask for a copy; if JAX ever copies here, this test and that paragraph go.
    v = statevar.Variable([1.0, 2.0])
    alias = jax.device_put(v.value, v.device)
    kept = jax.device_put(v.value, v.device, may_alias=False)
    assert alias is not v.value
    assert alias.unsafe_buffer_pointer() == v.value.unsafe_buffer_pointer()

    v.assign_add(1.0)

    assert alias.is_deleted()
    np.testing.assert_array_equal(kept, [1.0, 2.0])


def test_many_reads_survive_many_updates():
    v = statevar.Variable(np.zeros(8, np.float32))
    reads = []

    for i in range(20):
        reads.append((i, v.value))
        v.assign_add(1.0)

    for i, read in reads:
        assert not read.is_deleted()
        chex.assert_trees_all_close(read, jnp.full(8, float(i)))


# ----------------------------------------------------------------------- failures


def test_failure_while_tracing_under_jax_jit_keeps_the_old_value():
    v = statevar.Variable([1.0, 2.0], name="v")
    array = v._value

    @jax.jit
    def step(x):
        v.assign_add(1.0)  # concrete operands: the update itself is what gets traced
        return x

    with pytest.raises(statevar.TraceContextError, match=r"Cannot assign_add to Variable 'v'"):
        step(1.0)

    assert v._value is array and not array.is_deleted()
    chex.assert_trees_all_close(v.value, jnp.array([1.0, 2.0]))
    v.assign_add(1.0)
    chex.assert_trees_all_close(v.value, jnp.array([2.0, 3.0]))


def test_failure_in_a_nan_checked_update_keeps_the_old_value():
    v = statevar.Variable([1.0, 2.0])
    v.assign_add(1.0)

    with jax.debug_nans(True), pytest.raises(FloatingPointError, match="nan"):
        v.assign_add(jnp.array([np.nan, 0.0]))

    assert not v.value.is_deleted()
    chex.assert_trees_all_close(v.value, jnp.array([2.0, 3.0]))


# ----------------------------------------------------------------------- threads


@pytest.fixture
def frequent_thread_switches():
    """Switches threads every microsecond, so that races show up within a short test."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


@pytest.mark.usefixtures("frequent_thread_switches")
def test_concurrent_assign_add_loses_no_update():
    v = statevar.Variable(0)

    def work():
        for _ in range(500):
            v.assign_add(1)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert int(v) == 4000


@pytest.mark.usefixtures("frequent_thread_switches")
def test_a_reshard_in_another_thread_loses_no_update():
    v = statevar.Variable(jnp.zeros(4), name="v")
    one = jnp.ones(4)
    devices = jax.devices("cpu")[:2]  # the default backend may have one device (a GPU)

    def update():
        for _ in range(1000):
            v.assign_add(one)

    def move():
        for i in range(30):
            v.reshard(devices[i % 2])

    threads = [threading.Thread(target=update), threading.Thread(target=move)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    np.testing.assert_array_equal(v.numpy(), np.full(4, 1000.0))


def _check_value(v):
    value = v.value
    # An update is atomic: every element of a read holds the same count.
    return [] if np.ptp(np.asarray(value)) == 0 else ["torn read"]


def _check_numpy(v):
    array = np.asarray(v)
    return [] if np.ptp(array) == 0 else ["torn read"]


def _check_repr(v):
    text = repr(v)
    return [] if "unavailable" not in text else [text]


@pytest.mark.usefixtures("frequent_thread_switches")
@pytest.mark.parametrize(
    "check", [_check_value, _check_numpy, _check_repr], ids=["value", "np_asarray", "repr"]
)
def test_concurrent_readers_never_see_a_deleted_array(check):
    v = statevar.Variable(np.zeros(16, np.float32), name="shared")
    problems = []
    kept = []
    done = threading.Event()

    def write():
        for _ in range(2500):
            v.assign_add(1.0)

    def read():
        try:
            while not done.is_set():
                problems.extend(check(v))
                if len(kept) < 100:
                    kept.append(v.value)
        except Exception as error:  # a reader must never raise
            problems.append(repr(error))

    readers = [threading.Thread(target=read) for _ in range(3)]
    writers = [threading.Thread(target=write) for _ in range(2)]
    for thread in readers + writers:
        thread.start()
    for thread in writers:
        thread.join()
    done.set()
    for thread in readers:
        thread.join()

    assert problems == []
    assert float(v.value[0]) == 5000.0
    for value in kept:
        assert not value.is_deleted()
        assert np.ptp(np.asarray(value)) == 0


# ----------------------------------------------------------------------- plain JAX transformations


@pytest.mark.parametrize(
    ("update", "phrase"),
    [
        (lambda v, x: v.assign(x), "assign to"),
        (lambda v, x: v.assign_add(x), "assign_add to"),
        (lambda v, x: v.assign_sub(x), "assign_sub to"),
        (lambda v, x: v.__setitem__(0, x), "set an item of"),
    ],
    ids=_OPERATIONS,
)
@pytest.mark.parametrize("transform", [jax.jit, jax.grad], ids=["jit", "grad"])
def test_updating_with_a_tracer_raises_and_keeps_the_value(transform, update, phrase):
    v = statevar.Variable([1.0, 2.0], name="v")

    def step(x):
        update(v, x)
        return x

    with pytest.raises(
        statevar.TraceContextError, match=rf"Cannot {phrase} Variable 'v' inside jax.jit"
    ):
        transform(step)(1.0)

    assert isinstance(v._value, jax.Array) and not isinstance(v.value, jax.core.Tracer)
    chex.assert_trees_all_close(v.value, jnp.array([1.0, 2.0]))


def test_assign_under_jax_jit_raises_as_the_readme_shows():
    v = statevar.Variable(0.0, name="v")

    with pytest.raises(statevar.TraceContextError, match=r"Variable 'v'.*statevar.jit"):
        jax.jit(lambda x: v.assign(x))(1.0)

    assert float(v) == 0.0


@pytest.mark.parametrize(
    "update",
    [lambda v, one: v.assign_add(one), lambda v, one: v.assign_add(1.0)],
    ids=["hot_path", "general_path"],
)
def test_an_update_traced_by_jax_jit_never_leaves_a_tracer_stored(monkeypatch, update):
    # Not even while it raises: a Ctrl-C landing there would leave the tracer for good.
    v = statevar.Variable(jnp.zeros(3), name="v")
    one = jnp.ones(3)
    v.assign_add(one)
    v.assign_add(one)  # the hot path is open
    held = []
    refuse = statevar.Variable._refuse_traced

    def refuse_seeing_what_is_held(self, operation):
        held.append(self._value)
        return refuse(self, operation)

    monkeypatch.setattr(statevar.Variable, "_refuse_traced", refuse_seeing_what_is_held)
    with pytest.raises(statevar.TraceContextError, match=r"Variable 'v' inside jax.jit"):
        jax.jit(lambda: update(v, one))()
    (array,) = held
    assert not isinstance(array, jax.core.Tracer)
    np.testing.assert_array_equal(array, np.full(3, 2.0))


@pytest.mark.parametrize("update", ["assign_add", "assign_sub"])
def test_an_update_of_a_deleted_array_chains_jaxs_error_as_its_context(update):
    v = statevar.Variable(jnp.zeros(3), name="v")
    one = jnp.ones(3)
    getattr(v, update)(one)
    getattr(v, update)(one)  # the hot path is open
    v.value.delete()
    with pytest.raises(
        ValueError, match=r"Cannot .* Variable 'v': its array was donated"
    ) as raised:
        getattr(v, update)(one)
    # As raised while handling JAX's error (shown only with the traceback's context).
    assert isinstance(raised.value.__context__, RuntimeError | ValueError)
    assert raised.value.__suppress_context__


@pytest.mark.parametrize(
    "update",
    [
        lambda v, i: v.assign(2.0),
        lambda v, i: v.assign_sub(1.0),
        lambda v, i: v.__setitem__(i, 5.0),
    ],
    ids=["constant_assign", "constant_assign_sub", "traced_index"],
)
def test_updating_under_jax_jit_with_concrete_values_raises_and_keeps_the_value(update):
    v = statevar.Variable([1.0, 2.0], name="v")

    def step(i):
        update(v, i)
        return i

    with pytest.raises(
        statevar.TraceContextError, match=r"Variable 'v' inside jax.jit or another JAX"
    ):
        jax.jit(step)(1)

    assert not isinstance(v.value, jax.core.Tracer)
    chex.assert_trees_all_close(v.value, jnp.array([1.0, 2.0]))


@pytest.mark.parametrize(
    ("update", "phrase"),
    [
        (lambda x: x.assign_add(1.0), "assign_add to"),
        (lambda x: x.assign(x.value * 2), "assign to"),
        (lambda x: x.assign_sub(jnp.ones(2)), "assign_sub to"),
        (lambda x: x.__setitem__(Ellipsis, x.value), "set an item of"),
    ],
    ids=["constant", "traced_value", "concrete_array", "setitem"],
)
@pytest.mark.parametrize(
    "transform",
    [jax.jit, jax.vmap, lambda f: jax.grad(lambda x: jnp.sum(f(x)))],
    ids=["jit", "vmap", "grad"],
)
def test_updating_a_variable_passed_to_a_jax_transformation_raises(transform, update, phrase):
    v = statevar.Variable([1.0, 2.0], name="arg")
    before = _snapshot(v)

    def step(x):
        update(x)
        return x.value

    with pytest.raises(
        statevar.TraceContextError,
        match=rf"Cannot {phrase} Variable 'arg' inside jax.jit.* or another JAX transformation",
    ):
        transform(step)(v)

    _assert_unchanged(v, before)


@pytest.mark.parametrize(
    ("dtype", "value", "match"),
    [
        (
            jnp.int8,
            jnp.array(300),
            r"dtype int32 \(from 300 to 300\) is out of range for the variable's dtype int8",
        ),
        (
            jnp.uint8,
            jnp.array(-1),
            r"\(from -1 to -1\) is out of range for the variable's dtype uint8",
        ),
        (jnp.int32, jnp.array(np.uint32(4_000_000_000)), r"dtype uint32 .* out of range .* int32"),
    ],
)
def test_device_integers_out_of_range_are_refused(dtype, value, match):
    v = statevar.Variable(0, dtype=dtype, name="v")
    with pytest.raises(statevar.DtypeMismatchError, match=match):
        v.assign(value)
    assert int(v) == 0
    v.assign(jnp.array(5))  # in range: converted
    assert int(v) == 5


def test_boolean_mask_assignment_compiles_once_for_every_mask():
    v = statevar.Variable(jnp.arange(-4.0, 4.0))
    v[v < 0] = 0.0
    v[v > 4.0] = 4.0  # traces the comparison too
    with _counting_traces() as traces:
        for threshold in (1.0, 2.0, 3.0):
            v[v > threshold] = threshold
    assert traces == []
    chex.assert_trees_all_close(v.value, jnp.array([0.0, 0, 0, 0, 0, 1, 1, 1]))


def test_boolean_mask_assignment_inside_statevar_jit():
    v = statevar.Variable(jnp.array([-1.0, 2.0, -3.0]))

    @statevar.jit
    def clip():
        v[v < 0] = 0.0

    clip()
    chex.assert_trees_all_close(v.value, jnp.array([0.0, 2.0, 0.0]))


# --------------------------------------------------------------- rejected updates name the variable


@pytest.mark.parametrize(
    "update, phrase",
    [(lambda v: v.assign_sub(True), "assign_sub"), (lambda v: v.assign_add(True), "assign_add")],
)
@pytest.mark.parametrize("compiled", [False, True])
def test_arithmetic_on_a_bool_variable_is_refused_by_name(update, phrase, compiled):
    v = statevar.Variable([True, False], name="flags")
    run = statevar.jit(lambda: update(v)) if compiled else (lambda: update(v))
    expected = f"Cannot {phrase} to Variable 'flags'.*bool"
    with pytest.raises(statevar.DtypeMismatchError, match=expected):
        run()
    np.testing.assert_array_equal(v.numpy(), [True, False])


def test_a_slice_step_of_zero_is_refused_by_name():
    v = statevar.Variable(jnp.zeros(4), name="w")
    with pytest.raises(ValueError, match=r"Cannot set Variable 'w'\[.*slice step cannot be zero"):
        v[::0] = 1.0
    np.testing.assert_array_equal(v.numpy(), np.zeros(4))


def test_the_public_committed_attribute_the_hot_path_reads():
    # The eager update reads ``committed`` to tell an uncommitted value from a committed
    # one (on every supported JAX, a property of jax.Array).
    assert jnp.ones(2).committed is False
    assert jax.device_put(jnp.ones(2), jax.devices()[0]).committed is True


@pytest.mark.parametrize("method", ["assign", "assign_add", "assign_sub"])
def test_updates_take_tf_keywords(method):
    v = statevar.Variable([1.0, 2.0], name="v")
    assert getattr(v, method)(1.0, read_value=False) is None
    assert getattr(v, method)(1.0, use_locking=True, name="update") is v
    assert getattr(v, method)(1.0, False, "by_position", True) is v
    expected = {"assign": [1.0, 1.0], "assign_add": [4.0, 5.0], "assign_sub": [-2.0, -1.0]}
    chex.assert_trees_all_close(v.value, jnp.array(expected[method]))


def test_updates_take_tf_keywords_in_a_compiled_step():
    v = statevar.Variable(1.0, name="v")

    @statevar.jit
    def step():
        assert v.assign_add(1.0, read_value=False) is None
        return v.assign(v * 3, use_locking=True, name="triple").value

    chex.assert_trees_all_close(step(), 6.0)
    chex.assert_trees_all_close(v.value, 6.0)


@pytest.mark.parametrize(
    ("keywords", "match"),
    [
        ({"read_value": "no"}, r"Variable 'v' with read_value='no': expected True"),
        ({"use_locking": 1}, r"Variable 'v' with use_locking=1: expected True, False"),
        ({"name": 3}, r"Cannot assign_add to Variable 'v' with name=3: expected a str"),
    ],
)
def test_a_bad_tf_keyword_is_refused_and_changes_nothing(keywords, match):
    v = statevar.Variable(1.0, name="v")
    with pytest.raises(TypeError, match=match):
        v.assign_add(1.0, **keywords)
    assert float(v) == 1.0
