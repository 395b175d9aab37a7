"""Copies the committed results tables into the docs, so no figure in them is typed by hand.

A doc names a results file between two markers, e.g. in `docs/benchmarks.md`:

    <!-- results: flagship -->
    (the table of benchmarks/results/flagship.md, its notes and machine line)
    <!-- /results -->

`python -m benchmarks.tables` rewrites every such block from `benchmarks/results/<name>.md`
(`summary` is the Targets table of `summary.md`); `--check` changes nothing and exits 1 when
a block differs from its results file (the docs test runs it).

    python -m benchmarks.tables [--check]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DOCS = (REPO / "README.md", REPO / "docs" / "benchmarks.md")
"""The files whose results blocks are kept in step."""

BLOCK = re.compile(r"(<!-- results: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /results -->)", re.DOTALL)


def rendered(name: str) -> str:
    """The block's body for results file `name`: its table, notes and machine line (the heading
    dropped: the doc has its own); for `summary`, the Targets table of `summary.md`.

    Raises:
        FileNotFoundError: when `benchmarks/results/<name>.md` does not exist.
    """
    text = (RESULTS / f"{name}.md").read_text(encoding="utf-8")
    if name == "summary":
        text = text.split("## Targets", 1)[1].split("## Runs", 1)[0]
    else:
        text = text.split("\n", 1)[1]  # drop the "## title" line
    return text.strip("\n") + "\n"


def refresh(path: Path) -> tuple:
    """`(new text, names of the blocks that changed)` of one doc."""
    text = path.read_text(encoding="utf-8")
    changed = []

    def replace(match):
        body = rendered(match["name"])
        if body != match["body"]:
            changed.append(match["name"])
        return match.group(1) + body + match.group(4)

    return BLOCK.sub(replace, text), changed


def main(argv=None) -> int:
    """Rewrites (or with `--check` checks) every results block; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tables", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a block is stale")
    args = parser.parse_args(argv)
    stale = []
    for path in DOCS:
        text, changed = refresh(path)
        stale += [f"{path.relative_to(REPO)}: {name}" for name in changed]
        if changed and not args.check:
            path.write_text(text, encoding="utf-8")
    verb = "stale" if args.check else "rewrote"
    print("\n".join(f"{verb}: {s}" for s in stale) or "every results block matches its results file")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
