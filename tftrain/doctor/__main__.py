"""`python -m tftrain.doctor [FILE.py:NAME | MODULE:NAME] [--data-dir DIR] [--json] [--quick]`. Exit codes: 0 report
printed (failed measurements listed as warnings); 2 bad input; 1 the doctor failed."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional, Sequence

from tftrain.cli import OneLineParser
from tftrain.errors import ConfigError

PROG = "python -m tftrain.doctor"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, allow_abbrev=False,
                     description="Measure this machine (CPU, memory, disk, GPUs, all-reduce) in under a minute "
                                 "and say which device, precision, threads and strategy to train with.")
    parser.add_argument("task", nargs="?", default=None, metavar="FILE.py:NAME",
                        help="the task to advise on (FILE.py:NAME or MODULE:NAME, as for python -m tftrain.run); "
                             "default: the MNIST recipe's mlp and cnn")
    parser.add_argument("--data-dir", metavar="DIR", default=None,
                        help="folder (or file) whose disk read throughput is measured; default: the task's data "
                             "folder, else the bundled MNIST's")
    parser.add_argument("--json", action="store_true", help="print the report as JSON (for scripts)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: seconds, rough figures (tests)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parses flags, runs `diagnose`, prints the report; returns the exit code."""
    try:
        args = build_parser().parse_args(argv)
        from tftrain.doctor.diagnose import diagnose

        say = (lambda m: print(f"{PROG}: measuring {m} ...", file=sys.stderr, flush=True)) \
            if sys.stderr.isatty() and not args.json else None
        report = diagnose(args.task, args.data_dir, args.quick, say)
    except ConfigError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        from tftrain.errors import interrupted

        words, code = interrupted(e)
        print(f"\n{PROG}: {words}.", file=sys.stderr)
        return code
    except Exception as e:  # one line, as tftrain.run
        from tftrain.errors import one_line

        print(f"{PROG}: failed: {one_line(e)}", file=sys.stderr)
        return 1
    from tftrain.doctor.report import render

    print(json.dumps(report, indent=2, default=str) if args.json else render(report), end="" if not args.json else "\n")
    return 0


if __name__ == "__main__":
    from tftrain.errors import sigterm_as_interrupt

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    sigterm_as_interrupt()
    sys.exit(main())
