"""Code shown in the README and the docs runs as a reader copies it and prints what the docs say; the README's
commands are the ones docs/index.md and CI run."""

import ast
import contextlib
import io
import re
import runpy
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "worked_example.py"


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced code block of a Markdown text, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)


def snippet_options() -> dict:
    """mkdocs.yml's options of pymdownx.snippets, with ``base_path`` made absolute (mkdocs runs from the root)."""
    import yaml

    class Loader(yaml.SafeLoader):
        """Reads mkdocs.yml's ``!!python/name:`` tags (other extensions' options) as None."""

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)
    for ext in config["markdown_extensions"]:
        if isinstance(ext, dict) and "pymdownx.snippets" in ext:
            options = dict(ext["pymdownx.snippets"] or {})
            break
    else:
        raise AssertionError("mkdocs.yml does not enable pymdownx.snippets")
    base = options.get("base_path", ["."])
    options["base_path"] = [str(ROOT / b) for b in ([base] if isinstance(base, str) else base)]
    return options


def rendered(page: Path) -> str:
    """The page's Markdown as mkdocs renders it: ``--8<--`` includes (sections too) expanded by pymdownx.snippets
    itself, with the site's options."""
    import markdown

    md = markdown.Markdown(extensions=["pymdownx.snippets"], extension_configs={"pymdownx.snippets": snippet_options()})
    return "\n".join(md.preprocessors["snippet"].run(page.read_text(encoding="utf-8").split("\n")))


def run_python_blocks(text: str, source: str) -> int:
    """Exec the ``python`` blocks of ``text`` in order in one namespace, as a reader pasting them into one session;
    where a ``text`` block follows a ``python`` block, it must be exactly what that block printed. Returns how many
    blocks ran."""
    blocks = fenced_blocks(text)
    namespace: dict = {"__name__": "__main__"}
    ran = 0
    for i, (lang, body) in enumerate(blocks):
        if lang != "python":
            continue
        assert "--8<--" not in body, f"{source}: a snippet was left unexpanded:\n{body}"
        assert not body[:1].isspace(), f"{source}: block {i} renders indented:\n{body}"
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(body, f"{source}, block {i}", "exec"), namespace)
        ran += 1
        if i + 1 < len(blocks) and blocks[i + 1][0] == "text":
            assert out.getvalue().rstrip("\n") == blocks[i + 1][1].rstrip("\n"), (
                f"{source}: block {i} printed\n{out.getvalue()}\nbut the page shows\n{blocks[i + 1][1]}")
    return ran


def test_tutorial_runs_as_rendered():
    """Every Python block of the tutorial, after snippet expansion, runs when copied in order, and prints what the
    page shows after it."""
    assert run_python_blocks(rendered(ROOT / "docs" / "tutorial.md"), "docs/tutorial.md") >= 2


def test_rendering_resolves_sections_and_drops_their_markers():
    """The helper above expands like mkdocs: section markers of the included file never reach the page."""
    text = rendered(ROOT / "docs" / "tutorial.md")
    code = "\n".join(body for lang, body in fenced_blocks(text) if lang == "python")
    assert "import psa_ref" in code and "blocks = psa_ref.KVBlocks.from_dense" in code and "def compare_rules" in code
    assert "[start:" not in code and "[end:" not in code
    assert "def iteration_table" not in code  # only the marked sections, not the whole file


def test_readme_api_example_runs_and_prints_what_it_shows():
    assert run_python_blocks((ROOT / "README.md").read_text(encoding="utf-8"), "README.md") >= 1


def test_tutorial_numbers_come_from_the_example(capsys):
    example = runpy.run_path(str(EXAMPLE))
    tutorial = (ROOT / "docs" / "tutorial.md").read_text(encoding="utf-8")
    table = example["iteration_table"]()
    assert table in tutorial
    assert max(len(row.split("|")) - 2 for row in table.splitlines()) <= 6, "the trace table is too wide for a page"
    example["main"]()
    printed = capsys.readouterr().out
    for line in printed.splitlines():
        if line.strip().startswith(("seed:", "certified:", "remaining:", "ema:")):
            assert line in tutorial, f"the tutorial does not show: {line}"


@pytest.mark.parametrize("snippet", ["imports", "data", "run"])
def test_tutorial_snippet_sections_exist_and_are_top_level(snippet):
    source = EXAMPLE.read_text(encoding="utf-8")
    start, end = f"# --8<-- [start:{snippet}]\n", f"# --8<-- [end:{snippet}]"
    assert start in source and end in source
    section = source[source.index(start) + len(start) : source.index(end)]
    assert section and not section[:1].isspace(), f"section {snippet} is indented"
    assert f'--8<-- "examples/worked_example.py:{snippet}"' in (ROOT / "docs" / "tutorial.md").read_text()


# --- the two commands ---------------------------------------------------------------------------------------


def bash_blocks(path: Path) -> list[str]:
    return [body.strip() for lang, body in fenced_blocks(path.read_text(encoding="utf-8")) if lang == "bash"]


def test_readme_and_docs_show_the_same_two_commands_and_ci_runs_the_second():
    commands = bash_blocks(ROOT / "README.md")
    assert len(commands) == 2 and commands[0].endswith("psa demo") and commands[1].endswith("-m pytest")
    assert bash_blocks(ROOT / "docs" / "index.md") == commands, "docs/index.md's quick start differs from the README's"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    # CI runs the README's test command word for word, plus -m '' to include the slow tests
    assert f"\n{commands[1]} -m ''\n" in ci, ".ci/run must run the README's test command with -m ''"
    assert "-eq 5" in ci, ".ci/run must fail when pytest collects no test (exit 5)"


def test_torch_is_pinned_by_ci_constraints_not_by_the_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    torch = [r for r in project["optional-dependencies"]["hf"] if r.startswith("torch")]
    assert torch and "==" not in torch[0], f"the hf extra pins {torch[0]}; the pin belongs in .ci/constraints.txt"
    constraints = (ROOT / ".ci" / "constraints.txt").read_text(encoding="utf-8")
    assert re.search(r"^torch==\S+$", constraints, flags=re.M), "CI must pin the torch it installs"
    # without the pin, plain torch would pull a CUDA build of several GB: the test command must use the file
    assert "-c .ci/constraints.txt" in bash_blocks(ROOT / "README.md")[1]


def test_slow_tests_are_marked_and_deselected_by_default():
    """A contributor's pytest skips the real-model tests (addopts), CI runs them (-m ''): every test that loads
    SmolLM2 (the smollm2 fixture) carries the registered slow marker."""
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
    assert "-m 'not slow'" in ini["addopts"] and any(m.startswith("slow:") for m in ini["markers"])
    tree = ast.parse((ROOT / "tests" / "test_hf.py").read_text(encoding="utf-8"))
    loads_model = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")
                   and "smollm2" in [a.arg for a in f.args.args]]
    assert len(loads_model) >= 3
    for f in loads_model:
        marks = [ast.unparse(d) for d in f.decorator_list]
        assert "pytest.mark.slow" in marks, f"{f.name} loads SmolLM2 but is not marked slow"
