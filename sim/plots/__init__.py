"""Plots of one run (`run_plots`) and of capacity searches (`capacity`); matplotlib, pyplot-free."""
from sim.plots.run_plots import (new_figure, plot_batch_composition, plot_kv_occupancy, plot_latency_cdfs,
                                 plot_queue_length, plot_spec_decode, plot_throughput_latency, plot_timeline,
                                 save_plots)

__all__ = ["new_figure", "plot_batch_composition", "plot_kv_occupancy", "plot_latency_cdfs", "plot_queue_length",
           "plot_spec_decode", "plot_throughput_latency", "plot_timeline", "save_plots"]
