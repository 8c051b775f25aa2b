"""Tests of `statevar._hotpath`, the C extension: the eager updates' hot path, beyond what
the update tests check with both implementations (the `eager_updates` fixture), and the
update lock. That the install built it, that statevar runs without it, and how its update
stands in for a Python method."""

import inspect
import pathlib
import signal
import subprocess
import sys
import threading

import jax.numpy as jnp
import numpy as np
import pytest

import statevar
from statevar import _hotpath, _state
from statevar._update import ASSIGN_ADD

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_the_install_built_the_c_hot_path_and_the_updates_use_it():
    for name in ("assign", "assign_add", "assign_sub"):
        assert isinstance(getattr(statevar.Variable, name), _hotpath.Update), name


def test_without_the_c_extension_statevar_runs_the_python_updates():
    program = """
import sys
sys.modules["statevar._hotpath"] = None  # as where it could not be compiled
import inspect
import jax.numpy as jnp
import statevar
assert inspect.isfunction(statevar.Variable.assign_add)
import threading
assert type(statevar._state.update_lock) is type(threading.RLock())
v = statevar.Variable(jnp.zeros(3))
for _ in range(3):
    v.assign_add(jnp.ones(3))
print(v.numpy().tolist())
"""
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert result.stdout.strip() == "[3.0, 3.0, 3.0]"


def test_an_update_method_introspects_as_its_python_update():
    method = statevar.Variable.assign_add
    python = method.__wrapped__
    assert inspect.isfunction(python)
    assert method.__name__ == python.__name__ == "assign_add"
    assert method.__doc__ == python.__doc__ and "in place" in method.__doc__
    v = statevar.Variable(jnp.zeros(2))
    assert v.assign_add.__self__ is v
    assert str(inspect.signature(v.assign_add)) == str(inspect.signature(python.__get__(v)))


def test_keywords_and_wrong_argument_counts_are_the_python_updates():
    v = statevar.Variable(jnp.zeros(2), name="v")
    v.assign(value=jnp.ones(2))
    np.testing.assert_array_equal(v.numpy(), np.ones(2))
    with pytest.raises(TypeError, match=r"assign_add\(\) missing 1 required positional"):
        v.assign_add()
    with pytest.raises(TypeError, match=r"assign_add\(\) takes 2 positional arguments"):
        v.assign_add(1.0, 2.0)
    np.testing.assert_array_equal(v.numpy(), np.ones(2))


def test_an_update_needs_a_slot_and_an_operation_with_kernels():
    python = statevar.Variable.assign_add.__wrapped__
    with pytest.raises(ValueError, match=r"Update: slot must be >= 0, got -1"):
        _hotpath.Update(ASSIGN_ADD, -1, python)
    with pytest.raises(AttributeError, match=r"donating"):
        _hotpath.Update(object(), 1, python)


def test_configure_takes_a_one_item_flag_and_set_array_type_a_type():
    with pytest.raises(ValueError, match=r"the donating flag is a one-item list"):
        _hotpath.configure(_state.update_lock, [False, False], _state)
    with pytest.raises(TypeError, match=r"set_array_type: expected a type, got 3"):
        _hotpath.set_array_type(3)
    # Neither changed what the updates use.
    v = statevar.Variable(jnp.zeros(2))
    for _ in range(3):
        v.assign_add(jnp.ones(2))
    np.testing.assert_array_equal(v.numpy(), np.full(2, 3.0))


def test_a_warm_update_runs_in_c_and_anything_else_in_python(monkeypatch):
    python = statevar.Variable.assign_add.__wrapped__
    calls = []

    def recording(variable, value):
        calls.append(value)
        return python(variable, value)

    monkeypatch.setattr(statevar.Variable, "assign_add", _hotpath.Update(ASSIGN_ADD, 1, recording))
    v = statevar.Variable(jnp.zeros(3), name="v")
    one = jnp.ones(3)
    v.assign_add(one)  # compiles the donating call and opens the hot path
    assert len(calls) == 1
    for _ in range(3):
        v.assign_add(one)
    assert len(calls) == 1
    v.assign_add(1.0)  # a Python float: converted on the general path
    v.assign_add(jnp.ones(3, jnp.int32))  # another abstract value
    assert len(calls) == 3
    np.testing.assert_array_equal(v.numpy(), np.full(3, 6.0))


# ----------------------------------------------------------------------- the update lock


def test_the_update_lock_is_the_c_lock_and_reentrant():
    lock = _state.update_lock
    assert isinstance(lock, _hotpath.Lock)
    with lock:
        with lock:
            assert lock._is_owned()
        assert lock._is_owned()
    assert not lock._is_owned()


def test_a_lock_excludes_other_threads_until_released_as_often_as_acquired():
    lock = _hotpath.Lock()
    lock.acquire()
    lock.acquire()
    taken = threading.Event()

    def take():
        with lock:
            taken.set()

    thread = threading.Thread(target=take)
    thread.start()
    assert not taken.wait(0.05)  # held twice by this thread
    lock.release()
    assert not taken.wait(0.05)
    lock.release()
    thread.join()
    assert taken.is_set() and not lock._is_owned()


def test_a_lock_refuses_a_release_it_does_not_hold_and_arguments():
    lock = _hotpath.Lock()
    with pytest.raises(RuntimeError, match=r"cannot release un-acquired lock"):
        lock.release()
    held = threading.Event()
    threading.Thread(target=lambda: (lock.acquire(), held.set())).start()
    held.wait()
    with pytest.raises(RuntimeError, match=r"cannot release un-acquired lock"):
        lock.release()  # held by the other thread
    with pytest.raises(TypeError, match=r"Lock\(\) takes no arguments"):
        _hotpath.Lock(True)


def test_a_signal_handler_raising_while_a_thread_waits_for_the_lock_ends_the_wait():
    lock, release = _hotpath.Lock(), threading.Event()
    held = threading.Event()

    def hold():
        with lock:
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(
        0.05, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT)
    )
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            lock.acquire()
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
        release.set()
        holder.join()
    assert not lock._is_owned()
    with lock:  # free again, and takes this thread
        assert lock._is_owned()


def test_a_lock_reset_after_fork_is_free():
    lock = _hotpath.Lock()
    held = threading.Event()
    threading.Thread(target=lambda: (lock.acquire(), held.set())).start()
    held.wait()
    lock._at_fork_reinit()  # as in a child process, where the holding thread is gone
    with lock:
        assert lock._is_owned()
