"""The package's modules form layers: each imports only modules below it, at the top."""

import ast
import graphlib
import pathlib
import subprocess
import sys

import statevar

PACKAGE = pathlib.Path(statevar.__file__).parent


# The layers, lowest first: a module imports modules of its own layer or lower ones only.
# Each subpackage is one layer; the modules directly in statevar/ are the foundations
# (errors, signals, the shared state, the cache registry) or the top (the public random
# module and the package itself).
FOUNDATIONS = {"_errors", "_signals", "_state", "_caches"}
LAYERS = ["_tracing", "_cell", "_distribute", "_compile", "_train", "_checkpoint"]
TOP = {"random", "_random_args", "__init__"}


def _name(path: pathlib.Path) -> str:
    """A module's dotted name inside statevar: ``_cell.variable``, ``_errors``, ``__init__``
    (a subpackage's own ``__init__`` is ``_cell.__init__``)."""
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


def _layer(name: str) -> int:
    package = name.split(".")[0]
    if package in FOUNDATIONS:
        return 0
    if package in TOP:
        return len(LAYERS) + 1
    return LAYERS.index(package) + 1


def _resolve(name: str, node: ast.ImportFrom) -> list[str]:
    """The statevar modules a relative import in module ``name`` names."""
    here = name.split(".")[:-1]  # the package the module is in
    base = here[: len(here) - (node.level - 1)]
    target = [*base, *(node.module.split(".") if node.module else [])]
    if PACKAGE.joinpath(*target).is_dir():  # ``from .._cell import variable``: modules
        return [".".join([*target, alias.name]) for alias in node.names]
    return [".".join(target)]


def _imports(path: pathlib.Path) -> tuple[set[str], list[str]]:
    """Returns the statevar modules ``path`` imports at run time at its top level, and a
    description of each import of a statevar module made anywhere else."""
    tree = ast.parse(path.read_text())
    name = _name(path)
    top: set[str] = set()
    elsewhere: list[str] = []
    # A module-level import, or one in a module-level try block.
    top_level = {
        id(node)
        for block in tree.body
        for node in ([block] + (block.body if isinstance(block, ast.Try) else []))
    }
    type_checking = {
        id(node)
        for block in tree.body
        if isinstance(block, ast.If)
        and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for node in ast.walk(block)
    }
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        modules = _resolve(name, node)
        if id(node) in top_level:
            top.update(modules)
        elif id(node) not in type_checking:  # imports for type checkers only never run
            elsewhere += [f"{name}:{node.lineno} imports {m}" for m in modules]
    return top, elsewhere


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    graph, elsewhere = {}, []
    for path in sorted(PACKAGE.rglob("*.py")):
        graph[_name(path)], found = _imports(path)
        elsewhere += found
    return graph, elsewhere


def test_no_module_imports_another_inside_a_function():
    # An import inside a function is how a cycle hides; every import is at the top.
    assert _graph()[1] == []


def test_the_import_graph_has_no_cycle():
    graph, _ = _graph()
    order = list(graphlib.TopologicalSorter(graph).static_order())  # raises CycleError
    assert order[-1] == "__init__"  # the package imports everything; nothing imports it


def test_every_import_names_a_module_of_the_package():
    graph, _ = _graph()
    assert {target for targets in graph.values() for target in targets} <= set(graph)


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Each import in ``graph`` that runs from a module to a higher layer."""
    return [
        f"{module} imports {target}"
        for module, targets in graph.items()
        for target in targets
        if _layer(target) > _layer(module)
    ]


def test_no_module_imports_a_higher_layer():
    graph, _ = _graph()
    assert set(graph) == {n for n in graph if n.split(".")[0] in {*FOUNDATIONS, *LAYERS, *TOP}}
    assert _upward(graph) == []


def test_the_layer_check_finds_an_import_running_up():
    # The check above can fail: the shared state importing the Variable, or the cell
    # importing a compiled step, runs up; the step importing the Variable does not.
    graph = {
        "_state": {"_cell.variable"},
        "_cell.variable": {"_compile.step", "_errors"},
        "_compile.step": {"_cell.variable"},
    }
    assert _upward(graph) == [
        "_state imports _cell.variable",
        "_cell.variable imports _compile.step",
    ]


def test_each_subpackage_is_a_plain_folder_of_modules():
    # A subpackage's __init__ says what the package holds and imports nothing: each module
    # is imported by its own name.
    graph, _ = _graph()
    faces = [name for name in graph if name.endswith(".__init__")]
    assert sorted(faces) == sorted(f"{package}.__init__" for package in LAYERS)
    assert all(graph[face] == set() for face in faces)


def test_at_most_twelve_modules_stand_directly_in_the_package():
    direct = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(direct) <= 12, direct


def test_no_module_imports_the_package_for_type_checkers():
    # A lower layer that needs a higher type names it by a Protocol instead.
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for block in tree.body:
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test):
                relative = [
                    node
                    for node in ast.walk(block)
                    if isinstance(node, ast.ImportFrom) and node.level >= 1
                ]
                assert not relative, f"{_name(path)} imports statevar modules for type checkers"


def test_the_foundations_import_nothing_above_them():
    graph, _ = _graph()
    # Errors, the signal guard and the shared state import no statevar module; the core
    # Variable imports nothing that walks trees, traces, compiles, optimizes or checkpoints.
    assert graph["_errors"] == set() and graph["_signals"] == set()
    assert graph["_state"] == set()
    assert all(_layer(target) <= _layer("_cell.variable") for target in graph["_cell.variable"])


def test_importing_statevar_leaves_jax_unconfigured():
    # JAX options that take effect when its backends start (jax_num_cpu_devices,
    # jax_platforms) can still be set after ``import statevar``.
    code = (
        "import statevar, jax\n"
        "jax.config.update('jax_num_cpu_devices', 3)\n"
        "print(len(jax.devices('cpu')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "3"


# ------------------------------------------------------------ one boundary with JAX's internals

BOUNDARY = pathlib.Path("_tracing", "jax_internals.py")
# Modules of JAX that are private or unstable (`jax.core.Tracer` alone is public), and what
# reading JAX's Python frames or private fields of its objects looks like.
_INTERNAL_MODULES = ("jax.core", "jax.extend", "jax._src", "jax.interpreters", "jaxlib")
_INTERNAL_NAMES = {"f_locals", "parent_trace", "traced_for", "debug_info", "_committed"}
# Read by name: also a tracer's trace (statevar's frames have a ``_trace`` attribute of
# their own, read as an attribute).
_INTERNAL_NAMES_IN_STRINGS = _INTERNAL_NAMES | {"_trace"}


def _is_internal_module(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in _INTERNAL_MODULES)


def _uses_of_jax_internals(path: pathlib.Path, root: pathlib.Path = PACKAGE) -> list[str]:
    """Each import of JAX's private or unstable modules in ``path``, and each read of a
    private field of a JAX object or of a Python frame's locals, by attribute or by name in
    ``getattr``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [
                f"{where} imports {a.name}" for a in node.names if _is_internal_module(a.name)
            ]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = {a.name for a in node.names}
            if node.module == "jax.core" and names <= {"Tracer"}:
                continue  # public
            if _is_internal_module(node.module) or (
                node.module == "jax" and names & {"core", "extend", "interpreters"}
            ):
                found.append(f"{where} imports from {node.module}")
        elif isinstance(node, ast.Attribute) and node.attr in _INTERNAL_NAMES:
            found.append(f"{where} reads .{node.attr}")
        elif isinstance(node, ast.Attribute) and ast.unparse(node).endswith(".jaxpr.jaxpr"):
            found.append(f"{where} reads .jaxpr.jaxpr")  # kept in jax 0.12 for compatibility
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value in _INTERNAL_NAMES_IN_STRINGS
        ):
            found.append(f"{where} names {node.value!r}")  # getattr(x, "name") and the like
    return found


def test_only_the_boundary_module_reaches_into_jax_internals():
    modules = sorted(p for p in PACKAGE.rglob("*.py") if p != PACKAGE / BOUNDARY)
    assert len(modules) > 30  # subpackages included
    assert [use for path in modules for use in _uses_of_jax_internals(path)] == []


def test_the_boundary_scan_finds_each_kind_of_use(tmp_path):
    # The scan above can fail: each form it looks for is found.
    path = tmp_path / "probe.py"
    path.write_text(
        "import jax.extend.core\n"
        "from jax._src import core\n"
        "from jax import interpreters\n"
        "from jax.core import Tracer, get_aval\n"
        "a = frame.f_locals\n"
        "b = getattr(array, '_committed', False)\n"
        "c = trace.parent_trace\n"
        "e = getattr(tracer, '_trace', None)\n"
        "d = traced.jaxpr.jaxpr\n"
    )
    uses = sorted(use.split(" ", 1)[1] for use in _uses_of_jax_internals(path, tmp_path))
    assert uses == sorted(
        [
            "imports jax.extend.core",
            "imports from jax._src",
            "imports from jax",
            "imports from jax.core",
            "reads .f_locals",
            "names '_committed'",
            "reads .parent_trace",
            "names '_trace'",
            "reads .jaxpr.jaxpr",
        ]
    )


def test_the_boundary_module_uses_what_it_says():
    assert _uses_of_jax_internals(PACKAGE / BOUNDARY)  # the boundary is where they are
