"""Sharded variables over a device mesh: creation, in-place updates that keep the sharding,
resharding, mesh scopes and rules, Optimizer state, `statevar.jit` placement checks, and
data-parallel and FSDP training equal to training on one device. conftest gives this
machine eight CPU devices; every test runs on an Auto and on an Explicit mesh."""

from __future__ import annotations

import copy

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import statevar


@pytest.fixture(params=[AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
def mesh(request):
    """A 4 x 2 mesh of the eight CPU devices, axes ("data", "model")."""
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(request.param,) * 2)


def buffers(variable):
    """The addresses of a variable's shards: unchanged by an update made in place."""
    return [shard.data.unsafe_buffer_pointer() for shard in variable.value.addressable_shards]


def same_sharding(a, b):
    return a.is_equivalent_to(b, 2)


# ----------------------------------------------------------------------- creation


def test_sharding_argument_takes_a_sharding_a_spec_or_axis_names(mesh):
    sharding = NamedSharding(mesh, P("data", "model"))
    given = statevar.Variable(jnp.ones((8, 4)), sharding=sharding, name="given")
    with statevar.mesh(mesh):
        spec = statevar.Variable(jnp.ones((8, 4)), sharding=P("data", "model"))
        names = statevar.Variable(jnp.ones((8, 4)), sharding=("data", "model"))
    as_device = statevar.Variable(jnp.ones((8, 4)), device=sharding)
    for variable in (given, spec, names, as_device):
        assert variable.sharding == sharding
        assert variable.device == sharding  # as jax.Array.device for several devices
        assert len(variable.value.addressable_shards) == 8
        chex.assert_trees_all_close(variable.numpy(), np.ones((8, 4), np.float32))


def test_sharding_argument_takes_a_callable_of_name_and_shape(mesh):
    def spec(name, shape):
        assert (name, shape) == ("table", (8, 6))
        return P("data", None)

    with statevar.mesh(mesh):
        table = statevar.Variable(jnp.ones((8, 6)), sharding=spec, name="table")
    assert table.sharding == NamedSharding(mesh, P("data", None))


def test_reshard_is_refused_inside_a_compiled_step(mesh):
    w = statevar.Variable(jnp.ones(8), name="w")

    @statevar.jit
    def step():
        w.reshard(NamedSharding(mesh, P("data")))

    with pytest.raises(
        statevar.TraceContextError, match=r"Cannot reshard Variable 'w' inside statevar.jit"
    ):
        step()
    assert w.device == jax.devices()[0]


def test_callable_initial_value_is_computed_directly_with_its_sharding(mesh):
    traced = []

    def init():
        value = jax.random.normal(jax.random.key(0), (8, 4))
        traced.append(isinstance(value, jax.core.Tracer))
        return value

    sharding = NamedSharding(mesh, P("data", None))
    w = statevar.Variable(init, sharding=sharding, name="w")
    assert traced == [True]  # traced once, run compiled: never whole on one device
    assert w.sharding == sharding
    chex.assert_trees_all_close(w.numpy(), np.asarray(jax.random.normal(jax.random.key(0), (8, 4))))
    plain = statevar.Variable(lambda: jnp.arange(3.0), name="plain")
    assert plain.device == jax.devices()[0]
    chex.assert_trees_all_close(plain.numpy(), np.arange(3.0, dtype=np.float32))


def test_an_array_spread_over_devices_keeps_its_sharding(mesh):
    sharding = NamedSharding(mesh, P(None, "model"))
    array = jax.device_put(jnp.arange(8.0).reshape(2, 4), sharding)
    v = statevar.Variable(array)
    assert v.sharding == sharding
    assert not array.is_deleted()  # copied, never donated
    assert statevar.Variable(v).sharding == sharding
    copied = copy.deepcopy(v)
    assert copied.sharding == sharding
    chex.assert_trees_all_close(copied.numpy(), np.asarray(array))


def test_mesh_scope_replicates_unless_a_rule_matches(mesh):
    rules = [
        ("kernel", ("data", "model")),
        ("embedding", lambda name, shape: P("model") if shape[0] % 2 == 0 else None),
        ("bias", None),
    ]
    with statevar.mesh(mesh, rules=rules) as entered:
        assert entered is mesh
        kernel = statevar.Variable(np.ones((8, 4), np.float32), name="dense/kernel")
        embedding = statevar.Variable(np.ones((6, 3), np.float32), name="embedding")
        bias = statevar.Variable(np.zeros(4, np.float32), name="dense/bias")
        other = statevar.Variable(1.0, name="scale")
        with statevar.device("cpu:1"):
            inner = statevar.Variable(1.0, name="kernel_on_one_device")
    assert kernel.sharding.spec == P("data", "model")
    assert embedding.sharding.spec == P("model")
    assert bias.sharding.spec == P() and other.sharding.spec == P()
    assert inner.device == jax.devices()[1]  # the innermost scope wins
    with statevar.device("cpu:2"), statevar.mesh(mesh):
        assert statevar.Variable(1.0).sharding == NamedSharding(mesh, P())


def test_numpy_put_on_a_sharding_does_not_alias_host_memory(mesh):
    host = np.ones((8, 4), np.float32)
    v = statevar.Variable(host, sharding=NamedSharding(mesh, P("data", None)))
    before = buffers(v)
    v.assign_add(1.0)
    host[:] = 7.0
    assert buffers(v) == before
    chex.assert_trees_all_close(v.numpy(), np.full((8, 4), 2.0, np.float32))


# ----------------------------------------------------------------------- updates


_UPDATES = {
    "assign_numpy": (lambda v: v.assign(np.full((8, 4), 3.0, np.float32)), lambda a: a * 0 + 3),
    "assign_scalar": (lambda v: v.assign(2.0), lambda a: a * 0 + 2),
    "assign_add_other_device": (
        lambda v: v.assign_add(jax.device_put(jnp.ones((8, 4)), jax.devices()[5])),
        lambda a: a + 1,
    ),
    "assign_sub_row": (lambda v: v.assign_sub(jnp.arange(4.0)), lambda a: a - np.arange(4.0)),
    "setitem_row": (
        lambda v: v.__setitem__(1, 9.0),
        lambda a: np.where(np.arange(8)[:, None] == 1, 9, a),
    ),
    "setitem_slice": (
        lambda v: v.__setitem__(slice(2, 4), jnp.zeros((2, 4))),
        lambda a: np.where((np.arange(8)[:, None] >= 2) & (np.arange(8)[:, None] < 4), 0, a),
    ),
    "setmask": (lambda v: v.__setitem__(v > 20, 0.0), lambda a: np.where(a > 20, 0, a)),
}


@pytest.mark.parametrize("update", _UPDATES, ids=list(_UPDATES))
def test_updates_keep_the_sharding_and_run_in_place(mesh, update):
    apply, expected = _UPDATES[update]
    sharding = NamedSharding(mesh, P("data", "model"))
    start = np.arange(32.0, dtype=np.float32).reshape(8, 4)
    v = statevar.Variable(start, sharding=sharding, name="v")
    before = buffers(v)
    apply(v)
    apply(v)  # the second call takes the compiled update's fast path
    assert v.sharding == sharding
    assert buffers(v) == before
    chex.assert_trees_all_close(v.numpy(), expected(expected(start)).astype(np.float32))


def test_arithmetic_moves_an_operand_on_another_device_to_the_mesh(mesh):
    w = statevar.Variable(jnp.ones((8, 4)), sharding=NamedSharding(mesh, P("data", "model")))
    row = jax.device_put(jnp.arange(4.0), jax.devices()[3])
    total = w + row
    assert total.sharding.device_set == w.sharding.device_set
    chex.assert_trees_all_close(total, np.ones((8, 4), np.float32) + np.arange(4.0))
    same = jax.device_put(jnp.ones((8, 4)), jax.devices()[3])
    assert (w * same).sharding.device_set == w.sharding.device_set


def test_update_of_a_shared_value_copies_and_keeps_the_sharding(mesh):
    sharding = NamedSharding(mesh, P("data", None))
    v = statevar.Variable(jnp.zeros((8, 4)), sharding=sharding)
    earlier = v.value
    v.assign_add(jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P(None, "model"))))
    assert v.sharding == sharding
    chex.assert_trees_all_close(earlier, np.zeros((8, 4), np.float32))
    chex.assert_trees_all_close(v.numpy(), np.ones((8, 4), np.float32))


def test_reshard_moves_the_variable_and_earlier_reads_stay_valid(mesh):
    v = statevar.Variable(jnp.arange(8.0), name="v")
    earlier = v.value
    with statevar.mesh(mesh):
        assert v.reshard(("data",)) is v
    assert v.sharding == NamedSharding(mesh, P("data"))
    assert earlier.device == jax.devices()[0] and not earlier.is_deleted()
    before = buffers(v)
    v.assign_add(1.0)
    assert buffers(v) == before
    v.reshard(jax.devices()[3])
    assert v.device == jax.devices()[3]
    v.assign_add(1.0)
    assert v.device == jax.devices()[3]
    chex.assert_trees_all_close(v.numpy(), np.arange(8.0, dtype=np.float32) + 2)


# ----------------------------------------------------------------------- errors


def test_bad_specs_raise_naming_the_variable_shape_and_spec(mesh):
    with statevar.mesh(mesh):
        with pytest.raises(
            statevar.PlacementError,
            match=r"Variable 'w' of shape \(6, 4\) with sharding .*'data'.*dimension 0 \(6\) "
            r"is not divisible by the size of mesh axis 'data' \(4\)",
        ):
            statevar.Variable(jnp.ones((6, 4)), sharding=("data", None), name="w")
        with pytest.raises(statevar.PlacementError, match=r"Variable 'w'.*no axis 'batch'"):
            statevar.Variable(jnp.ones((8, 4)), sharding=P("batch"), name="w")
        with pytest.raises(
            statevar.PlacementError, match=r"Variable 'w' of shape \(8,\).*2 entries, more than"
        ):
            statevar.Variable(jnp.ones(8), sharding=("data", "model"), name="w")
        with pytest.raises(statevar.PlacementError, match=r"'data' is used twice"):
            statevar.Variable(jnp.ones((8, 8)), sharding=("data", "data"), name="w")
        with pytest.raises(TypeError, match=r"Variable 'w'.*expected a sharding"):
            statevar.Variable(jnp.ones(8), sharding=3, name="w")
    with pytest.raises(statevar.PlacementError, match=r"Variable 'w' of shape \(8,\).*no mesh"):
        statevar.Variable(jnp.ones(8), sharding=P("data"), name="w")
    with pytest.raises(
        statevar.PlacementError, match=r"Variable 'w' of shape \(6, 4\).*not divisible"
    ):
        statevar.Variable(jnp.ones((6, 4)), sharding=NamedSharding(mesh, P("data")), name="w")
    with pytest.raises(TypeError, match=r"Variable 'w' with both device= and sharding="):
        statevar.Variable(1.0, device="cpu:0", sharding=P(), name="w")


def test_bad_mesh_scopes_and_rules_raise():
    with pytest.raises(TypeError, match=r"statevar.mesh needs a jax.sharding.Mesh, got NoneType"):
        with statevar.mesh(None):
            pass
    devices = jax.make_mesh((8,), ("data",))
    with pytest.raises(TypeError, match=r"each sharding rule to be a \(regex, spec\) pair"):
        with statevar.mesh(devices, rules=["kernel"]):
            pass
    with pytest.raises(TypeError, match=r"regex of sharding rule .* to be a str, got int"):
        with statevar.mesh(devices, rules=[(1, P())]):
            pass
    with pytest.raises(ValueError, match=r"Cannot compile the regex of sharding rule"):
        with statevar.mesh(devices, rules=[("(", P())]):
            pass
    with statevar.mesh(devices, rules=[("w", ("data",))]):
        with pytest.raises(statevar.PlacementError, match=r"Variable 'w' of shape \(3,\)"):
            statevar.Variable(jnp.ones(3), name="w")


@pytest.mark.parametrize("spread", [False, True], ids=["eager", "traced for a sharding"])
def test_bad_callables_raise_naming_the_variable(spread, mesh):
    placement = {"sharding": NamedSharding(mesh, P())} if spread else {}
    with pytest.raises(TypeError, match=r"add got incompatible shapes") as raised:
        statevar.Variable(lambda: jnp.ones(3) + jnp.ones(4), name="w", **placement)
    assert "(raised by the initial value callable of Variable 'w')" in raised.value.__notes__
    with pytest.raises(statevar.DtypeMismatchError, match=r"Variable 'w'.*returns tuple"):
        statevar.Variable(lambda: (jnp.ones(3), jnp.ones(3)), name="w", **placement)
    with (
        statevar.mesh(mesh),
        pytest.raises(
            statevar.DtypeMismatchError, match=r"Variable 'w'.*returns list, expected one array"
        ),
    ):
        statevar.Variable(lambda: [jnp.ones(3)], name="w")


def test_reshard_moves_every_variable_of_two_modules_whose_names_are_alike(mesh):
    class Dense(statevar.Module):
        def __init__(self):
            self.kernel = statevar.Variable(jnp.ones((8, 4)))
            self.bias = statevar.Variable(jnp.ones(4))

    generator, discriminator = Dense(), Dense()
    a, b = statevar.Variable(jnp.ones(8)), statevar.Variable(jnp.ones(8))  # both 'Variable'

    placed = statevar.reshard([generator, discriminator, a, b], [("kernel", P("data"))], mesh=mesh)

    kernel = NamedSharding(mesh, P("data"))
    assert placed["kernel"] == kernel
    assert generator.kernel.sharding == discriminator.kernel.sharding == kernel
    assert a.sharding == b.sharding == NamedSharding(mesh, P())


def test_reshard_refuses_alike_names_a_callable_spec_shards_differently(mesh):
    first, second = statevar.Variable(jnp.ones(8)), statevar.Variable(jnp.ones((8, 2)))
    rules = [("", lambda name, shape: P(*(None,) * (len(shape) - 1), "model"))]

    with pytest.raises(
        ValueError, match=r"Two variables .* have the name 'Variable' and would be sharded"
    ):
        statevar.reshard([first, second], rules, mesh=mesh)
    assert first.sharding != NamedSharding(mesh, P("model"))  # nothing moved


def test_rejected_reshard_changes_no_variable(mesh):
    class Model(statevar.Module):
        def __init__(self):
            self.kernel = statevar.Variable(jnp.ones((8, 4)))
            self.bias = statevar.Variable(jnp.ones(3))

    model = Model()
    before = {name: v.sharding for name, v in model.named_variables().items()}
    with pytest.raises(
        statevar.PlacementError, match=r"Cannot reshard Variable 'bias' of shape \(3,\)"
    ):
        statevar.reshard(model, [("kernel", ("data", None)), ("bias", ("model",))], mesh=mesh)
    assert {name: v.sharding for name, v in model.named_variables().items()} == before
    with pytest.raises(statevar.PlacementError, match=r"statevar.reshard needs a mesh"):
        statevar.reshard(model, [])
    with pytest.raises(TypeError, match=r"mesh= to be a jax.sharding.Mesh, got str"):
        statevar.reshard(model, [], mesh="data")
    with statevar.mesh(mesh):
        with pytest.raises(
            statevar.PlacementError, match=r"Cannot reshard Variable 'kernel'.*no axis 'batch'"
        ):
            model.kernel.reshard(P("batch"))
    assert {name: v.sharding for name, v in model.named_variables().items()} == before


# ----------------------------------------------------------------------- compiled steps


def test_writes_inside_jit_keep_the_sharding_in_place(mesh):
    sharding = NamedSharding(mesh, P("data", "model"))
    w = statevar.Variable(jnp.zeros((8, 4)), sharding=sharding, name="w")
    count = statevar.Variable(0, sharding=NamedSharding(mesh, P()), name="count")

    @statevar.jit
    def overwrite(x):
        w.assign(jnp.full((8, 4), 5.0))  # a constant, written without reading w
        w.assign_add(x)
        count.assign_add(1)
        return jnp.sum(x)

    before = buffers(w)
    for _ in range(3):
        total = overwrite(jax.device_put(jnp.ones(4), NamedSharding(mesh, P())))
    assert float(total) == 4.0
    assert w.sharding == sharding and buffers(w) == before
    assert int(count) == 3
    chex.assert_trees_all_close(w.numpy(), np.full((8, 4), 6.0, np.float32))
    assert isinstance(overwrite.lower(jnp.ones(4)), jax.stages.Lowered)


def test_jit_traces_again_after_reshard(mesh):
    w = statevar.Variable(jnp.ones((8, 4)), sharding=NamedSharding(mesh, P("data")), name="w")

    @statevar.jit
    def double():
        w.assign(w * 2)

    double()
    w.reshard(NamedSharding(mesh, P(None, "model")))
    before = buffers(w)
    double()
    assert w.sharding == NamedSharding(mesh, P(None, "model"))
    assert buffers(w) == before
    chex.assert_trees_all_close(w.numpy(), np.full((8, 4), 4.0, np.float32))


def test_jit_refuses_variables_and_arguments_on_different_devices(mesh):
    w = statevar.Variable(jnp.ones(8), sharding=NamedSharding(mesh, P("data")), name="w")
    b = statevar.Variable(jnp.ones(8), device="cpu:1", name="b")

    @statevar.jit
    def step(x):
        w.assign_add(x)
        return w.value

    on_one_device = jax.device_put(jnp.ones(8), jax.devices()[2])
    with pytest.raises(
        statevar.PlacementError,
        match=r"'step' got variables and arguments on different devices: Variable 'w' on "
        r"\{cpu:0, .*cpu:7\}; argument 0 on cpu:2",
    ):
        step(on_one_device)
    with pytest.raises(statevar.PlacementError, match=r"argument 0 on cpu:2"):
        step.lower(on_one_device)
    step(jnp.ones(8))  # an uncommitted array is moved by JAX
    with pytest.raises(statevar.PlacementError, match=r"argument 0 on cpu:2"):
        step(on_one_device)  # a warm step too, before donating anything

    @statevar.jit
    def mixed():
        w.assign_add(b.value)

    with pytest.raises(
        statevar.PlacementError, match=r"'mixed'.*Variable 'b' on cpu:1; Variable 'w' on \{"
    ):
        mixed()
    assert not w.value.is_deleted() and not b.value.is_deleted()
    chex.assert_trees_all_close(w.numpy(), np.full(8, 2.0, np.float32))


def test_optimizer_state_takes_its_parameters_sharding(mesh):
    with statevar.mesh(mesh, rules=[("kernel", ("data", "model"))]):
        kernel = statevar.Variable(jnp.ones((8, 4)), name="kernel")
        bias = statevar.Variable(jnp.ones(4), name="bias")
    optimizer = statevar.Optimizer(optax.adam(0.1), [kernel, bias])
    names = {v.name: v for v in optimizer.state_variables}
    assert names["optimizer/mu/kernel"].sharding == kernel.sharding
    assert names["optimizer/nu/kernel"].sharding == kernel.sharding
    assert names["optimizer/mu/bias"].sharding == bias.sharding
    replicated = NamedSharding(mesh, P())
    assert names["optimizer/count"].sharding == replicated
    assert optimizer.iterations.sharding == replicated
    before = buffers(kernel)
    optimizer.apply([jnp.ones((8, 4)), jax.device_put(jnp.ones(4), jax.devices()[0])])
    assert buffers(kernel) == before and kernel.sharding.spec == P("data", "model")
    assert names["optimizer/mu/kernel"].sharding == kernel.sharding


# ----------------------------------------------------------------------- training


def _init(key, shape):
    return lambda: jax.random.normal(key, shape) / np.sqrt(shape[0])


class MLP(statevar.Module):
    def __init__(self, gather=None):
        keys = jax.random.split(jax.random.key(1), 2)
        self.w1 = statevar.Variable(_init(keys[0], (8, 16)), name="w1")
        self.b1 = statevar.Variable(jnp.zeros(16), name="b1")
        self.w2 = statevar.Variable(_init(keys[1], (16, 4)), name="w2")
        # On Explicit axes, an FSDP model gathers its sharded weights where it uses them.
        self.gather = gather or (lambda v: v.value)

    def __call__(self, x):
        hidden = jax.nn.relu(x @ self.gather(self.w1) + self.b1)
        return hidden @ self.gather(self.w2)


def _train(model, batches, targets, steps=6):
    optimizer = statevar.Optimizer(optax.adam(0.05), model)

    @statevar.jit
    def step(x, y):
        def loss():
            return jnp.mean((model(x) - y) ** 2)

        value, grads = statevar.value_and_grad(loss, model)()
        optimizer.apply(grads)
        return value

    # One loss at a time: a few collectives in flight, never dozens (see docs/scaling.md).
    losses = [float(step(batches[i % 2], targets[i % 2])) for i in range(steps)]
    return losses, {name: v.numpy() for name, v in model.named_variables().items()}


@pytest.mark.parametrize("strategy", ["data_parallel", "fsdp"])
def test_sharded_training_equals_training_on_one_device(mesh, strategy):
    rng = np.random.default_rng(0)
    batches = rng.normal(size=(2, 16, 8)).astype(np.float32)
    targets = rng.normal(size=(2, 16, 4)).astype(np.float32)
    expected_losses, expected_params = _train(MLP(), batches, targets)

    data = NamedSharding(mesh, P(("data", "model")))  # the batch over all eight devices
    if strategy == "data_parallel":
        model = MLP()
        statevar.reshard(model, [], mesh=mesh)  # every parameter replicated
    else:
        replicated = NamedSharding(mesh, P())
        explicit = mesh.axis_types[0] == AxisType.Explicit
        model = MLP(
            gather=(lambda v: jax.sharding.reshard(v.value, replicated)) if explicit else None
        )
        statevar.reshard(model, [("w", ("data",))], mesh=mesh)
        assert model.w1.sharding.spec == P("data") and model.b1.sharding.spec == P()
    shard = lambda a: jax.device_put(a, data)  # noqa: E731
    losses, params = _train(model, list(map(shard, batches)), list(map(shard, targets)))
    chex.assert_trees_all_close(losses, expected_losses, rtol=1e-5, atol=1e-5)
    chex.assert_trees_all_close(params, expected_params, rtol=1e-5, atol=1e-5)
    if strategy == "fsdp":
        # Equivalent shardings: a compiled step on Explicit axes spells P("data") P("data", None).
        assert same_sharding(model.w1.sharding, NamedSharding(mesh, P("data")))
        assert same_sharding(model.w2.sharding, NamedSharding(mesh, P("data")))


# ----------------------------------------------------------------------- checkpoints


def test_restore_onto_another_mesh_and_onto_one_device(mesh, tmp_path):
    w = statevar.Variable(
        jnp.arange(32.0).reshape(8, 4), sharding=NamedSharding(mesh, P("data", "model")), name="w"
    )
    statevar.save(tmp_path / "ckpt", [w])
    other_mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=mesh.axis_types)
    target = statevar.Variable(
        jnp.zeros((8, 4)), sharding=NamedSharding(other_mesh, P(None, "y")), name="w"
    )
    before = buffers(target)
    statevar.restore(tmp_path / "ckpt", [target])
    assert target.sharding == NamedSharding(other_mesh, P(None, "y"))
    assert buffers(target) == before
    chex.assert_trees_all_close(target.numpy(), np.arange(32.0, dtype=np.float32).reshape(8, 4))
    single = statevar.Variable(jnp.zeros((8, 4)), device="cpu:3", name="w")
    statevar.restore(tmp_path / "ckpt", [single])
    assert single.device == jax.devices()[3]
    chex.assert_trees_all_close(single.numpy(), w.numpy())


def test_placement_log_names_the_sharding(mesh, caplog):
    statevar.set_log_device_placement(True)
    with caplog.at_level("INFO", logger="statevar"):
        v = statevar.Variable(jnp.ones(8), sharding=NamedSharding(mesh, P("data")), name="v")
        v.assign_add(1.0)
        v.reshard(jax.devices()[1])
    messages = [record.getMessage() for record in caplog.records]
    assert messages[0].startswith("Variable 'v': create on NamedSharding(")
    assert messages[1].startswith("Variable 'v': assign_add on NamedSharding(")
    assert messages[2] == "Variable 'v': reshard on cpu:1"
