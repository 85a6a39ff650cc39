"""`servesim report RUN_DIR`: one self-contained HTML page of a run saved with `servesim run --out`."""
from __future__ import annotations

import argparse
from pathlib import Path

DESCRIPTION = """\
Write one self-contained HTML page of a saved run: the summary, the configuration, every plot
(inline SVG) and the per-request table with a search box and sortable columns. Nothing is loaded
from elsewhere; open it in any browser, mail it, archive it."""


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("report", help="one self-contained HTML page of a saved run",
                              description=DESCRIPTION)
    p.add_argument("dir", type=Path, metavar="RUN_DIR", help="folder written by `servesim run --out`")
    p.add_argument("--out", type=Path, metavar="FILE", help="where to write (default RUN_DIR/report.html)")
    p.set_defaults(func=report)
    return p


def report(args) -> int:
    """Handler of `servesim report`."""
    from sim.api.table_io import check_output_file
    from sim.plots.html_report import write_report
    if args.out:
        check_output_file(args.out, "--out")
    print(write_report(args.dir, args.out))
    return 0
