"""Imports go one way: a lower layer never imports a higher one (imports inside functions count), and no two
modules import each other. The layer order is written here, once."""

import ast
import collections
from pathlib import Path

from tests.conftest import REPO

LAYERS = (
    ("errors", "host", "metering", "_compat", "files", "epoch_log"),  # without TensorFlow; _compat: the private uses
    ("config",),
    ("runtime", "data", "rundir", "flops", "checkpoint_files"),
    ("callbacks",),
    ("tuning", "reports"),
    ("train",),
    ("run", "cli", "export"),
    ("recipes",),
    ("doctor", "launch"),
    ("__init__",),  # the public API re-exports every layer
)
"""tftrain's layers, bottom first: by the module's first name under `tftrain`."""


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else "__init__"
    found = [i for i, names in enumerate(LAYERS) if top in names]
    assert found, f"{module}: its first name {top!r} is in no layer of LAYERS; add it there"
    return found[0]


def _modules() -> dict:
    out = {}
    for path in (REPO / "tftrain").rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(module: str, path: Path, modules: dict) -> set:
    """Every tftrain module `module` imports, at its top or inside a function."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "tftrain"}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            if name.split(".")[0] == "tftrain":  # `from X import m` of a module m imports X.m; of a name, X
                found |= {f"{name}.{a.name}" if f"{name}.{a.name}" in modules else name for a in node.names}
    return found


def _graph() -> dict:
    modules = _modules()
    return {m: _imports(m, p, modules) for m, p in modules.items()}


def test_no_module_imports_a_higher_layer():
    upward = [f"{m} -> {t}" for m, targets in _graph().items() for t in sorted(targets) if _layer(t) > _layer(m)]
    assert not upward, "imports going up the layers (see LAYERS):\n" + "\n".join(sorted(upward))


def test_no_two_modules_import_each_other():
    graph = _graph()
    pairs = {tuple(sorted((m, t))) for m, targets in graph.items() for t in targets
             if m in graph.get(t, ()) and m != t and not t.startswith(m + ".") and not m.startswith(t + ".")}
    assert not pairs, f"import cycles: {sorted(pairs)}"


def test_the_checks_see_imports_inside_functions(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text("def f():\n    from tftrain.doctor import diagnose\n    import tftrain.train.trainer\n")
    found = _imports("tftrain.runtime.probe", path, {"tftrain.doctor.diagnose": None})
    assert found == {"tftrain.doctor.diagnose", "tftrain.train.trainer"}
    assert max(_layer(t) for t in found) > _layer("tftrain.runtime.probe")  # what the first test would flag

