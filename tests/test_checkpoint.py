"""statevar.save, statevar.restore and statevar.CheckpointManager.

The promises tested: orbax stores the data and nothing is a pickle; a save killed at any
moment leaves the previous checkpoint whole; restore is all or nothing and never casts;
damage is detected, never restored; errors subclass the builtins a user would catch.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time

import chex
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

import statevar
from statevar._checkpoint import manager as _manager
from statevar._checkpoint import manifest as _manifest
from statevar._checkpoint import save_restore as _save_restore

MANIFEST = "statevar_checkpoint.json"


class Dense(statevar.Module):
    def __init__(self, n_in=2, n_out=3, scale=1.0):
        self.kernel = statevar.Variable(np.full((n_in, n_out), scale, np.float32))
        self.bias = statevar.Variable(np.zeros(n_out, np.float32))


class Model(statevar.Module):
    def __init__(self, scale=1.0):
        self.layers = [Dense(scale=scale), Dense(3, 1, scale=scale)]
        self.step = statevar.Variable(0, trainable=False, name="step")


def values(model):
    return {name: np.asarray(v.value) for name, v in model.named_variables().items()}


def assert_values(model, expected):
    got = values(model)
    assert list(got) == list(expected)
    for name in expected:
        assert got[name].dtype == expected[name].dtype, name
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def rewrite_manifest(directory, edit):
    """Applies ``edit`` to the parsed manifest and writes it back with a valid checksum, as a
    different program could."""
    path = pathlib.Path(directory, MANIFEST)
    manifest = json.loads(path.read_text())
    manifest.pop("sha256")
    edit(manifest)
    manifest["sha256"] = _manifest.manifest_digest(manifest)
    path.write_text(json.dumps(manifest))


_INSIDE = {
    "save": lambda directory, v: statevar.save(directory / "inside", v),
    "restore": lambda directory, v: statevar.restore(directory / "saved", v),
    "manager-save": lambda directory, v: statevar.CheckpointManager(directory / "m").save(1, v),
    "manager-restore": lambda directory, v: statevar.CheckpointManager(
        directory / "managed"
    ).restore(v),
}


_BAD_ARGUMENTS = {
    "save to a number": (
        lambda d, v: statevar.save(123, v),
        r"Cannot save a checkpoint: expected the directory to be a str or an os.PathLike "
        r"\(a pathlib.Path\), got int 123",
    ),
    "restore from a number": (
        lambda d, v: statevar.restore(123, v),
        r"Cannot restore a checkpoint: expected the directory to be a str .* got int 123",
    ),
    "a manager of bytes": (
        lambda d, v: statevar.CheckpointManager(b"ckpt"),
        r"Cannot create a CheckpointManager: expected the directory .* got bytes b'ckpt'",
    ),
    "blocking not a bool": (
        lambda d, v: statevar.save(d / "x", v, blocking="no"),
        r"Cannot save a checkpoint: expected blocking= to be True or False, got str 'no'",
    ),
    "partial not a bool": (
        lambda d, v: statevar.restore(d / "saved", v, partial=1),
        r"Cannot restore a checkpoint: expected partial= to be True or False, got int 1",
    ),
    "manager partial not a bool": (
        lambda d, v: statevar.CheckpointManager(d / "managed").restore(v, partial="yes"),
        r"expected partial= to be True or False, got str 'yes'",
    ),
}


@pytest.mark.parametrize("call", _BAD_ARGUMENTS.values(), ids=_BAD_ARGUMENTS.keys())
def test_arguments_of_the_wrong_kind_are_refused_by_name(tmp_path, call):
    v = statevar.Variable(1.0, name="v")
    statevar.save(tmp_path / "saved", v)
    statevar.CheckpointManager(tmp_path / "managed").save(0, v)
    v.assign(2.0)
    refused, message = call
    with pytest.raises(TypeError, match=message):
        refused(tmp_path, v)
    assert float(v) == 2.0 and not (tmp_path / "x").exists()
    assert not any(pathlib.Path().glob("123*")) and not pathlib.Path("ckpt").exists()


@pytest.mark.parametrize(
    "transform", [statevar.jit, lambda f: statevar.grad(f, [])], ids=["jit", "grad"]
)
@pytest.mark.parametrize("call", _INSIDE.values(), ids=_INSIDE.keys())
def test_save_and_restore_inside_a_traced_function_are_refused_by_name(tmp_path, call, transform):
    v = statevar.Variable(1.0, name="v")
    statevar.save(tmp_path / "saved", v)
    statevar.CheckpointManager(tmp_path / "managed").save(0, v)
    v.assign(2.0)

    def step():
        call(tmp_path, v)
        return v * 1.0

    with pytest.raises(
        statevar.TraceContextError,
        match=r"Cannot (save|restore) a checkpoint inside statevar\.(jit|grad): .* between calls",
    ):
        transform(step)()
    assert float(v) == 2.0
    assert not (tmp_path / "inside").exists() and not (tmp_path / "m").exists()
    statevar.restore(tmp_path / "saved", v)  # the checkpoint is fine
    assert float(v) == 1.0


# --------------------------------------------------------------------------- round trips


def test_save_restore_round_trip_of_a_module(tmp_path):
    model = Model()
    model.layers[0].kernel.assign(np.arange(6, dtype=np.float32).reshape(2, 3))
    model.step.assign(7)
    saved = values(model)
    statevar.save(tmp_path / "ckpt", model)

    other = Model(scale=5.0)
    restored = statevar.restore(tmp_path / "ckpt", other).restored

    assert restored == [
        "layers/0/kernel",
        "layers/0/bias",
        "layers/1/kernel",
        "layers/1/bias",
        "step",
    ]
    assert_values(other, saved)


@pytest.mark.parametrize(
    "dtype",
    [
        np.bool_,
        np.int8,
        np.uint8,
        np.int16,
        np.uint32,
        np.int32,
        np.float16,
        ml_dtypes.bfloat16,
        np.float32,
        np.complex64,
    ],
    ids=lambda d: np.dtype(d).name,
)
@pytest.mark.parametrize("shape", [(), (2, 0), (4, 5)], ids=str)
def test_round_trip_is_exact_for_every_dtype_and_shape(tmp_path, dtype, shape):
    rng = np.random.default_rng(0)
    data = (rng.standard_normal(shape) * 100).astype(dtype)
    if np.issubdtype(dtype, np.complexfloating):
        data = (data + 1j * rng.standard_normal(shape)).astype(dtype)
    variable = statevar.Variable(data, name="v")
    statevar.save(tmp_path, variable)
    variable.assign(np.zeros(shape, dtype))

    statevar.restore(tmp_path, variable)

    assert variable.dtype == np.dtype(dtype)
    assert variable.shape == shape
    np.testing.assert_array_equal(variable.numpy(), data)


def test_restore_places_each_value_on_its_variables_device(tmp_path):
    a = statevar.Variable([1.0, 2.0], name="a", device="cpu:1")
    b = statevar.Variable([3.0], name="b", device="cpu:3")
    statevar.save(tmp_path, [a, b])
    a2 = statevar.Variable([0.0, 0.0], name="a", device="cpu:2")
    b2 = statevar.Variable([0.0], name="b", device="cpu:0")

    statevar.restore(tmp_path, [a2, b2])

    chex.assert_tree_is_on_device(a2.value, device=jax.devices("cpu")[2])
    chex.assert_tree_is_on_device(b2.value, device=jax.devices("cpu")[0])
    chex.assert_trees_all_close((a2.value, b2.value), (jnp.array([1.0, 2.0]), jnp.array([3.0])))


def test_restore_leaves_a_variable_placed_nowhere_uncommitted(tmp_path):
    # A restore changes values, never placements: compiled steps need not compile again.
    a = statevar.Variable([1.0, 2.0], name="a")
    b = statevar.Variable([3.0], name="b", device="cpu:0")
    statevar.save(tmp_path, [a, b])
    a.assign([0.0, 0.0])

    statevar.restore(tmp_path, [a, b])

    assert not a.value.committed and b.value.committed
    chex.assert_trees_all_close((a.value, b.value), (jnp.array([1.0, 2.0]), jnp.array([3.0])))


def test_keys_are_module_paths_explicit_names_and_own_names(tmp_path):
    model = Model()
    loose = statevar.Variable(1.0, name="ema/decay")
    statevar.save(tmp_path, [model, (loose,)])

    manifest = json.loads((tmp_path / MANIFEST).read_text())
    names = [entry["name"] for entry in manifest["variables"]]
    assert names == [
        "layers/0/kernel",
        "layers/0/bias",
        "layers/1/kernel",
        "layers/1/bias",
        "step",
        "ema/decay",
    ]
    # Lists and tuples add nothing: the same names restore into differently nested targets.
    target = [[Model()], statevar.Variable(0.0, name="ema/decay")]
    assert statevar.restore(tmp_path, target).restored == names


def test_dict_keys_namespace_what_they_hold(tmp_path):
    generator, discriminator = Model(), Model(scale=2.0)
    loose = statevar.Variable(1.0, name="decay")
    target = {"generator": generator, "discriminator": discriminator, "ema": {"decay": loose}}
    statevar.save(tmp_path, target)

    names = [entry["name"] for entry in json.loads((tmp_path / MANIFEST).read_text())["variables"]]
    assert names[:2] == ["generator/layers/0/kernel", "generator/layers/0/bias"]
    assert names[5:7] == ["discriminator/layers/0/kernel", "discriminator/layers/0/bias"]
    assert names[-1] == "ema/decay"  # a Variable right under a key is named by the key
    fresh = {
        "generator": Model(scale=0.0),
        "discriminator": Model(scale=0.0),
        "ema": {"decay": statevar.Variable(0.0)},
    }
    statevar.restore(tmp_path, fresh)
    assert_values(fresh["discriminator"], values(discriminator))
    assert_values(fresh["generator"], values(generator))
    assert float(fresh["ema"]["decay"]) == 1.0


def test_two_variables_with_one_name_raise(tmp_path):
    with pytest.raises(
        ValueError, match=r"Two variables .* name 'Variable' \(at \[0\] and \[1\]\)"
    ):
        statevar.save(tmp_path, [statevar.Variable(1.0), statevar.Variable(2.0)])
    assert not (tmp_path / MANIFEST).exists()


def test_the_same_variable_twice_is_one_variable(tmp_path):
    w = statevar.Variable([1.0], name="w")
    statevar.save(tmp_path, [w, (w,)])
    assert statevar.restore(tmp_path, w).restored == ["w"]


def test_a_target_of_the_wrong_type_raises(tmp_path):
    with pytest.raises(
        TypeError,
        match=r"Variable, a Module, an Optimizer, or a list, tuple or dict .* got str at \[1\]",
    ):
        statevar.save(tmp_path, [statevar.Variable(1.0), "oops"])


def test_save_reads_without_donating_and_restore_keeps_earlier_reads_valid(tmp_path):
    w = statevar.Variable([1.0, 2.0], name="w")
    before_save = w.value
    statevar.save(tmp_path, w)
    assert not before_save.is_deleted()
    w.assign([5.0, 6.0])
    before_restore = w.value

    statevar.restore(tmp_path, w)

    np.testing.assert_array_equal(before_restore, [5.0, 6.0])
    np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])


def test_nothing_on_disk_is_a_pickle_and_loading_unpickles_nothing(tmp_path, monkeypatch):
    model = Model()
    statevar.save(tmp_path, model)
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert not path.read_bytes().startswith(b"\x80"), f"{path} looks like a pickle"
    json.loads((tmp_path / MANIFEST).read_text())

    def refuse(*args, **kwargs):
        raise AssertionError("restore unpickled something")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    statevar.restore(tmp_path, Model(scale=3.0))


def test_save_replaces_a_checkpoint_and_deletes_the_old_data(tmp_path):
    w = statevar.Variable([1.0], name="w")
    (tmp_path / "notes.txt").write_text("mine")
    statevar.save(tmp_path, w)
    w.assign([2.0])
    statevar.save(tmp_path, w)
    w.assign([0.0])

    statevar.restore(tmp_path, w)

    np.testing.assert_array_equal(w.numpy(), [2.0])
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 3 and names[1:] == ["notes.txt", MANIFEST]
    assert names[0].startswith("data-")


def test_a_checkpoint_of_only_zero_size_variables_needs_no_orbax_data(tmp_path):
    empty = statevar.Variable(np.zeros((0, 4), np.float32), name="empty")
    statevar.save(tmp_path, empty)
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST]
    assert statevar.restore(tmp_path, empty).restored == ["empty"]


# --------------------------------------------------------------------------- not found


def test_a_missing_directory_raises_file_not_found_naming_it(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=r"'.*nowhere' does not exist") as raised:
        statevar.restore(missing, statevar.Variable(1.0))
    assert isinstance(raised.value, statevar.CheckpointNotFoundError)


def test_an_empty_or_partial_directory_is_not_a_checkpoint(tmp_path):
    w = statevar.Variable([1.0], name="w")
    with pytest.raises(statevar.CheckpointNotFoundError, match="holds no complete checkpoint"):
        statevar.restore(tmp_path, w)
    statevar.save(tmp_path, w)
    (tmp_path / MANIFEST).unlink()  # as if the save had been killed before its last step
    with pytest.raises(statevar.CheckpointNotFoundError, match="holds no complete checkpoint"):
        statevar.restore(tmp_path, w)


def test_restoring_a_manager_directory_points_to_the_manager(tmp_path):
    w = statevar.Variable([1.0], name="w")
    statevar.CheckpointManager(tmp_path).save(4, w)
    with pytest.raises(statevar.CheckpointNotFoundError, match=r"CheckpointManager\(.*\)\.restore"):
        statevar.restore(tmp_path, w)
    assert statevar.restore(tmp_path / "4", w).restored == ["w"]


# --------------------------------------------------------------------------- mismatch


def test_mismatches_name_every_offending_variable_and_change_nothing(tmp_path):
    statevar.save(
        tmp_path,
        [
            statevar.Variable([1.0, 2.0], name="shape"),
            statevar.Variable([1, 2], name="dtype"),
            statevar.Variable(1.0, name="only_in_checkpoint"),
            statevar.Variable(1.0, name="fine"),
        ],
    )
    target = [
        statevar.Variable([0.0, 0.0, 0.0], name="shape"),
        statevar.Variable([0.0, 0.0], name="dtype"),  # int32 saved: no silent cast
        statevar.Variable(0.0, name="only_in_target"),
        statevar.Variable(0.0, name="fine"),
    ]
    before = [v.numpy() for v in target]

    with pytest.raises(statevar.CheckpointMismatchError) as raised:
        statevar.restore(tmp_path, target)

    message = str(raised.value)
    missing = "missing from the checkpoint (the target has them, the checkpoint does not)"
    unexpected = "unexpected in the checkpoint (the checkpoint has them, the target does not)"
    assert f"{missing}: 'only_in_target'" in message
    assert f"{unexpected}: 'only_in_checkpoint'" in message
    assert "'shape' (checkpoint float32[2], variable float32[3])" in message
    assert "'dtype' (checkpoint int32[2], variable float32[2])" in message
    assert isinstance(raised.value, ValueError)
    for variable, old in zip(target, before, strict=True):
        np.testing.assert_array_equal(variable.numpy(), old)


@pytest.mark.parametrize("extra", ["target", "checkpoint"])
def test_a_name_on_one_side_only_raises_and_suggests_partial(tmp_path, extra):
    a, b = statevar.Variable(1.0, name="a"), statevar.Variable(2.0, name="b")
    statevar.save(tmp_path, [a, b] if extra == "checkpoint" else [a])
    target = [statevar.Variable(0.0, name="a"), statevar.Variable(0.0, name="b")]
    with pytest.raises(statevar.CheckpointMismatchError, match=r"(?s)'b'.*Pass partial=True"):
        statevar.restore(tmp_path, target if extra == "target" else target[:1])
    assert [float(v) for v in target] == [0.0, 0.0]


def test_partial_restores_only_the_names_both_have_and_reports_the_rest(tmp_path, caplog):
    statevar.save(tmp_path, [statevar.Variable(1.0, name="a"), statevar.Variable(2.0, name="old")])
    a, new = statevar.Variable(0.0, name="a"), statevar.Variable(9.0, name="new")

    with caplog.at_level(logging.INFO, logger="statevar"):
        result = statevar.restore(tmp_path, [a, new], partial=True)

    assert result == statevar.RestoreResult(restored=["a"], untouched=["new"], unused=["old"])
    assert (float(a), float(new)) == (1.0, 9.0)
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        f"Restored 1 of the target's 2 variables from checkpoint {str(tmp_path)!r}. Left "
        "unchanged (not in the checkpoint): new. Not restored (not in the target): old."
    )


def test_a_full_restore_reports_every_name_and_logs_at_info(tmp_path, caplog):
    model = Model()
    statevar.save(tmp_path, model)
    with caplog.at_level(logging.INFO, logger="statevar"):
        result = statevar.restore(tmp_path, Model(), partial=True)
    assert result.restored == list(model.named_variables())
    assert (result.untouched, result.unused, result.step) == ([], [], None)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, f"Restored 5 variables from checkpoint {str(tmp_path)!r}")
    ]


def test_partial_still_refuses_a_shape_mismatch(tmp_path):
    statevar.save(tmp_path, [statevar.Variable(1.0, name="a"), statevar.Variable([1.0], name="b")])
    a, b = statevar.Variable(0.0, name="a"), statevar.Variable([0.0, 0.0], name="b")
    with pytest.raises(
        statevar.CheckpointMismatchError,
        match=r"'b' \(checkpoint float32\[1\], variable float32\[2\]\)",
    ):
        statevar.restore(tmp_path, [a, b], partial=True)
    assert float(a) == 0.0


def test_partial_with_no_shared_name_raises(tmp_path):
    statevar.save(tmp_path, statevar.Variable(1.0, name="a"))
    with pytest.raises(
        statevar.CheckpointMismatchError, match=r"(?s)missing .*'b'.*unexpected .*'a'"
    ):
        statevar.restore(tmp_path, statevar.Variable(0.0, name="b"), partial=True)


# --------------------------------------------------------------------------- corruption


def _data_files(checkpoint):
    return sorted(p for p in checkpoint.rglob("*") if p.is_file() and p.name != MANIFEST)


@pytest.mark.parametrize("damage", ["bit flip", "truncation", "deletion"])
def test_damage_to_any_data_file_is_detected_before_anything_changes(tmp_path, damage):
    """Orbax alone restores a bit-flipped chunk as a wrong value, silently."""
    rng = np.random.default_rng(1)
    saved = {"big": rng.standard_normal((64, 256)).astype(np.float32), "small": np.arange(5)}
    statevar.save(tmp_path / "good", [statevar.Variable(v, name=k) for k, v in saved.items()])
    files = _data_files(tmp_path / "good")
    assert len(files) > 5
    for file in files:
        checkpoint = tmp_path / "damaged"
        shutil.rmtree(checkpoint, ignore_errors=True)
        shutil.copytree(tmp_path / "good", checkpoint)
        damaged = checkpoint / file.relative_to(tmp_path / "good")
        data = bytearray(damaged.read_bytes())
        if damage == "bit flip":
            data[len(data) // 2] ^= 0x04
            damaged.write_bytes(bytes(data))
        elif damage == "truncation":
            damaged.write_bytes(bytes(data[: len(data) // 2]))
        else:
            damaged.unlink()
        target = [statevar.Variable(np.zeros_like(v), name=k) for k, v in saved.items()]
        relative = damaged.relative_to(next(checkpoint.glob("data-*"))).as_posix()
        with pytest.raises(
            statevar.CheckpointCorruptedError,
            match=rf"'.*damaged' is corrupted: its data files '{relative}' are missing or changed",
        ):
            statevar.restore(checkpoint, target)
        for variable in target:
            assert not variable.numpy().any()


def test_a_read_error_from_orbax_is_reported_as_corruption(tmp_path, monkeypatch):
    import orbax.checkpoint as ocp

    w = statevar.Variable([1.0], name="w")
    statevar.save(tmp_path, w)

    def fail(*args, **kwargs):
        raise ValueError("DATA_LOSS: Error reading chunk\n<a long TensorStore spec>")

    monkeypatch.setattr(ocp.Checkpointer, "restore", fail)
    with pytest.raises(
        statevar.CheckpointCorruptedError,
        match=r"data could not be read \(ValueError: DATA_LOSS: Error reading chunk\); no variable",
    ):
        statevar.restore(tmp_path, w)


def test_a_checksum_mismatch_names_the_variable_and_changes_nothing(tmp_path):
    statevar.save(
        tmp_path, [statevar.Variable([1.0], name="a"), statevar.Variable([2.0], name="b")]
    )

    def corrupt_b(manifest):
        manifest["variables"][1]["sha256"] = "0" * 64

    rewrite_manifest(tmp_path, corrupt_b)
    a, b = statevar.Variable([0.0], name="a"), statevar.Variable([0.0], name="b")
    with pytest.raises(
        statevar.CheckpointCorruptedError, match=r"data of 'b' does not match the sha256"
    ):
        statevar.restore(tmp_path, [a, b])
    assert (float(a[0]), float(b[0])) == (0.0, 0.0)


def _flip_manifest_bit(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_flip_manifest_bit, "not valid JSON|does not match its own sha256"),
        (lambda path: path.write_bytes(b'{"format": '), "not valid JSON"),
        (lambda path: path.write_text("[1, 2]"), "is not a statevar manifest"),
        (
            lambda path: path.write_text(path.read_text().replace('"shape": [2]', '"shape": [3]')),
            "does not match its own sha256",
        ),
    ],
    ids=["bit flip", "truncated", "not a manifest", "edited"],
)
def test_a_damaged_manifest_is_detected(tmp_path, damage, message):
    w = statevar.Variable([1.0, 2.0], name="w")
    statevar.save(tmp_path, w)
    damage(tmp_path / MANIFEST)
    with pytest.raises(statevar.CheckpointCorruptedError, match=message):
        statevar.restore(tmp_path, w)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda m: m.update(version=3),
            "version 3; this statevar reads 'statevar.checkpoint' version 2",
        ),
        (lambda m: m.update(data="../elsewhere"), "invalid data directory '../elsewhere'"),
        (lambda m: m.update(data=None), "stored data but no data directory"),
        (lambda m: m["files"][0].update(path="../../etc/passwd"), "file entries are malformed"),
        (lambda m: m["variables"][0].update(shape="2"), "entries are malformed"),
        (lambda m: m["variables"].append(dict(m["variables"][0])), "lists a name or key twice"),
    ],
    ids=["newer version", "data outside", "no data", "file outside", "malformed", "duplicate"],
)
def test_a_manifest_that_is_consistent_but_invalid_is_refused(tmp_path, edit, message):
    w = statevar.Variable([1.0, 2.0], name="w")
    statevar.save(tmp_path, w)
    rewrite_manifest(tmp_path, edit)
    with pytest.raises(statevar.CheckpointCorruptedError, match=message):
        statevar.restore(tmp_path, w)


# --------------------------------------------------------------------------- manager


def test_manager_keeps_the_last_steps_and_resumes_from_the_latest(tmp_path):
    model = Model()
    manager = statevar.CheckpointManager(tmp_path / "run", max_to_keep=3)
    assert manager.restore(model) is None  # nothing to resume yet (and a warning says so)
    assert not (tmp_path / "run").exists()
    for step in range(1, 6):
        model.step.assign(step)
        manager.save(step, model)

    assert manager.all_steps() == [3, 4, 5]
    assert manager.latest_step() == 5
    resumed = Model()
    assert manager.restore(resumed).step == 5
    assert int(resumed.step) == 5
    assert manager.restore(resumed, step=3).step == 3
    assert int(resumed.step) == 3
    assert repr(manager) == f"CheckpointManager({str(tmp_path / 'run')!r}, max_to_keep=3)"


def test_manager_saves_a_step_below_the_latest_instead_of_skipping_it(tmp_path):
    w = statevar.Variable(0, name="w")
    manager = statevar.CheckpointManager(tmp_path, max_to_keep=2)
    manager.save(10, w)
    manager.save(20, w)
    w.assign(5)
    manager.save(5, w)  # orbax alone would skip this silently
    assert manager.all_steps() == [5, 20]
    w.assign(0)
    manager.restore(w, step=5)
    assert int(w) == 5


@pytest.mark.parametrize("async_save", [False, True], ids=["blocking", "async"])
def test_a_failed_deletion_of_an_old_step_is_logged_and_the_step_saved(
    tmp_path, monkeypatch, caplog, async_save
):
    w = statevar.Variable([1.0], name="w")
    manager = statevar.CheckpointManager(tmp_path, max_to_keep=1, async_save=async_save)
    manager.save(1, w)
    manager.wait_until_finished()
    real_rmtree = shutil.rmtree

    def refused(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(_manager.shutil, "rmtree", refused)
    w.assign([2.0])
    with caplog.at_level(logging.WARNING, logger="statevar"):
        manager.save(2, w)
        manager.wait_until_finished()  # the save succeeded: nothing to raise
    assert "Saved step 2 to " in caplog.text
    assert "deleting step 1 (beyond max_to_keep=1) failed" in caplog.text
    assert "Permission denied" in caplog.text
    assert manager.all_steps() == [2]
    monkeypatch.setattr(_manager.shutil, "rmtree", real_rmtree)
    manager.save(3, w)
    manager.wait_until_finished()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["3"]  # the next save cleared it
    w.assign([0.0])
    manager.restore(w)
    np.testing.assert_array_equal(w.numpy(), [2.0])


@pytest.mark.parametrize("step", [None, 1], ids=["latest", "given"])
def test_manager_restore_chooses_its_step_holding_the_directory_lock(tmp_path, monkeypatch, step):
    # No save in another thread can delete the step chosen before it is read.
    w = statevar.Variable([1.0], name="w")
    manager = statevar.CheckpointManager(tmp_path, max_to_keep=1)
    manager.save(1, w)
    real_all_steps = manager.all_steps
    locked = []

    def all_steps():
        locked.append(_save_restore.DIRECTORY_LOCKS.locks[str(tmp_path.resolve())]._is_owned())
        return real_all_steps()

    monkeypatch.setattr(manager, "all_steps", all_steps)
    w.assign([0.0])
    assert manager.restore(w, step=step).step == 1
    assert locked and all(locked)
    np.testing.assert_array_equal(w.numpy(), [1.0])


def test_restoring_a_managers_step_directory_reads_holding_the_managers_lock(tmp_path, monkeypatch):
    # statevar.restore("run/3"): no save of the manager's, in another thread, deletes the
    # step while it is read.
    w = statevar.Variable([1.0], name="w")
    statevar.CheckpointManager(tmp_path / "run").save(3, w)
    real_read = _save_restore._read_restored
    locked = []

    def read_restored(*args):
        locks = [
            _save_restore.DIRECTORY_LOCKS.locks[str(p.resolve())]
            for p in (tmp_path / "run", tmp_path)
        ]
        locked.append([lock._is_owned() for lock in locks])
        return real_read(*args)

    monkeypatch.setattr(_save_restore, "_read_restored", read_restored)
    statevar.save(tmp_path, w)  # a directory whose name is no step: its own lock alone
    w.assign([0.0])
    statevar.restore(tmp_path / "run" / "3", w)
    statevar.restore(tmp_path, w)
    assert locked == [[True, False], [False, True]]
    np.testing.assert_array_equal(w.numpy(), [1.0])


def test_manager_never_lists_an_interrupted_or_foreign_step(tmp_path):
    w = statevar.Variable([1.0], name="w")
    manager = statevar.CheckpointManager(tmp_path, max_to_keep=None)
    manager.save(1, w)
    manager.save(2, w)
    (tmp_path / "7").mkdir()  # empty
    shutil.copytree(tmp_path / "2", tmp_path / "8")
    (tmp_path / "8" / MANIFEST).unlink()  # killed before its manifest
    (tmp_path / "8" / _manager.MANIFEST_WRITTEN).unlink()  # (written after the manifest)
    (tmp_path / "9.orbax-checkpoint-tmp").mkdir()  # killed while orbax wrote

    assert manager.all_steps() == [1, 2]
    assert manager.latest_step() == 2
    with pytest.raises(
        FileNotFoundError, match=r"no complete step 8; the steps there are \[1, 2\]"
    ):
        manager.restore(w, step=8)

    manager.save(3, w)  # clears orbax's temporary directories; leaves unknown ones alone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2", "3", "7", "8"]
    manager.save(8, w)  # replaces what an interrupted save of this step left
    assert manager.all_steps() == [1, 2, 3, 8]
    manager.restore(w, step=8)


def _replace_by_a_directory(manifest):
    manifest.unlink()
    manifest.mkdir()


def _replace_by_a_dangling_link(manifest):
    manifest.unlink()
    manifest.symlink_to(manifest.parent / "gone.json")


_MANIFEST_DAMAGE = {
    "deleted": (pathlib.Path.unlink, "was deleted"),
    "a directory": (_replace_by_a_directory, "is a directory, not a file"),
    "a dangling link": (_replace_by_a_dangling_link, r"is a link to '.*gone.json', which is no"),
}


@pytest.mark.parametrize(("damage", "why"), _MANIFEST_DAMAGE.values(), ids=_MANIFEST_DAMAGE.keys())
def test_a_latest_step_whose_manifest_is_lost_is_never_skipped_silently(tmp_path, damage, why):
    w = statevar.Variable([1.0], name="w")
    manager = statevar.CheckpointManager(tmp_path, max_to_keep=None)
    for step in (1, 2):
        w.assign([float(step)])
        manager.save(step, w)
    damage(tmp_path / "2" / MANIFEST)
    w.assign([9.0])
    damaged = (
        rf"Checkpoint directory '.*': step 2 is damaged: it holds data, but its manifest "
        rf"{MANIFEST} {why}.*nothing was restored. Restore an older step explicitly, "
        r"manager.restore\(target, step=1\) \(the complete steps are \[1\]\)"
    )
    for restore in (lambda: manager.restore(w), lambda: manager.restore(w, step=2)):
        with pytest.raises(statevar.CheckpointDamagedError, match=damaged) as raised:
            restore()
        assert isinstance(raised.value, statevar.CheckpointCorruptedError)
        assert isinstance(raised.value, ValueError)
        np.testing.assert_array_equal(w.numpy(), [9.0])
    assert manager.all_steps() == [1]  # listed only once whole, as before
    with pytest.raises(
        statevar.CheckpointExistsError, match=r"that step holds data whose manifest"
    ):
        manager.save(2, w)  # the damaged data is never overwritten
    assert manager.restore(w, step=1).step == 1  # explicitly
    np.testing.assert_array_equal(w.numpy(), [1.0])


def test_a_damaged_step_with_no_complete_step_is_said_too(tmp_path):
    w = statevar.Variable([1.0], name="w")
    manager = statevar.CheckpointManager(tmp_path)
    manager.save(4, w)
    (tmp_path / "4" / MANIFEST).unlink()
    with pytest.raises(
        statevar.CheckpointDamagedError,
        match=r"step 4 is damaged: .* There is no complete step to restore instead; move",
    ):
        manager.restore(w)


def test_a_newer_save_that_did_not_finish_is_logged_with_the_step_restored(tmp_path, caplog):
    w = statevar.Variable([1.0], name="w")
    manager = statevar.CheckpointManager(tmp_path, max_to_keep=None)
    manager.save(1, w)
    w.assign([2.0])
    manager.save(2, w)
    # Killed after orbax wrote the data and before the manifest: no manifest, no sign of one.
    for name in (MANIFEST, _manager.MANIFEST_WRITTEN):
        (tmp_path / "2" / name).unlink()
    with caplog.at_level(logging.WARNING, logger="statevar"):
        assert manager.restore(w).step == 1
    assert [r.levelno for r in caplog.records if "no manifest" in r.getMessage()] == [
        logging.WARNING
    ]
    assert re.search(
        r"Step 2 in checkpoint directory '.*' holds data but no manifest: a save that did "
        r"not finish .* Restoring step 1 instead",
        caplog.text,
    )
    np.testing.assert_array_equal(w.numpy(), [1.0])


def test_manager_refuses_to_overwrite_a_step(tmp_path):
    w = statevar.Variable([1.0], name="w")
    manager = statevar.CheckpointManager(tmp_path)
    manager.save(3, w)
    with pytest.raises(
        FileExistsError, match="Cannot save step 3 .*: that step already holds a checkpoint"
    ) as raised:
        manager.save(3, w)
    assert isinstance(raised.value, statevar.CheckpointExistsError)


@pytest.mark.parametrize(
    ("step", "error", "message"),
    [
        ("3", TypeError, "step to be an int, got str '3'"),
        (True, TypeError, "got bool"),
        (5.0, TypeError, "got float 5.0"),
        (-1, ValueError, "non-negative, got -1"),
    ],
)
@pytest.mark.parametrize("action", ["save", "restore"])
def test_manager_rejects_a_bad_step(tmp_path, step, error, message, action):
    manager = statevar.CheckpointManager(tmp_path)
    v = statevar.Variable(1.0)
    manager.save(5, v)
    v.assign(2.0)
    with pytest.raises(error, match=message):
        if action == "save":
            manager.save(step, v)
        else:
            manager.restore(v, step)
    assert float(v) == 2.0 and manager.all_steps() == [5]


def test_manager_accepts_a_numpy_integer_step(tmp_path):
    manager = statevar.CheckpointManager(tmp_path)
    manager.save(np.int64(4), statevar.Variable(1.0))
    assert manager.all_steps() == [4]


def test_manager_takes_a_scalar_integer_array_or_variable_as_the_step(tmp_path):
    manager = statevar.CheckpointManager(tmp_path)
    w = statevar.Variable(1.0, name="w")
    opt = statevar.Optimizer(optax.sgd(0.1), w)
    opt.apply(jnp.ones(()))

    manager.save(jnp.array(13), w)
    manager.save(opt.iterations, w)  # as Keras users pass optimizer.iterations
    w.assign(5.0)
    manager.restore(w, step=jnp.array(13))

    assert manager.all_steps() == [1, 13] and float(w) == pytest.approx(0.9)
    with pytest.raises(TypeError, match=r"step to be an int, got ArrayImpl"):
        manager.save(jnp.array(2.0), w)
    with pytest.raises(TypeError, match=r"step to be an int, got ArrayImpl"):
        manager.save(jnp.array([2]), w)


@pytest.mark.parametrize("max_to_keep", [0, -2, 1.5, True])
def test_manager_rejects_a_bad_max_to_keep(tmp_path, max_to_keep):
    with pytest.raises(ValueError, match=r"max_to_keep to be None or a positive int"):
        statevar.CheckpointManager(tmp_path, max_to_keep=max_to_keep)


def test_checkpointing_is_quiet(tmp_path, caplog):
    """No warnings (the suite turns them into errors) and no log records at WARNING or above,
    even with debris from interrupted saves around."""
    caplog.set_level(logging.WARNING)
    w = statevar.Variable([1.0], name="w")
    manager = statevar.CheckpointManager(tmp_path / "run", max_to_keep=1)
    manager.save(1, w)
    (tmp_path / "run" / "5").mkdir()
    manager.save(2, w)
    manager.restore(w)
    statevar.save(tmp_path / "plain", w)
    statevar.restore(tmp_path / "plain", w)
    assert caplog.records == []


# --------------------------------------------------------------------------- atomicity


@pytest.mark.parametrize("where", ["manifest", "rename"])
def test_a_save_that_dies_before_its_manifest_leaves_the_previous_checkpoint(
    tmp_path, monkeypatch, where
):
    """Deterministic: the save dies after orbax has finalized the data, at the last step."""
    w = statevar.Variable([1.0], name="w")
    statevar.save(tmp_path / "plain", w)
    manager = statevar.CheckpointManager(tmp_path / "run")
    manager.save(1, w)
    w.assign([2.0])

    def die(*args, **kwargs):
        raise KeyboardInterrupt("killed")

    if where == "manifest":
        monkeypatch.setattr(_save_restore, "write_manifest", die)
        monkeypatch.setattr(_manager, "write_manifest", die)
    else:
        monkeypatch.setattr(os, "replace", die)
    for save in (lambda: statevar.save(tmp_path / "plain", w), lambda: manager.save(2, w)):
        with pytest.raises(KeyboardInterrupt):
            save()
    monkeypatch.undo()

    assert manager.all_steps() == [1]
    for restore in (lambda: statevar.restore(tmp_path / "plain", w), lambda: manager.restore(w)):
        w.assign([0.0])
        restore()
        np.testing.assert_array_equal(w.numpy(), [1.0])


def test_a_manager_killed_while_deleting_an_old_step_never_lists_it(tmp_path, monkeypatch):
    w = statevar.Variable([1.0], name="w")
    manager = statevar.CheckpointManager(tmp_path, max_to_keep=1)
    manager.save(1, w)

    def die(path, *args, **kwargs):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(_manager.shutil, "rmtree", die)
    with pytest.raises(KeyboardInterrupt):
        manager.save(2, w)
    monkeypatch.undo()

    assert manager.all_steps() == [2]
    assert [p.name.split(".")[1][:16] for p in tmp_path.iterdir() if p.name.startswith("1")] == [
        "statevar-deleted"
    ]
    manager.save(3, w)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["3"]


_CHILD = """
import sys
import time
import numpy as np
import orbax.checkpoint  # imported before the first save, which is timed
import statevar

directory, mode, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
base = np.random.default_rng(0).random(size, dtype=np.float32)
big = statevar.Variable(base, name="big")
count = statevar.Variable(0, name="count")
manager = statevar.CheckpointManager(directory, max_to_keep=2) if mode == "manager" else None
for k in range(1000):
    if k:
        big.assign(base + np.float32(k))
        count.assign(k)
    print("saving", k, flush=True)
    start = time.monotonic()
    if manager is None:
        statevar.save(directory, [big, count])
    else:
        manager.save(k, [big, count])
    print("saved", k, flush=True)
    if k == 0:
        print(time.monotonic() - start, flush=True)  # how long one save takes here
        sys.stdin.readline()  # wait for the parent's go
"""

_SIZE = 4 * 1024 * 1024  # float32s: 16 MiB
# When to kill, from the moment orbax starts writing the second save (its first new file or
# directory appears), as a fraction of the time the child's first save took: at once, in the
# middle of the write, and around its end (the first save, made while the other children
# start, takes two to four times as long as one made alone). Following the save's progress
# and the child's own pace, not the clock, keeps this right on a loaded machine.
_KILL_FRACTIONS = [0.0, 0.15, 0.35]


def _wait_for_new_entry(directory, before, child, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if set(os.listdir(directory)) - before:
            return
        assert child.poll() is None, child.communicate()[1]
        time.sleep(0.001)
    raise AssertionError(f"no save started writing in {directory} within {timeout} s")


@pytest.mark.slow
def test_a_save_killed_at_any_moment_leaves_the_previous_checkpoint_exact(tmp_path):
    """Real processes, killed with SIGKILL in the middle of saving 16 MiB."""
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    runs = [(mode, fraction) for mode in ("plain", "manager") for fraction in _KILL_FRACTIONS]
    children = {
        run: subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / f"{run[0]}-{run[1]}"), run[0], str(_SIZE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, JAX_PLATFORMS="cpu"),
        )
        for run in runs
    }
    save_seconds = {}
    for run, child in children.items():  # start-up runs in parallel; each waits after one save
        lines = [child.stdout.readline(), child.stdout.readline()]
        assert lines == ["saving 0\n", "saved 0\n"], child.communicate()[1]
        save_seconds[run] = float(child.stdout.readline())
    printed = {}
    for run, child in children.items():  # one at a time, so that timings hold
        directory = tmp_path / f"{run[0]}-{run[1]}"
        before = set(os.listdir(directory))
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "saving 1\n"
        _wait_for_new_entry(directory, before, child)
        time.sleep(run[1] * save_seconds[run])
        child.send_signal(signal.SIGKILL)
        printed[run] = ["saved 0", *child.communicate()[0].splitlines()]
        assert child.returncode == -signal.SIGKILL

    base = np.random.default_rng(0).random(_SIZE, dtype=np.float32)
    big = statevar.Variable(np.zeros(_SIZE, np.float32), name="big")
    count = statevar.Variable(-1, name="count")
    interrupted = set()
    for mode, fraction in runs:
        done = max(
            int(line.split()[1]) for line in printed[mode, fraction] if line.startswith("saved")
        )
        directory = tmp_path / f"{mode}-{fraction}"
        if mode == "plain":
            checkpoints = [directory]
            data = json.loads((directory / MANIFEST).read_text())["data"]
            debris = any(p.name not in (MANIFEST, data) for p in directory.iterdir())
        else:
            manager = statevar.CheckpointManager(directory, max_to_keep=2)
            steps = manager.all_steps()
            assert steps[-1] in (done, done + 1) and len(steps) <= 3, (steps, done)
            checkpoints = [directory / str(step) for step in steps]
            debris = any(p.name not in map(str, steps) for p in directory.iterdir())
        for checkpoint in checkpoints:
            statevar.restore(checkpoint, [big, count])
            if mode == "plain":
                assert int(count) in (done, done + 1), (fraction, int(count), done)
            np.testing.assert_array_equal(big.numpy(), base + np.float32(int(count)))
        if debris and mode not in interrupted:
            # A later save, by another process, clears what the killed one left behind.
            if mode == "plain":
                statevar.save(directory, [big, count])
                assert len(list(directory.iterdir())) == 2
            else:
                manager.save(10**6, [big, count])
                assert not any("orbax-checkpoint-tmp" in p.name for p in directory.iterdir())
                assert all(
                    (directory / str(step) / MANIFEST).exists() for step in manager.all_steps()
                )
            interrupted.add(mode)
    assert interrupted == {"plain", "manager"}, f"no kill landed while orbax wrote: {interrupted}"


def test_manager_delete(tmp_path):
    w = statevar.Variable([1.0], name="w")
    manager = statevar.CheckpointManager(tmp_path, max_to_keep=None)
    manager.save(1, w)
    manager.save(2, w)
    manager.delete(1)
    assert manager.all_steps() == [2] and sorted(p.name for p in tmp_path.iterdir()) == ["2"]
    with pytest.raises(
        FileNotFoundError, match=r"Cannot delete step 1 .*the steps there are \[2\]"
    ):
        manager.delete(1)


def test_one_variable_under_two_names_is_refused(tmp_path):
    class Holder(statevar.Module):
        def __init__(self):
            self.k = statevar.Variable([1.0])

    holder = Holder()
    with pytest.raises(
        ValueError, match=r"One variable appears in the checkpoint target under two names, 'k'"
    ):
        statevar.save(
            tmp_path / "c", [holder, {"again": statevar.Variable([2.0], name="x"), "w": holder.k}]
        )
    assert not (tmp_path / "c").exists()


def test_restoring_from_a_file_says_it_is_not_a_directory(tmp_path):
    (tmp_path / "file").write_text("not a checkpoint")
    with pytest.raises(FileNotFoundError, match="is a file, not a checkpoint directory"):
        statevar.restore(tmp_path / "file", statevar.Variable(1.0))


@pytest.mark.parametrize("exists", [False, True], ids=["missing", "empty"])
def test_resuming_with_no_checkpoint_logs_a_warning_naming_the_directory(tmp_path, caplog, exists):
    directory = tmp_path / "typo"
    if exists:
        directory.mkdir()
    w = statevar.Variable([1.0], name="w")
    with caplog.at_level(logging.INFO, logger="statevar"):
        assert statevar.CheckpointManager(directory).restore(w) is None
    reason = "holds no complete step" if exists else "does not exist"
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            logging.WARNING,
            f"No checkpoint to restore: directory {str(directory)!r} ({directory}) {reason}; "
            "nothing was restored",
        )
    ]
    assert float(w[0]) == 1.0


def test_a_manager_restore_reports_the_step_and_names(tmp_path):
    model = Model()
    manager = statevar.CheckpointManager(tmp_path)
    manager.save(4, model)
    bigger = [Model(), statevar.Variable(0.0, name="extra")]
    result = manager.restore(bigger, partial=True)
    assert result == statevar.RestoreResult(list(model.named_variables()), ["extra"], [], step=4)


class _Trainer(statevar.Module):
    """A Module holding its own Optimizer, as flax nnx and Keras users write it."""

    def __init__(self):
        self.kernel = statevar.Variable(jnp.ones(2), name="kernel")
        self.opt = statevar.Optimizer(optax.adam, self, learning_rate=0.1)


@pytest.mark.parametrize("action", ["save", "restore", "manager save", "manager restore"])
def test_a_checkpoint_leaving_out_an_optimizer_a_module_holds_warns(tmp_path, action):
    trainer = _Trainer()
    statevar.save(tmp_path / "ckpt", [trainer, trainer.opt])
    manager = statevar.CheckpointManager(tmp_path / "steps")
    manager.save(0, [trainer, trainer.opt])
    run = {
        "save": lambda: statevar.save(tmp_path / "ckpt", trainer),
        "restore": lambda: statevar.restore(tmp_path / "ckpt", trainer, partial=True),
        "manager save": lambda: manager.save(1, trainer),
        "manager restore": lambda: manager.restore(trainer, 0, partial=True),
    }[action]

    with pytest.warns(
        UserWarning,
        match=r"The checkpoint leaves out Optimizer 'optimizer', which a Module holds at "
        r"'opt'.*statevar.save\(directory, \[model, model.opt\]\)",
    ) as warned:
        run()

    assert warned[0].filename == __file__  # blames the caller


def test_an_unbuilt_optimizer_a_module_holds_has_no_state_to_warn_of(tmp_path):
    model = statevar.Module()
    model.kernel = statevar.Variable(jnp.ones(2), name="kernel")
    model.opt = statevar.Optimizer(optax.adam, learning_rate=0.1)  # built by its first use

    statevar.save(tmp_path / "ckpt", model)  # the suite turns any warning into an error

    assert statevar.restore(tmp_path / "ckpt", model).restored == ["kernel"]


def test_a_checkpoint_including_the_optimizer_a_module_holds_round_trips_quietly(tmp_path):
    trainer = _Trainer()
    trainer.opt.apply({"kernel": jnp.ones(2)})
    statevar.save(tmp_path / "ckpt", {"model": trainer, "opt": trainer.opt})
    fresh = _Trainer()

    statevar.restore(tmp_path / "ckpt", {"model": fresh, "opt": fresh.opt})

    assert int(fresh.opt.iterations) == 1
    chex.assert_trees_all_equal(fresh.kernel.value, trainer.kernel.value)


# ------------------------------------------------------------------ concurrent training


def _pair_and_step():
    """Two variables that a compiled step keeps equal, and the step."""
    a = statevar.Variable(jnp.zeros(4), name="a")
    b = statevar.Variable(jnp.zeros(4), name="b")

    @statevar.jit
    def step():
        a.assign_add(1.0)
        b.assign_add(1.0)

    step()
    return a, b, step


def _step_in_another_thread(step, started):
    """Starts ``step`` in another thread (once) and gives it a moment to run: it runs
    unless the update lock keeps it waiting."""
    import threading

    if not started:
        started.append(threading.Thread(target=step))
        started[0].start()
        started[0].join(timeout=0.5)


def test_a_save_while_another_thread_trains_holds_one_steps_values(tmp_path, monkeypatch):
    a, b, step = _pair_and_step()
    started: list = []
    read = statevar.Variable._read

    def read_then_let_a_step_run(variable):
        value = read(variable)
        if variable is a:
            _step_in_another_thread(step, started)
        return value

    monkeypatch.setattr(statevar.Variable, "value", property(read_then_let_a_step_run))
    statevar.save(tmp_path / "ckpt", [a, b])
    monkeypatch.undo()
    started[0].join()

    restored = [statevar.Variable(jnp.zeros(4), name=n) for n in ("a", "b")]
    statevar.restore(tmp_path / "ckpt", restored)
    chex.assert_trees_all_equal(restored[0].value, restored[1].value, jnp.ones(4))
    chex.assert_trees_all_equal(a.value, b.value, jnp.full(4, 2.0))  # the step ran after


def test_a_restore_while_another_thread_trains_lands_before_or_after_its_steps(
    tmp_path, monkeypatch
):
    a, b, step = _pair_and_step()
    statevar.save(tmp_path / "ckpt", [a, b])
    step()
    started: list = []
    assign = statevar.Variable.assign

    def assign_then_let_a_step_run(variable, value):
        assign(variable, value)
        if variable is a:
            _step_in_another_thread(step, started)

    monkeypatch.setattr(statevar.Variable, "assign", assign_then_let_a_step_run)
    statevar.restore(tmp_path / "ckpt", [a, b])
    monkeypatch.undo()
    started[0].join()

    chex.assert_trees_all_equal(a.value, b.value, jnp.full(4, 2.0))  # restored, then stepped


@pytest.mark.usefixtures("default_sigint_handler")
def test_ctrl_c_during_a_restore_is_raised_once_every_variable_is_restored(tmp_path, monkeypatch):
    a, b, step = _pair_and_step()
    statevar.save(tmp_path / "ckpt", [a, b])
    step()
    assign = statevar.Variable.assign

    def assign_then_interrupt(variable, value):
        assign(variable, value)
        if variable is a:
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(statevar.Variable, "assign", assign_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        statevar.restore(tmp_path / "ckpt", [a, b])
    monkeypatch.undo()

    chex.assert_trees_all_equal(a.value, b.value, jnp.ones(4))


@pytest.mark.parametrize(
    ("api", "module", "hook"),
    [("save", _save_restore, "_write_data"), ("CheckpointManager", _manager, "write_manifest")],
    ids=["save", "CheckpointManager"],
)
def test_two_threads_saving_into_one_directory_keep_each_others_data(
    tmp_path, monkeypatch, api, module, hook
):
    import threading

    x = statevar.Variable(jnp.arange(4.0), name="x")
    # Keeping one step: the later save deletes the earlier once both are whole.
    manager = statevar.CheckpointManager(tmp_path / "run", max_to_keep=1)

    def save(step):
        if api == "save":
            statevar.save(tmp_path / "ckpt", x)
        else:
            manager.save(step, x)

    errors: list = []
    other = threading.Thread(target=lambda: _collect(errors, save, 1))
    real = getattr(module, hook)

    def let_the_other_thread_save_midway(*args):
        # This save's data is written, its manifest not yet: the other thread's save would
        # delete that data as what an interrupted save left. It waits instead.
        if api == "save":
            real(*args)
        if other.ident is None:
            other.start()
            other.join(timeout=0.5)
        if api != "save":
            real(*args)

    monkeypatch.setattr(module, hook, let_the_other_thread_save_midway)
    save(0)
    other.join()
    monkeypatch.undo()

    assert errors == []
    restored = statevar.Variable(jnp.zeros(4), name="x")
    if api == "save":
        statevar.restore(tmp_path / "ckpt", restored)
    else:
        assert manager.all_steps() == [1]
        manager.restore(restored)
    chex.assert_trees_all_equal(restored.value, jnp.arange(4.0))


def _collect(errors, fn, *args):
    try:
        fn(*args)
    except Exception as error:  # asserted by the test
        errors.append(error)
