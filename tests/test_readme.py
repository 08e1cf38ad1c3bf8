"""Every Python block of the README runs as pasted, and type-checks.

A block is a complete program unless its first line is a comment starting with
``# fragment``. Each complete block runs in a fresh interpreter, in an empty directory,
with the providers ``openai``, ``anthropic`` and ``local`` registered to a
``ScriptedModel`` that calls the request's first tool once when it can, then answers.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
FRAGMENT = "# fragment"

PRELUDE = '''
from littleghost import Role
from littleghost.models import ModelRequest, ModelResponse, register_provider
from littleghost.testing import ScriptedModel, text_response, tool_call_response


def answer(request: ModelRequest) -> ModelResponse:
    """Call the first tool whose required arguments are all strings, then answer."""
    if request.purpose == "chat" and request.tools and request.messages[-1].role is Role.USER:
        spec = request.tools[0]
        properties = spec.parameters.get("properties", {})
        required = spec.parameters.get("required", [])
        if all(properties[name].get("type") == "string" for name in required):
            return tool_call_response(spec.name, {name: "42" for name in required})
    return text_response("A scripted answer.", input_tokens=12, output_tokens=4)


def scripted(name):
    return ScriptedModel([answer] * 1000, name=name or "scripted", context_window=32_000)


for provider in ("openai", "anthropic", "local"):
    register_provider(provider, scripted)
'''


def python_blocks() -> list[tuple[int, str]]:
    """The README's ```python blocks, with the line each starts on."""
    text = README.read_text()
    return [
        (text.count("\n", 0, found.start()) + 2, found.group(1))
        for found in re.finditer(r"^```python\n(.*?)^```$", text, re.DOTALL | re.MULTILINE)
    ]


COMPLETE = [(line, code) for line, code in python_blocks() if not code.startswith(FRAGMENT)]


def test_the_readme_has_complete_programs_and_marks_its_fragments() -> None:
    blocks = python_blocks()
    assert len(COMPLETE) >= 8, "the README's examples are complete programs"
    for line, code in blocks:
        if code.startswith(FRAGMENT):
            continue
        compile(code, f"README.md:{line}", "exec")  # a syntax error names its block


@pytest.mark.parametrize(("line", "code"), COMPLETE, ids=[f"line-{line}" for line, _ in COMPLETE])
def test_a_complete_block_runs_as_pasted(line: int, code: str, tmp_path: Path) -> None:
    program = tmp_path / "block.py"
    program.write_text(
        PRELUDE
        + "\n"
        + f"exec(compile({code!r}, 'README.md:{line}', 'exec'), {{'__name__': '__main__'}})\n"
    )
    done = subprocess.run(
        [sys.executable, str(program)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, textwrap.indent(done.stderr[-3000:], "    ")


def test_the_complete_blocks_type_check(tmp_path: Path) -> None:
    """``mypy --strict``, but for the functions a block leaves unannotated for brevity."""
    for line, code in COMPLETE:
        (tmp_path / f"block_{line}.py").write_text(code)
    command = ["mypy", "--strict", "--allow-untyped-defs", "--no-incremental"]
    done = subprocess.run(
        [sys.executable, "-m", *command, "--cache-dir", os.devnull, str(tmp_path)],
        cwd=README.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout
