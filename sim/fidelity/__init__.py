"""End-to-end fidelity: replay real vLLM runs in the simulator and compare with the measurement.

    from sim.fidelity.real_runs import find_runs, read_run
    from sim.fidelity.report import compare_run
    c = compare_run(read_run(find_runs()[0]))
    print(c.aggregates)          # metric, sim, real, rel_error

`python benchmarks/fidelity.py` does this for every run and writes plots; docs/fidelity.md has the results.
"""
