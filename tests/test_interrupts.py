"""Tests that an exception raised at any bytecode (Ctrl-C, a signal handler's) never leaves a
variable holding a deleted array, on every update path.

Each trial loops an update in the main thread until a timer thread interrupts it with
SIGINT after a few milliseconds, then checks that every variable holds its old or its new
value and takes the next update. Where the interrupt lands varies from run to run; what is
asserted holds wherever it lands.
"""

import builtins
import contextlib
import pathlib
import random
import signal
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import statevar

TRIALS = 20

# An interrupt that lands in a callback run by the garbage collector (JAX registers one that
# frees XLA buffers) is reported by Python as "Exception ignored in ..." and swallowed: the
# trial then ends without an interrupt (see `_interrupted`), and the warning is expected.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture(autouse=True)
def _default_sigint_handler(default_sigint_handler):
    """Every test here interrupts with SIGINT (see `default_sigint_handler`)."""


def _interrupted(loop, delays):
    """Runs ``loop`` once per delay, interrupting it with SIGINT after that many seconds.

    Python may swallow an interrupt that lands in a finalizer or a callback run by the garbage
    collector ("Exception ignored in ..."): a trial whose loop goes on well after the signal
    was sent ends without an interrupt, and most trials must still be interrupted.
    """
    main = threading.main_thread().ident
    interrupted = 0
    for delay in delays:
        timer = threading.Timer(delay, signal.pthread_kill, (main, signal.SIGINT))
        try:
            timer.start()
            after_signal = 0
            while after_signal < 200:
                loop()
                if timer.finished.is_set():
                    after_signal += 1
        except (KeyboardInterrupt, ValueError) as error:
            if not _is_interrupt(error):
                raise
            interrupted += 1
        finally:
            timer.cancel()
            timer.join()
        yield
    assert interrupted >= len(delays) // 2, f"only {interrupted} of {len(delays)} interrupted"


def _is_interrupt(error):
    """Whether ``error`` is the trial's interrupt: a ``KeyboardInterrupt``, or one that landed
    in a JAX cache's key compare, which JAX reports as a ``ValueError`` caused by it or
    holding its traceback (see
    `test_jax_reports_an_interrupt_in_a_cache_key_compare_as_a_value_error`).
    """
    return (
        isinstance(error, KeyboardInterrupt)
        or isinstance(error, ValueError)
        and (isinstance(error.__cause__, KeyboardInterrupt) or "\nKeyboardInterrupt" in str(error))
    )


def _delays(seed, low=0.001, high=0.008):
    rng = random.Random(seed)
    return [rng.uniform(low, high) for _ in range(TRIALS)]


def _assert_intact(variable):
    assert not variable.value.is_deleted()
    return variable.numpy()


class _InterruptedCompare:
    """A static argument whose compare with an equal-hashing one is interrupted."""

    def __hash__(self):
        return 0

    def __eq__(self, other):
        raise KeyboardInterrupt


def test_jax_reports_an_interrupt_in_a_cache_key_compare_as_a_value_error():
    # JAX wraps an exception raised while it compares cache keys (a static argument's, a
    # pytree's metadata, and from jax 0.12 its trace caches' keys, compared in Python) in a
    # ValueError: a Ctrl-C landing there reaches the caller so. A step it ends leaves its
    # variables intact.
    v = statevar.Variable(jnp.zeros(4), name="v")
    add_one = jax.jit(lambda key, x: x + 1.0, static_argnums=0)
    add_one(_InterruptedCompare(), jnp.zeros(4))
    interrupted = True

    @statevar.jit
    def step():
        key = _InterruptedCompare() if interrupted else object()
        v.assign(add_one(key, v.value))

    with pytest.raises(ValueError) as caught:
        step()
    assert _is_interrupt(caught.value)
    np.testing.assert_array_equal(_assert_intact(v), np.zeros(4))
    interrupted = False
    step()
    np.testing.assert_array_equal(v.numpy(), np.ones(4))


@pytest.mark.parametrize(
    "update, step",
    [
        (lambda v: v.assign_add(1.0), 1.0),
        (lambda v: v.assign_sub(1.0), -1.0),
        (lambda v: v.assign_add(jnp.ones(8)), 1.0),
    ],
    ids=["assign_add", "assign_sub", "assign_add_array"],
)
@pytest.mark.parametrize("device", [None, "cpu:0"], ids=["uncommitted", "placed"])
def test_an_interrupted_eager_update_leaves_the_old_or_the_new_value(update, step, device):
    v = statevar.Variable(jnp.zeros(8), name="v", device=device)
    completed = 0

    def loop():
        nonlocal completed
        update(v)
        completed += 1

    for _ in _interrupted(loop, _delays(0)):
        value = _assert_intact(v)
        # The interrupt landed before the update, inside it, or after it returned.
        assert value[0] in (step * completed, step * (completed + 1))
        completed = round(value[0] / step)
        update(v)
        completed += 1
        np.testing.assert_array_equal(v.numpy(), np.full(8, step * completed))


@pytest.mark.parametrize(
    "update",
    [
        lambda v, i: v.assign(jnp.full(8, i, jnp.float32)),  # not weakly typed: the hot path
        lambda v, i: v.__setitem__(i % 8, float(i)),
        lambda v, i: v.__setitem__(v < 0, float(i)),
    ],
    ids=["assign", "setitem", "setmask"],
)
def test_an_interrupted_assignment_leaves_a_readable_variable(update):
    v = statevar.Variable(jnp.zeros(8), name="v")
    counter = iter(range(10**9))

    def loop():
        update(v, next(counter))

    for _ in _interrupted(loop, _delays(1)):
        _assert_intact(v)
        v.assign(jnp.arange(8.0))
        np.testing.assert_array_equal(v.numpy(), np.arange(8.0))


def test_an_interrupted_compiled_step_leaves_every_variable_old_or_new():
    a = statevar.Variable(jnp.zeros(16), name="a")
    b = statevar.Variable(jnp.zeros(16), name="b")

    @statevar.jit
    def step():
        a.assign_add(1.0)
        b.assign_sub(1.0)
        return a.value.sum()

    completed = 0

    def loop():
        nonlocal completed
        step()
        completed += 1

    for _ in _interrupted(loop, _delays(2)):
        first, second = _assert_intact(a), _assert_intact(b)
        # One compiled call updates both, or neither.
        assert first[0] == -second[0]
        assert first[0] in (completed, completed + 1)
        completed = int(first[0])
        step()
        completed += 1
        assert float(a[0]) == completed == -float(b[0])


def test_an_interrupted_first_call_of_a_compiled_step_leaves_the_variables_intact():
    # Each trial compiles a new step: its first call traces, compiles and runs Python code
    # after donating, where the signal handlers are held.
    v = statevar.Variable(jnp.zeros(4), name="v")
    offsets = iter(range(10**9))

    def loop():
        offset = float(next(offsets))

        @statevar.jit
        def step():
            v.assign(v.value * 0.0 + offset)

        step()

    for _ in _interrupted(loop, _delays(3, 0.005, 0.05)):
        _assert_intact(v)
        v.assign_add(1.0)


def test_an_interrupted_optimizer_step_leaves_parameters_and_state_readable():
    w = statevar.Variable(jnp.ones(32), name="w")
    opt = statevar.Optimizer(optax.adam(1e-3), w)
    grads = jnp.ones(32)

    def loop():
        opt.apply(grads)

    for _ in _interrupted(loop, _delays(4)):
        _assert_intact(w)
        for state in opt.state_variables:
            _assert_intact(state)
        before = w.numpy()
        opt.apply(grads)
        assert (w.numpy() < before).all()


# An interrupt during orbax's reads leaves its event loop, files and coroutines to the garbage
# collector, which warns: orbax's own clean-up, not statevar's.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
def test_an_interrupted_restore_leaves_every_variable_old_or_restored(tmp_path, collect_garbage):
    a = statevar.Variable(jnp.full(64, 1.0), name="a")
    b = statevar.Variable(jnp.full(64, 2.0), name="b")
    statevar.save(tmp_path / "ckpt", [a, b])

    def loop():
        a.assign(jnp.full(64, -1.0))
        b.assign(jnp.full(64, -2.0))
        statevar.restore(tmp_path / "ckpt", [a, b])

    # Restores take longer than updates: spread the interrupts over a whole one.
    for _ in _interrupted(loop, _delays(5, 0.001, 0.06)):
        assert _assert_intact(a)[0] in (1.0, -1.0)
        assert _assert_intact(b)[0] in (2.0, -2.0)
        statevar.restore(tmp_path / "ckpt", [a, b])
        assert float(a[0]) == 1.0 and float(b[0]) == 2.0
    # Finalize orbax's interrupted reads now, under this test's filters, not in a later test.
    collect_garbage()


@pytest.mark.parametrize(
    "update, step",
    [
        (lambda v, deltas: v.assign_add(statevar.PerReplica(deltas)), 4.0),
        (lambda v, deltas: v.assign_add(1.0), 1.0),
    ],
    ids=["per_replica", "cross_replica"],
)
def test_an_interrupted_on_read_update_leaves_the_old_or_the_new_value(update, step):
    mesh = jax.make_mesh((4,), ("data",), devices=jax.devices()[:4])
    with statevar.mesh(mesh):
        v = statevar.Variable(0.0, synchronization="on_read", aggregation="sum", name="v")
    deltas = jax.device_put(jnp.ones(4), v.replica_values.sharding)
    completed = 0

    def loop():
        nonlocal completed
        update(v, deltas)
        completed += 1

    for _ in _interrupted(loop, _delays(2)):
        assert not v.replica_values.is_deleted()
        value = float(v)
        assert value in (step * completed, step * (completed + 1))
        completed = round(value / step)
        update(v, deltas)
        completed += 1
        assert float(v) == step * completed


# ----------------------------------------------------------------------- the eager hot path


@pytest.fixture
def general_path(monkeypatch):
    """Counts the eager updates that leave the hot path for `Variable._update`."""
    counted = []
    real = statevar.Variable._update

    def counting(self, *args, **kwargs):
        counted.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(statevar.Variable, "_update", counting)
    return counted


def test_the_first_donating_update_holds_signal_handlers_after_copying_ones(
    first_calls, general_path
):
    v = statevar.Variable(jnp.zeros(4), name="v")
    one = jnp.ones(4)
    for _ in range(2):
        read = v.value  # held: the update copies, which donates nothing
        v.assign_add(one)
    assert first_calls == [] and len(general_path) == 2

    del read
    # JAX's first call of the donating update runs its Python code after donating.
    v.assign_add(one)
    assert first_calls == [1] and len(general_path) == 3
    # The hot path from then on, copying while something holds the array.
    v.assign_add(one)
    read = v.value
    v.assign_add(one)
    assert first_calls == [1] and len(general_path) == 3
    np.testing.assert_array_equal(read, np.full(4, 4.0))
    np.testing.assert_array_equal(v.numpy(), np.full(4, 5.0))


def test_a_variable_committed_by_a_compiled_step_leaves_the_eager_hot_path(
    first_calls, general_path
):
    v = statevar.Variable(jnp.zeros(2), name="v")
    one = jnp.ones(2)
    v.assign_add(one)
    v.assign_add(one)
    assert len(general_path) == 1
    step = statevar.jit(lambda x: v.assign_add(x))

    # An argument committed to the variable's device commits the variable, for which JAX
    # compiles the eager update anew: its first call runs cold, holding signal handlers.
    step(jax.device_put(one, v.device))
    assert v.value.committed is True
    general, held = len(general_path), len(first_calls)
    v.assign_add(one)
    assert len(general_path) == general + 1 and len(first_calls) == held + 1
    v.assign_add(one)
    assert len(general_path) == general + 1 and len(first_calls) == held + 1
    np.testing.assert_array_equal(v.numpy(), np.full(2, 5.0))


def test_an_update_on_the_hot_paths_terms_inside_a_compiled_step_is_traced(general_path):
    v = statevar.Variable(jnp.zeros(2), name="v")
    one = jnp.ones(2)
    v.assign_add(one)
    v.assign_add(one)  # the hot path is open for this update

    @statevar.jit
    def step():
        v.assign_add(one)
        return v.value

    np.testing.assert_array_equal(step(), np.full(2, 3.0))
    np.testing.assert_array_equal(step(), np.full(2, 4.0))
    np.testing.assert_array_equal(v.numpy(), np.full(2, 4.0))


def _on_the_hot_path(update):
    """A variable of four zeros whose eager hot path is open for ``update`` (a method
    name), and the value that takes it there: ones."""
    v = statevar.Variable(jnp.zeros(4), name="v")
    one = jnp.ones(4)
    getattr(v, update)(one)
    getattr(v, update)(one)
    return v, one


def _ctrl_c_on_leaving(held_signals):
    """``held_signals`` with a Ctrl-C pressed inside: the handlers defer it, and it is raised
    as they come back, as a Ctrl-C during JAX's first call is."""

    @contextlib.contextmanager
    def interrupted():
        with held_signals():
            yield
            signal.raise_signal(signal.SIGINT)

    return interrupted


def test_a_ctrl_c_ending_an_update_that_commits_the_variable_closes_the_hot_path(
    monkeypatch, general_path
):
    v, one = _on_the_hot_path("assign")
    real = statevar._cell.variable.held_signals
    monkeypatch.setattr(statevar._cell.variable, "held_signals", _ctrl_c_on_leaving(real))

    with pytest.raises(KeyboardInterrupt):
        v.assign(jax.device_put(one, v.device))  # commits the variable
    monkeypatch.setattr(statevar._cell.variable, "held_signals", real)

    assert v.value.committed is True
    general = len(general_path)
    v.assign(one)  # compiled anew for a committed variable: the general path holds handlers
    assert len(general_path) == general + 1
    np.testing.assert_array_equal(v.numpy(), np.ones(4))


def test_a_ctrl_c_ending_a_first_call_that_commits_a_variable_closes_its_hot_path(
    monkeypatch, general_path
):
    v, one = _on_the_hot_path("assign_add")
    pinned = jax.sharding.make_single_device_sharding(v.device)

    @statevar.jit
    def step():
        v.assign(jax.lax.with_sharding_constraint(v.value + 1.0, pinned))

    real = statevar._compile.step.held_signals
    monkeypatch.setattr(statevar._compile.step, "held_signals", _ctrl_c_on_leaving(real))
    with pytest.raises(KeyboardInterrupt):
        step()  # commits the variable
    monkeypatch.setattr(statevar._compile.step, "held_signals", real)

    assert v.value.committed is True
    general = len(general_path)
    v.assign_add(one)
    assert len(general_path) == general + 1
    np.testing.assert_array_equal(v.numpy(), np.full(4, 4.0))


def test_an_interrupted_reshard_leaves_the_variable_where_it_was(monkeypatch):
    v, one = _on_the_hot_path("assign_add")
    home = v.device

    def interrupted(self):  # a signal handler raising as reshard starts its bookkeeping
        raise KeyboardInterrupt

    monkeypatch.setattr(statevar.Variable, "_forget_compiled", interrupted)
    with pytest.raises(KeyboardInterrupt):
        v.reshard(jax.devices()[1])
    monkeypatch.undo()

    assert v.device == home and v.value.committed is False
    v.assign_add(one)
    np.testing.assert_array_equal(v.numpy(), np.full(4, 3.0))


# ------------------------------------------------------------- signal handlers using variables


class _HandlerInTheWindow:
    """Runs a SIGUSR1 handler in the middle of one update: when ``wrapped`` (a callable the
    update calls between reading the reference count and the donating call) is next called.
    """

    def __init__(self, monkeypatch, handler):
        self.kept = []
        signal.signal(signal.SIGUSR1, lambda *_: handler(self.kept))
        self._monkeypatch = monkeypatch

    def arm(self, namespace, name):
        real = namespace.get(name) or getattr(builtins, name)

        fired = []

        def raise_signal_then_call(*args):
            namespace[name] = real
            if not fired:  # once: the update may have looked the name up twice
                fired.append(True)
                signal.raise_signal(signal.SIGUSR1)  # the handler runs right after this
            return real(*args)

        self._monkeypatch.setitem(namespace, name, raise_signal_then_call)


def _paths(v):
    """(name, update, namespace, name) for each update path: ``update`` runs it, and the
    callable ``name`` in ``namespace`` is what it calls between reading the reference count
    and donating."""
    one = jnp.ones(4)

    @statevar.jit
    def step():
        v.assign_add(1.0)

    for update in (lambda: v.assign_add(one), lambda: v.assign_add(1.0), step):
        update()
        update()  # warm: the hot path is open, the step compiled
    variable_globals = vars(statevar._cell.variable)
    return [
        ("eager hot path", lambda: v.assign_add(one), variable_globals, "map"),
        ("eager general path", lambda: v.assign_add(1.0), variable_globals, "_starmap"),
        ("compiled step", step, vars(statevar._compile.step), "sum"),
    ]


@pytest.fixture
def _sigusr1():
    previous = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, previous)


@pytest.mark.usefixtures("_sigusr1")
def test_a_signal_handler_reading_during_an_update_keeps_a_valid_array(monkeypatch):
    v = statevar.Variable(jnp.zeros(4), name="v")
    window = _HandlerInTheWindow(monkeypatch, lambda kept: kept.append(v.value))
    for name, update, namespace, wrapped in _paths(v):
        before = v.numpy()
        window.arm(namespace, wrapped)
        update()
        (kept,) = window.kept
        window.kept.clear()
        # The array the handler read was about to be donated: it got a copy.
        assert not kept.is_deleted(), name
        np.testing.assert_array_equal(np.asarray(kept), before, err_msg=name)
        np.testing.assert_array_equal(v.numpy(), before + 1, err_msg=name)


@pytest.mark.usefixtures("_sigusr1")
def test_a_signal_handler_updating_during_an_update_is_refused_and_changes_nothing(monkeypatch):
    v = statevar.Variable(jnp.zeros(4), name="v")
    w = statevar.Variable(jnp.zeros(4), name="w")
    window = _HandlerInTheWindow(monkeypatch, lambda kept: w.assign_add(1.0))
    for name, update, namespace, wrapped in _paths(v):
        before = v.numpy()
        window.arm(namespace, wrapped)
        with pytest.raises(
            statevar.StatevarError,
            match=r"Cannot assign_add to Variable 'w' in a signal handler that interrupted "
            r"an update: .* Have the handler set a plain Python flag",
        ):
            update()
        np.testing.assert_array_equal(v.numpy(), before, err_msg=name)
        np.testing.assert_array_equal(w.numpy(), np.zeros(4), err_msg=name)
        update()  # the next update works
        np.testing.assert_array_equal(v.numpy(), before + 1, err_msg=name)


@pytest.mark.usefixtures("_sigusr1")
def test_a_signal_handler_updating_while_an_assign_restores_a_lost_array_is_refused(
    monkeypatch,
):
    v = statevar.Variable(jnp.zeros(4), name="v")
    one = jnp.ones(4)
    for _ in range(3):
        v.assign(one)  # the hot path is open
    v.value.delete()  # deleted outside statevar: the next assign restores the variable
    window = _HandlerInTheWindow(
        monkeypatch, lambda kept: _record(kept, lambda: v.assign(jnp.zeros(4)))
    )
    window.arm(vars(statevar._cell.kernels), "fresh")  # the restore's copy of the new value
    v.assign(one)
    (error,) = window.kept
    assert isinstance(error, statevar.StatevarError)
    assert "Cannot assign to Variable 'v' in a signal handler that interrupted" in str(error)
    np.testing.assert_array_equal(v.numpy(), np.ones(4))  # the restore, not overwritten


def _record(errors, update):
    try:
        update()
    except statevar.StatevarError as error:
        errors.append(error)


@pytest.mark.usefixtures("_sigusr1")
@pytest.mark.parametrize("warm", [True, False], ids=["warm", "first call"])
def test_a_signal_handler_calling_a_compiled_step_during_an_update_is_refused(monkeypatch, warm):
    v = statevar.Variable(jnp.zeros(4), name="v")
    w = statevar.Variable(jnp.zeros(4), name="w")

    @statevar.jit
    def bump_w():
        w.assign_add(1.0)

    if warm:
        bump_w()
    window = _HandlerInTheWindow(monkeypatch, lambda kept: bump_w())
    paths = {name: entry for name, *entry in _paths(v)}
    update, namespace, wrapped = paths["eager hot path"]
    window.arm(namespace, wrapped)
    with pytest.raises(
        statevar.StatevarError,
        match=r"Cannot call the statevar.jit function 'bump_w' in a signal handler",
    ):
        update()
    np.testing.assert_array_equal(w.numpy(), np.full(4, 1.0 if warm else 0.0))


@pytest.mark.usefixtures("_sigusr1")
@pytest.mark.parametrize("api", ["save", "CheckpointManager"])
def test_a_signal_handler_saving_while_a_save_to_the_same_place_runs_is_refused(
    tmp_path, monkeypatch, api
):
    from statevar._checkpoint import manager as _manager
    from statevar._checkpoint import save_restore as _save_restore

    x = statevar.Variable(jnp.arange(4.0), name="x")
    manager = statevar.CheckpointManager(tmp_path / "run")

    def save(step):
        if api == "save":
            statevar.save(tmp_path / "ckpt", x)
        else:
            manager.save(step, x)

    save(0)
    x.assign_add(1.0)
    signal.signal(signal.SIGUSR1, lambda *_: save(2))
    # The signal arrives once this save's data is written, before its manifest.
    module, name = (
        (_save_restore, "write_manifest") if api == "save" else (_manager, "write_manifest")
    )
    monkeypatch.setattr(module, name, _signalled(getattr(module, name)))
    with pytest.raises(
        statevar.StatevarError,
        match=r"Cannot save to '.*' in a signal handler that interrupted a save to or restore "
        r"from it: the two would delete each other's files",
    ):
        save(1)
    monkeypatch.undo()

    restored = statevar.Variable(jnp.zeros(4), name="x")
    if api == "save":
        statevar.restore(tmp_path / "ckpt", restored)
    else:
        assert manager.all_steps() == [0]
        manager.restore(restored)
    np.testing.assert_array_equal(restored.numpy(), np.arange(4.0))  # the earlier save


def _signalled(fn):
    def call_then_signal(*args):
        signal.raise_signal(signal.SIGUSR1)
        return fn(*args)

    return call_then_signal


def test_a_child_process_made_by_fork_finds_the_update_lock_free():
    program = """
import os, signal, threading
import statevar
from statevar import _state
held, release = threading.Event(), threading.Event()
def hold():
    with _state.STATE.update_lock:
        held.set()
        release.wait(30)
threading.Thread(target=hold, daemon=True).start()
held.wait(30)
pid = os.fork()
if pid == 0:
    signal.alarm(20)  # a lock still held would hang the child: killed, it fails the test
    with _state.STATE.update_lock:
        os._exit(0 if _state.STATE.update_lock._is_owned() else 1)
_, status = os.waitpid(pid, 0)
release.set()
print(os.waitstatus_to_exitcode(status))
"""
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", program],
        capture_output=True,
        text=True,
        cwd=pathlib.Path(__file__).resolve().parent.parent,
        timeout=120,
    )
    assert result.stdout.strip() == "0", result.stderr
