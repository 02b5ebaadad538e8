"""The folders are the layers: each module imports only the layers below it.

Layer 1 is the algorithm (``psa_ref/*.py``), layer 2 the KV cache manager (``psa_ref/kvcache``),
layer 3 the tools (``psa_ref/tools``); ``psa_ref/testing`` holds helpers shared by tests and
benchmarks. The reference never imports the GPU package, and ``import psa_ref`` pulls in neither
torch nor CuPy.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "psa_ref"
# what each part of psa_ref may import from psa_ref (None: the algorithm, the top-level modules)
ALLOWED = {
    None: {None},
    "kvcache": {None, "kvcache", "testing"},  # sim draws synthetic workloads from psa_ref.testing
    "testing": {None, "kvcache", "testing"},
    "tools": {None, "kvcache", "testing", "tools"},
}


def part_of(module: str) -> str | None:
    """``psa_ref.kvcache.pool`` -> ``"kvcache"``; a top-level module -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ALLOWED) else None


def imports_of(path: Path) -> list[str]:
    """Absolute names of the modules a file imports (relative imports resolved)."""
    rel = path.relative_to(ROOT.parent).with_suffix("")
    package = list(rel.parts[:-1])  # a module and its package's __init__ resolve "." alike
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            names += [mod] if node.module else [f"{mod}.{a.name}" for a in node.names]
    return names


MODULES = sorted(ROOT.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_each_module_imports_only_the_layers_below(path):
    rel = path.relative_to(ROOT)
    own = rel.parts[0] if len(rel.parts) > 1 else None
    for name in imports_of(path):
        top = name.split(".")[0]
        assert top != "psa_fast", f"{rel} imports {name}: the reference never imports the GPU package"
        if top == "psa_ref":
            assert part_of(name) in ALLOWED[own], f"{rel} (layer {own or 'algorithm'}) imports {name}"


def test_the_layer_rule_sees_a_violation():
    """The check itself can fail: a made-up tools import from an algorithm module is caught."""
    assert part_of("psa_ref.tools.hf") not in ALLOWED[None]
    assert part_of("psa_ref.blocks") in ALLOWED["kvcache"]
    assert imports_of(ROOT / "kvcache" / "pool.py").count("psa_ref.kvcache.store") == 1


def test_importing_the_reference_pulls_in_neither_torch_nor_cupy():
    code = ("import sys, psa_ref, psa_ref.kvcache; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'cupy', 'psa_fast', 'numba'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"import psa_ref loaded {out.strip()}"
