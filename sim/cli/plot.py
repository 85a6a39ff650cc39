"""`servesim plot DIR`: draw the plots of a run saved with `servesim run --out DIR`."""
from __future__ import annotations

import argparse
from pathlib import Path

from sim.cli.output import PLOT_FORMATS


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("plot", help="re-plot a run saved with `servesim run --out DIR`",
                              description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path, metavar="DIR", help="folder written by `servesim run --out`")
    p.add_argument("--out", type=Path, metavar="PLOT_DIR", help="where to write (default DIR/plots)")
    p.add_argument("--plot-format", "--format", dest="plot_format", choices=PLOT_FORMATS, default="png",
                   help="image format (default png; alias --format)")
    p.set_defaults(func=plot)
    return p


def plot(args) -> int:
    """Handler of `servesim plot`."""
    from sim.api.results import Results
    from sim.api.table_io import make_output_folder
    from sim.plots.run_plots import save_plots
    results = Results.load(args.dir)
    out = make_output_folder(args.out, "--out") if args.out else args.dir / "plots"
    for path in save_plots(results, out, args.plot_format):
        print(path)
    return 0
