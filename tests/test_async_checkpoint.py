"""Saves written in the background: ``statevar.save(..., blocking=False)`` and
``CheckpointManager(..., async_save=True)``.

The promises tested: a save holds the values of its call, bit for bit, while the next steps
donate the same variables; a failed write is raised (by `PendingSave.wait`, the next save,
a restore, the manager's close), naming the step, the directory and the cause, and is
logged at exit if nothing raised it; a restore waits for a save in flight; a process killed
during a save leaves the previous checkpoint; the interpreter finishes saves in flight
before it exits.

orbax's background thread is held at a known point (`held_orbax_writes`) so that a save is
in flight for as long as a test needs, without timing.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import pathlib
import resource
import signal
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from orbax.checkpoint._src.checkpointers import async_checkpointer

import statevar
from statevar._checkpoint import async_saves as _async_saves
from statevar._checkpoint import manager as _manager
from statevar._checkpoint import save_restore as _save_restore
from statevar._checkpoint.targets import named_variables

APIS = ["save", "CheckpointManager"]


class Model(statevar.Module):
    def __init__(self):
        self.kernel = statevar.Variable(jnp.arange(12.0).reshape(3, 4) / 7)
        self.bias = statevar.Variable(jnp.linspace(-1.0, 1.0, 4))
        self.step = statevar.Variable(0, trainable=False, name="step")


def host_values(target):
    """The values of the target's variables, copied to the host, by checkpoint name."""
    return {name: np.array(variable.value) for name, variable in named_variables(target).items()}


def assert_bit_identical(got, expected):
    assert list(got) == list(expected)
    for name in expected:
        assert got[name].dtype == expected[name].dtype, name
        assert got[name].tobytes() == expected[name].tobytes(), name


class Saver:
    """One API's way to save into ``directory``: `statevar.save` or a CheckpointManager's
    numbered steps, in the background unless told otherwise."""

    def __init__(self, api, directory):
        self.api, self.directory = api, directory
        self.manager = statevar.CheckpointManager(directory, max_to_keep=2, async_save=True)

    def save(self, step, target, blocking=False):
        if self.api == "save":
            return statevar.save(self.directory, target, blocking=blocking)
        if blocking:
            return statevar.CheckpointManager(self.directory).save(step, target)
        return self.manager.save(step, target)

    def restore(self, target):
        if self.api == "save":
            return statevar.restore(self.directory, target)
        return self.manager.restore(target)


@pytest.fixture
def held_orbax_writes(monkeypatch):
    """Holds orbax's background thread, before it commits the data it writes, until the
    returned event is set (at the latest when the test ends)."""
    release = threading.Event()
    real = async_checkpointer._background_wait_for_commit_futures

    def wait_for_release(*args, **kwargs):
        release.wait()
        return real(*args, **kwargs)

    monkeypatch.setattr(async_checkpointer, "_background_wait_for_commit_futures", wait_for_release)
    yield release
    release.set()


# A data file larger than this cannot be written while `full_disk` is in effect.
_FILE_SIZE_LIMIT = 64 * 1024


@contextlib.contextmanager
def full_disk():
    """Simulates a full disk: no file this process writes can grow past 64 KiB
    (RLIMIT_FSIZE), and a write that would fails (EFBIG) instead of killing the process
    (SIGXFSZ ignored). tensorstore reports it as it reports a full disk (ENOSPC)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (_FILE_SIZE_LIMIT, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def big_variable():
    """256 KiB of random float32s: their data file outgrows `full_disk`'s limit."""
    values = np.random.default_rng(0).standard_normal(64 * 1024, dtype=np.float32)
    return statevar.Variable(values, name="big")


# --------------------------------------------------------------------------- donation


@pytest.mark.parametrize("api", APIS)
def test_a_save_in_flight_holds_its_calls_values_while_steps_donate_them(
    tmp_path, held_orbax_writes, api
):
    model = Model()
    optimizer = statevar.Optimizer(optax.adam(0.1), model)
    target = {"model": model, "optimizer": optimizer}
    loss_and_grads = statevar.value_and_grad(
        lambda: jnp.sum((model.kernel.value @ jnp.ones(4) - 1.0) ** 2) + jnp.sum(model.bias), model
    )

    @statevar.jit
    def train_step():
        _, grads = loss_and_grads()
        optimizer.apply(grads)
        model.step.assign_add(1)

    train_step()
    saver = Saver(api, tmp_path / "ckpt")
    expected = host_values(target)
    pending = saver.save(1, target)
    for _ in range(3):  # compiled steps donate every variable, eager updates too
        train_step()
        model.bias.assign_add(jnp.ones(4))
    assert not pending.is_done()  # the steps ran while orbax was writing
    assert int(model.step) == 4

    held_orbax_writes.set()
    pending.wait()
    assert pending.is_done()
    fresh = Model()
    fresh_target = {"model": fresh, "optimizer": statevar.Optimizer(optax.adam(0.1), fresh)}
    saver.restore(fresh_target)
    assert_bit_identical(host_values(fresh_target), expected)
    assert {"model/step", "optimizer/mu/kernel", "optimizer/nu/bias"} <= set(expected)


def test_only_the_first_update_after_a_save_copies(tmp_path, held_orbax_writes):
    """The save holds the array of its call: the next update copies it (one extra copy of
    the variable), every later update donates its own buffer again, in place."""
    w = statevar.Variable(jnp.zeros(1024), name="w")
    w.assign_add(1.0)
    saved = w.value.unsafe_buffer_pointer()
    pending = statevar.save(tmp_path, w, blocking=False)
    w.assign_add(1.0)
    copy = w.value.unsafe_buffer_pointer()
    w.assign_add(1.0)
    assert copy != saved and w.value.unsafe_buffer_pointer() == copy
    held_orbax_writes.set()
    pending.wait()
    w.assign_add(1.0)
    assert w.value.unsafe_buffer_pointer() == copy
    statevar.restore(tmp_path, w)
    np.testing.assert_array_equal(w.numpy(), np.ones(1024))


def test_the_copy_a_save_in_flight_costs_is_named_and_not_warned_of(tmp_path, held_orbax_writes):
    """A background save's one copy is by design: the copy policy "warn" lets it pass,
    "raise" refuses it naming the save, and a memory report names it."""
    w = statevar.Variable(jnp.zeros(1024), name="w")

    @statevar.jit
    def step():
        w.assign_add(1.0)

    step()
    pending = statevar.save(tmp_path, w, blocking=False)
    assert step.memory_report().variables[0].cause == "saving"
    with statevar.copy_policy("raise"):
        with pytest.raises(statevar.CopyError, match="Variable 'w'.*checkpoint save in flight"):
            w.assign_add(1.0)
        with pytest.raises(statevar.CopyError, match="Variable 'w'.*checkpoint save in flight"):
            step()
    assert float(w.numpy()[0]) == 1.0
    with statevar.copy_policy("warn"):
        step()  # copies for the save, silently (filterwarnings = error)
    held_orbax_writes.set()
    pending.wait()
    with statevar.copy_policy("raise"):
        step()  # the save let go: donated again
    assert float(w.numpy()[0]) == 3.0
    statevar.restore(tmp_path, w)
    assert float(w.numpy()[0]) == 1.0


# --------------------------------------------------------------------------- waiting


@pytest.mark.parametrize("api", [*APIS, "step directory"])
def test_a_restore_waits_for_the_save_in_flight(tmp_path, monkeypatch, held_orbax_writes, api):
    w = statevar.Variable([1.0, 1.0], name="w")
    saver = Saver("save" if api == "save" else "CheckpointManager", tmp_path / "ckpt")
    saver.save(1, w, blocking=True)
    w.assign([2.0, 2.0])
    pending = saver.save(2, w)
    w.assign([3.0, 3.0])
    check_untraced = _save_restore.check_untraced

    def release_when_restoring(action):
        if action == "restore":
            held_orbax_writes.set()  # only once the restore has started
        check_untraced(action)

    monkeypatch.setattr(_save_restore, "check_untraced", release_when_restoring)
    monkeypatch.setattr(_manager, "check_untraced", release_when_restoring)
    if api == "step directory":
        statevar.restore(tmp_path / "ckpt" / "2", w)
    else:
        saver.restore(w)
    assert pending.is_done()
    np.testing.assert_array_equal(w.numpy(), [2.0, 2.0])


def test_the_next_save_waits_for_the_one_in_flight(tmp_path, held_orbax_writes):
    w = statevar.Variable([1.0], name="w")
    manager = statevar.CheckpointManager(tmp_path, max_to_keep=None, async_save=True)
    first = manager.save(1, w)
    assert repr(first) == f"<PendingSave step 1 to {str(tmp_path)!r}: writing>"
    assert (first.step, first.directory) == (1, tmp_path)
    w.assign([2.0])
    held_orbax_writes.set()
    second = manager.save(2, w)
    assert first.is_done()
    manager.wait_until_finished()
    assert second.is_done() and repr(second).endswith(": done>")
    assert manager.all_steps() == [1, 2]


def test_background_saves_keep_max_to_keep_and_stay_quiet(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    w = statevar.Variable([0.0], name="w")
    with statevar.CheckpointManager(tmp_path / "run", max_to_keep=2, async_save=True) as manager:
        for step in range(1, 5):
            w.assign([float(step)])
            manager.save(step, w)
    assert manager.all_steps() == [3, 4]
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["3", "4"]
    statevar.save(tmp_path / "plain", w, blocking=False)
    statevar.save(tmp_path / "plain", w, blocking=False).wait()
    assert len(list((tmp_path / "plain").iterdir())) == 2  # the manifest and one data
    assert caplog.records == []


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize("api", APIS)
def test_a_full_disk_in_the_background_is_raised_by_wait_naming_step_directory_and_cause(
    tmp_path, api
):
    big = big_variable()
    saver = Saver(api, tmp_path / "ckpt")
    saver.save(1, big).wait()
    before = big.numpy()
    big.assign_add(1.0)
    where = "to" if api == "save" else "step 2 to"
    with full_disk():
        pending = saver.save(2, big)
        message = rf"Saving {where} '{tmp_path / 'ckpt'}' failed: File too large \(errno 27\)"
        with pytest.raises(statevar.CheckpointWriteError, match=message) as raised:
            pending.wait()
    assert raised.value.errno == errno.EFBIG and "Error writing" in str(raised.value)
    assert isinstance(raised.value.__cause__, ValueError)  # tensorstore's own error
    assert repr(pending).endswith(": failed>")
    with pytest.raises(statevar.CheckpointWriteError, match=message):
        pending.wait()  # as often as it is asked
    saver.restore(big)  # the failure was raised: the restore goes on, to the previous save
    np.testing.assert_array_equal(big.numpy(), before)


@pytest.mark.parametrize("api", APIS)
def test_a_failure_nobody_waited_for_is_raised_by_the_next_save_once(tmp_path, api):
    (tmp_path / "in-the-way").write_text("")  # the directory cannot be made
    w = statevar.Variable([1.0], name="w")
    saver = Saver(api, tmp_path / "in-the-way" / "ckpt")
    saver.save(3, w)
    (tmp_path / "in-the-way").unlink()
    where = "to" if api == "save" else "step 3 to"
    with pytest.raises(statevar.CheckpointWriteError, match=rf"Saving {where} '{tmp_path}"):
        saver.save(4, w)  # raises the failure of step 3, and saves nothing
    assert not (tmp_path / "in-the-way").exists()
    saver.save(4, w).wait()
    assert saver.restore(w).restored == ["w"]


def test_a_manager_raises_a_failure_from_wait_until_finished_and_close(tmp_path):
    big = big_variable()
    manager = statevar.CheckpointManager(tmp_path, async_save=True)
    with full_disk():
        manager.save(5, big)
        with pytest.raises(statevar.CheckpointWriteError, match="Saving step 5 to"):
            manager.wait_until_finished()
        manager.save(6, big)
        with pytest.raises(statevar.CheckpointWriteError, match="Saving step 6 to"):
            manager.close()
        manager.close()  # raised once: nothing more to raise
        with pytest.raises(statevar.CheckpointWriteError, match="Saving step 7 to"):
            with statevar.CheckpointManager(tmp_path, async_save=True) as closed_on_exit:
                closed_on_exit.save(7, big)
    assert manager.all_steps() == []


def test_a_restore_raises_the_failure_of_the_save_it_waited_for(tmp_path):
    big = big_variable()
    statevar.save(tmp_path, big)
    with full_disk():
        statevar.save(tmp_path, big, blocking=False)
        with pytest.raises(statevar.CheckpointWriteError, match="File too large"):
            statevar.restore(tmp_path, big)
    assert statevar.restore(tmp_path, big).restored == ["big"]  # the previous checkpoint


@pytest.mark.parametrize("api", APIS)
def test_an_unwritable_directory_is_raised_by_wait(tmp_path, api):
    (tmp_path / "file").write_text("not a directory")
    w = statevar.Variable([1.0], name="w")
    pending = Saver(api, tmp_path / "file" / "ckpt").save(1, w)
    assert pending.is_done()
    with pytest.raises(statevar.CheckpointWriteError, match=r"Not a directory \(errno 20\)"):
        pending.wait()


@pytest.mark.parametrize("api", APIS)
def test_a_full_disk_in_a_blocking_save_raises_naming_step_directory_and_cause(tmp_path, api):
    big = big_variable()
    saver = Saver(api, tmp_path / "ckpt")
    saver.save(1, big, blocking=True)
    where = "to" if api == "save" else "step 2 to"
    with full_disk():
        with pytest.raises(OSError, match=rf"Saving {where} .*File too large") as raised:
            saver.save(2, big, blocking=True)
    assert isinstance(raised.value, statevar.CheckpointWriteError)
    assert isinstance(raised.value.__cause__, ValueError)  # tensorstore's own error
    assert saver.restore(big).restored == ["big"]


def test_an_interruption_that_orbax_wraps_is_raised_as_the_interruption(tmp_path, monkeypatch):
    def interrupted(*args):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as interrupt:
            raise ValueError("a failed write, wrapping it") from interrupt

    monkeypatch.setattr(_save_restore, "_write_data", interrupted)
    with pytest.raises(KeyboardInterrupt):
        statevar.save(tmp_path, statevar.Variable([1.0], name="w"))


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("wrapped", [True, False], ids=["wrapped by orbax", "plain"])
def test_an_interruption_starting_a_background_save_is_raised_at_once(
    tmp_path, monkeypatch, api, wrapped
):
    closed = []

    def interrupted():
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as interrupt:
            if not wrapped:
                raise
            raise ValueError("a failed write, wrapping it") from interrupt

    def start_data(path, arrays):
        interrupted()

    def save_data(self, manager, step, snapshot):
        close = manager.close
        monkeypatch.setattr(manager, "close", lambda: (closed.append(step), close()))
        interrupted()

    monkeypatch.setattr(_save_restore, "_start_data", start_data)
    monkeypatch.setattr(_manager.CheckpointManager, "_save_data", save_data)
    w = statevar.Variable([1.0], name="w")
    saver = Saver(api, tmp_path / "ckpt")
    with pytest.raises(KeyboardInterrupt):
        saver.save(1, w)
    assert closed == ([] if api == "save" else [1])  # orbax's manager stopped, none left
    monkeypatch.undo()
    w.assign([2.0])
    saver.save(2, w).wait()  # the interruption is no failure left to report
    w.assign([0.0])
    saver.restore(w)
    np.testing.assert_array_equal(w.numpy(), [2.0])


def test_async_save_must_be_a_bool(tmp_path):
    with pytest.raises(TypeError, match="Expected async_save to be True or False, got str 'yes'"):
        statevar.CheckpointManager(tmp_path, async_save="yes")


@pytest.mark.parametrize("api", APIS)
def test_background_saves_are_refused_under_jax_distributed(tmp_path, monkeypatch, api):
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(statevar.StatevarError, match="Cannot save in the background with 2 proc"):
        Saver(api, tmp_path / "ckpt").save(1, statevar.Variable([1.0], name="w"))
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "background"])
def test_a_save_in_another_thread_holds_its_arrays_as_a_save_from_its_read_on(
    tmp_path, monkeypatch, api, blocking
):
    # Its copy is the save's doing from the moment the save reads the values, before orbax
    # takes them: the policy "warn" lets it pass, "raise" names the save.
    w = statevar.Variable(jnp.zeros(256), name="w")
    read, release = threading.Event(), threading.Event()
    real_settle = _save_restore.settle

    def settle(directory):  # the save has read the values and holds the directory's lock
        read.set()
        release.wait()
        real_settle(directory)

    monkeypatch.setattr(_save_restore, "settle", settle)
    monkeypatch.setattr(_manager, "settle", settle)
    saved = []
    saver = Saver(api, tmp_path / "ckpt")
    thread = threading.Thread(target=lambda: saved.append(saver.save(1, w, blocking=blocking)))
    thread.start()
    try:
        read.wait()
        with statevar.copy_policy("raise"):
            with pytest.raises(statevar.CopyError, match="Variable 'w'.*checkpoint save in fli"):
                w.assign_add(1.0)
        with statevar.copy_policy("warn"):
            w.assign_add(1.0)  # copies for the save, silently (filterwarnings = error)
    finally:
        release.set()
        thread.join()
    if not blocking:
        saved[0].wait()
    with statevar.copy_policy("raise"):
        w.assign_add(1.0)  # the save let go: donated again
    w.assign(jnp.full(256, 7.0))
    saver.restore(w)
    np.testing.assert_array_equal(w.numpy(), np.zeros(256))  # the values the save read


@pytest.mark.parametrize("api", APIS)
@pytest.mark.usefixtures("default_sigint_handler")
def test_an_interruption_as_a_background_save_starts_waits_until_it_is_registered(
    tmp_path, monkeypatch, held_orbax_writes, api
):
    real_thread = threading.Thread

    class Interrupted(real_thread):
        def start(self):
            super().start()
            if self.name == "statevar-save":  # the save's thread: orbax's start no signal
                signal.raise_signal(signal.SIGINT)  # before the save is registered

    monkeypatch.setattr(threading, "Thread", Interrupted)
    w = statevar.Variable([1.0], name="w")
    saver = Saver(api, tmp_path / "ckpt")
    with pytest.raises(KeyboardInterrupt):
        saver.save(1, w)
    monkeypatch.setattr(threading, "Thread", real_thread)
    # Raised once the save was registered: a restore waits for it.
    assert str((tmp_path / "ckpt").resolve()) in _async_saves._in_flight
    held_orbax_writes.set()
    w.assign([0.0])
    saver.restore(w)
    np.testing.assert_array_equal(w.numpy(), [1.0])


# --------------------------------------------------------------------------- processes

# In a process of its own: pytest's log capture keeps the records orbax logs of a failed
# write, and with them the frames that hold the arrays it was writing.
_FAILED = """
import pathlib, resource, signal, sys, weakref
import numpy as np
import statevar

directory = pathlib.Path(sys.argv[1])
(directory / "file").write_text("not a directory")
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
for api in ("save", "CheckpointManager"):
    for when in ("starting", "writing"):
        big = statevar.Variable(np.ones(64 * 1024, np.float32), name="big")
        array = weakref.ref(big._value)
        where = directory / ("file" if when == "starting" else f"{api}-{when}") / "ckpt"
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
        if api == "save":
            pending = statevar.save(where, big, blocking=False)
        else:
            pending = statevar.CheckpointManager(where, async_save=True).save(1, big)
        pending._done.wait()  # failed; nothing has raised it yet
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        big.assign_add(1.0)  # the save's array is the only other holder of the old one
        freed = array() is None
        try:
            pending.wait()
        except statevar.CheckpointWriteError as error:
            notes = getattr(error.__cause__, "__notes__", [])
            noted = any(n.startswith("Raised in the background save, at:") for n in notes)
        print(api, when, "freed" if freed else "held", "noted" if noted else "no note")
"""


def test_a_failed_background_save_lets_go_of_its_arrays_before_anything_raises_it(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", _FAILED, str(tmp_path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"{api} {when} freed noted" for api in APIS for when in ("starting", "writing")
    ], result.stdout


_KILLED = """
import pathlib, sys, threading
import numpy as np
from orbax.checkpoint._src.checkpointers import async_checkpointer
import statevar
from statevar._checkpoint import manager as _manager

directory = pathlib.Path(sys.argv[1])
w = statevar.Variable(np.arange(4096, dtype=np.float32), name="w")
statevar.save(directory / "plain", w)
manager = statevar.CheckpointManager(directory / "run", async_save=True)
manager.save(1, w).wait()

def hold(where, real=None):
    def held(*args, **kwargs):
        if real is not None and "plain" not in str(args[0]):
            return real(*args, **kwargs)
        print("held", where, flush=True)
        threading.Event().wait()
    return held

async_checkpointer._background_wait_for_commit_futures = hold(
    "while orbax writes", async_checkpointer._background_wait_for_commit_futures
)
_manager.write_manifest = hold("before the manifest")
w.assign_add(1.0)
statevar.save(directory / "plain", w, blocking=False)
manager.save(2, w)
w.assign_add(1.0)
threading.Event().wait()
"""


def test_a_process_killed_during_background_saves_leaves_the_previous_checkpoints(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    held = {child.stdout.readline(), child.stdout.readline()}
    assert held == {"held while orbax writes\n", "held before the manifest\n"}, child.stderr
    child.send_signal(signal.SIGKILL)
    child.communicate()
    assert child.returncode == -signal.SIGKILL

    w = statevar.Variable(np.zeros(4096, np.float32), name="w")
    statevar.restore(tmp_path / "plain", w)
    np.testing.assert_array_equal(w.numpy(), np.arange(4096))
    manager = statevar.CheckpointManager(tmp_path / "run", async_save=True)
    assert manager.all_steps() == [1]
    w.assign_add(5.0)
    manager.restore(w)
    np.testing.assert_array_equal(w.numpy(), np.arange(4096))
    # The next saves clear what the killed ones left.
    statevar.save(tmp_path / "plain", w, blocking=False).wait()
    assert len(list((tmp_path / "plain").iterdir())) == 2
    manager.save(2, w).wait()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["1", "2"]


_EXITING = """
import os, pathlib, signal, sys, threading
import numpy as np
from orbax.checkpoint._src.checkpointers import async_checkpointer
import statevar
from statevar._state import STATE  # imported before the fork: a child imports nothing

directory = pathlib.Path(sys.argv[1])
exiting = threading.Event()
threading._register_atexit(exiting.set)  # set as the interpreter starts to exit
real = async_checkpointer._background_wait_for_commit_futures

def once_exiting(*args, **kwargs):
    exiting.wait()  # so that the save is still in flight when the interpreter exits
    return real(*args, **kwargs)

async_checkpointer._background_wait_for_commit_futures = once_exiting
w = statevar.Variable(np.arange(4, dtype=np.float32), name="w")
statevar.save(directory / "written", w, blocking=False)
(directory / "file").write_text("")
statevar.save(directory / "file" / "unwritable", w, blocking=False)
child = os.fork()  # a child has no thread of these saves: it exits without them
if child == 0:
    signal.alarm(60)  # one waiting for them would wait forever: killed, it fails the test
    # The interpreter's exit up to its own teardown, whose C++ part (jaxlib's thread pools,
    # which a forked child lacks) may deadlock after a fork: JAX warns that it will.
    threading._shutdown()  # runs the exit hooks that wait for saves in flight
    os._exit(3 if STATE.saved_arrays else 0)  # nor counts the arrays they hold as held
print("forked child:", os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]), flush=True)
"""


_AT_EXIT = """
import atexit, pathlib, sys
import statevar

directory = pathlib.Path(sys.argv[1])
w = statevar.Variable([1.0], name="w")
manager = statevar.CheckpointManager(directory / "run", async_save=True)

def last_saves():  # too late for orbax, which needs thread pools the interpreter has shut
    statevar.save(directory / "plain", w, blocking=False)
    manager.save(9, w)
    print("saves started", flush=True)

atexit.register(last_saves)
"""


def test_a_background_save_started_as_the_interpreter_exits_logs_its_failure(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", _AT_EXIT, str(tmp_path)], capture_output=True, text=True
    )
    assert result.stdout == "saves started\n", result.stderr
    failed = "A checkpoint save failed and nothing waited for it: Saving"
    assert f"{failed} to '{tmp_path / 'plain'}' failed" in result.stderr, result.stderr
    assert f"{failed} step 9 to '{tmp_path / 'run'}' failed" in result.stderr, result.stderr


@pytest.mark.skipif(
    (3, 12, 0) <= sys.version_info[:3] < (3, 12, 3),
    reason="CPython 3.12.0 to 3.12.2 refuse to start threads while the interpreter exits, "
    "which orbax's write needs (python/cpython#113964, fixed in 3.12.3)",
)
def test_the_interpreter_finishes_saves_in_flight_and_reports_failures_as_it_exits(tmp_path):
    """A forked child, which has none of these saves' threads, exits without them."""
    result = subprocess.run(
        [sys.executable, "-c", _EXITING, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "forked child: 0\n", result.stderr
    w = statevar.Variable(np.zeros(4, np.float32), name="w")
    statevar.restore(tmp_path / "written", w)
    np.testing.assert_array_equal(w.numpy(), np.arange(4))
    unwritable = pathlib.Path(tmp_path, "file", "unwritable")
    assert (
        "A checkpoint save failed and nothing waited for it: Saving to "
        f"'{unwritable}' failed: Not a directory (errno 20)" in result.stderr
    )
