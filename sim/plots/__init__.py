"""Plots of one run (`run_plots`), across runs (`sweep`), of capacity searches (`capacity`), and the
one-page HTML report of a saved run (`html_report`); matplotlib, pyplot-free."""
from sim.plots.run_plots import (PLOTS, new_figure, plot_batch_composition, plot_kv_occupancy, plot_latency_cdfs,
                                 plot_queue_length, plot_spec_decode, plot_timeline, save_plots)
from sim.plots.sweep import plot_throughput_latency

__all__ = ["PLOTS", "new_figure", "plot_batch_composition", "plot_kv_occupancy", "plot_latency_cdfs",
           "plot_queue_length", "plot_spec_decode", "plot_throughput_latency", "plot_timeline", "save_plots"]
