"""Every command shown in the docs runs: ```console blocks' `$ planforge ...` lines, and ```python blocks.

Each document runs in a fresh folder, its commands in the order shown (a later
command may read what an earlier one wrote), and each must exit 0.
"""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.M | re.S)


def blocks(path: Path) -> list[tuple[str, str]]:
    """(kind, text) of the runnable blocks: each console command, each python block."""
    out = []
    for lang, body in FENCE.findall(path.read_text()):
        if lang == "console":
            out += [("console", ln[2:].strip()) for ln in body.splitlines() if ln.startswith("$ ")]
        elif lang == "python":
            out.append(("python", body))
    return out


def test_the_docs_show_commands():
    shown = {p.name: [b for b in blocks(p) if b[0] == "console"] for p in DOCS}
    assert all(shown.values()), f"a document without a command: {shown}"
    for p in DOCS:
        for kind, cmd in blocks(p):
            if kind == "console":
                assert cmd.startswith("planforge "), f"{p.name}: only planforge commands are runnable here: {cmd}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_command_in_the_docs_runs(doc, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from planforge.cli import app

    env = {**os.environ, "COLUMNS": "120", "PLANFORGE_PROBE": "quick"}
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for kind, text in blocks(doc):
        if kind == "console":  # in this process: the CLI exactly as typed, without paying the import per command
            r = runner.invoke(app, shlex.split(text)[1:], env={"COLUMNS": "120"})
            assert r.exit_code == 0, f"{doc.name}: `{text}` exited {r.exit_code}:\n{r.output[-3000:]}\n{r.exception!r}"
        else:
            if "import torch" in text:
                pytest.importorskip("torch", reason=f"{doc.name}: a python example needs the torch extra")
                try:
                    from planforge.ir import from_torch  # noqa: F401
                except ImportError:
                    pytest.skip(f"{doc.name}: the torch importer (planforge.ir.from_torch) is not in this checkout yet")
            p = subprocess.run([sys.executable, "-c", text], cwd=tmp_path, capture_output=True, text=True,
                               timeout=600, env=env)
            assert p.returncode == 0, f"{doc.name}: python example failed:\n{text}\n{p.stderr[-3000:]}"
