"""Code shown in the README and the tutorial runs and prints what the docs say."""

import re
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)


def test_readme_api_example_runs(capsys):
    blocks = python_blocks(ROOT / "README.md")
    assert blocks, "the README shows no Python example"
    exec(compile(blocks[0], "README.md", "exec"), {})
    assert "(32, 128)" in capsys.readouterr().out


def test_readme_and_docs_show_the_same_two_commands():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = re.findall(r"```bash\n(.*?)\n```", readme, flags=re.S)
    assert len(commands) == 2 and "psa demo" in commands[0] and "pytest" in commands[1]
    assert commands[1] in ci, ".ci/run must run the README's test command"


def test_tutorial_numbers_come_from_the_example(capsys):
    example = runpy.run_path(str(ROOT / "examples" / "worked_example.py"))
    tutorial = (ROOT / "docs" / "tutorial.md").read_text(encoding="utf-8")
    assert example["iteration_table"]() in tutorial
    example["main"]()
    printed = capsys.readouterr().out
    for line in printed.splitlines():
        if line.strip().startswith(("seed:", "certified:", "remaining:")):
            assert line in tutorial, f"the tutorial does not show: {line}"


@pytest.mark.parametrize("snippet", ["data", "run"])
def test_tutorial_snippet_sections_exist(snippet):
    source = (ROOT / "examples" / "worked_example.py").read_text(encoding="utf-8")
    assert f"# --8<-- [start:{snippet}]" in source and f"# --8<-- [end:{snippet}]" in source
