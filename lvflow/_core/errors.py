"""Exceptions raised by lvflow. Each names the offending input and the problem."""


class LvflowError(ValueError):
    """Base class: bad input to an lvflow function (a `ValueError`)."""


class ZGZError(LvflowError):
    """A unit violates *zero gradient at zero* (ZGZ, Thm 1): `∇_w unit(0, x) ≠ 0`.

    Typical causes: a bias term, or an activation with `φ(0) ≠ 0`.
    """


class NotCommutingError(LvflowError):
    """The structure matrices `A(x_μ)` share no eigenbasis (Assumption 1 fails); `commutator_norm`
    is the largest `‖[A_μ, A_ν]‖` measured, when known."""

    commutator_norm: float | None = None


class NotPSDError(LvflowError):
    """A matrix that must be positive semi-definite (`M`, or `C` of the gLV) is not."""


class SymmetryError(LvflowError):
    """A module is not invariant under permuting its units, or `A` is not symmetric."""


class SolverError(RuntimeError):
    """An ODE solve failed (step-size collapse, too many steps, or non-finite state)."""


class DivergenceError(SolverError):
    """Gradient descent's iterates overflowed: the learning rate `η` is too large for the loss's
    curvature (GD on a quadratic needs `η λ_max < 2`). `step`: the first step seen overflowed."""

    def __init__(self, message: str, step: int | None = None):
        super().__init__(message)
        self.step = step
