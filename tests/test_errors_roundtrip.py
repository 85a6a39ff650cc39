"""Every servesim exception survives being rebuilt from its args: SimPy, pickle, multiprocessing, Ray.

The classes are found by walking the packages, so a new exception type is covered without a test
edit; each is built from arguments made up from its constructor's signature.
"""
from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
from pathlib import Path

import pytest
import simpy

import sim  # noqa: F401 - the facade first: it fixes the import order of the layers

PACKAGES = ("kernels_cost_model", "sim", "policies", "workloads")
OPTIONAL = ("torch", "triton", "ray", "matplotlib", "nbformat")


def project_exceptions() -> list[type[BaseException]]:
    found = {}
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if info.name.endswith("__main__"):
                continue  # running it is its import
            try:
                module = importlib.import_module(info.name)
            except ImportError as exc:  # a backend that is not installed here
                if exc.name and exc.name.split(".")[0] in OPTIONAL:
                    continue
                raise
            for obj in vars(module).values():
                if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == info.name:
                    found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[name] for name in sorted(found)]


SAMPLES = {"path": Path("trace.csv"), "line": 7, "field": "engine.max_num_seqs", "value": lambda: None,
           "reason": "must be an integer >= 1"}


def make(cls: type[BaseException]) -> BaseException:
    """An instance built from sample arguments named like its constructor's parameters."""
    params = [p for p in inspect.signature(cls.__init__).parameters.values()
              if p.name != "self" and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not params or cls.__init__ is BaseException.__init__:
        return cls("something went wrong")
    return cls(*[SAMPLES.get(p.name, f"<{p.name}>") for p in params])


EXCEPTIONS = project_exceptions()


def test_the_walk_finds_the_known_exceptions():
    names = {cls.__name__ for cls in EXCEPTIONS}
    assert {"ConfigError", "TraceFormatError", "InvariantError"} <= names


@pytest.mark.parametrize("cls", EXCEPTIONS, ids=lambda c: c.__name__)
def test_rebuilt_from_args_reads_the_same(cls):
    exc = make(cls)
    again = type(exc)(*exc.args)
    assert type(again) is cls and str(again) == str(exc)
    for name in ("field", "reason", "path", "line"):
        assert getattr(again, name, None) == getattr(exc, name, None)


@pytest.mark.parametrize("cls", EXCEPTIONS, ids=lambda c: c.__name__)
def test_pickled_reads_the_same(cls):
    exc = make(cls)  # its value (a lambda) cannot be pickled: kept as text
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is cls and str(again) == str(exc)


@pytest.mark.parametrize("cls", EXCEPTIONS, ids=lambda c: c.__name__)
def test_raised_inside_a_simpy_process_reaches_the_caller_intact(cls):
    exc = make(cls)
    env = simpy.Environment()

    def process(env):
        yield env.timeout(1)
        raise exc

    def waiter(env, child):
        yield child  # SimPy rebuilds the failure here: type(exc)(*exc.args)

    env.process(waiter(env, env.process(process(env))))
    with pytest.raises(cls) as info:
        env.run()
    assert str(info.value) == str(exc)


def test_a_bad_trace_line_reaches_the_user_from_simulate_and_the_cli(tmp_path, capsys):
    from sim import SimulationConfig, simulate
    from sim.cli import main
    from workloads.errors import TraceFormatError
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,2\n0.5,ten,2\n")
    config = SimulationConfig.from_dict({"workload": {"kind": "trace", "path": str(trace)},
                                         "deployment": {"cost_model": "linear"}})
    with pytest.raises(TraceFormatError, match=rf"^{trace}:3: prompt_tokens='ten' is not a number$"):
        simulate(config)
    assert main(["run", "--trace", str(trace), "--cost-model", "linear", "--no-progress"]) == 2
    assert capsys.readouterr().err == f"servesim: error: {trace}:3: prompt_tokens='ten' is not a number\n"
