"""Length distributions and the shipped presets."""
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels_cost_model.errors import ConfigError
from workloads import (Copula, Empirical, EmpiricalPairs, Fixed, Independent, LogNormal, Normal, Quantile,
                       TraceFormatError, Uniform, Zipf, length_preset, make_rng, preset_info, preset_names)
from workloads.presets import PRESET_FILE

N = 100_000


@given(low=st.integers(1, 5000), width=st.integers(0, 5000), seed=st.integers(0, 1000))
def test_bounded_distributions_stay_in_bounds(low, width, seed):
    high = low + width
    rng = make_rng(seed, "lengths")
    for dist in (Uniform(low, high), Normal(low + width / 2, width + 1, low, high),
                 LogNormal(np.log(low + 1), 1.0, low, high), Zipf(1.2, low, high)):
        x = dist.sample(rng, 500)
        assert x.dtype == np.int64 and x.min() >= low and x.max() <= high


def test_distribution_moments():
    rng = make_rng(0, "moments")
    assert np.all(Fixed(7).sample(rng, 10) == 7)
    assert Uniform(10, 20).sample(rng, N).mean() == pytest.approx(15, rel=0.01)
    assert Normal(500, 50).sample(rng, N).mean() == pytest.approx(500, rel=0.01)
    ln = LogNormal.from_mean_cv(300, 0.5)
    x = ln.sample(rng, N)
    assert x.mean() == pytest.approx(300, rel=0.02) and x.std() / x.mean() == pytest.approx(0.5, rel=0.05)
    z = Zipf(1.5, 1, 1000).sample(rng, N)
    assert np.mean(z == 1) > np.mean(z == 2) > np.mean(z == 3)


def test_empirical_resampling_keeps_pairs():
    pairs = EmpiricalPairs([10, 20, 30], [1, 2, 3])
    p, o = pairs.sample(make_rng(1), 1000)
    assert np.array_equal(o * 10, p) and set(p.tolist()) == {10, 20, 30}
    assert set(Empirical([5, 6]).sample(make_rng(2), 100).tolist()) == {5, 6}


def test_copula_correlation_and_quantiles():
    ln = LogNormal(5.0, 1.0)
    p, o = Copula(ln, ln, rho=0.9).sample(make_rng(3), N)
    assert np.corrcoef(np.log(p), np.log(o))[0, 1] == pytest.approx(0.9, abs=0.02)
    q = Quantile([0, 0.5, 1], [10, 100, 110])
    x = q.sample(make_rng(4), N)
    assert x.min() >= 10 and x.max() <= 110 and np.median(x) == pytest.approx(100, abs=2)
    p, o = Independent(Fixed(3), Fixed(4)).sample(make_rng(5), 3)
    assert p.tolist() == [3, 3, 3] and o.tolist() == [4, 4, 4]


@pytest.mark.parametrize("name", ["sharegpt", "arxiv_summarization", "bwb_translation", "azure_code",
                                  "azure_conv", "mooncake_conversation"])
def test_presets_ship_source_fit_and_match_their_means(name):
    info = preset_info(name)
    assert info["source"] and info["file"] and info["rows"] > 1000
    assert info["quantile"]["fit"]["prompt"]["ks"] < 0.02 and info["quantile"]["fit"]["output"]["ks"] < 0.02
    p, o = length_preset(name).sample(make_rng(6, name), N)
    assert p.mean() == pytest.approx(info["data_mean"]["prompt"], rel=0.03)
    assert o.mean() == pytest.approx(info["data_mean"]["output"], rel=0.05)
    lp, lo = length_preset(name, "lognormal").sample(make_rng(6, name), 1000)
    assert lp.min() >= info["lognormal"]["prompt"]["low"] and lo.max() <= info["lognormal"]["output"]["high"]


def test_preset_names_and_aliases():
    assert "sharegpt" in preset_names()
    assert preset_info("arxiv") is preset_info("arxiv_summarization")
    with pytest.raises(ConfigError, match="unknown preset"):
        length_preset("nope")
    with pytest.raises(ConfigError):
        length_preset("sharegpt", "weibull")


def test_preset_file_matches_readme_means():
    presets = json.loads(PRESET_FILE.read_text())["presets"]
    assert presets["sharegpt"]["data_mean"] == {"prompt": 2340.0, "output": 438.7}
    assert presets["bwb_translation"]["data_mean"] == {"prompt": 1067.2, "output": 1612.8}


@pytest.mark.parametrize("build, field", [
    (lambda: Fixed(0), "value"), (lambda: Uniform(5, 4), "high"), (lambda: Uniform(0, 4), "low"),
    (lambda: LogNormal(1.0, -1.0), "sigma"), (lambda: Empirical([3, -1]), "values"),
    (lambda: Zipf(0), "a"), (lambda: Quantile([0, 1], [5, 4]), "values"), (lambda: Copula(None, None, 2), "rho"),
])
def test_bad_length_parameters(build, field):
    with pytest.raises(ConfigError) as err:
        build()
    assert err.value.field == field


def test_lengths_file_errors_name_file_and_line(tmp_path):
    path = tmp_path / "lens.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n10,5\n12,-3\n")
    with pytest.raises(TraceFormatError, match=r"lens.csv:3: num_decode_tokens=-3"):
        EmpiricalPairs.from_csv(path)
    path.write_text("prompt,num_decode_tokens\n10,5\n")
    with pytest.raises(TraceFormatError, match=r"lens.csv:1: missing column"):
        EmpiricalPairs.from_csv(path)
    path.write_text("num_prefill_tokens,num_decode_tokens\n10,5\n20,6\n")
    p, o = EmpiricalPairs.from_csv(path).sample(make_rng(0), 50)
    assert set(zip(p.tolist(), o.tolist())) <= {(10, 5), (20, 6)}
