r"""Dissipative and controlled (port-Hamiltonian) models trained through the forced integrators.

:class:`PortHamiltonianNN` is a :class:`~torchgeo_int.ForcedSystem` whose parts are learned:

    q̇ = ∂H_θ/∂p,    ṗ = −∂H_θ/∂q − C_θ(q) ∂H_θ/∂p + G_θ(q) u(t),

H_θ a learned Hamiltonian (``MechanicalHNN``, ``SeparableHNN`` or ``HNN``), C_θ = L Lᵀ positive
semidefinite by construction (a constant or an MLP of q: the Rayleigh dissipation
R_θ = ½ vᵀC_θv ≥ 0, so dH_θ/dt = −vᵀC_θv + vᵀG_θu), G_θ(q) an MLP input map for k controls.
Since it is a System, every integrator of the library steps it with the force in eq. (20)'s
tangent (the forced cotangent-lift step, ``torchgeo_int.forced``).

Losses (windows ``(N, L, n)`` as in :mod:`torchgeo_int.nn.losses`; ``control``: None, a tensor
(N, k) held over each window, or a callable u(t) → (N, k) with t measured from each window's
start; the losses set ``model.control`` to it and leave it set, for the implicit steps'
backward; a control they refuse, or their own stacked values, never stays on the model):

* :func:`forced_rollout_loss`   k steps of any integrator of the forced model against the data,
* :func:`forced_residual_loss`  the forced eq. (20) residual of every observed pair (no solve),
* :func:`forced_derivative_loss` derivative matching against given targets (e.g. finite
  differences): the dissipative-HNN baseline.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from ..forced import ForcedSystem
from ..maps import DiscretizationMap
from ..rollout import rollout
from .losses import check_data, check_layout, map_pairs
from .._validate import check_int, check_nonzero, check_placement, check_real
from .modules import HNN, MLP, MechanicalHNN, SeparableHNN, TrilFill

Tensor = torch.Tensor

__all__ = ["PSDMatrix", "StateDamping", "InputMap", "PortHamiltonianNN", "forced_rollout_loss",
           "forced_residual_loss", "forced_derivative_loss"]


def _sqrt_init(init) -> float:
    """√init of a damping C = LLᵀ that starts at init·I: init > 0, since at L = 0 the gradient
    of C = LLᵀ in L vanishes and the damping would never learn (and √ of a negative is complex)."""
    return check_real(init, "damping_init", 0.0, lo_open=True) ** 0.5


class PSDMatrix(nn.Module):
    """A constant learned C = L Lᵀ (n × n, positive semidefinite for every θ), returned as
    ``(..., n, n)`` for points q ``(..., n)``.  ``init``: the initial C = init·I."""

    def __init__(self, dim: int, *, init: float = 0.1):
        super().__init__()
        check_int(dim, "dim", 1)
        self.dim = dim
        self.tril = TrilFill(dim)
        self.values = nn.Parameter(self.tril.diagonal_values(_sqrt_init(init)))

    def forward(self, q):
        L = self.tril(self.values)
        return (L @ L.mT).expand(*q.shape[:-1], self.dim, self.dim)


class StateDamping(nn.Module):
    """C_θ(q) = L_θ(q) L_θ(q)ᵀ, L_θ lower triangular from an MLP of q: positive semidefinite for
    every θ and q.  Starts at C ≡ init·I (zero output layer)."""

    def __init__(self, dim: int, *, width: int = 64, depth: int = 2, init: float = 0.1):
        super().__init__()
        check_int(dim, "dim", 1)
        self.dim = dim
        self.tril = TrilFill(dim)
        self.net = MLP(dim, self.tril.size, width=width, depth=depth)
        nn.init.zeros_(self.net[-1].weight)
        self.bias = nn.Parameter(self.tril.diagonal_values(_sqrt_init(init)))

    def forward(self, q):
        L = self.tril(self.net(q) + self.bias)
        return L @ L.mT


class InputMap(nn.Module):
    """G_θ(q) (..., n, k): an MLP of q (``state=True``) or a constant matrix."""

    def __init__(self, dim: int, n_controls: int, *, state: bool = True, width: int = 64,
                 depth: int = 2):
        super().__init__()
        check_int(dim, "dim", 1)
        check_int(n_controls, "n_controls", 1)
        self.dim, self.k = dim, n_controls
        if state:
            self.net = MLP(dim, dim * n_controls, width=width, depth=depth)
            self.const = None
        else:
            self.net = None
            self.const = nn.Parameter(torch.zeros(dim, n_controls, dtype=torch.get_default_dtype()))

    def forward(self, q):
        if self.net is None:
            return self.const.expand(*q.shape[:-1], self.dim, self.k)
        return self.net(q).unflatten(-1, (self.dim, self.k))


_HAMILTONIANS = {"mechanical": lambda d, o: MechanicalHNN(d, constant_mass=True, **o),
                 "mechanical_q": lambda d, o: MechanicalHNN(d, **o),
                 "separable": lambda d, o: SeparableHNN(d, **o), "hnn": lambda d, o: HNN(d, **o)}


class PortHamiltonianNN(ForcedSystem):
    r"""ṗ = −∂H_θ/∂q − C_θ ∂H_θ/∂p + G_θ(q) u, q̇ = ∂H_θ/∂p (module docstring).

    ``hamiltonian``: ``"mechanical"`` (½pᵀM⁻¹p + V_θ(q), constant learned M: separable),
    ``"mechanical_q"`` (M_θ(q)), ``"separable"`` (T_θ(p) + V_θ(q)), ``"hnn"`` (MLP of (q, p)),
    or a Hamiltonian module.  ``damping``: ``"constant"`` (:class:`PSDMatrix`), ``"state"``
    (:class:`StateDamping`) or None (conservative).  ``n_controls`` k ≥ 1 adds the input map
    G_θ (``input_map="state"`` an MLP of q, ``"constant"`` a matrix); set the control with
    ``model.control = u`` (the losses set it and leave it set).
    """

    def __init__(self, dim: int, *, n_controls: int = 0, hamiltonian="mechanical",
                 damping: str | None = "constant", input_map: str = "state", width: int = 64,
                 depth: int = 2, damping_init: float = 0.1):
        check_int(dim, "dim", 1)
        check_int(n_controls, "n_controls", 0)
        opts = dict(width=width, depth=depth)
        if isinstance(hamiltonian, str):
            if hamiltonian not in _HAMILTONIANS:
                raise ValueError(f"hamiltonian must be one of {sorted(_HAMILTONIANS)} or a module, "
                                 f"got {hamiltonian!r}")
            H = _HAMILTONIANS[hamiltonian](dim, opts)
        else:
            H = hamiltonian
        if damping not in ("constant", "state", None):
            raise ValueError(f"damping must be 'constant', 'state' or None, got {damping!r}")
        if input_map not in ("state", "constant"):
            raise ValueError(f"input_map must be 'state' or 'constant', got {input_map!r}")
        C = None if damping is None else (PSDMatrix(dim, init=damping_init) if damping == "constant"
                                          else StateDamping(dim, init=damping_init, **opts))
        G = InputMap(dim, n_controls, state=input_map == "state", **opts) if n_controls else None
        super().__init__(H, damping=C, input_map=G, velocity_dependent=False)
        self.dim, self.n_controls = dim, n_controls

    def dissipation(self, q: Tensor, p: Tensor) -> Tensor:
        """vᵀC_θ(q)v ≥ 0, v = ∂H_θ/∂p: the rate at which the damping removes energy."""
        v = self.system.vector_field(q, p)[0]
        if self._damping_fn is None:
            return torch.zeros_like(v[..., 0])
        return (v * (self._damping_fn(q) @ v.unsqueeze(-1)).squeeze(-1)).sum(-1)


@contextlib.contextmanager
def _control_set(model, control, leave=None):
    """``model.control = control`` for the block, then ``leave`` (the control as the caller
    passed it, or the model's own u(t)), which stays set: the implicit steps' backward passes
    evaluate the field again after the loss returns, and must see the same control.  If the
    block raises (a control of the wrong shape refused), the model's control before the call
    is put back: a refused or internal (stacked) control never stays on the model."""
    if control is None:
        yield
        return
    if not isinstance(model, ForcedSystem):
        raise TypeError(f"a control needs a ForcedSystem model, got {type(model).__name__}")
    before = getattr(model, "control", None)
    model.control = control
    try:
        yield
    except BaseException:
        model.control = before
        raise
    model.control = control if leave is None else leave


def forced_rollout_loss(model, q: Tensor, p: Tensor, *, dt: float, control=None, method="verlet",
                        substeps: int = 1, layout: str | None = None, **rollout_options) -> Tensor:
    r"""(1 / 2knN) Σ |Φ^{∘j}(x₀) − x_j|² over windows ``(N, k + 1, n)`` (½ the mean over every
    coordinate, as :func:`~torchgeo_int.nn.rollout_loss`), Φ = ``substeps`` steps of ``method``
    on the forced model with step dt/substeps, from t = 0 at each window's start.
    ``control``: u, set as ``model.control`` and left set (as in every forced loss); None keeps
    the control the model already has (a model with an input map and no control is refused).
    ``layout``: as :func:`~torchgeo_int.nn.rollout_loss`'s (time-first data are refused)."""
    dt = check_nonzero(dt, "dt")
    q, p = check_layout(q, p, layout, "forced_rollout_loss")
    check_data(q, p, names=("q", "p"), ndim=3, min_len=2)
    check_placement(model, q, "q")
    check_int(substeps, "substeps", 1)
    k = q.shape[1] - 1
    with _control_set(model, control):
        qs, ps = rollout(model, q[:, 0], p[:, 0], h=dt / substeps, steps=k * substeps,
                         method=method, save_every=substeps, **rollout_options)
    eq = qs[1:] - q[:, 1:].transpose(0, 1)
    ep = ps[1:] - p[:, 1:].transpose(0, 1)
    return 0.5 * ((eq * eq).mean() + (ep * ep).mean())


def _own_control(model, control):
    """With control None, the model's own control when it is a callable u(t), else None.  The
    residual and derivative losses evaluate the field at t = 0, so a u(t) left on the model
    would be read as u(0) at every pair; it is stacked at the pairs' times as a passed one is,
    and put back on the model after the field is evaluated (the losses' graphs hold the
    stacked values; nothing steps after they return)."""
    own = getattr(model, "control", None) if control is None else None
    return own if callable(own) else None


def _field_with_control(model, q, p, U, control):
    """The forced field at (q, p), t = 0, with the stacked control U set on the model; then the
    control as passed (or the model's own u(t)) is the model's control."""
    with _control_set(model, U, control):
        return model.vector_field(q, p, 0.0)


def _stacked_control(control, times, like):
    """The control at each time of ``times`` as (N, len(times), k) (None stays None)."""
    if control is None:
        return None
    N, stacked = like.shape[0], []
    for t in times:
        u = control(t) if callable(control) else control
        if not isinstance(u, torch.Tensor):
            raise TypeError(f"the control must be a tensor (k,) or (N, k) (N = {N} windows), or a "
                            f"callable u(t) returning one; got {type(u).__name__}"
                            + (f" from u({t:g})" if callable(control) else ""))
        if u.dim() not in (1, 2) or (u.dim() == 2 and u.shape[0] not in (1, N)) or u.shape[-1] < 1:
            raise ValueError(f"the control must have shape (k,) or (N, k) with N = {N} windows (one "
                             f"per window, held over it), got {tuple(u.shape)}"
                             + (f" from u({t:g})" if callable(control) else ""))
        stacked.append(u.expand(N, u.shape[-1]))
    return torch.stack(stacked, 1)


def forced_residual_loss(model, q: Tensor, p: Tensor, *, dt: float, control=None,
                         R: DiscretizationMap | None = None, layout: str | None = None) -> Tensor:
    r"""The forced eq. (20) residual r_j = tangent − h (X_{H_θ} + F_θ^v)(base) of every observed
    pair, (base, tangent) = (R_d^{T*})⁻¹(x_j, x_{j+1}), mean |r_j|²/h² (units of derivative
    matching).  The force is evaluated at the base time t_j + αh (α of R, ½ otherwise).
    ``layout``: as :func:`~torchgeo_int.nn.residual_loss`'s."""
    q, p = check_layout(q, p, layout, "forced_residual_loss")
    check_placement(model, q, "q")
    dt, R, n, base, tangent = map_pairs(q, p, dt, R)
    own = _own_control(model, control)
    control = control if own is None else own
    a = float(getattr(R, "alpha", 0.5))
    U = _stacked_control(control, [(j + a) * dt for j in range(q.shape[1] - 1)], q)
    dq, dp = _field_with_control(model, base[..., :n], base[..., n:], U, control)
    r = tangent - dt * torch.cat([dq, dp], -1)
    return (r * r).mean() / (dt * dt)


def forced_derivative_loss(model, q: Tensor, p: Tensor, dq: Tensor, dp: Tensor, *,
                           dt: float | None = None, control=None) -> Tensor:
    r"""Derivative matching (1 / 2nP) Σ |(X_{H_θ} + F_θ^v)(x_j) − (dq, dp)_j|² (½ the mean over every
    coordinate, as :func:`~torchgeo_int.nn.derivative_loss`) at the P observed states of
    windows ``(N, L, n)``; a callable control is evaluated at t_j = j·dt (so it needs ``dt``)."""
    check_data(q, p, dq, dp, names=("q", "p", "dq", "dp"), ndim=3)
    check_placement(model, q, "q")
    own = _own_control(model, control)
    control = control if own is None else own
    if callable(control):
        if dt is None:
            raise ValueError("a callable control u(t) is evaluated at the states' times t_j = j·dt: "
                             "pass dt")
        dt = check_nonzero(dt, "dt")
    U = _stacked_control(control, [j * dt if callable(control) else 0.0 for j in range(q.shape[1])], q)
    fq, fp = _field_with_control(model, q, p, U, control)
    eq, ep = fq - dq, fp - dp
    return 0.5 * ((eq * eq).mean() + (ep * ep).mean())
