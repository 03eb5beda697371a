"""lvflow: neural quadratic forms, Lotka–Volterra learning dynamics, plateaus and scaling laws.

Importing lvflow switches JAX to float64 (`jax_enable_x64`): the theory lives at initial
scales down to ε = 1e-300, far below float32. Set `LVFLOW_KEEP_X64=1` in the environment to
leave JAX's setting untouched.

The public names below are loaded on first use (PEP 562), so that `import lvflow` and the
`lvflow` command's `--help` do not pay JAX's import; `dir(lvflow)` and `lvflow.__all__` list them.
"""

import importlib as _importlib
import importlib.abc as _importlib_abc
import importlib.util as _importlib_util
import os as _os
import sys as _sys
from typing import TYPE_CHECKING as _TYPE_CHECKING


class _X64WhenJaxLoads(_importlib_abc.MetaPathFinder):
    """Switches JAX to float64 right after `jax` is first imported, without importing it now (and
    without an environment variable that child processes would inherit)."""

    def find_spec(self, name, path=None, target=None):
        if name != "jax":
            return None
        _sys.meta_path.remove(self)
        spec = _importlib_util.find_spec("jax")
        if spec is None or spec.loader is None:  # not installed: the import fails as usual, naming jax
            return None
        exec_module = spec.loader.exec_module

        def exec_and_switch(module):
            exec_module(module)
            module.config.update("jax_enable_x64", True)

        spec.loader.exec_module = exec_and_switch
        return spec


if not _os.environ.get("LVFLOW_KEEP_X64"):
    if _sys.modules.get("jax") is not None:
        _sys.modules["jax"].config.update("jax_enable_x64", True)
    else:
        _sys.meta_path.insert(0, _X64WhenJaxLoads())

__version__ = "0.1.0"

#: public name → the private module that defines it
_EXPORTS = {
    "architectures": ".architectures",
    "figures": ".figures",
    "DivergenceError": "._core.errors",
    "LvflowError": "._core.errors",
    "NotCommutingError": "._core.errors",
    "NotPSDError": "._core.errors",
    "SolverError": "._core.errors",
    "SymmetryError": "._core.errors",
    "ZGZError": "._core.errors",
    # The neural quadratic form (§1) and its dynamics on (M, μ) (§2).
    "Expansion": "._form.structure",
    "expand": "._form.structure",
    "structure_matrix": "._form.structure",
    "NQF": "._form.nqf",
    "FlowSolution": "._form.flow",
    "matrix_flow": "._form.flow",
    "MatrixDrops": "._form.drops",
    "matrix_drops": "._form.drops",
    "nqf_from_data": "._workflow.predict_data",
    "power_law_lv": "._workflow.predict_inputs",
    "eps_merge": "._workflow.eps_merge",
    "RecursionResult": "._form.recursion",
    "gd_recursion": "._form.recursion",
    "Compressed": "._form.compress",
    "compress": "._form.compress",
    "compression_bound": "._form.compress",
    "NTKRegime": "._form.ntk",
    "ntk": "._form.ntk",
    "ntk_regime": "._form.ntk",
    "Horizon": "._form.expansion",
    "NextOrder": "._form.expansion",
    "next_order": "._form.expansion",
    "nqf_horizon": "._form.expansion",
    "representative_neurons": "._form.expansion",
    # The Lotka–Volterra reduction (§3), its solution and the ε → 0 schedule (§4).
    "AbstractLotkaVolterra": "._glv.lv",
    "LotkaVolterra": "._glv.lv",
    "LowRankLotkaVolterra": "._glv.lv",
    "AbstractInteraction": "._glv.interaction",
    "DenseInteraction": "._glv.interaction",
    "DiagonalInteraction": "._glv.interaction",
    "LowRankInteraction": "._glv.interaction",
    "saturated_equilibrium": "._glv.equilibrium",
    "ProjectorForm": "._glv.reduce",
    "reduce_to_lv": "._glv.reduce",
    "reduce_to_projectors": "._glv.reduce",
    "LVSolution": "._glv.solution",
    "solve_lv": "._glv.solve",
    "LogLotkaVolterraTerm": "._glv.term",
    "Rodas5P": "._glv.rodas5p",
    "ClosedForm": "._glv.solve",
    "Rodas5PInterpolation": "._glv.rodas5p",
    "SwitchOnState": "._glv.switch_on",
    "SwitchOnTracker": "._glv.switch_on",
    "XiSolution": "._glv.closed_forms",
    "ignition_time": "._glv.closed_forms",
    "isotropic_modes": "._glv.closed_forms",
    "isotropic_riccati": "._glv.closed_forms",
    "log_orthogonal_features": "._glv.closed_forms",
    "orthogonal_features": "._glv.closed_forms",
    "orthogonal_samples": "._glv.closed_forms",
    "projector_modes": "._glv.closed_forms",
    "proportional_samples": "._glv.closed_forms",
    "PlateauSchedule": "._schedule.schedule",
    "AbstractPlateauSchedule": "._schedule.base",
    "NQFPlateauSchedule": "._schedule.nqf_schedule",
    "plateau_schedule": "._schedule.schedule",
    # Scaling laws (Thm 9–11, App. C).
    "PowerLawFit": "._schedule.scaling",
    "SpectrumExponents": "._schedule.scaling",
    "StepResolution": "._schedule.scaling",
    "effective_exponent": "._schedule.scaling",
    "effective_exponent_time": "._schedule.scaling",
    "fit_power_law": "._schedule.scaling",
    "predicted_exponent": "._schedule.scaling",
    "resolved_steps": "._schedule.scaling",
    "spectrum_exponents": "._schedule.scaling",
    # Real networks beside their NQF twins (§5).
    "AbstractDataset": "._training.data",
    "Dataset": "._training.data",
    "LowRankTeacher": "._training.data",
    "TeacherStream": "._training.data",
    "digits_parity": "._training.data",
    "fourier_task": "._training.data",
    "gaussian_inputs": "._training.data",
    "low_rank_teacher": "._training.data",
    "teacher_student_stream": "._training.data",
    "TrainHistory": "._training.train",
    "minibatch_indices": "._training.train",
    "mse_loss": "._training.train",
    "train": "._training.train",
    "NQFModel": "._training.twin",
    "nqf_twin": "._training.twin",
    "AbstractChain": "._training.deep",
    "AbstractDeepModel": "._training.deep",
    "DeepAttention": "._training.deep",
    "DeepMLP": "._training.deep",
    "DeepNQF": "._training.deep",
    "Agreement": "._training.agreement",
    "compare_histories": "._training.agreement",
    "recovered_singular_values": "._training.agreement",
    # The user's workflow.
    "Prediction": "._workflow.predict",
    "PredictionHorizon": "._workflow.predict_horizon",
    "predict": "._workflow.predict",
    # Reading a loss curve.
    "LossDrops": "._curve.drops",
    "loss_drops": "._curve.drops",
    # Fitting a training curve.
    "AbstractCurveModel": "._fit.base",
    "DecoupledModes": "._fit.modes",
    "PowerLawModel": "._fit.power",
    "FitResult": "._fit.fit",
    "fit": "._fit.fit",
    "TrainingLog": "._fit.log",
    "training_log": "._fit.fit",
    # Sweeps over many configurations, sharded over devices and hosts.
    "SweepResult": "._sweep.result",
    "load_sweep": "._sweep.result",
    "sweep": "._sweep.sweep",
}

# computed: type checkers read the `name as name` imports below instead
__all__ = sorted(_EXPORTS)  # pyright: ignore[reportUnsupportedDunderAll]

if _TYPE_CHECKING:  # the same names, statically, for editors and type checkers (tests/test_exports.py)
    from . import architectures as architectures, figures as figures
    from ._core.errors import (
        DivergenceError as DivergenceError,
        LvflowError as LvflowError,
        NotCommutingError as NotCommutingError,
        NotPSDError as NotPSDError,
        SolverError as SolverError,
        SymmetryError as SymmetryError,
        ZGZError as ZGZError,
    )
    from ._curve.drops import LossDrops as LossDrops, loss_drops as loss_drops
    from ._fit.base import AbstractCurveModel as AbstractCurveModel
    from ._fit.fit import FitResult as FitResult, fit as fit, training_log as training_log
    from ._fit.log import TrainingLog as TrainingLog
    from ._fit.modes import DecoupledModes as DecoupledModes
    from ._fit.power import PowerLawModel as PowerLawModel
    from ._form.compress import (
        Compressed as Compressed,
        compress as compress,
        compression_bound as compression_bound,
    )
    from ._form.drops import MatrixDrops as MatrixDrops, matrix_drops as matrix_drops
    from ._form.expansion import (
        Horizon as Horizon,
        NextOrder as NextOrder,
        next_order as next_order,
        nqf_horizon as nqf_horizon,
        representative_neurons as representative_neurons,
    )
    from ._form.flow import FlowSolution as FlowSolution, matrix_flow as matrix_flow
    from ._form.nqf import NQF as NQF
    from ._form.ntk import NTKRegime as NTKRegime, ntk as ntk, ntk_regime as ntk_regime
    from ._form.recursion import RecursionResult as RecursionResult, gd_recursion as gd_recursion
    from ._form.structure import Expansion as Expansion, expand as expand, structure_matrix as structure_matrix
    from ._glv.closed_forms import (
        XiSolution as XiSolution,
        ignition_time as ignition_time,
        isotropic_modes as isotropic_modes,
        isotropic_riccati as isotropic_riccati,
        log_orthogonal_features as log_orthogonal_features,
        orthogonal_features as orthogonal_features,
        orthogonal_samples as orthogonal_samples,
        projector_modes as projector_modes,
        proportional_samples as proportional_samples,
    )
    from ._glv.equilibrium import saturated_equilibrium as saturated_equilibrium
    from ._glv.interaction import (
        AbstractInteraction as AbstractInteraction,
        DenseInteraction as DenseInteraction,
        DiagonalInteraction as DiagonalInteraction,
        LowRankInteraction as LowRankInteraction,
    )
    from ._glv.lv import (
        AbstractLotkaVolterra as AbstractLotkaVolterra,
        LotkaVolterra as LotkaVolterra,
        LowRankLotkaVolterra as LowRankLotkaVolterra,
    )
    from ._glv.reduce import (
        ProjectorForm as ProjectorForm,
        reduce_to_lv as reduce_to_lv,
        reduce_to_projectors as reduce_to_projectors,
    )
    from ._glv.rodas5p import Rodas5P as Rodas5P, Rodas5PInterpolation as Rodas5PInterpolation
    from ._glv.solution import LVSolution as LVSolution
    from ._glv.solve import ClosedForm as ClosedForm, solve_lv as solve_lv
    from ._glv.switch_on import SwitchOnState as SwitchOnState, SwitchOnTracker as SwitchOnTracker
    from ._glv.term import LogLotkaVolterraTerm as LogLotkaVolterraTerm
    from ._schedule.base import AbstractPlateauSchedule as AbstractPlateauSchedule
    from ._schedule.nqf_schedule import NQFPlateauSchedule as NQFPlateauSchedule
    from ._schedule.scaling import (
        PowerLawFit as PowerLawFit,
        SpectrumExponents as SpectrumExponents,
        StepResolution as StepResolution,
        effective_exponent as effective_exponent,
        effective_exponent_time as effective_exponent_time,
        fit_power_law as fit_power_law,
        predicted_exponent as predicted_exponent,
        resolved_steps as resolved_steps,
        spectrum_exponents as spectrum_exponents,
    )
    from ._schedule.schedule import PlateauSchedule as PlateauSchedule, plateau_schedule as plateau_schedule
    from ._sweep.result import SweepResult as SweepResult, load_sweep as load_sweep
    from ._sweep.sweep import sweep as sweep
    from ._training.agreement import (
        Agreement as Agreement,
        compare_histories as compare_histories,
        recovered_singular_values as recovered_singular_values,
    )
    from ._training.data import (
        AbstractDataset as AbstractDataset,
        Dataset as Dataset,
        LowRankTeacher as LowRankTeacher,
        TeacherStream as TeacherStream,
        digits_parity as digits_parity,
        fourier_task as fourier_task,
        gaussian_inputs as gaussian_inputs,
        low_rank_teacher as low_rank_teacher,
        teacher_student_stream as teacher_student_stream,
    )
    from ._training.deep import (
        AbstractChain as AbstractChain,
        AbstractDeepModel as AbstractDeepModel,
        DeepAttention as DeepAttention,
        DeepMLP as DeepMLP,
        DeepNQF as DeepNQF,
    )
    from ._training.train import (
        TrainHistory as TrainHistory,
        minibatch_indices as minibatch_indices,
        mse_loss as mse_loss,
        train as train,
    )
    from ._training.twin import NQFModel as NQFModel, nqf_twin as nqf_twin
    from ._workflow.eps_merge import eps_merge as eps_merge
    from ._workflow.predict import Prediction as Prediction, predict as predict
    from ._workflow.predict_data import nqf_from_data as nqf_from_data
    from ._workflow.predict_horizon import PredictionHorizon as PredictionHorizon
    from ._workflow.predict_inputs import power_law_lv as power_law_lv


def __getattr__(name: str):
    try:
        module = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'lvflow' has no attribute {name!r}") from None
    try:
        mod = _importlib.import_module(module, __name__)
    except Exception as e:
        missing = _dependency_error(e)
        if missing is None:
            raise
        raise missing from e
    value = mod if module == "." + name else getattr(mod, name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def _dependency_error(error: BaseException) -> ImportError | None:
    """The one-line `ImportError` for a dependency of lvflow that is missing or fails to import,
    naming the package, or `None` when `error` was raised by lvflow itself."""
    package = getattr(error, "name", None) if isinstance(error, ImportError) else None
    tb = error.__traceback__ if package is None else None
    while tb is not None:  # a package that fails to import: the innermost frame outside lvflow raised
        top = str(tb.tb_frame.f_globals.get("__name__", "")).split(".")[0]
        if top not in ("lvflow", "importlib", "__main__", ""):
            package = top
        tb = tb.tb_next
    if not package or package.split(".")[0] == "lvflow":
        return None
    package = package.split(".")[0]
    detail = " ".join(str(error).split()) or type(error).__name__
    return ImportError(
        f"lvflow needs the package {package!r}, which is not installed or fails to import ({detail}); "
        "`pip install -e .` in lvflow's checkout installs its dependencies",
        name=package,
    )


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
