"""`servesim plot DIR`: draw the plots of a run saved with `servesim run --out DIR`."""
from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("plot", help="re-plot a run saved with `servesim run --out DIR`",
                              description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path, metavar="DIR", help="folder written by `servesim run --out`")
    p.add_argument("--out", type=Path, metavar="PLOT_DIR", help="where to write (default DIR/plots)")
    p.add_argument("--format", choices=("png", "svg"), default="png", help="image format")
    p.set_defaults(func=plot)
    return p


def plot(args) -> int:
    """Handler of `servesim plot`."""
    from sim.plots.run_plots import save_plots
    from sim.api.results import Results
    results = Results.load(args.dir)
    for path in save_plots(results, args.out or args.dir / "plots", args.format):
        print(path)
    return 0
