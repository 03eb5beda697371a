"""lvflow: neural quadratic forms, Lotka–Volterra learning dynamics, plateaus and scaling laws.

Importing lvflow switches JAX to float64 (`jax_enable_x64`): the theory lives at initial
scales down to ε = 1e-300, far below float32. Set `LVFLOW_KEEP_X64=1` in the environment to
leave JAX's setting untouched.
"""

import os as _os

import jax as _jax

if not _os.environ.get("LVFLOW_KEEP_X64"):
    _jax.config.update("jax_enable_x64", True)

from ._errors import (
    LvflowError as LvflowError,
    NotCommutingError as NotCommutingError,
    NotPSDError as NotPSDError,
    SolverError as SolverError,
    SymmetryError as SymmetryError,
    ZGZError as ZGZError,
)
from ._lv import LotkaVolterra as LotkaVolterra
from ._nqf import NQF as NQF
from ._structure import Expansion as Expansion, expand as expand, structure_matrix as structure_matrix

__version__ = "0.1.0"

# Re-exports added per module below (one line each).
from ._scaling import PowerLawFit as PowerLawFit
from ._scaling import SpectrumExponents as SpectrumExponents
from ._scaling import StepResolution as StepResolution
from ._scaling import predicted_exponent as predicted_exponent
from ._scaling import spectrum_exponents as spectrum_exponents
from ._scaling import effective_exponent as effective_exponent
from ._scaling import effective_exponent_time as effective_exponent_time
from ._scaling import fit_power_law as fit_power_law
from ._scaling import resolved_steps as resolved_steps
from ._flow import FlowSolution as FlowSolution, matrix_flow as matrix_flow
from ._recursion import RecursionResult as RecursionResult, gd_recursion as gd_recursion
from ._compress import Compressed as Compressed, compress as compress
from . import architectures as architectures
from ._predict import Prediction as Prediction, predict as predict
from ._solve import LVSolution as LVSolution, solve_lv as solve_lv
from ._closed_forms import XiSolution as XiSolution, ignition_time as ignition_time, isotropic_modes as isotropic_modes, isotropic_riccati as isotropic_riccati, log_orthogonal_features as log_orthogonal_features, orthogonal_features as orthogonal_features, orthogonal_samples as orthogonal_samples, projector_modes as projector_modes, proportional_samples as proportional_samples
from ._schedule import LowRankLotkaVolterra as LowRankLotkaVolterra, PlateauSchedule as PlateauSchedule, plateau_schedule as plateau_schedule
from ._reduce import ProjectorForm as ProjectorForm, reduce_to_lv as reduce_to_lv, reduce_to_projectors as reduce_to_projectors
from ._train import TrainHistory as TrainHistory, train as train, minibatch_indices as minibatch_indices, mse_loss as mse_loss
from ._data import Dataset as Dataset, LowRankTeacher as LowRankTeacher, TeacherStream as TeacherStream, low_rank_teacher as low_rank_teacher, gaussian_inputs as gaussian_inputs, teacher_student_stream as teacher_student_stream, fourier_task as fourier_task, digits_parity as digits_parity
from ._twin import NQFModel as NQFModel, nqf_twin as nqf_twin
from ._deep import DeepMLP as DeepMLP, DeepAttention as DeepAttention, DeepNQF as DeepNQF
from ._agreement import Agreement as Agreement, compare_histories as compare_histories, recovered_singular_values as recovered_singular_values
