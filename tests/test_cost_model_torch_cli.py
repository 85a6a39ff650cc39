"""The calibrate CLI (profile backend) and the optional torch backend (skipped without torch)."""
import argparse
import json

import pytest

from kernels_cost_model.cli import add_calibrate_parser, main
from kernels_cost_model.profile_schema import write_profile
from tests.test_cost_model_calibration import synthetic_rows


def parse(argv):
    parser = argparse.ArgumentParser()
    add_calibrate_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_parser_registers_calibrate_with_handler():
    args = parse(["calibrate", "--backend", "torch", "--device", "cpu", "--quick", "--model", "qwen2.5-0.5b"])
    assert callable(args.func) and args.backend == "torch" and args.quick


def test_calibrate_from_profile(tmp_path, capsys):
    profile = write_profile(synthetic_rows(), tmp_path / "p.csv")
    out = tmp_path / "h100.json"
    assert main(["calibrate", "--profile", str(profile), "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["device"] == "h100-sxm" and "matmul" in data["coeffs"]
    text = capsys.readouterr().out
    assert "held out" in text and "matmul" in text


def test_calibrate_errors_are_exit_code_2(tmp_path, capsys):
    assert main(["calibrate", "--profile", str(tmp_path / "missing.csv")]) == 2
    assert main(["calibrate"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("servesim: error: ") == 2


@pytest.mark.parametrize("measured_s", ["1e300", "1e-300", "inf"])
def test_calibrate_names_a_measured_time_out_of_range(tmp_path, capsys, measured_s):
    rows = [dict(r, measured_s=measured_s) if i == 1 else r for i, r in enumerate(synthetic_rows())]
    profile = write_profile(rows, tmp_path / "p.csv")
    assert main(["calibrate", "--profile", str(profile), "--out", str(tmp_path / "c.json")]) == 2
    assert capsys.readouterr().err == (f"servesim: error: {profile}:3:measured_s='{measured_s}': must be a number"
                                       " of seconds in [1e-09, 3600]\n")


def test_calibrate_names_an_unknown_gpu(tmp_path, capsys):
    profile = write_profile(synthetic_rows(), tmp_path / "p.csv")
    out = tmp_path / "c.json"
    assert main(["calibrate", "--profile", str(profile), "--gpu", "h900", "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith("servesim: error: --gpu='h900': unknown GPU; known: a10, a100-pcie-40gb")
    unknown = write_profile([dict(r, device="h900") for r in synthetic_rows()], tmp_path / "u.csv")
    assert main(["calibrate", "--profile", str(unknown), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("servesim: error: profile device='h900': unknown GPU; known:") and "--gpu" in err
    assert not out.exists()
    assert main(["calibrate", "--profile", str(unknown), "--gpu", "h100", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["device"] == "h100-sxm"


def test_torch_backend_quick_cpu_profile_calibrates(tmp_path):
    pytest.importorskip("torch")
    from kernels_cost_model import make_cost_model
    from kernels_cost_model.profile_schema import read_profile
    from kernels_cost_model.batch import BatchShape
    out = tmp_path / "cpu.json"
    assert main(["calibrate", "--backend", "torch", "--device", "cpu", "--quick", "--out", str(out)]) == 0
    rows = read_profile(out.with_suffix(".profile.csv"))
    assert {r["family"] for r in rows} >= {"matmul", "elementwise", "prefill_attention", "decode_attention"}
    assert all(r["device"] == "cpu" and r["dtype"] == "float32" for r in rows)
    cm = make_cost_model("qwen2.5-0.5b", "h100", calibration=out)  # a CPU fit priced on any catalog shape
    assert cm.step_time(BatchShape([64, 1], [0, 100], 2)) > 0


def test_torch_backend_rejects_unknown_device():
    pytest.importorskip("torch")
    from kernels_cost_model.torch_backend import measure_profile
    from kernels_cost_model.errors import ConfigError
    with pytest.raises(ConfigError):
        measure_profile(device="tpu")


def test_torch_backend_names_a_prefill_kernel_it_cannot_run():
    """FlashAttention-3 needs a Hopper GPU (and the fa3_fwd package); an unknown kernel is named."""
    pytest.importorskip("torch")
    from kernels_cost_model.torch_backend import measure_profile
    from kernels_cost_model.errors import ConfigError
    with pytest.raises(ConfigError, match="prefill_kernel='fa3': FlashAttention-3 runs on Hopper"):
        measure_profile("qwen2.5-0.5b", "cpu", quick=True, families=("prefill_attention",), prefill_kernel="fa3")
    with pytest.raises(ConfigError, match="prefill_kernel='fa4': must be one of"):
        measure_profile(device="cpu", prefill_kernel="fa4")
