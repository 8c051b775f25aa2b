"""The package's modules form layers: each imports only modules below it, at the top."""

import ast
import graphlib
import pathlib
import subprocess
import sys

import statevar

PACKAGE = pathlib.Path(statevar.__file__).parent


def _imports(path: pathlib.Path) -> tuple[set[str], list[str]]:
    """Returns the statevar modules ``path`` imports at run time at its top level, and a
    description of each import of a statevar module made anywhere else."""
    tree = ast.parse(path.read_text())
    top: set[str] = set()
    elsewhere: list[str] = []
    # A module-level import, or one in a module-level try (an optional extension's).
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
        if not isinstance(node, ast.ImportFrom) or node.level != 1:
            continue
        modules = [node.module] if node.module else [alias.name for alias in node.names]
        if id(node) in top_level:
            top.update(modules)
        elif id(node) not in type_checking:  # imports for type checkers only never run
            elsewhere += [f"{path.name}:{node.lineno} imports {m}" for m in modules]
    return top, elsewhere


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    graph, elsewhere = {}, []
    for path in sorted(PACKAGE.glob("*.py")):
        graph[path.stem], found = _imports(path)
        elsewhere += found
    return graph, elsewhere


def test_no_module_imports_another_inside_a_function():
    # An import inside a function is how a cycle hides; every import is at the top.
    assert _graph()[1] == []


def test_the_import_graph_has_no_cycle():
    graph, _ = _graph()
    order = list(graphlib.TopologicalSorter(graph).static_order())  # raises CycleError
    assert order[-1] == "__init__"  # the package imports everything; nothing imports it


def test_no_module_imports_a_higher_one_even_for_type_checkers():
    # A lower floor that needs a higher type names it by a Protocol instead.
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text())
        for block in tree.body:
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test):
                relative = [
                    node
                    for node in ast.walk(block)
                    if isinstance(node, ast.ImportFrom) and node.level == 1
                ]
                assert not relative, f"{path.name} imports statevar modules for type checkers"


def test_the_foundations_import_nothing_above_them():
    graph, _ = _graph()
    # Errors, the signal guard and the shared state import no statevar module; the core
    # Variable imports nothing that walks trees, traces, compiles, optimizes or checkpoints.
    assert graph["_errors"] == set() and graph["_signals"] == set()
    assert graph["_state"] == set()
    above_the_variable = {"_tree", "_module", "_jit", "_grad", "_optim", "_checkpoint"}
    assert not graph["_variable"] & above_the_variable


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

BOUNDARY = "_jax.py"
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
    modules = sorted(p for p in PACKAGE.rglob("*.py") if p.name != BOUNDARY)
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
