"""Tests of placement: ``device=``, `statevar.device` scopes, soft placement and placement
logging. conftest gives this machine eight CPU devices, cpu:0 to cpu:7."""

import copy
import logging
import re
import threading

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import statevar


def _cpu(index):
    return jax.devices("cpu")[index]


def _has_gpu():
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


_HAS_GPU = _has_gpu()
_DEFAULT = jax.devices()[0]
_DEFAULT_SPEC = statevar._cell.placement.describe(_DEFAULT)  # "cpu:0", or "gpu:0" on a GPU
_AVAILABLE = "Available devices: " + ", ".join(f"{d.platform}:{d.id}" for d in jax.devices())
# Device specs this machine lacks; "gpu:0" only where there is no GPU.
_MISSING = [
    pytest.param("gpu:0", marks=pytest.mark.skipif(_HAS_GPU, reason="this machine has gpu:0")),
    pytest.param(
        "/device:GPU:0", marks=pytest.mark.skipif(_HAS_GPU, reason="this machine has gpu:0")
    ),
    "cpu:8",
    "gpu:99",
]


# ----------------------------------------------------------------------- where variables live


@pytest.mark.parametrize(
    ("spec", "index"),
    [
        ("cpu:1", 1),
        ("cpu:3", 3),
        ("cpu", 0),
        ("CPU:2", 2),
        ("/device:CPU:1", 1),
        ("/CPU:2", 2),
        ("/cpu:3", 3),
        ("/job:localhost/replica:0/task:0/device:CPU:1", 1),
    ],
)
def test_device_argument_places_the_variable(spec, index):
    v = statevar.Variable([1.0, 2.0], device=spec)

    assert v.device == _cpu(index)
    chex.assert_tree_is_on_device(v.value, device=_cpu(index))


def test_device_argument_accepts_a_jax_device():
    v = statevar.Variable([1.0, 2.0], device=_cpu(2))

    assert v.device == _cpu(2)


def test_variable_defaults_to_jax_default_device():
    assert statevar.Variable(1.0).device == _DEFAULT
    with jax.default_device(_cpu(3)):
        assert statevar.Variable(1.0).device == _cpu(3)


def test_a_variable_placed_nowhere_holds_an_uncommitted_array_while_its_updates_do():
    # As jnp.zeros does: compiled steps take it without a sharding annotation.
    v = statevar.Variable([1.0, 2.0], name="v")
    assert v.value.committed is False and v.device == _DEFAULT

    v.assign_add(1.0)
    v.assign_sub(jnp.ones(2))
    v.assign(v.value + 2.0)
    v[0] = 7.0
    held = v.value
    v.assign_add(1.0)  # copies: `held` holds the array

    assert v.value.committed is False and not held.is_deleted()
    chex.assert_trees_all_equal(v.value, jnp.array([8.0, 5.0]))
    with jax.default_device(_cpu(3)):
        elsewhere = statevar.Variable(1.0)
    assert elsewhere.value.committed is False and elsewhere.device == _cpu(3)


def test_a_first_call_that_fails_to_trace_leaves_a_variable_placed_nowhere_uncommitted():
    # A committed argument commits the variables a compiled step lifts, before the trace;
    # a step that fails to trace changes no variable, its placement included.
    v = statevar.Variable([1.0, 2.0], name="v")
    argument = jax.device_put(jnp.ones(2), _DEFAULT)
    fail = True

    @statevar.jit
    def step(x):
        v.assign_add(x)
        if fail:
            raise ValueError("the step's own error")

    with pytest.raises(ValueError, match="the step's own error"):
        step(argument)
    assert v.value.committed is False
    chex.assert_trees_all_equal(v.value, jnp.array([1.0, 2.0]))
    fail = False
    step(argument)
    assert v.value.committed is True
    chex.assert_trees_all_equal(v.value, jnp.array([2.0, 3.0]))


def test_jax_default_device_moves_a_variable_placed_nowhere_as_any_uncommitted_array():
    # JAX runs a computation on uncommitted arrays on its default device at the time: an
    # update under jax.default_device moves a variable placed nowhere (the documented
    # trap); a variable given a device stays on it.
    free = statevar.Variable([1.0, 2.0], name="free")
    placed = statevar.Variable([1.0, 2.0], device=_DEFAULT, name="placed")

    with jax.default_device(_cpu(3)):
        free.assign_add(1.0)
        placed.assign_add(1.0)

    assert free.device == _cpu(3) and free.value.committed is False
    assert placed.device == _DEFAULT
    chex.assert_trees_all_equal(free.value, placed.value)


@pytest.mark.parametrize(
    "create",
    [
        lambda: statevar.Variable(1.0, device=_DEFAULT_SPEC),
        lambda: statevar.Variable(1.0, device=_DEFAULT),
        lambda: _in_scope_value(_DEFAULT_SPEC),
        lambda: statevar.Variable(jax.device_put(1.0, _DEFAULT)),
        lambda: statevar.Variable(lambda: jnp.ones(2), device=_DEFAULT_SPEC),
    ],
    ids=["device string", "device", "scope", "committed initial value", "initializer"],
)
def test_a_variable_given_a_placement_holds_a_committed_array(create):
    v = create()
    v.assign_add(1.0)
    assert v.value.committed is True and v.device == _DEFAULT


def _in_scope_value(spec):
    with statevar.device(spec):
        return statevar.Variable(1.0)


def test_assigning_a_committed_array_commits_the_variable_and_its_next_updates_run_cold():
    v = statevar.Variable([1.0, 2.0], name="v")
    one = jnp.ones(2)  # of the variable's abstract value: the hot path's bare key
    v.assign_add(one)
    warm = statevar._cell.variable.compiled_key("assign_add", committed=True)
    assert "assign_add" in v._compiled and warm not in v._compiled

    v.assign(jax.device_put(jnp.array([3.0, 4.0]), _DEFAULT))
    assert v.value.committed is True
    # JAX compiles apart for a committed variable array: the first such update runs
    # cold, holding signal handlers while JAX's Python path runs after donating.
    assert warm not in v._compiled
    v.assign_add(one)
    assert warm in v._compiled
    v.assign_add(one)
    chex.assert_trees_all_equal(v.value, jnp.array([5.0, 6.0]))


def test_device_scope_places_variables_created_in_it():
    with statevar.device("cpu:2") as placed_on:
        v = statevar.Variable([1.0, 2.0])
    w = statevar.Variable([1.0, 2.0])

    assert placed_on == _cpu(2)
    assert v.device == _cpu(2)
    chex.assert_tree_is_on_device(v.value, device=_cpu(2))
    assert w.device == _DEFAULT


def test_device_scopes_nest():
    with statevar.device("cpu:1"):
        with statevar.device("cpu:2"):
            inner = statevar.Variable(1.0)
        outer = statevar.Variable(1.0)

    assert inner.device == _cpu(2)
    assert outer.device == _cpu(1)


def test_device_argument_wins_over_the_scope():
    with statevar.device("cpu:1"):
        v = statevar.Variable(1.0, device="cpu:3")

    assert v.device == _cpu(3)


def test_device_scope_is_per_thread():
    placed = {}

    def create():
        placed["other thread"] = statevar.Variable(1.0).device

    with statevar.device("cpu:3"):
        thread = threading.Thread(target=create)
        thread.start()
        thread.join()
        placed["this thread"] = statevar.Variable(1.0).device

    assert placed == {"other thread": _DEFAULT, "this thread": _cpu(3)}


def test_device_scope_is_left_when_the_block_raises():
    with pytest.raises(KeyError, match="inside"), statevar.device("cpu:2"):
        raise KeyError("inside")

    assert statevar.Variable(1.0).device == _DEFAULT


_UPDATES = {
    "assign_list": lambda v: v.assign([5.0, 6.0]),
    "assign_scalar": lambda v: v.assign(3.0),
    "assign_other_device": lambda v: v.assign(jax.device_put(jnp.ones(2), _cpu(3))),
    "assign_variable_elsewhere": lambda v: v.assign(statevar.Variable([7.0, 8.0], device="cpu:2")),
    "assign_add": lambda v: v.assign_add(1.0),
    "assign_add_other_device": lambda v: v.assign_add(jax.device_put(jnp.ones(2), _cpu(2))),
    "assign_sub": lambda v: v.assign_sub([1.0, 1.0]),
    "setitem": lambda v: v.__setitem__(0, 4.0),
    "setitem_other_device": lambda v: v.__setitem__(1, jax.device_put(jnp.array(9.0), _cpu(3))),
    "setitem_in_scope": lambda v: _in_scope("cpu:2", lambda: v.__setitem__(0, 1.0)),
    "setitem_index_elsewhere": lambda v: v.__setitem__(jax.device_put(jnp.array(1), _cpu(3)), 2.0),
    "setitem_mask_elsewhere": lambda v: v.__setitem__(
        jax.device_put(jnp.array([True, False]), _cpu(2)), 3.0
    ),
    "setitem_indices_elsewhere": lambda v: v.__setitem__(
        (jax.device_put(jnp.array([0, 1]), _cpu(3)),), jnp.array([4.0, 5.0])
    ),
    "assign_in_scope": lambda v: _in_scope("cpu:3", lambda: v.assign([1.0, 1.0])),
}


def _in_scope(spec, fn):
    with statevar.device(spec):
        fn()


@pytest.mark.parametrize("device", ["cpu:1", None], ids=["placed", "uncommitted"])
@pytest.mark.parametrize("update", _UPDATES.values(), ids=_UPDATES.keys())
def test_updates_keep_the_variable_on_its_device(update, device):
    v = statevar.Variable([1.0, 2.0], device=device)
    where = v.device
    held = v.value

    update(v)  # copies, as ``held`` still holds the array
    del held
    update(v)  # donates

    assert v.device == where
    chex.assert_tree_is_on_device(v.value, device=where)


def test_deepcopy_keeps_the_device():
    v = statevar.Variable([1.0, 2.0], device="cpu:3")

    assert copy.deepcopy(v).device == _cpu(3)


def test_deepcopy_of_a_variable_placed_nowhere_is_placed_nowhere_on_the_same_device():
    with jax.default_device(_cpu(3)):
        v = statevar.Variable([1.0, 2.0])

    epoch = statevar._state.STATE.compile_epoch
    copied = copy.deepcopy(v)

    assert copied.device == _cpu(3) and copied.value.committed is False
    assert statevar._state.STATE.compile_epoch == epoch  # steps over other variables stay warm
    chex.assert_trees_all_equal(copied.value, v.value)


# ----------------------------------------------------------------------- compiled steps


def _step_over(*variables):
    @statevar.jit
    def step(x):
        for v in variables:
            v.assign_add(x)

    return step


def test_a_compiled_step_over_uncommitted_variables_annotates_no_sharding():
    # A sharding annotation on each of thousands of inputs slows XLA's compilation.
    free = statevar.Variable(jnp.zeros(2), name="free")
    placed = statevar.Variable(jnp.zeros(2), device="cpu:0", name="placed")

    assert "sdy.sharding" not in _step_over(free).lower(jnp.ones(2)).as_text()
    assert "sdy.sharding" in _step_over(placed).lower(jnp.ones(2)).as_text()


def test_a_first_call_given_a_committed_argument_commits_its_variables_and_compiles_once(
    first_calls,
):
    v = statevar.Variable(jnp.zeros(2), name="v")
    step = _step_over(v)
    x = jax.device_put(jnp.ones(2), _DEFAULT)

    step(x)
    assert v.value.committed is True
    step(x)  # of the same argument types as the first call: not compiled again, warm
    assert len(first_calls) == 1

    (entry,) = step._cache.entries.values()
    assert entry.jitted._cache_size() == 1
    chex.assert_trees_all_equal(v.value, jnp.full(2, 2.0))


def test_the_commitment_a_warm_step_reads_of_its_arguments_is_jax_arrays_committed():
    # A warm step reads each argument's commitment through JAX's C++ attribute (see
    # jax_internals.COMMITTED_ATTRIBUTE), and takes a NumPy array or a number as uncommitted.
    attribute = statevar._tracing.jax_internals.COMMITTED_ATTRIBUTE
    assert attribute == "_committed"  # on every JAX the suite runs on (0.10.2 to 0.12)
    free, placed = jnp.ones(2), jax.device_put(jnp.ones(2), _DEFAULT)

    assert (getattr(free, attribute), getattr(placed, attribute)) == (False, True)
    assert (free.committed, placed.committed) == (False, True)
    assert getattr(np.ones(2), attribute, False) is False and not hasattr(1.0, attribute)


class _PythonCommitted:
    @property
    def _committed(self):
        return False


@pytest.mark.parametrize("array_type", [object, _PythonCommitted], ids=["none", "in Python"])
def test_without_jaxs_cpp_commitment_attribute_a_warm_step_reads_committed(monkeypatch, array_type):
    # Should a JAX release drop `_committed` or make it Python, the public name is read.
    monkeypatch.setattr(jax._src.array, "ArrayImpl", array_type)
    assert statevar._tracing.jax_internals._commitment_attribute() == "committed"


def test_a_compiled_step_does_not_move_an_uncommitted_variable_to_its_arguments_device():
    v = statevar.Variable(jnp.zeros(2), name="v")
    step = _step_over(v)

    with pytest.raises(
        statevar.PlacementError,
        match=r"'step' got variables and arguments on different devices: Variable 'v' on "
        rf"{_DEFAULT_SPEC}; argument 0 on cpu:2",
    ):
        step(jax.device_put(jnp.ones(2), _cpu(2)))

    assert v.value.committed is False and v.device == _DEFAULT
    step(jnp.ones(2))
    with pytest.raises(statevar.PlacementError, match=rf"Variable 'v' on {_DEFAULT_SPEC}; arg"):
        step(jax.device_put(jnp.ones(2), _cpu(2)))  # a warm step too

    assert v.value.committed is False and v.device == _DEFAULT
    step(jax.device_put(jnp.ones(2), _DEFAULT))  # commits it
    step(jnp.ones(2))
    assert v.value.committed is True
    chex.assert_trees_all_equal(v.value, jnp.full(2, 3.0))


def test_a_step_over_committed_and_uncommitted_variables_commits_them_and_compiles_once():
    placed = statevar.Variable(jnp.zeros(2), device=_DEFAULT, name="placed")
    free = statevar.Variable(jnp.zeros(2), name="free")
    step = _step_over(placed, free)

    step(jnp.ones(2))
    step(jnp.ones(2))

    assert free.value.committed is True
    (entry,) = step._cache.entries.values()
    assert entry.jitted._cache_size() == 1


def test_a_variable_committed_between_calls_makes_the_next_call_a_first_call(first_calls):
    v = statevar.Variable(jnp.zeros(2), name="v")
    step = _step_over(v)
    step(jnp.ones(2))
    step(jnp.ones(2))
    assert len(first_calls) == 1

    v.assign(jax.device_put(jnp.zeros(2), _DEFAULT))  # commits it: a first update
    assert len(first_calls) == 2
    step(jnp.ones(2))  # JAX compiles again for the committed array, signals held
    assert len(first_calls) == 3
    step(jnp.ones(2))
    assert len(first_calls) == 3
    chex.assert_trees_all_equal(v.value, jnp.full(2, 2.0))


def test_a_step_that_commits_what_it_computes_runs_its_next_call_as_a_first_call(first_calls):
    v = statevar.Variable(jnp.zeros(2), name="v")
    pin = jax.sharding.make_single_device_sharding(_DEFAULT)

    @statevar.jit
    def step(x):
        v.assign(jax.lax.with_sharding_constraint(v.value + x, pin))

    step(jnp.ones(2))
    assert v.value.committed is True and len(first_calls) == 1
    step(jnp.ones(2))
    step(jnp.ones(2))
    assert len(first_calls) == 2
    chex.assert_trees_all_equal(v.value, jnp.full(2, 3.0))


@pytest.fixture
def acquire_hook(monkeypatch):
    """Sets a function that the eager updates call just before they take the update
    lock."""
    lock, hooks = statevar._state.STATE.update_lock, []

    def acquire(*args):
        for hook in hooks:
            hook()
        return lock.acquire(*args)

    monkeypatch.setattr(statevar._cell.variable, "_acquire", acquire)
    yield hooks.append


def test_an_update_checks_the_variable_under_the_lock(first_calls, acquire_hook):
    # Another thread may commit the variable between a check made before the lock and
    # the donation: the update must see it, and run as a first update.
    v = statevar.Variable(jnp.zeros(2), name="v")
    one = jnp.ones(2)
    v.assign_add(one)
    v.assign_add(one)  # the hot path is open
    commit = [jax.device_put(jnp.zeros(2), _DEFAULT)]

    def another_thread_commits():
        if commit:
            v.assign(commit.pop())  # as another thread would, just before the lock

    acquire_hook(another_thread_commits)
    before = len(first_calls)
    v.assign_add(one)

    assert v.value.committed is True
    assert len(first_calls) == before + 2  # the assign, then this update
    chex.assert_trees_all_equal(v.value, one)


# ----------------------------------------------------------------------- arithmetic in a scope

_ARITHMETIC = {
    "mul": lambda a, b: a * b,
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "truediv": lambda a, b: a / b,
    "matmul": lambda a, b: a @ b,
    "pow": lambda a, b: a**b,
    "lt": lambda a, b: a < b,
    "eq": lambda a, b: a == b,
    "scalar": lambda a, b: a * 2.0,
    "reflected_scalar": lambda a, b: 2.0 - a,
    "neg": lambda a, b: -a,
    "abs": lambda a, b: abs(a),
}


@pytest.mark.parametrize("operation", _ARITHMETIC.values(), ids=_ARITHMETIC.keys())
def test_arithmetic_in_a_scope_runs_on_the_scope_device(operation):
    a = statevar.Variable([1.0, 2.0], device="cpu:0")
    b = statevar.Variable([3.0, 4.0], device="cpu:0")

    with statevar.device("cpu:1"):
        k = operation(a, b)

    assert k.devices() == {_cpu(1)}
    chex.assert_trees_all_close(k, operation(a.value, b.value))
    assert a.device == b.device == _cpu(0)


def test_arithmetic_in_a_scope_copies_operands_from_several_devices():
    a = statevar.Variable([1.0, 2.0], device="cpu:2")
    b = statevar.Variable([3.0, 4.0], device="cpu:3")

    elsewhere = jax.device_put(jnp.ones(2), _cpu(0))

    with statevar.device("cpu:1"):
        k = a * b
        j = a + elsewhere

    assert k.devices() == {_cpu(1)}
    assert j.devices() == {_cpu(1)}
    chex.assert_trees_all_close((k, j), (jnp.array([3.0, 8.0]), jnp.array([2.0, 3.0])))


@pytest.mark.parametrize(
    "operation",
    [
        lambda a, b: a + b,
        lambda a, b: b * a,
        lambda a, b: a @ b,
        lambda a, b: a + jax.device_put(jnp.ones(2), _cpu(3)),
        lambda a, b: 2.0 - a,
    ],
    ids=["add", "mul", "matmul", "jax_array", "reflected_scalar"],
)
def test_operands_on_different_devices_work_outside_a_scope(operation):
    a = statevar.Variable([1.0, 2.0], device="cpu:1")
    b = statevar.Variable([3.0, 4.0], device="cpu:2")

    result = operation(a, b)

    chex.assert_trees_all_close(result, operation(np.array([1.0, 2.0]), np.array([3.0, 4.0])))
    assert a.device == _cpu(1) and b.device == _cpu(2)


# ----------------------------------------------------------------------- soft placement


@pytest.mark.parametrize("spec", _MISSING)
def test_soft_placement_falls_back_to_the_default_device_with_a_warning(spec):
    with pytest.warns(
        statevar.PlacementWarning, match=rf"Device '{re.escape(spec)}' does not exist"
    ) as rec:
        v = statevar.Variable([1.0, 2.0], name="w", device=spec)

    assert v.device == _DEFAULT
    chex.assert_trees_all_close(v.value, jnp.array([1.0, 2.0]))
    assert "Variable 'w'" in str(rec[0].message)
    assert _AVAILABLE in str(rec[0].message)


@pytest.mark.parametrize("spec", _MISSING)
def test_soft_placement_applies_to_device_scopes(spec):
    with pytest.warns(
        statevar.PlacementWarning, match=rf"Device '{re.escape(spec)}' does not exist"
    ):
        with statevar.device(spec) as placed_on:
            v = statevar.Variable(1.0)

    assert placed_on == _DEFAULT
    assert v.device == _DEFAULT


def test_placement_warning_points_at_the_callers_line():
    with pytest.warns(statevar.PlacementWarning, match="does not exist") as rec:
        statevar.Variable(1.0, device="gpu:99")
        with statevar.device("gpu:99"):
            pass

    assert [warning.filename for warning in rec] == [__file__, __file__]


@pytest.mark.parametrize("spec", _MISSING)
def test_without_soft_placement_a_missing_device_raises(spec):
    statevar.set_soft_device_placement(False)

    with pytest.raises(
        ValueError, match=rf"Cannot place Variable 'w' on '{re.escape(spec)}': no such"
    ) as info:
        statevar.Variable(1.0, name="w", device=spec)

    assert isinstance(info.value, statevar.PlacementError)
    assert _AVAILABLE in str(info.value)
    assert "statevar.set_soft_device_placement(True)" in str(info.value)


def test_without_soft_placement_a_scope_on_a_missing_device_raises():
    statevar.set_soft_device_placement(False)

    with pytest.raises(statevar.PlacementError, match=r"Cannot place 'gpu:99': no such device"):
        with statevar.device("gpu:99"):
            pass


def test_soft_placement_can_be_turned_back_on():
    statevar.set_soft_device_placement(False)
    statevar.set_soft_device_placement(True)

    with pytest.warns(statevar.PlacementWarning, match="gpu:99"):
        statevar.Variable(1.0, device="gpu:99")


def test_existing_devices_never_warn_without_soft_placement():
    statevar.set_soft_device_placement(False)

    assert statevar.Variable(1.0, device="cpu:3").device == _cpu(3)


@pytest.mark.parametrize("spec", [3, 1.5, ["cpu:0"], b"cpu:0"])
def test_device_spec_of_the_wrong_type_raises_type_error(spec):
    with pytest.raises(TypeError, match=r"Expected a device spec such as 'cpu:0' or a jax.Device"):
        statevar.Variable(1.0, device=spec)
    with pytest.raises(TypeError, match=r"Expected a device spec"):
        with statevar.device(spec):
            pass


@pytest.mark.parametrize("spec", ["banana:0", "", "cpu:x", "cpu:0:1", "gpu-0", ":0", "/", "cpu/"])
def test_unparseable_device_spec_raises_value_error(spec):
    with pytest.raises(
        ValueError, match=r"Cannot parse device spec .* for Variable 'w': expected 'cpu', 'gpu'"
    ):
        statevar.Variable(1.0, device=spec, name="w")
    with pytest.raises(ValueError, match=r"Cannot parse device spec"):
        with statevar.device(spec):
            pass


# ----------------------------------------------------------------------- placement logging


def test_placement_logging_is_off_by_default(caplog):
    caplog.set_level(logging.INFO, logger="statevar")

    v = statevar.Variable([1.0], name="quiet")
    v.assign_add(1.0)

    assert caplog.records == []


def test_placement_logging_logs_creation_and_every_update(caplog):
    caplog.set_level(logging.INFO, logger="statevar")
    statevar.set_log_device_placement(True)

    v = statevar.Variable([1.0, 2.0], name="logged", device="cpu:2")
    v.assign([3.0, 4.0])
    v.assign_add(1.0)
    v.assign_sub(1.0)
    v[0] = 0.0

    assert [(r.name, r.levelno) for r in caplog.records] == [("statevar", logging.INFO)] * 5
    assert [r.getMessage() for r in caplog.records] == [
        "Variable 'logged': create on cpu:2",
        "Variable 'logged': assign on cpu:2",
        "Variable 'logged': assign_add on cpu:2",
        "Variable 'logged': assign_sub on cpu:2",
        "Variable 'logged': setitem on cpu:2",
    ]


def test_placement_logging_logs_updates_of_the_eager_hot_path(caplog):
    caplog.set_level(logging.INFO, logger="statevar")
    v = statevar.Variable([1.0, 2.0], name="hot")
    one = jnp.ones(2)
    v.assign_add(one)
    v.assign_add(one)  # on the hot path, which now takes this update

    statevar.set_log_device_placement(True)
    v.assign_add(one)
    v.assign_add(one)
    statevar.set_log_device_placement(False)
    v.assign_add(one)

    device = f"{_DEFAULT.platform}:{_DEFAULT.id}"
    assert [r.getMessage() for r in caplog.records] == [
        f"Variable 'hot': assign_add on {device}"
    ] * 2
    chex.assert_trees_all_equal(v.value, jnp.array([6.0, 7.0]))


def test_placement_logging_can_be_turned_off(caplog):
    caplog.set_level(logging.INFO, logger="statevar")
    statevar.set_log_device_placement(True)
    v = statevar.Variable(1.0, name="v")
    statevar.set_log_device_placement(False)

    v.assign(2.0)

    assert [r.getMessage() for r in caplog.records] == [
        f"Variable 'v': create on {_DEFAULT.platform}:{_DEFAULT.id}"
    ]


def test_placement_logging_names_the_fallback_device(caplog):
    caplog.set_level(logging.INFO, logger="statevar")
    statevar.set_log_device_placement(True)

    with pytest.warns(statevar.PlacementWarning, match="gpu:99"):
        statevar.Variable(1.0, name="moved", device="gpu:99")

    assert [r.getMessage() for r in caplog.records] == [
        f"Variable 'moved': create on {_DEFAULT.platform}:{_DEFAULT.id}"
    ]


@pytest.mark.parametrize("spec", ["cpu:2", "/CPU:2", "/device:CPU:2"])
def test_reshard_takes_a_device_spec_as_device_does(spec):
    v = statevar.Variable([1.0, 2.0], device="cpu:0", name="w")
    before = v.value

    v.reshard(spec)

    assert v.device == _cpu(2)
    chex.assert_trees_all_equal(v.value, before)


def test_reshard_to_a_spec_that_cannot_be_parsed_names_the_variable():
    v = statevar.Variable([1.0, 2.0], device="cpu:0", name="w")

    with pytest.raises(ValueError, match=r"Cannot parse device spec 'gpu-0' for Variable 'w'"):
        v.reshard("gpu-0")
    assert v.device == _cpu(0)
