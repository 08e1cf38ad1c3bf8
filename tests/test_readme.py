"""Every Python block of the README and the pages of ``docs/`` runs as pasted, prints what
it says, and type-checks; their tables of defaults and events say what the code does, and
their links lead to a page and heading that exist.

A block is a complete program unless its first line is a comment starting with
``# fragment``. Each complete block runs in a fresh interpreter, in an empty directory,
with the providers ``openai``, ``anthropic`` and ``local`` registered to a
``ScriptedModel`` that calls the request's first tool once when it can, then answers.
The comment of a ``print(...)`` line says what it prints: its text up to `` — `` (an
explanation may follow) is a whole line of the block's output, unless it starts with
``e.g.`` (what a real model might answer, which the scripted one does not).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import attrs
import pytest

from littleghost import Agent, ReasoningPart, RunContext, errors, events
from littleghost.agent import AgentOptions
from littleghost.context import (
    CharacterEstimator,
    SelectiveToolCallCompaction,
    Summarization,
    ToolResultCompaction,
    Truncation,
    TurnExcerpts,
)
from littleghost.context.calibration import DENSE_GAP
from littleghost.context.config import ContextManagement, ContextOptions
from littleghost.context.index import RECENT_LOGS
from littleghost.context.management import REGROWTH
from littleghost.context.strategies import SUMMARY_FLOOR_TOKENS
from littleghost.models.anthropic import DEFAULT_MAX_TOKENS, LONGEST_UNSTREAMED
from littleghost.models.local import LocalModel
from littleghost.models.overflow import MAX_DETAIL_CHARS, SCANNED_CHARS
from littleghost.models.served_window import MODELS_TIMEOUT
from littleghost.models.windows import CONTEXT_WINDOWS, known_context_window
from littleghost.run import COUNT_TIMEOUT
from littleghost.sessions import InMemorySessionStore, PostgresSessionStore, SQLiteSessionStore
from littleghost.sessions.base import MAX_SESSION_ID_LENGTH

from .public_api import PUBLIC_MODULES

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
"""The documentation: the README and the pages it links to."""
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


def documentation() -> str:
    """The text of every page, with single spaces for line breaks and runs of spaces."""
    return " ".join(" ".join(page.read_text().split()) for page in PAGES)


def python_blocks() -> list[tuple[str, str]]:
    """The pages' ```python blocks, each named by its page and the line it starts on."""
    blocks = []
    for page in PAGES:
        text = page.read_text()
        blocks += [
            (f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, found.start()) + 2}", found[1])
            for found in re.finditer(r"^```python\n(.*?)^```$", text, re.DOTALL | re.MULTILINE)
        ]
    return blocks


COMPLETE = [(line, code) for line, code in python_blocks() if not code.startswith(FRAGMENT)]
PRINTED = re.compile(r"^\s*print\(.*\)  # (?P<said>.+)$", re.MULTILINE)
EXAMPLE = "e.g."


def said_printed(code: str) -> list[str]:
    """The lines a block's ``print`` comments say it prints (examples of a model's aside)."""
    said = (found.group("said").split(" — ")[0] for found in PRINTED.finditer(code))
    return [line for line in said if not line.startswith(EXAMPLE)]


def test_print_comments_are_found() -> None:
    """The comments this file checks are there (a changed convention fails here)."""
    said = [line for _, code in COMPLETE for line in said_printed(code)]
    assert "Ticket(order_id='42', urgent=True)" in said
    assert len(said) >= 7, said


def test_the_readme_has_complete_programs_and_marks_its_fragments() -> None:
    blocks = python_blocks()
    assert len(COMPLETE) >= 8, "the README's examples are complete programs"
    assert any(where.startswith("README.md:") for where, _ in COMPLETE)
    for where, code in blocks:
        if code.startswith(FRAGMENT):
            continue
        compile(code, where, "exec")  # a syntax error names its block


@pytest.mark.parametrize(("where", "code"), COMPLETE, ids=[where for where, _ in COMPLETE])
def test_a_complete_block_runs_as_pasted(where: str, code: str, tmp_path: Path) -> None:
    program = tmp_path / "block.py"
    program.write_text(
        PRELUDE + "\n" + f"exec(compile({code!r}, {where!r}, 'exec'), {{'__name__': '__main__'}})\n"
    )
    done = subprocess.run(
        [sys.executable, str(program)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # this checkout's littleghost
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, textwrap.indent(done.stderr[-3000:], "    ")
    printed = done.stdout.splitlines()
    for said in said_printed(code):
        assert said in printed, f"{where} says it prints {said!r}; it printed {printed}"


def test_the_complete_blocks_type_check(tmp_path: Path) -> None:
    """``mypy --strict``, but for the functions a block leaves unannotated for brevity."""
    for number, (_, code) in enumerate(COMPLETE):
        (tmp_path / f"block_{number}.py").write_text(code)
    command = ["mypy", "--strict", "--allow-untyped-defs", "--no-incremental"]
    done = subprocess.run(
        [sys.executable, "-m", *command, "--cache-dir", os.devnull, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout


def table(header: str) -> dict[str, list[str]]:
    """The documentation's table whose header row starts with ``header``: its rows by
    first cell (backticks off), each the list of its other cells."""
    lines = "\n".join(page.read_text() for page in PAGES).splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith(header))
    rows: dict[str, list[str]] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        first, *rest = (cell.strip() for cell in line.strip("|").split("|"))
        rows[first.strip("`")] = rest
    return rows


def stated(cell: str) -> object:
    """The value a table's default cell states: a Python literal in backticks, or a figure
    (``10 000``), before any note in parentheses; ``None`` for a dash."""
    text = cell.split(" (")[0].strip()
    if text == "—":
        return None
    if re.fullmatch(r"\d{1,3}( \d{3})*(\.\d+)?", text):
        text = text.replace(" ", "")
    return ast.literal_eval(text.strip("`"))


DESCRIBED = {
    "session_store": "an `InMemorySessionStore` of the class's own",
    "tokenizer": "characters ÷ 4, beyond ASCII weighed (below)",
    "summary_instructions": "built in",
    "summary_max_tokens": "¼ of the window, at most 4 096",
}
"""Defaults the tables describe in words, checked by the tests below one by one."""


def test_the_agent_table_lists_every_knob_with_its_default() -> None:
    rows = table("| attribute | default |")
    assert list(rows) == list(AgentOptions.__annotations__)
    for name, (default, _) in rows.items():
        if name in DESCRIBED:
            assert default == DESCRIBED[name], name
        else:
            value = getattr(Agent, name)
            assert stated(default) == (dict(value) if name == "settings" else value), name

    class One(Agent):
        pass

    class Two(Agent):
        pass

    assert isinstance(One.session_store, InMemorySessionStore)
    assert One.session_store is not Two.session_store


def test_the_context_table_lists_every_keyword_with_its_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = table("| keyword | default |")
    assert list(rows) == list(ContextOptions.__annotations__)
    defaults = ContextManagement()
    for name, (default, _) in rows.items():
        if name in DESCRIBED:
            assert default == DESCRIBED[name], name
        else:
            assert stated(default) == getattr(defaults, name), name
    assert defaults.tokenizer == CharacterEstimator()
    assert defaults.summary_instructions is None
    assert [defaults.summary_cap(window) for window in (8_000, 16_384, 1_000_000)] == [
        2_000,
        4_096,
        4_096,
    ]
    assert "`LITTLEGHOST_CONTEXT_WINDOW_TOKENS`" in rows["context_window_tokens"][0]
    monkeypatch.setenv("LITTLEGHOST_CONTEXT_WINDOW_TOKENS", "32000")
    assert ContextManagement().context_window_tokens == 32_000


def test_the_event_table_lists_every_event_with_its_fields() -> None:
    rows = table("| event | when |")
    listed: dict[str, list[str]] = {}
    for cell in rows:
        name, _, names = cell.rstrip(")").partition("(")
        listed[name] = [field.strip() for field in names.split(",") if field.strip()]
    kinds = [name for name in events.__all__ if name not in ("Event", "EventOf")]
    assert sorted(listed) == sorted(kinds)
    for name, fields in listed.items():
        assert fields == [field.name for field in attrs.fields(getattr(events, name))], name


SIGNATURES = [
    (LocalModel, "LocalModel(path=None, *, n_ctx=4096, threads=None, request_timeout=None)"),
    (PostgresSessionStore, "PostgresSessionStore(conninfo, max_connections=10, max_sessions=None)"),
    (
        PostgresSessionStore,
        "PostgresSessionStore(conninfo, connect_timeout=10.0, statement_timeout=30.0)",
    ),
    (ReasoningPart, "ReasoningPart(text, signature=None, provider=None, redacted=False)"),
    (CharacterEstimator, "CharacterEstimator(chars_per_token=4.0, image_tokens=85)"),
    (
        ToolResultCompaction,
        "ToolResultCompaction(keep_last_tool_call_groups=2, max_result_chars=400)",
    ),
    (SelectiveToolCallCompaction, "SelectiveToolCallCompaction(keep_last_tool_call_groups=2)"),
    (
        Summarization,
        "Summarization(minimum_preserved=4, prompt=None, model=None, max_tokens=None, "
        "max_item_chars=4000, mask_tool_results=None, quote_specifics=True)",
    ),
    (TurnExcerpts, "TurnExcerpts(excerpt_chars=160"),  # written as `excerpt_chars=160`
    (SQLiteSessionStore, "SQLiteSessionStore(timeout=30"),  # "its `timeout` (30 s)"
    (Truncation, "Truncation(minimum_preserved=32"),  # "(keeps 32)"
]


@pytest.mark.parametrize(
    ("subject", "signature"),
    SIGNATURES,
    ids=[f"{signature.partition('(')[0]}-{n}" for n, (_, signature) in enumerate(SIGNATURES)],
)
def test_a_stated_signature_gives_the_defaults(subject: Any, signature: str) -> None:
    readme = documentation()
    if signature.endswith(")"):
        assert f"`{signature}`" in readme
    parameters = inspect.signature(subject).parameters
    for argument in signature.partition("(")[2].rstrip(")").split(","):
        name, equals, value = (part.strip() for part in argument.partition("="))
        if equals:
            assert parameters[name].default == ast.literal_eval(value), name
        else:
            assert name in {"*", *parameters}, name


FIGURES = [
    ("COUNT_TIMEOUT", COUNT_TIMEOUT, "{} s", "after `COUNT_TIMEOUT` ({})"),
    ("MAX_DETAIL_CHARS", MAX_DETAIL_CHARS, "{}", "cut to {} characters (`MAX_DETAIL_CHARS`)"),
    ("SCANNED_CHARS", SCANNED_CHARS, "{:,}", "its first {} characters (`SCANNED_CHARS`)"),
    ("MODELS_TIMEOUT", MODELS_TIMEOUT, "{} s", "given up after {} (`MODELS_TIMEOUT`)"),
    (
        "DEFAULT_MAX_TOKENS",
        DEFAULT_MAX_TOKENS,
        "{:,}",
        "`AnthropicModel` sends {} (`DEFAULT_MAX_TOKENS`)",
    ),
    ("LONGEST_UNSTREAMED", LONGEST_UNSTREAMED, "{:,}", "is over {} (`LONGEST_UNSTREAMED`)"),
    ("DENSE_GAP", DENSE_GAP, "{}", "more than {} times that (`DENSE_GAP`)"),
    ("REGROWTH", REGROWTH, "{:.0%}", "grown by {} of the window (`REGROWTH`)"),
    (
        "SUMMARY_FLOOR_TOKENS",
        SUMMARY_FLOOR_TOKENS,
        "{}",
        "halved down to {} tokens (`SUMMARY_FLOOR_TOKENS`)",
    ),
    ("RECENT_LOGS", RECENT_LOGS, "{}", "the last `RECENT_LOGS`, {}, logs"),
    (
        "MAX_SESSION_ID_LENGTH",
        MAX_SESSION_ID_LENGTH,
        "{}",
        "Session ids are non-empty, at most {} characters",
    ),
]
"""Constants the documentation gives the figure of: (the name, the value, how the pages
write it, the sentence it stands in)."""


@pytest.mark.parametrize(
    ("name", "value", "written", "sentence"), FIGURES, ids=[name for name, *_ in FIGURES]
)
def test_a_stated_figure_is_the_code_s(
    name: str, value: float, written: str, sentence: str
) -> None:
    readme = documentation()
    figure = written.format(value).replace(",", " ").replace(".0 s", " s").replace("%", " %")
    assert sentence.format(figure) in readme, name


def test_the_architecture_names_modules_that_exist() -> None:
    text = README.read_text()
    drawing = text[text.index("## Architecture") :].split("```")[1]
    folders, named = [ROOT], []
    for line in drawing.splitlines()[1:]:
        found = re.match(r"(\s*)(\S+)", line)
        if found is None:
            continue
        depth, name = len(found.group(1)) // 2, found.group(2)
        path = folders[depth] / name
        named.append(path)
        folders[depth + 1 :] = [path] if name.endswith("/") else []
    assert len(named) >= 20
    assert [path for path in named if not path.exists()] == []


MODEL_NAME = re.compile(r"\b(?:gpt|chatgpt|o\d|claude)(?:[\w.-]*\w)?")
"""A model name in the window table's first column (``gpt-4-1106-*`` is its prefix)."""


def test_the_window_table_gives_the_code_s_windows_and_leaves_none_out() -> None:
    """Each model the table names has the window its row states (a row of several
    figures pairs them with its names in order), and each prefix of the code's table
    is named, or a model it covers is, in a row of its window."""
    named: list[tuple[str, int]] = []
    for names, (windows,) in table("| models | window (tokens) |").items():
        models = MODEL_NAME.findall(names)
        figures = [int(figure.replace(" ", "")) for figure in windows.split(", ")]
        assert len(figures) in (1, len(models)), names
        named += [
            (name, figures[-1] if len(figures) == 1 else figures[n])
            for n, name in enumerate(models)
        ]
    for name, window in named:
        provider = "anthropic" if name.startswith("claude") else "openai"
        assert known_context_window(provider, name) == window, name
    for provider, prefixes in CONTEXT_WINDOWS.items():
        for prefix, window in prefixes.items():
            assert any(name.startswith(prefix) and stated == window for name, stated in named), (
                f"{provider}: {prefix} ({window}) is not in the table"
            )


def test_every_environment_variable_the_library_reads_is_documented() -> None:
    package = ROOT / "littleghost"
    read = {
        name
        for path in package.rglob("*.py")
        for name in re.findall(r"\bLITTLEGHOST_[A-Z_]+\b", path.read_text())
    }
    assert "LITTLEGHOST_STORE" in read
    # and those read by name (a provider's key and server: ANTHROPIC_BASE_URL was not told)
    read |= {
        name
        for path in package.rglob("*.py")
        for name in re.findall(r"\benviron\.get\(\s*\"([A-Z_]+)\"", path.read_text())
    }
    assert {"OPENAI_BASE_URL", "ANTHROPIC_BASE_URL"} <= read
    readme = documentation()
    assert sorted(name for name in read if f"`{name}`" not in readme) == []


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation off, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings (outside code blocks)."""
    found, fenced = set(), False
    for line in page.read_text().splitlines():
        fenced ^= line.startswith("```")
        heading = None if fenced else re.match(r"#+ (.*)", line)
        if heading:
            found.add(slug(heading[1]))
    return found


def test_every_link_between_pages_leads_to_a_page_and_heading_that_exist() -> None:
    links = 0
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            links += 1
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.exists(), f"{page.name} links to {target}: no such file"
            if anchor:
                assert anchor in anchors(linked), f"{page.name} links to {target}: no heading"
    assert links >= 20


def code_words() -> set[str]:
    """The words of the pages' code: their blocks and their `inline` code (a name in
    prose, ``turn`` or ``view``, is an English word as often as it is the API's)."""
    code = []
    for page in PAGES:
        text = page.read_text()
        code += re.findall(r"```.*?```", text, re.DOTALL)
        code += re.findall(r"`[^`]+`", re.sub(r"```.*?```", "", text, flags=re.DOTALL))
    return set(re.findall(r"\w+", " ".join(code)))


def test_every_public_name_is_in_the_documentation() -> None:
    named = code_words()
    left_out = [
        f"{module}.{name}"
        for module in PUBLIC_MODULES
        for name in importlib.import_module(module).__all__
        if name not in named and name != "__version__"
    ]
    members = [name for name in dir(RunContext) if not name.startswith("_")]
    assert len(members) >= 20
    left_out += [f"RunContext.{name}" for name in members if name not in named]
    assert left_out == []


PROSE_WIDTH = 89
"""The longest prose line of a page or the changelog (code blocks and table rows aside)."""


def test_prose_lines_are_at_most_89_characters() -> None:
    long = []
    for page in [*PAGES, ROOT / "benchmarks" / "README.md", ROOT / "CHANGELOG.md"]:
        fenced = False
        for number, line in enumerate(page.read_text().splitlines(), 1):
            fenced ^= line.startswith("```")
            if not fenced and not line.startswith(("```", "|")) and len(line) > PROSE_WIDTH:
                long.append(f"{page.relative_to(ROOT)}:{number}")
    assert long == []


def test_the_readme_links_every_page() -> None:
    linked = set(re.findall(r"\]\((docs/[^)#]+)", README.read_text()))
    assert {str(page.relative_to(ROOT)) for page in PAGES[1:]} <= linked


def test_the_errors_page_draws_the_tree_the_errors_module_does() -> None:
    page = (ROOT / "docs" / "errors.md").read_text()
    drawn = page.split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    block = (errors.__doc__ or "").split("::", 1)[1].lstrip("\n").splitlines()
    tree = [line[4:] for line in itertools.takewhile(lambda line: line[:4] == "    ", block)]
    assert drawn == tree
    assert len(tree) == 1 + len(
        [name for name in errors.__all__ if name.endswith("Error") and name != "LittleGhostError"]
    )
