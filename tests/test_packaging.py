"""Tests that ``pyproject.toml`` declares what the package, the examples, the tests and the
benchmarks import: the package its dependencies, and each of the others its extra."""

import ast
import importlib.metadata
import pathlib
import re
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Import names to the distributions that provide them, for what is installed here.
PROVIDERS = importlib.metadata.packages_distributions()


def _normalized(requirement: str) -> str:
    name = re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0)
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared(*extras: str) -> set[str]:
    """The distributions the dependencies and ``extras`` declare, following
    ``statevar[...]`` references to other extras."""
    names = {_normalized(r) for r in PROJECT["dependencies"]}
    for extra in extras:
        for requirement in PROJECT["optional-dependencies"][extra]:
            included = re.fullmatch(r"statevar\[([\w,]+)\]", requirement)
            if included:
                names |= _declared(*included.group(1).split(","))
            else:
                names.add(_normalized(requirement))
    return names


def _imported(*folders: str) -> set[str]:
    """The distributions that the Python files (and Markdown code) in ``folders`` import."""
    modules = set()
    # Scripts in the same folder import each other (benchmarks/ shares helpers).
    local = {path.stem for folder in folders for path in (ROOT / folder).glob("*.py")}
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):  # the package's subpackages included
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    modules |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules.add(node.module.split(".")[0])
    third_party = modules - set(sys.stdlib_module_names) - local - {"statevar", "__future__"}
    return {_normalized(d) for module in third_party for d in PROVIDERS.get(module, [module])}


def test_the_package_declares_exactly_what_it_imports():
    imported = _imported("statevar")
    assert imported <= _declared()
    # jaxlib is pinned beside jax, whose version must match it; nothing else goes unused.
    assert _declared() - imported == {"jaxlib"}
    assert "flax" not in _declared()  # used by the tests and benchmarks only


@pytest.mark.parametrize(
    "folder, extras",
    [
        ("examples", ("examples",)),
        ("tests", ("test",)),
        ("benchmarks", ("bench",)),
    ],
)
def test_each_extra_declares_what_its_scripts_import(folder, extras):
    missing = _imported(folder) - _declared(*extras)
    assert not missing, f"{folder}/ imports {sorted(missing)}, not declared in {extras}"


def test_the_readme_run_command_installs_the_examples_extra():
    readme = (ROOT / "README.md").read_text()
    run = readme.split("# run\n", 1)[1].splitlines()[0]
    assert '".[examples]"' in run and "examples/train.py" in run
