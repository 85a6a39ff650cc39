"""GPU prices ($ per GPU-hour) for deployment search, with their sources.

The defaults (sim/planning/gpu_prices.csv) are public cloud list prices: provider, instance, region, price
type and date in each row. Prices move; pass your own with `load_prices(overrides={"h100": 2.99})`
or a CSV with the same `gpu,usd_per_gpu_hour` columns.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from kernels_cost_model.errors import ConfigError, require
from sim.core.fields import is_number

DEFAULT_PRICES = Path(__file__).resolve().parent / "gpu_prices.csv"


def _canonical(gpu: str) -> str:
    from kernels_cost_model import get_gpu
    return get_gpu(gpu).name


def load_prices(path: str | Path | None = None, overrides: dict[str, float] | None = None) -> pd.DataFrame:
    """The price table (indexed by canonical GPU name), from `path` or the defaults, plus overrides."""
    require(path is None or isinstance(path, (str, Path)), "prices.path", path, "must be the path of a CSV file")
    source = Path(path) if path is not None else DEFAULT_PRICES
    require(not source.is_dir(), "prices.path", str(source), "is a folder, not a CSV file")
    try:
        table = pd.read_csv(source, dtype={"gpu": str, "usd_per_gpu_hour": str})
    except FileNotFoundError:
        raise ConfigError("prices.path", str(source), "file not found") from None
    except (UnicodeDecodeError, pd.errors.EmptyDataError, pd.errors.ParserError) as exc:
        raise ConfigError("prices.path", str(source), f"not a readable CSV file ({type(exc).__name__})") from None
    require({"gpu", "usd_per_gpu_hour"} <= set(table.columns), "prices.path", str(source),
            "needs columns gpu and usd_per_gpu_hour")
    table["gpu"] = [_row_gpu(source, line, g) for line, g in enumerate(table["gpu"], start=2)]
    table["usd_per_gpu_hour"] = [_row_price(source, line, p)
                                 for line, p in enumerate(table["usd_per_gpu_hour"], start=2)]
    repeated = table["gpu"].duplicated()
    if repeated.any():
        line = int(repeated.to_numpy().argmax()) + 2
        raise ConfigError(f"{source}:{line}", table["gpu"].iloc[line - 2], "prices this GPU a second time")
    table = table.set_index("gpu")
    for gpu, price in (overrides or {}).items():
        require(is_number(price) and price > 0, f"prices.{gpu}", price, "must be a number > 0")
        table.loc[_override_name(gpu, price), ["usd_per_gpu_hour", "source"]] = [float(price), "user override"]
    return table


def _row_gpu(source: Path, line: int, gpu) -> str:
    """A price row's canonical GPU name; an empty or unknown one is named with its file and line."""
    require(isinstance(gpu, str) and gpu.strip() != "", f"{source}:{line}: gpu", gpu, "is empty; name a catalog GPU")
    try:
        return _canonical(gpu)
    except ConfigError as exc:
        raise ConfigError(f"{source}:{line}: gpu", gpu, exc.reason) from None


def _row_price(source: Path, line: int, price) -> float:
    """A price row's $ per GPU-hour: a finite number > 0."""
    try:
        value = float(price)
    except (TypeError, ValueError):
        value = float("nan")
    require(is_number(value) and value > 0, f"{source}:{line}: usd_per_gpu_hour", price, "must be a number > 0")
    return value


def _override_name(gpu: str, price: float) -> str:
    """The canonical name of a [prices] key; an unknown GPU is named as prices.<key>."""
    try:
        return _canonical(gpu)
    except ConfigError as exc:
        raise ConfigError(f"prices.{gpu}", price, exc.reason) from None


def price_per_gpu_hour(prices: pd.DataFrame, gpu: str) -> float:
    """$ per GPU-hour of `gpu`; ConfigError naming the GPU when the table has no price."""
    name = _canonical(gpu)
    if name not in prices.index:
        raise ConfigError("deployment.gpu", gpu, f"no price for {name}; add it under [prices] "
                          f"(known: {sorted(prices.index)})")
    return float(prices.loc[name, "usd_per_gpu_hour"])
