"""One set of rules for a configuration of `predict` (where the system comes from, how the initial
scale is given): `lvflow predict`, `lvflow sweep` and the Python API refuse the same
configurations and name the same input. The rules are restated here independently (`_broken`), as a
truth table over which inputs are given."""

from __future__ import annotations

import numpy as np
import pytest
from _cli import main
from hypothesis import HealthCheck, given, settings, strategies as st

import lvflow

R3 = np.array([1.0, 0.5, 0.25])
C3 = np.diag([1.0, 1.0, 1.0])

#: CLI flags of the inputs (the names of `lvflow sweep`/`sweep()` are the keys).
FLAG = {
    "system": "--system",
    "architecture": "--architecture",
    "data": "--data",
    "alpha1": "--alpha1",
    "alpha2": "--alpha2",
    "modes": "--modes",
    "eps": "--eps",
    "z0": "--z0",
    "c": "--c",
    "beta": "--beta",
    "init_std": "--init-std",
    "width": "--width",
}
INPUTS = tuple(FLAG)


def _broken(given: frozenset[str]) -> str | None:
    """The rule a set of given inputs breaks (the input the error must name), or None: written
    from the documentation of `lvflow predict --help` and `sweep()`, not from lvflow's code."""
    power = given & {"alpha1", "alpha2", "modes"}
    arch = given & {"architecture", "data"}
    if (bool(power) + ("system" in given) + bool(arch)) != 1:
        return "input"
    for name in ("alpha1", "alpha2", "modes"):
        if power and name not in given:
            return name
    if "architecture" in given and "data" not in given:
        return "data"
    if "data" in given and "architecture" not in given:
        return "data"
    scales = given & {"eps", "z0", "init_std"}
    if len(scales) > 1:
        return "initial scale"
    if not scales:
        return "eps"
    if "width" in given and "init_std" not in given:
        return "width"
    if "init_std" in given and "width" not in given:
        return "width"
    for a, b in (("c", "z0"), ("c", "beta"), ("beta", "z0")):
        if a in given and b in given:
            return a
    return None


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("spec")
    np.savez(d / "sys.npz", r=R3, C=C3)
    np.save(d / "z0.npy", np.full(3, 1e-4))
    np.save(d / "c.npy", np.ones(3))
    np.savez(d / "data.npz", x=np.eye(3), y=np.ones(3))
    return d


def _values(given: frozenset[str], d) -> dict:
    v = {
        "system": str(d / "sys.npz"),
        "architecture": "mlp",
        "data": str(d / "data.npz"),
        "alpha1": 2.0,
        "alpha2": 1.0,
        "modes": 3,
        "eps": 1e-4,
        "z0": str(d / "z0.npy"),
        "c": str(d / "c.npy"),
        "beta": 0.5,
        "init_std": 1e-3,
        "width": 10,
    }
    return {k: v[k] for k in given}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.frozensets(st.sampled_from(INPUTS), max_size=6).filter(lambda g: _broken(g) is not None))
def test_predict_and_sweep_refuse_alike(files, capsys, given):
    broken = _broken(given)
    values = _values(given, files)
    argv = ["predict", "--quiet"] + [a for k, v in values.items() for a in (FLAG[k], str(v))]
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, (argv, err)
    head = err.removeprefix("lvflow predict: error: ").split(":")[0]
    assert head == FLAG.get(broken, broken), (sorted(given), err)
    with pytest.raises(lvflow.LvflowError) as e:
        lvflow.sweep(configs=[values], progress=False, summary=False)
    assert str(e.value).split(":")[0] == broken, (sorted(given), str(e.value))


@pytest.mark.parametrize(
    "given",
    [
        {"eps", "z0"},
        {"eps", "init_std", "width"},
        {"z0", "c"},
        {"eps", "width"},
        {"init_std"},
        set(),
    ],
)
def test_predict_api_refuses_alike(files, given):
    """`predict()` takes a system object; its initial-scale rules are the same."""
    broken = _broken(frozenset(given) | {"system"})
    kw = {k: np.load(v) if k in ("z0", "c") else v for k, v in _values(frozenset(given), files).items()}
    with pytest.raises(lvflow.LvflowError) as e:
        lvflow.predict(lvflow.LotkaVolterra(R3, C3), **kw)
    assert str(e.value).split(":")[0] == broken, str(e.value)
