"""The README's and the documentation's code examples run as written.

Every Python example is a file under ``docs/examples/`` that the docs include verbatim (MkDocs
snippets) and the README shows verbatim; this test runs each file, so none can drift or rot.
"""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples"
README = (ROOT / "README.md").read_text()


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def example_code(name: str) -> str:
    """The example's code without its module docstring (what the README shows)."""
    text = (EXAMPLES / name).read_text()
    return re.sub(r'\A""".*?"""\n\n', "", text, flags=re.S)


def test_every_readme_example_is_a_tested_file() -> None:
    blocks = python_blocks(README)
    assert blocks, "the README shows no Python example"
    files = {name: example_code(name) for name in ("quickstart.py",)}
    for block in blocks:
        assert block in files.values(), f"README example is not a file of docs/examples/:\n{block[:200]}"


def test_every_docs_example_is_included_from_a_file() -> None:
    for page in (ROOT / "docs").glob("*.md"):
        for block in python_blocks(page.read_text()):
            match = re.fullmatch(r'--8<-- "(docs/examples/[\w/.]+)"\n', block)
            assert match, f"{page.name} has a Python example that is not included from docs/examples/"
            assert (ROOT / match.group(1)).is_file(), f"{page.name} includes {match.group(1)}, which does not exist"


def test_quickstart_retrieves_the_pass_key(monkeypatch, capsys) -> None:
    monkeypatch.chdir(ROOT)
    runpy.run_path(str(EXAMPLES / "quickstart.py"), run_name="__main__")
    out = capsys.readouterr().out
    kept, key = re.search(r"kept (\d+) of \d+ tokens per layer; answer: '(\d+)", out).groups()
    assert kept == "128"
    assert f"the pass key: '{key}'" in out  # the micro model finds it in a cache of 128 tokens


def test_new_policy_example(monkeypatch, capsys) -> None:
    from restkv import registry

    # the example registers "keynorm": in a copy of the registry, so later tests see the real one (its plugins
    # loaded first: loading them into the copy would leave the real registry without them, marked as loaded)
    registry.policy_names()
    monkeypatch.setattr(registry, "_POLICIES", dict(registry._POLICIES))
    monkeypatch.chdir(ROOT)
    runpy.run_path(str(EXAMPLES / "keynorm_policy.py"), run_name="__main__")
    assert "each layer kept [40, 40, 40, 40] tokens of 100" in capsys.readouterr().out


def test_new_benchmark_example(tmp_path: Path) -> None:
    """The documented command: the example module on the path, its config folder on Hydra's search path."""
    command = [
        sys.executable,
        "eval/run.py",
        f"hydra.searchpath=[file://{EXAMPLES / 'configs'}]",
        "bench=magic_number",
        "policy=snapkv",
        "budget=64",
        f"out_dir={tmp_path}",
    ]
    env = {**os.environ, "PYTHONPATH": str(EXAMPLES)}
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "magic_number  100.00     4" in run.stdout
    assert (tmp_path / "magic_number" / "micro-llama" / "snapkv" / "budget64" / "predictions.jsonl").is_file()


@pytest.mark.parametrize("page", ["getting-started.md", "adding-a-policy.md", "adding-a-benchmark.md"])
def test_guides_include_their_examples(page: str) -> None:
    assert '--8<-- "docs/examples/' in (ROOT / "docs" / page).read_text()
