"""Output flags of `servesim run`: tables, plots, JSON, `vllm bench serve`-style result files.

Table format and image format have distinct names (`--table-format`, `--plot-format`); the old
`--format` still selects the table format.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sim.api.metrics import LATENCY_METRICS

TABLE_FORMATS = ("parquet", "csv")
PLOT_FORMATS = ("png", "svg")


def csv_list(kind, allowed=None):
    """argparse type: 'a,b,c' -> tuple of `kind` values (each in `allowed`, if given)."""
    def parse(text: str) -> tuple:
        items = []
        for item in (item.strip() for item in text.split(",") if item.strip()):
            try:
                items.append(kind(item))
            except ValueError as exc:
                why = f" ({exc})" if str(exc) != item else ""
                raise argparse.ArgumentTypeError(f"{text!r}: {item!r} is not a {kind.__name__}{why}") from None
        items = tuple(items)
        bad = [i for i in items if allowed is not None and i not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(allowed or ())}")
        return items
    return parse


def percentile(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("not a number") from None
    if not 0 < value < 100:
        raise ValueError("must be strictly between 0 and 100")
    return value


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: give KEY=VALUE")
    return key.strip(), value.strip()


def add_output_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--out", type=Path, metavar="DIR",
                   help="write requests/steps/tokens tables, summary.json, summary.txt and plots/")
    g.add_argument("--table-format", "--format", dest="table_format", choices=TABLE_FORMATS,
                   help="table format (default: parquet when pyarrow is installed, else csv; alias --format)")
    g.add_argument("--plot-format", choices=PLOT_FORMATS + ("none",), default="png",
                   help="plot image format (default png)")
    g.add_argument("--json", action="store_true", help="print the summary as JSON, not a table")
    g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress line and status on stderr (default: when stderr is a terminal)")
    g = p.add_argument_group("metrics (vllm bench serve's names)")
    g.add_argument("--percentile-metrics", type=csv_list(str, tuple(LATENCY_METRICS)), metavar="LIST",
                   help=f"latency rows to report: {','.join(LATENCY_METRICS)} (default all)")
    g.add_argument("--metric-percentiles", type=csv_list(percentile), metavar="LIST",
                   help="percentiles beside mean and median, e.g. 50,90,99.9 (default: 90,99 printed;"
                        " 99 in the --save-result JSON, as vllm bench serve)")
    g.add_argument("--save-result", action="store_true",
                   help="write the results as JSON in vllm bench serve's --save-result schema")
    g.add_argument("--save-detailed", action="store_true", help="with per-request lists (ttfts, itls, ...)")
    g.add_argument("--result-dir", type=Path, metavar="DIR", help="where --save-result writes (default: --out or .)")
    g.add_argument("--result-filename", metavar="NAME",
                   help="file name (default <label>-<rate>qps-<model>-<date>.json, as vLLM)")
    g.add_argument("--label", help="label (prefix) of the result file (default servesim)")
    g.add_argument("--metadata", nargs="*", type=key_value, metavar="KEY=VALUE", default=(),
                   help="extra key-value pairs recorded in the result JSON")


def summary_options(args) -> tuple[tuple | None, tuple | None]:
    """(latency metrics to show, percentiles to compute) from the flags (None = defaults)."""
    return args.percentile_metrics, args.metric_percentiles


def save_outputs(args, results, table: str, status: bool) -> None:
    """Tables, summary and plots into --out; the vLLM-style result file with --save-result."""
    if args.out:
        save_run(results, args.out, args.table_format, args.plot_format, table, status)
    if args.save_result:
        path = save_result(results, args)
        print(f"wrote {path}", file=sys.stderr)


def save_run(results, out: Path, fmt: str | None, plot_format: str, table: str, status: bool = False) -> None:
    """Tables, summary and plots of one run into `out`; `status` says on stderr what is being written."""
    from sim.api.results import parquet_available
    from sim.api.table_io import make_output_folder
    make_output_folder(out, "--out")
    fmt = fmt or ("parquet" if parquet_available() else "csv")
    if status:
        print(f"servesim: writing {fmt} tables to {out} ...", file=sys.stderr, flush=True)
    results.save(out, fmt)
    from sim.api.table_io import write_text
    write_text(out / "summary.txt", table + "\n")
    written = [f"{fmt} tables", "summary.json", "summary.txt"]
    if plot_format != "none":
        from sim.plots.run_plots import save_plots
        if status:
            print(f"servesim: writing plots to {out / 'plots'} ...", file=sys.stderr, flush=True)
        paths = save_plots(results, out / "plots", plot_format)
        written.append(f"{len(paths)} plots in plots/")
    print(f"wrote {', '.join(written)} to {out}", file=sys.stderr)


def save_result(results, args) -> Path:
    """`--save-result`: vllm bench serve's JSON into --result-dir (default --out, else .)."""
    from sim.api.bench_result import bench_serve_result, result_filename
    metadata = dict(args.metadata)
    doc = bench_serve_result(results, args.percentile_metrics or ("ttft", "tpot", "itl", "e2el"),
                             args.metric_percentiles or (99.0,), label=args.label, metadata=metadata,
                             detailed=args.save_detailed)
    from sim.api.table_io import make_output_folder
    folder = make_output_folder(*result_folder(args))
    path = folder / (args.result_filename or result_filename(doc, args.label))
    path.write_text(json.dumps(doc, indent=2))
    return path


def result_folder(args) -> tuple[Path, str]:
    """Where --save-result writes, and the flag that chose it."""
    if args.result_dir:
        return args.result_dir, "--result-dir"
    return (args.out, "--out") if args.out else (Path("."), "--result-dir")


#: Longest --label: the default file name adds ~70 bytes (rate, model, date) under the usual 255-byte limit.
MAX_LABEL_BYTES = 160


def _check_label(label: str | None) -> None:
    """--label starts the default file name: one name, not a path, short enough for one."""
    from kernels_cost_model.errors import ConfigError
    if label is None:
        return
    if "/" in label or "\0" in label:
        raise ConfigError("--label", label, "starts the result file's name: no '/' or NUL; give the folder "
                          "with --result-dir")
    if len(label.encode()) > MAX_LABEL_BYTES:
        raise ConfigError("--label", label[:40] + "...", f"is {len(label.encode())} bytes; the file name it "
                          f"starts must stay under 255: at most {MAX_LABEL_BYTES}")


RESULT_FLAGS = (("save_detailed", "--save-detailed"), ("result_dir", "--result-dir"),
                ("result_filename", "--result-filename"), ("label", "--label"), ("metadata", "--metadata"))
"""The flags that shape the --save-result file, and nothing else."""


def warn_result_flags_unused(args) -> None:
    """Say so when flags of the result file are given without --save-result (as in vllm bench serve, they
    then change nothing)."""
    given = [flag for dest, flag in RESULT_FLAGS if getattr(args, dest, None)]
    if given:
        print(f"servesim: warning: {', '.join(given)} shape the --save-result file only; without --save-result"
              " no result file is written", file=sys.stderr)


def check_result_path(args) -> None:
    """Before the run: the --save-result folder can be made, and --result-filename's own folder exists."""
    from kernels_cost_model.errors import ConfigError
    from sim.api.table_io import check_output_folder
    if not args.save_result:
        warn_result_flags_unused(args)
        return
    folder = check_output_folder(*result_folder(args))
    if not args.result_filename:
        _check_label(args.label)
        return
    path = folder / args.result_filename
    if len(path.name.encode()) > 255:
        raise ConfigError("--result-filename", args.result_filename[:40] + "...", "is longer than a file name "
                          "may be (255 bytes)")
    if path.is_dir() or path.absolute() == Path(folder).absolute():
        raise ConfigError("--result-filename", args.result_filename, f"{path} is a folder; give a file name")
    if Path(args.result_filename).parent != Path(".") and not path.parent.is_dir():
        raise ConfigError("--result-filename", args.result_filename,
                          f"folder {path.parent.absolute()} does not exist")
