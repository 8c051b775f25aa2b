"""statevar.summary, Module reprs, path names in messages and Module.trainable."""

import io
import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import statevar


class Dense(statevar.Module):
    def __init__(self, n_in=2, n_out=3):
        self.kernel = statevar.Variable(jnp.ones((n_in, n_out)))
        self.bias = statevar.Variable(jnp.zeros(n_out))

    def __call__(self, x):
        return x @ self.kernel + self.bias


class Model(statevar.Module):
    def __init__(self):
        self.layers = [Dense(), Dense(3, 1)]
        self.step = statevar.Variable(0, trainable=False, name="step")
        self.width = 3


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_summary_lists_every_variable_with_module_subtotals_and_totals():
    out = io.StringIO()
    statevar.summary(Model(), file=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "Model"
    assert lines[1].split() == [
        "path",
        "shape",
        "dtype",
        "trainable",
        "placement",
        "params",
        "bytes",
    ]
    rows = [line.split() for line in lines[3:-2]]
    assert rows == [
        ["layers/0", "Dense", "9", "36", "B"],
        ["layers/0/kernel", "(2,", "3)", "float32", "yes", "cpu:0", "6", "24", "B"],
        ["layers/0/bias", "(3,)", "float32", "yes", "cpu:0", "3", "12", "B"],
        ["layers/1", "Dense", "4", "16", "B"],
        ["layers/1/kernel", "(3,", "1)", "float32", "yes", "cpu:0", "3", "12", "B"],
        ["layers/1/bias", "(1,)", "float32", "yes", "cpu:0", "1", "4", "B"],
        ["step", "()", "int32", "no", "cpu:0", "1", "4", "B"],
    ]
    assert lines[4].startswith("  layers/0/kernel")  # indented under its sub-Module
    assert lines[-1] == (
        "Total: 14 params (56 B) in 5 variables; trainable 13 (52 B), non-trainable 1 (4 B)"
    )


def test_module_summary_method_prints_to_stdout(capsys):
    model = Model()
    model.summary()
    out = io.StringIO()
    statevar.summary(model, file=out)
    assert capsys.readouterr().out == out.getvalue()


def test_summary_on_a_terminal_draws_a_rich_table(monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    out = Terminal()
    statevar.summary(Model(), file=out)
    text = out.getvalue()
    assert "\x1b[" in text  # styled for the terminal
    assert "┃" in text or "│" in text
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    assert "layers/1/kernel" in plain and "Total: 14 params (56 B)" in plain


def test_summary_shows_shardings_explicit_names_and_large_sizes():
    mesh = jax.make_mesh((4,), ("model",), axis_types=(jax.sharding.AxisType.Auto,))

    class Big(statevar.Module):
        def __init__(self):
            self.table = statevar.Variable(jnp.zeros((1024, 512)), name="embedding")
            self.sharded = statevar.Variable(jnp.zeros((8, 4)))

    big = Big()
    big.sharded.reshard(NamedSharding(mesh, P("model")))  # spread over four devices

    out = io.StringIO()
    statevar.summary(big, file=out)
    text = out.getvalue()
    assert re.search(r"table \('embedding'\) +\(1024, 512\) .* 524,288 +2\.0 MiB", text)
    assert re.search(r"sharded +\(8, 4\) +float32 +yes +P\('model',\) over 4 devices", text)


def test_summary_of_something_else_is_refused():
    with pytest.raises(
        TypeError,
        match="Expected statevar.summary.s module to be a statevar.Module or statevar.Optimizer",
    ):
        statevar.summary([statevar.Variable(1.0)])


def test_module_repr_is_readable_and_breaks_long_lines():
    assert repr(Dense()) == "Dense(kernel=Variable(float32[2,3]), bias=Variable(float32[3]))"
    assert repr(Model()) == (
        "Model(\n"
        "  layers=[\n"
        "    Dense(kernel=Variable(float32[2,3]), bias=Variable(float32[3])),\n"
        "    Dense(kernel=Variable(float32[3,1]), bias=Variable(float32[1])),\n"
        "  ],\n"
        "  step=Variable(int32[], name='step', trainable=False),\n"
        "  width=3,\n"
        ")"
    )


def test_module_repr_survives_cycles_and_long_containers():
    class Node(statevar.Module):
        def __init__(self):
            self.me = self
            self.items = list(range(20))
            self.pair = (np.zeros(2),)

    text = repr(Node())
    assert "me=<cycle: Node>" in text
    assert "... (4 more)" in text
    assert "ndarray(float64[2]),)" in text


def test_unnamed_variables_are_named_by_their_path_in_messages_and_logs(caplog):
    model = Model()
    kernel = model.layers[1].kernel
    assert kernel.name == "layers/1/kernel"
    assert "<Variable 'layers/1/kernel'" in repr(kernel)
    with pytest.raises(ValueError, match=r"Cannot assign to Variable 'layers/1/kernel': shape"):
        kernel.assign(jnp.ones(5))
    statevar.set_log_device_placement(True)
    with caplog.at_level(logging.INFO, logger="statevar"):
        kernel.assign_add(1.0)
    assert "Variable 'layers/1/kernel': assign_add on cpu:0" in caplog.text


def test_the_path_from_the_outermost_module_wins():
    dense = Dense()
    assert dense.kernel.name == "kernel"

    class Outer(statevar.Module):
        def __init__(self):
            self.model = Model()

    outer = Outer()
    assert outer.model.layers[0].bias.name == "model/layers/0/bias"
    outer.model.layers[0].named_variables()  # a walk from further in keeps the longer path
    assert outer.model.layers[0].bias.name == "model/layers/0/bias"
    assert outer.model.step.name == "step"  # an explicit name always wins


def test_variables_added_to_a_list_later_are_named_when_the_module_lists_them():
    model = Model()
    model.layers.append(Dense(1, 1))
    assert model.layers[2].kernel.name == "kernel"
    assert [v.name for v in model.variables][4:6] == ["layers/2/kernel", "layers/2/bias"]


def test_a_back_reference_does_not_rename_the_outer_modules_variables():
    model = Model()
    model.layers[1].owner = model
    assert model.layers[0].kernel.name == "layers/0/kernel"


def test_a_deep_copy_keeps_the_paths():
    import copy

    model = copy.deepcopy(Model())
    assert model.layers[1].bias.name == "layers/1/bias"


def test_setting_module_trainable_freezes_everything_below():
    model = Model()
    model.step.trainable = True
    assert model.trainable and model.layers[0].trainable
    model.trainable = False
    assert not model.trainable and not model.layers[1].trainable
    assert model.trainable_variables == ()
    grads = statevar.grad(lambda: jnp.sum(model.layers[0].kernel), model)()
    assert all(g is None for g in grads.values())

    model.layers[1].trainable = True
    assert [v.name for v in model.trainable_variables] == ["layers/1/kernel", "layers/1/bias"]
    assert not model.trainable  # the Module's own flag, as in Keras


def test_module_trainable_must_be_a_bool():
    model = Model()
    with pytest.raises(TypeError, match=r"Expected Model.trainable to be set to a bool, got str"):
        model.trainable = "no"
    assert all(v.trainable for v in model.layers[0].variables)


def test_a_frozen_layer_retraces_a_compiled_step_and_stops_training():
    model = Model()
    optimizer = statevar.Optimizer(optax.sgd(0.1), model)

    @statevar.jit
    def step():
        forward = lambda: jnp.sum(model.layers[1](model.layers[0](jnp.ones(2))))  # noqa: E731
        grads = statevar.grad(forward, model)()
        optimizer.apply(grads)

    step()
    before = np.asarray(model.layers[0].kernel.value)
    model.layers[0].trainable = False
    step()
    np.testing.assert_array_equal(model.layers[0].kernel.value, before)
    assert not np.array_equal(model.layers[1].kernel.value, np.ones((3, 1)))
