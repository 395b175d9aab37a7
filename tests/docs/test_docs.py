"""The documentation: its links resolve, the README stays a front page, and what it shows runs.

The commands below are copied from README.md / docs/*.md; each test first checks that
its command still appears there verbatim (so editing the docs fails the test until
the test follows), then runs it at smoke size in a subprocess (`SMOKE` appended:
argparse keeps the last value of a flag given twice) and checks that the run wrote
its `metrics.json`. The README's "Your own model" snippet is taken from the README
itself (the code block after its `docs-test` marker) and run with `tftrain.Trainer`
patched to add the same smoke settings. Four subprocess runs in all; the image-folder
recipe's command runs in tests/integration/test_own_task.py (on PNG and JPEG files), and
commands that need several processes (`tftrain.launch`) in tests/integration.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from tests.conftest import REPO, read_metrics, run_module, run_python

pytestmark = pytest.mark.integration

README = REPO / "README.md"
DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]

README_MAX_LINES = 200

SMOKE = ["--train-examples", "512", "--epochs", "1", "--verbose", "2", "--seed", "0"]
"""Flags appended to every documented command: a run of a few seconds."""

SNIPPET_MARKER = "<!-- docs-test: your-own-model -->"

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)


def _prose(text: str) -> str:
    """The Markdown without its fenced code blocks."""
    return _FENCE.sub("", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces -> hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set:
    """Every heading anchor of a Markdown file (repeated headings get -1, -2, ... as on GitHub)."""
    seen: dict = {}
    out = set()
    for heading in _HEADING.findall(_prose(path.read_text(encoding="utf-8"))):
        slug = _slug(heading)
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def _docs_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in DOCS)


def _shown(command: str) -> None:
    """Fails unless `command` appears verbatim in README.md or docs/*.md."""
    assert command in _docs_text(), f"no longer in README.md or docs/*.md: {command!r}; update this test"


# -- links and size -------------------------------------------------------------
@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_point_to_existing_files_and_headings(path):
    broken = []
    for target in _LINK.findall(_prose(path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target} (no file {file_part})")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target} (no heading #{anchor} in {linked.name})")
    assert not broken, f"{path.name}: broken links: {broken}"


def test_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/ (at most {README_MAX_LINES})"
    assert 'pip install -e ".[dev]"' in README.read_text(encoding="utf-8")  # what .ci/run installs
    assert "python -m pytest\n" in README.read_text(encoding="utf-8")  # what .ci/run runs


def test_docs_name_no_path_of_the_machine_they_were_written_on():
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        assert str(REPO) not in text and "/home/" not in text and "/tmp/" not in text, path.name


# -- the documented commands, at smoke size ----------------------------------------
def _run_documented(command: str, run_dir: Path, extra=()):
    """Runs a documented `python -m MODULE ARGS` command with SMOKE and `extra` appended."""
    _shown(command)
    words = command.split()
    assert words[:2] == ["python", "-m"], command
    proc = run_module(words[2], [*words[3:], *SMOKE, "--run-dir", run_dir, *extra], cwd=REPO)
    assert proc.returncode == 0, f"{command}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert (run_dir / "metrics.json").is_file(), proc.stdout[-3000:]
    return read_metrics(run_dir)


def test_readme_mnist_command(tmp_path):
    m = _run_documented("python -m tftrain.recipes.mnist --strategy mirrored", tmp_path / "run")
    assert m["strategy"] == "mirrored" and m["epochs_trained"] == 1
    assert m["test_accuracy"] > 0.3  # it learned in its 2 steps (chance: 0.1)


def test_regression_example_command(tmp_path):
    m = _run_documented("python -m tftrain.run examples/regression.py:task --hidden 32 --validation-split 0.1",
                        tmp_path / "run")
    assert m["task"] == "regression" and m["hidden"] == 32 and "val_loss" in m["history"]


def test_two_input_example_command(tmp_path):
    m = _run_documented("python -m tftrain.run examples/two_input.py:task --strategy mirrored --cpu-replicas 2",
                        tmp_path / "run")
    assert m["task"] == "two_input" and m["replicas"] == 2


NSYS_COMMAND = ("nsys profile -t cuda,nvtx,osrt -o runs/regression-nvtx "
                "python -m tftrain.run examples/regression.py:task --nvtx --epochs 2")


def test_nsys_command_runs_and_says_nvtx_has_nothing_to_do_without_a_gpu(tmp_path):
    """The Python part of the documented Nsight Systems command (no nsys, no GPU here)."""
    _shown(NSYS_COMMAND)
    words = NSYS_COMMAND[NSYS_COMMAND.index("python -m"):].split()
    proc = run_module(words[2], [*words[3:], *SMOKE, "--run-dir", tmp_path / "run"], cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("nvtx:      no GPU in use (NVTX ranges are for Nsight Systems on a GPU); --nvtx has nothing to do"
            in proc.stdout.splitlines())
    assert read_metrics(tmp_path / "run")["task"] == "regression"


def readme_snippet() -> str:
    """The Python code block right after the README's docs-test marker."""
    text = README.read_text(encoding="utf-8")
    assert SNIPPET_MARKER in text, f"README.md lost its marker {SNIPPET_MARKER}"
    match = re.match(r"\s*```python\n(.*?)^```", text.split(SNIPPET_MARKER, 1)[1], re.S | re.M)
    assert match, f"no ```python block right after {SNIPPET_MARKER} in README.md"
    return match.group(1)


def test_readme_your_own_model_snippet_runs(tmp_path):
    run_dir = tmp_path / "run"
    smoke = {"train_examples": 512, "epochs": 1, "verbose": 2, "seed": 0, "run_dir": str(run_dir)}
    prelude = (
        "import tftrain\n"
        "class _Smoke(tftrain.Trainer):\n"
        "    def __init__(self, task, config=None, **kwargs):\n"
        f"        super().__init__(task, config, **{{**kwargs, **{smoke!r}}})\n"
        "tftrain.Trainer = _Smoke\n"
    )
    proc = run_python(prelude + readme_snippet(), cwd=tmp_path)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    m = read_metrics(run_dir)
    assert m["task"] == "arrays" and m["epochs_trained"] == 1 and "test_mae" in m and "val_loss" in m["history"]
    assert "{'loss':" in proc.stdout  # the snippet's own print(record.test, ...)


def test_results_tables_in_the_docs_match_the_committed_results_files():
    """README.md and docs/benchmarks.md quote benchmark figures only through results blocks that
    `python -m benchmarks.tables` copies from benchmarks/results/; a stale or hand-edited block fails."""
    from benchmarks import tables

    blocks = 0
    for path in tables.DOCS:
        text, changed = tables.refresh(path)
        blocks += len(tables.BLOCK.findall(path.read_text(encoding="utf-8")))
        assert changed == [], f"{path.name}: run python -m benchmarks.tables ({', '.join(changed)} stale)"
    assert blocks >= 7


def test_table_example_command(tmp_path):
    m = _run_documented("python -m tftrain.run examples/table.py:task --epochs 5", tmp_path / "run")
    assert m["task"] == "table" and m["train_examples"] == 512  # the smoke size: --train-examples 512
    assert math.isfinite(m["test_loss"]) and m["test_examples"] == 1000
