"""Docstrings render in mkdocstrings: no raw Sphinx roles, and each ``Returns:`` section is one entry.

mkdocstrings reads Markdown, so a Sphinx role such as ``:func:`psa_ref.attention``` shows up verbatim on the API
pages. Cross-references are written ``[`attention`][psa_ref.attention]`` (resolved by autorefs; ``mkdocs build
--strict`` fails on a target the site does not document) or as plain code. The modules are read as source text
(ast), so this runs without a GPU, torch or transformers.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("psa_ref", "psa_fast")

# `:role:` or `:domain:role:` followed by a single backtick: :meth:`x`, :py:class:`y`, :data:`~a.b`.
ROLE = re.compile(r"(?<![\w:`]):(?:[a-z]+:)?[a-z]+:`(?!`)[^`\n]+`")


def modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def docstrings(path: Path) -> list[tuple[str, int, str]]:
    """``(owner, line, text)`` for the module's docstring and every class and function docstring in it."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text is not None:
                found.append((getattr(node, "name", "<module>"), node.body[0].lineno, text))
    return found


def raw_roles(text: str) -> list[str]:
    return ROLE.findall(text)


def split_returns(text: str) -> list[str]:
    """Lines of a ``Returns:``/``Yields:`` section at its first line's indent after that line.

    mkdocstrings (Google style) starts a new row at each such line; a description continues on lines
    indented further."""
    lines = text.splitlines()
    bad = []
    for i, line in enumerate(lines):
        if re.fullmatch(r"\s*(Returns|Yields):\s*", line) and i + 1 < len(lines):
            first = lines[i + 1]
            indent = len(first) - len(first.lstrip())
            for later in lines[i + 2:]:
                if not later.strip():
                    break
                ind = len(later) - len(later.lstrip())
                if ind < indent:
                    break
                if ind == indent:
                    bad.append(later.strip())
    return bad


def test_the_detectors_flag_what_they_should():
    assert raw_roles("Build one with :meth:`x`.") == [":meth:`x`"]
    assert raw_roles("see :py:class:`~psa_ref.KVBlocks` and :data:`METADATA_KINDS`") == [
        ":py:class:`~psa_ref.KVBlocks`", ":data:`METADATA_KINDS`"]
    assert raw_roles("[`attention`][psa_ref.attention], ``q``: ``[Hq, D]``, ``{a: b}``, http://x") == []
    assert split_returns("Sum.\n\nReturns:\n    one entry\n    split in two.\n") == ["split in two."]
    assert split_returns("Sum.\n\nReturns:\n    one entry\n        continued.\n\nRaises:\n    ValueError: x\n") == []


def test_every_package_module_is_walked():
    found = {p.relative_to(ROOT).as_posix() for p in modules()}
    assert {"psa_ref/progressive.py", "psa_ref/kvcache/pool.py", "psa_ref/tools/hf.py", "psa_fast/api.py",
            "psa_fast/hf.py"} <= found


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_sphinx_roles_in_docstrings(path):
    hits = [f"{path.relative_to(ROOT)}:{line} ({owner}): {role}"
            for owner, line, text in docstrings(path) for role in raw_roles(text)]
    assert not hits, ("Sphinx roles do not render in mkdocstrings; write [`name`][psa_ref.name] (a documented "
                      "object) or plain ``name``:\n" + "\n".join(hits))


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_returns_sections_are_one_entry(path):
    hits = [f"{path.relative_to(ROOT)}:{line} ({owner}): {text!r}"
            for owner, line, doc in docstrings(path) for text in split_returns(doc)]
    assert not hits, "indent the continuation lines of a Returns: description by 4 more spaces:\n" + "\n".join(hits)
