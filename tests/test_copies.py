"""Copy diagnostics: an update or a compiled step that copies a variable instead of donating
its buffer says why, under `statevar.set_copy_policy`."""

import warnings
import weakref

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.interpreters import mlir

import statevar
from statevar._cell import copies as _copies
from statevar._state import STATE

HELD = "still held elsewhere"


@pytest.fixture
def no_donation_on_cpu(monkeypatch):
    """Lowers as on a platform without donation (this one: the message names it), as JAX's
    own warning says."""
    monkeypatch.setattr(mlir, "_platforms_with_donation", [])


@pytest.fixture
def first_donation_unaliased(monkeypatch):
    """Lowers as if no output could take the first donated buffer (JAX then warns that
    some donated buffers were not usable, and the program copies)."""
    real = mlir._set_up_aliases

    def set_up_aliases(*args, **kwargs):
        aliases, donated, xla_donated = real(*args, **kwargs)
        first = next((i for i, alias in enumerate(aliases) if alias is not None), None)
        if first is None:
            return aliases, donated, xla_donated
        aliases, donated = list(aliases), list(donated)
        aliases[first], donated[first] = None, True
        if xla_donated is not None:
            xla_donated = list(xla_donated)
            xla_donated[first] = False
        return aliases, donated, xla_donated

    monkeypatch.setattr(mlir, "_set_up_aliases", set_up_aliases)


def _warm(variable):
    """Runs the variable's eager assign_add until its hot path is open."""
    variable.assign_add(jnp.zeros(variable.shape, variable.dtype))
    variable.assign_add(jnp.zeros(variable.shape, variable.dtype))


def _eager_hot(variable):
    variable.assign_add(jnp.ones(variable.shape, variable.dtype))


def _eager_general(variable):
    variable.assign_add(np.ones(variable.shape, np.float32))  # a NumPy value: converted


def _eager_setitem(variable):
    variable[0] = 5.0


UPDATES = [_eager_hot, _eager_general, _eager_setitem]


# --------------------------------------------------------------------------- held elsewhere


@pytest.mark.parametrize("update", UPDATES)
def test_an_eager_copy_of_a_read_variable_warns_once_naming_it(update):
    v = statevar.Variable(jnp.zeros(3), name="weights")
    _warm(v)
    read = v.value
    with statevar.copy_policy("warn"), pytest.warns(statevar.CopyWarning) as caught:
        update(v)
        again = v.value
        update(v)  # the same variable and cause: no second warning
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "Variable 'weights' (12 bytes)" in message and HELD in message
    assert "del it" in message  # the fix
    assert caught[0].filename == __file__  # points at the caller's line
    np.testing.assert_array_equal(read, np.zeros(3))
    del again


@pytest.mark.parametrize("update", UPDATES)
def test_raise_refuses_an_eager_copy_and_changes_nothing(update):
    v = statevar.Variable(jnp.arange(3.0), name="weights")
    _warm(v)
    read = v.value
    before = weakref.ref(v._value)
    refused = f"Variable 'weights' \\(12 bytes\\): its array is {HELD}"
    with statevar.copy_policy("raise"):
        with pytest.raises(statevar.CopyError, match=refused):
            update(v)
        assert v._value is before() and not read.is_deleted()
        np.testing.assert_array_equal(v.value, [0.0, 1.0, 2.0])
        del read
        update(v)  # nothing else holds the array now: donated, allowed
    assert before() is None or before().is_deleted()


def _compiled_update(variable):
    _step_for(variable)(jnp.ones(variable.shape, variable.dtype))


@pytest.mark.parametrize("warm", [False, True], ids=["first update", "warm"])
@pytest.mark.parametrize("update", [*UPDATES, _compiled_update])
def test_a_kept_copy_error_holds_no_array(update, warm):
    # The error's traceback keeps its frames alive: none may hold the variable's array, or
    # the update retried once the read is gone would still find it held.
    v = statevar.Variable(jnp.arange(3.0), name="weights")
    step = _step_for(v)
    if warm:
        _warm(v)
        step(jnp.zeros(3))
    read = v.value
    with statevar.copy_policy("raise"):
        try:
            update(v) if update is not _compiled_update else step(jnp.ones(3))
        except statevar.CopyError as error:
            kept = error
        del read
        update(v) if update is not _compiled_update else step(jnp.ones(3))  # donated
    assert isinstance(kept, statevar.CopyError) and HELD in str(kept)


def test_a_kept_update_error_holds_no_array():
    v = statevar.Variable(jnp.arange(3.0), name="weights")
    _warm(v)
    read = v.value
    errors = []
    for bad in (jnp.ones(4), "text", jnp.full(3, 1j)):
        try:
            v.assign(bad)
        except (TypeError, ValueError) as error:
            errors.append(error)
    try:
        v[7] = 1.0
    except IndexError as error:
        errors.append(error)
    del read
    with statevar.copy_policy("raise"):
        v.assign_add(1.0)  # no kept error holds the array: donated
    assert len(errors) == 4
    np.testing.assert_array_equal(v.value, [1.0, 2.0, 3.0])


def test_min_bytes_lets_small_copies_pass():
    v = statevar.Variable(jnp.zeros(4), name="small")
    read = v.value
    with statevar.copy_policy("raise", min_bytes=17):
        v.assign_add(1.0)  # 16 bytes: below the threshold, copied quietly
    with statevar.copy_policy("raise", min_bytes=16), pytest.raises(statevar.CopyError):
        read = v.value
        v.assign_add(1.0)
    del read


def test_the_default_warns_of_copies_from_64_mib():
    assert (_copies.POLICY.policy, _copies.POLICY.min_bytes) == ("warn", 64 * 2**20)
    small = statevar.Variable(jnp.zeros(4), name="small")
    read = small.value
    small.assign_add(1.0)  # a small copy: no warning (the suite turns warnings into errors)
    large = statevar.Variable(jnp.zeros(64 * 2**20, jnp.uint8), name="large")
    read = large.value
    with pytest.warns(statevar.CopyWarning, match="Variable 'large' \\(67,108,864 bytes\\)"):
        large.assign_add(jnp.uint8(1))
    del read


def _step_for(variable):
    @statevar.jit
    def step(delta):
        variable.assign_add(delta)
        return variable.value.sum()

    return step


@pytest.mark.parametrize("warm", [False, True], ids=["first call", "warm call"])
def test_a_compiled_step_copying_a_read_variable_warns_once(warm):
    v = statevar.Variable(jnp.zeros(3), name="weights")
    step = _step_for(v)
    if warm:
        step(jnp.zeros(3))
    read = v.value
    with statevar.copy_policy("warn"), pytest.warns(statevar.CopyWarning) as caught:
        step(jnp.ones(3))
        again = v.value
        step(jnp.ones(3))
    assert len(caught) == 1
    message = str(caught[0].message)
    assert message.startswith("The statevar.jit function 'step' copied Variable 'weights'")
    assert HELD in message and caught[0].filename == __file__
    np.testing.assert_array_equal(read, np.zeros(3))
    np.testing.assert_array_equal(v.value, np.full(3, 2.0))
    del again


@pytest.mark.parametrize("warm", [False, True], ids=["first call", "warm call"])
def test_raise_refuses_a_compiled_step_and_changes_no_variable(warm):
    held = statevar.Variable(jnp.arange(3.0), name="held")
    free = statevar.Variable(jnp.zeros(2), name="free")

    @statevar.jit
    def step():
        held.assign_add(1.0)
        free.assign_add(1.0)

    if warm:
        step()
    arrays = weakref.ref(held._value), weakref.ref(free._value)
    read = held.value
    with statevar.copy_policy("raise"):
        with pytest.raises(statevar.CopyError, match="'step' would copy Variable 'held'"):
            step()
    assert held._value is arrays[0]() and free._value is arrays[1]()
    assert not held._value.is_deleted() and not free._value.is_deleted()
    del read
    with statevar.copy_policy("raise"):
        step()  # the read is gone: donated
    np.testing.assert_array_equal(held.value, [1.0, 2.0, 3.0] if not warm else [2.0, 3.0, 4.0])


def test_no_copy_diagnosis_when_donation_works():
    v = statevar.Variable(jnp.zeros(3), name="v")
    step = _step_for(v)
    with statevar.copy_policy("raise"), warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            v.assign_add(1.0)
            v[0] = 2.0
            step(jnp.ones(3))
    np.testing.assert_array_equal(v.value, [3.0, 6.0, 6.0])


def test_the_policy_is_no_part_of_a_trace_or_cache_key(first_calls):
    v = statevar.Variable(jnp.zeros(3), name="v")

    @statevar.jit
    @chex.assert_max_traces(n=1)
    def step():
        v.assign_add(1.0)

    step()
    v.assign_add(1.0)
    compiled = len(first_calls)
    for policy in ("silent", "warn", "raise"):
        with statevar.copy_policy(policy):
            step()
            v.assign_add(1.0)
    assert len(first_calls) == compiled  # no update or step compiled again
    np.testing.assert_array_equal(v.value, np.full(3, 8.0))


# --------------------------------------------------------------------------- refused by JAX


CAUSES = [
    ("first_donation_unaliased", "XLA found no output of the compiled call"),
    ("no_donation_on_cpu", "platform does not implement buffer donation"),
]


@pytest.mark.parametrize(("cause", "reason"), CAUSES, ids=["not aliased", "unsupported"])
def test_an_eager_update_whose_donation_jax_refuses_warns(request, cause, reason):
    request.getfixturevalue(cause)
    shape = (13, 7) if cause == "no_donation_on_cpu" else (11, 3)  # lowered afresh
    v = statevar.Variable(jnp.zeros(shape), name="refused")
    with statevar.copy_policy("warn"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        v.assign_add(1.0)
        v.assign_add(1.0)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1, messages  # JAX's own warning is replaced by statevar's
    if cause == "no_donation_on_cpu":
        assert f"the {v.device.platform} platform" in messages[0]
    assert caught[0].category is statevar.CopyWarning
    assert "assign_add copied Variable 'refused'" in messages[0] and reason in messages[0]
    np.testing.assert_array_equal(v.value, np.full(shape, 2.0))


@pytest.mark.parametrize(("cause", "reason"), CAUSES, ids=["not aliased", "unsupported"])
def test_raise_refuses_an_eager_update_jax_would_copy(request, cause, reason):
    request.getfixturevalue(cause)
    shape = (13, 9) if cause == "no_donation_on_cpu" else (11, 5)
    v = statevar.Variable(jnp.ones(shape), name="refused")
    before = weakref.ref(v._value)
    with statevar.copy_policy("raise"):
        with pytest.raises(statevar.CopyError, match=f"Variable 'refused' .*{reason}"):
            v.assign_add(1.0)
        with pytest.raises(statevar.CopyError, match="'refused'"):  # still refused
            v.assign_add(1.0)
    assert v._value is before() and not v._value.is_deleted()
    np.testing.assert_array_equal(v.value, np.ones(shape))


@pytest.mark.parametrize(("cause", "reason"), CAUSES, ids=["not aliased", "unsupported"])
def test_a_compiled_step_whose_donation_jax_refuses_warns_and_raises(request, cause, reason):
    request.getfixturevalue(cause)
    v = statevar.Variable(jnp.zeros(5), name="refused")
    step = _step_for(v)
    with statevar.copy_policy("raise"), pytest.raises(statevar.CopyError) as raised:
        step(jnp.ones(5))
    message = str(raised.value)
    del raised  # its traceback holds the arrays the step was given
    assert "The statevar.jit function 'step' would copy Variable 'refused'" in message
    assert reason in message
    np.testing.assert_array_equal(v.value, np.zeros(5))
    with statevar.copy_policy("warn"), pytest.warns(statevar.CopyWarning, match=reason):
        step(jnp.ones(5))  # JAX lowered it already: statevar remembers the refusal
    np.testing.assert_array_equal(v.value, np.ones(5))
    assert step.memory_report(jnp.ones(5)).variables[0].fate == "copied"


@pytest.mark.parametrize("inspect", ["lower", "memory_report"])
def test_a_refusal_found_by_lower_or_memory_report_is_the_calls_too(
    first_donation_unaliased, monkeypatch, inspect
):
    # JAX warns of a refused donation on its first lowering only, which these make; they
    # lower as a call does, holding the update lock (the warning filters are process state).
    v = statevar.Variable(jnp.zeros(7), name="inspected")
    step = _step_for(v)
    real_lower_checked = _copies.lower_checked
    locked = []

    def lower_checked(lower):
        locked.append(STATE.update_lock._is_owned())
        return real_lower_checked(lower)

    monkeypatch.setattr(_copies, "lower_checked", lower_checked)
    getattr(step, inspect)(jnp.ones(7))  # JAX's own warning would fail the test
    assert locked == [True]
    with statevar.copy_policy("raise"):
        with pytest.raises(statevar.CopyError, match="'inspected' .*XLA found no output"):
            step(jnp.ones(7))
    np.testing.assert_array_equal(v.value, np.zeros(7))


def test_a_refused_first_call_leaves_a_variable_placed_nowhere_uncommitted(
    first_donation_unaliased,
):
    # A committed argument commits the variables a first call lifts; a refusal undoes it.
    v = statevar.Variable(jnp.zeros(6), name="placed_nowhere")
    assert not v.value.committed
    before = weakref.ref(v._value)
    step = _step_for(v)
    argument = jax.device_put(jnp.ones(6), v.device)
    with statevar.copy_policy("raise"), pytest.raises(statevar.CopyError, match="'placed_nowhere'"):
        step(argument)
    assert v._value is before() and not v.value.committed
    np.testing.assert_array_equal(v.value, np.zeros(6))
    with statevar.copy_policy("silent"):
        step(argument)
    assert v.value.committed
    np.testing.assert_array_equal(v.value, np.ones(6))


@pytest.mark.parametrize("call", ["eager", "compiled"])
def test_a_refused_donation_meets_the_policy_of_each_calls_time(first_donation_unaliased, call):
    # Once warned of, later calls copy in silence under "warn", and "raise" still refuses.
    v = statevar.Variable(jnp.zeros((5, 3)), name="refused")
    step = _step_for(v)

    def update():
        v.assign_add(jnp.ones((5, 3))) if call == "eager" else step(jnp.ones((5, 3)))

    with statevar.copy_policy("warn"), pytest.warns(statevar.CopyWarning, match="'refused'"):
        update()
    with statevar.copy_policy("warn"):
        for _ in range(3):  # the hot path and the warm call stay shut: no warning again
            update()
    with statevar.copy_policy("raise"):
        with pytest.raises(statevar.CopyError, match="'refused' .*XLA found no output"):
            update()
    np.testing.assert_array_equal(v.value, np.full((5, 3), 4.0))


# --------------------------------------------------------------------------- the setting


def test_set_copy_policy_sets_the_process_policy():
    try:
        statevar.set_copy_policy("silent")
        assert (_copies.POLICY.policy, _copies.POLICY.min_bytes) == ("silent", 0)
        statevar.set_copy_policy("raise", min_bytes=1024)
        assert (_copies.POLICY.policy, _copies.POLICY.min_bytes) == ("raise", 1024)
    finally:
        statevar.set_copy_policy("warn", min_bytes=64 * 2**20)


def test_copy_policy_puts_the_previous_policy_back_after_an_error():
    with pytest.raises(KeyError), statevar.copy_policy("raise", min_bytes=3):
        assert (_copies.POLICY.policy, _copies.POLICY.min_bytes) == ("raise", 3)
        raise KeyError
    assert (_copies.POLICY.policy, _copies.POLICY.min_bytes) == ("warn", 64 * 2**20)


@pytest.mark.parametrize(
    ("policy", "min_bytes", "error", "match"),
    [
        (
            "loud",
            0,
            ValueError,
            "Expected the copy policy to be 'silent', 'warn' or 'raise', got 'loud'",
        ),
        ("warn", 1.5, TypeError, "min_bytes to be an int, got float"),
        ("warn", True, TypeError, "min_bytes to be an int, got bool"),
        ("warn", -1, ValueError, "min_bytes to be >= 0, got -1"),
    ],
)
def test_set_copy_policy_refuses_bad_settings(policy, min_bytes, error, match):
    with pytest.raises(error, match=match):
        statevar.set_copy_policy(policy, min_bytes=min_bytes)
    with pytest.raises(error, match=match), statevar.copy_policy(policy, min_bytes=min_bytes):
        pass
    assert (_copies.POLICY.policy, _copies.POLICY.min_bytes) == ("warn", 64 * 2**20)
