"""servesim kernels_cost_model: GPU + model catalogs, per-operator roofline, calibration, torch backend.

    from kernels_cost_model import make_cost_model
    cm = make_cost_model("llama-3.1-8b", "h100")
    cm.step_time(BatchShape([512, 1, 1], [0, 300, 900], num_sampled=3))
"""
from .calibration import Calibration, fit_profile, load_calibration, save_calibration
from .builder import make_cost_model
from .cost_model import BREAKDOWN_KEYS, RooflineCostModel
from .hardware import GPU, get_gpu, list_gpus
from .kv_memory import kv_bytes_per_token, kv_cache_blocks, kv_layout
from .models import ModelSpec, get_model, list_models
from .profile_schema import read_profile, write_profile
from .roofline import Coeffs

__all__ = [
    "BREAKDOWN_KEYS", "Calibration", "Coeffs", "GPU", "ModelSpec", "RooflineCostModel", "fit_profile",
    "get_gpu", "get_model", "kv_bytes_per_token", "kv_cache_blocks", "kv_layout", "list_gpus", "list_models",
    "load_calibration", "make_cost_model", "read_profile", "save_calibration", "write_profile",
]
