"""A compiled step's memory report: each variable's bytes and fate, and XLA's figures."""

import ctypes
import gc
import io
import logging
import sys

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import statevar


def _known_step():
    weights = statevar.Variable(jnp.zeros((256,)), name="weights")  # 1 KiB, assigned
    scale = statevar.Variable(jnp.ones((64,)), name="scale")  # 256 B, only read
    count = statevar.Variable(0, name="count")  # 4 B, assigned

    @statevar.jit
    def step(x):
        weights.assign_add(x * scale.value.sum())
        count.assign_add(1)
        return weights.value.sum()

    return step, weights, scale, count


def test_the_report_gives_each_variable_its_bytes_and_fate():
    step, weights, scale, count = _known_step()
    x = jnp.ones((256,))
    report = step.memory_report(x)
    rows = {row.path: (row.bytes, row.fate, row.cause) for row in report.variables}
    assert rows == {
        "weights": (1024, "donated", None),
        "scale": (256, "read", None),
        "count": (4, "donated", None),
    }
    # In the order the step lifts them (its closure's, by name).
    assert [(row.path, row.shape) for row in report.variables] == [
        ("count", ()),
        ("scale", (64,)),
        ("weights", (256,)),
    ]
    # The arguments: the three variables and x; every variable's output takes its buffer.
    assert report.argument_bytes == 1024 + 256 + 4 + 1024
    assert report.alias_bytes == 1024 + 256 + 4
    assert report.output_bytes >= 1024 + 256 + 4 + 4  # the variables and the f32 result
    expected_peak = report.argument_bytes + report.output_bytes - report.alias_bytes
    assert report.peak_bytes == expected_peak + report.temp_bytes
    assert report.flops is not None and report.flops >= 256  # an add per element at least
    assert report.function == "step"


def test_the_report_is_of_the_step_the_next_call_runs_after_a_flag_changes():
    a = statevar.Variable(jnp.zeros(4), name="a")
    b = statevar.Variable(jnp.zeros(4), name="b")

    @statevar.jit
    def step():
        a.assign_add(1.0)
        if b.trainable:  # what the trace reads off a flag, as statevar.grad's variables
            b.assign_add(1.0)
        return b.value.sum()

    step()
    b.trainable = False  # the next call traces again, and only reads b
    fates = {row.path: row.fate for row in step.memory_report().variables}
    assert fates == {"a": "donated", "b": "read"}
    step()
    assert [float(a.value[0]), float(b.value[0])] == [2.0, 1.0]


def test_a_variable_with_a_read_alive_shows_as_copied():
    step, weights, _, _ = _known_step()
    read = weights.value
    report = step.memory_report(jnp.ones((256,)))
    assert (report.variables[2].path, report.variables[2].fate) == ("weights", "copied")
    assert report.variables[2].cause == "held"
    del read
    assert step.memory_report(jnp.ones((256,))).variables[2].fate == "donated"


def test_the_report_runs_nothing_and_the_step_reuses_its_compilation(caplog):
    step, weights, scale, count = _known_step()
    arrays = [v._value for v in (weights, scale, count)]
    step.memory_report(jnp.ones((256,)))
    assert not any(array.is_deleted() for array in arrays)  # nothing donated
    del arrays
    assert int(count) == 0 and float(weights.value.sum()) == 0.0
    with jax.log_compiles(True), caplog.at_level(logging.WARNING, logger="jax"):
        step(jnp.ones((256,)))
    assert not [r for r in caplog.records if "Compiling" in r.getMessage()]
    assert int(count) == 1


def test_as_dict_and_the_plain_text_table():
    step, *_ = _known_step()
    report = step.memory_report(jnp.ones((256,)))
    figures = report.as_dict()
    assert figures["variables"][1] == {
        "path": "scale",
        "shape": (64,),
        "dtype": "float32",
        "bytes": 256,
        "fate": "read",
        "cause": None,
    }
    assert figures["argument_bytes"] == report.argument_bytes
    assert figures["peak_bytes"] == report.peak_bytes
    text = str(report)  # pytest's captured stdout is no terminal: plain text
    lines = text.splitlines()
    assert lines[0] == "Memory of the statevar.jit function 'step'"
    assert lines[1].split() == ["path", "shape", "dtype", "bytes", "fate"]
    assert lines[3].split() == ["count", "()", "int32", "4", "B", "donated"]
    assert lines[5].split() == ["weights", "(256,)", "float32", "1.0", "KiB", "donated"]
    assert "Variables: 1.0 KiB donated, 0 B copied, 256 B read" in text
    assert "MemoryReport of 'step': 3 variables" in repr(report)


def test_on_a_terminal_the_table_is_drawn_with_rich(monkeypatch):
    step, *_ = _known_step()
    report = step.memory_report(jnp.ones((256,)))

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdout", Terminal())
    drawn = str(report)
    assert "\x1b[" in drawn and "┃" in drawn  # styles and box drawing
    assert "weights" in drawn and "donated" in drawn


def _status(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/self/status")


@pytest.mark.slow
def test_the_figures_match_what_the_process_uses():
    # On the CPU, whose memory is the process's (a GPU's memory_stats() would be read
    # instead): a 256 MiB temporary XLA must hold, which the barrier keeps from being fused
    # away.
    with jax.default_device(jax.devices("cpu")[0]):
        _measure_a_step_on_the_cpu()


def _measure_a_step_on_the_cpu():
    size = 64 * 2**20
    total = statevar.Variable(0.0, name="total")

    @statevar.jit
    def step(x):
        values = lax.optimization_barrier(jnp.sin(jnp.arange(size, dtype=jnp.float32) * x))
        total.assign_add(values.sum())

    report = step.memory_report(1.0)
    assert 256 * 2**20 <= report.temp_bytes <= 300 * 2**20
    step(1.0)
    jax.block_until_ready(total.value)
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed memory returned to the system
    before = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # resets the peak (VmHWM) to the memory in use now
    step(2.0)
    jax.block_until_ready(total.value)
    grown = _status("VmHWM") - before
    # The process's peak grew by the temporary, within generous margins.
    assert 0.75 * report.temp_bytes <= grown <= 1.5 * report.temp_bytes + 64 * 2**20
