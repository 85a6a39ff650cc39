"""servesim workloads: arrival processes, length distributions, trace replay, sessions, mixes.

    from workloads import poisson_workload, make_rng
    specs = poisson_workload(rate=10, num_requests=1000, lengths="sharegpt").iter_requests(make_rng(0, "workload"))
"""
from workloads.arrivals import (ArrivalProcess, Constant, Gamma, Poisson, TimeVarying, TraceTimes,
                                arrival_times, diurnal, piecewise, rescale)
from workloads.base import ClosedLoopWorkload, OpenLoopWorkload, Workload, as_process, feed, is_closed_loop
from workloads.closed_loop import ClosedLoopClients
from workloads.delays import ThinkTime
from workloads.hidden_states import with_hidden_states
from workloads.errors import TraceFormatError
from workloads.lengths import (Copula, Empirical, EmpiricalPairs, Fixed, Independent, LogNormal, Normal,
                               Quantile, Uniform, Zipf)
from workloads.mix import Mix, WorkloadClass, workload_class
from workloads.presets import length_preset, preset_info, preset_names
from workloads.rng import make_rng
from workloads.sessions import SessionWorkload
from workloads.spec import RequestSpec
from workloads.synthetic import SyntheticWorkload, gamma_workload, poisson_workload
from workloads.tokens import DEFAULT_EOS_TOKEN_ID
from workloads.trace_workload import TraceWorkload
from workloads.traces import TraceRow, read_azure, read_burstgpt, read_generic, read_mooncake, read_trace

__all__ = [
    "ArrivalProcess", "ClosedLoopClients", "ClosedLoopWorkload", "Constant", "Copula", "DEFAULT_EOS_TOKEN_ID",
    "Empirical", "EmpiricalPairs", "Fixed", "Gamma", "Independent", "LogNormal", "Mix", "Normal",
    "OpenLoopWorkload", "Poisson", "Quantile", "RequestSpec", "SessionWorkload", "SyntheticWorkload",
    "ThinkTime", "TimeVarying", "TraceFormatError", "TraceRow", "TraceTimes", "TraceWorkload", "Uniform",
    "Workload", "WorkloadClass", "Zipf", "arrival_times", "as_process", "diurnal", "feed", "gamma_workload",
    "is_closed_loop", "length_preset", "make_rng", "piecewise", "poisson_workload", "preset_info",
    "preset_names", "read_azure", "read_burstgpt", "read_generic", "read_mooncake", "read_trace", "rescale",
    "with_hidden_states", "workload_class",
]
