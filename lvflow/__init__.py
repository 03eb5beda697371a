"""lvflow: neural quadratic forms, Lotka–Volterra learning dynamics, plateaus and scaling laws.

Importing lvflow switches JAX to float64 (`jax_enable_x64`): the theory lives at initial
scales down to ε = 1e-300, far below float32. Set `LVFLOW_KEEP_X64=1` in the environment to
leave JAX's setting untouched.
"""

import os as _os

import jax as _jax

if not _os.environ.get("LVFLOW_KEEP_X64"):
    _jax.config.update("jax_enable_x64", True)

from . import architectures as architectures
from ._errors import (
    LvflowError as LvflowError,
    NotCommutingError as NotCommutingError,
    NotPSDError as NotPSDError,
    SolverError as SolverError,
    SymmetryError as SymmetryError,
    ZGZError as ZGZError,
)

# The neural quadratic form (§1) and its dynamics on (M, μ) (§2).
from ._structure import Expansion as Expansion, expand as expand, structure_matrix as structure_matrix
from ._nqf import NQF as NQF
from ._flow import FlowSolution as FlowSolution, matrix_flow as matrix_flow
from ._recursion import RecursionResult as RecursionResult, gd_recursion as gd_recursion
from ._compress import Compressed as Compressed, compress as compress

# The Lotka–Volterra reduction (§3), its solution and the ε → 0 schedule (§4).
from ._lv import LotkaVolterra as LotkaVolterra, LowRankLotkaVolterra as LowRankLotkaVolterra
from ._reduce import (
    ProjectorForm as ProjectorForm,
    reduce_to_lv as reduce_to_lv,
    reduce_to_projectors as reduce_to_projectors,
)
from ._solution import LVSolution as LVSolution
from ._solve import solve_lv as solve_lv
from ._term import LogLotkaVolterraTerm as LogLotkaVolterraTerm
from ._rodas5p import Rodas5P as Rodas5P, Rodas5PInterpolation as Rodas5PInterpolation
from ._switch_on import SwitchOnState as SwitchOnState, SwitchOnTracker as SwitchOnTracker
from ._closed_forms import (
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
from ._schedule import PlateauSchedule as PlateauSchedule, plateau_schedule as plateau_schedule

# Scaling laws (Thm 9–11, App. C).
from ._scaling import (
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

# Real networks beside their NQF twins (§5).
from ._data import (
    Dataset as Dataset,
    LowRankTeacher as LowRankTeacher,
    TeacherStream as TeacherStream,
    digits_parity as digits_parity,
    fourier_task as fourier_task,
    gaussian_inputs as gaussian_inputs,
    low_rank_teacher as low_rank_teacher,
    teacher_student_stream as teacher_student_stream,
)
from ._train import (
    TrainHistory as TrainHistory,
    minibatch_indices as minibatch_indices,
    mse_loss as mse_loss,
    train as train,
)
from ._twin import NQFModel as NQFModel, nqf_twin as nqf_twin
from ._deep import DeepAttention as DeepAttention, DeepMLP as DeepMLP, DeepNQF as DeepNQF
from ._agreement import (
    Agreement as Agreement,
    compare_histories as compare_histories,
    recovered_singular_values as recovered_singular_values,
)

# The user's workflow.
from ._predict import Prediction as Prediction, predict as predict

__version__ = "0.1.0"
