r"""Modified Hamiltonians of symplectic methods, and the correction of a learned one.

Backward error analysis (Hairer, Lubich & Wanner, *Geometric Numerical Integration*, ch. IX): a
symplectic method Φ_h of order p applied to H is, to all orders in h, the exact time-h flow of a
*modified Hamiltonian*  H̃_h[H] = H + h^p H_p[H] + h^{p+1} H_{p+1}[H] + ….  A model H_θ trained
through Φ_h on data of the true flow learns Φ_h[H_θ] ≈ φ_h[H_true], i.e. H̃_h[H_θ] ≈ H_true:
H_θ ≈ H_true − h^p H_p[H_true] − …, the *inverse* modified Hamiltonian, with the integrator's
error baked in.  The correction (David & Méhats, J. Comput. Phys. 2023) is therefore the
modified Hamiltonian of the model itself, H_θ ↦ H_θ + h^p H_p[H_θ] + … = H̃_h[H_θ], which
recovers H_true to the next order, so the corrected model can be rolled out by another method
or step, or its energy read (:class:`CorrectedHamiltonian`).  On the harmonic oscillator, the
model whose Verlet step at h = 0.3 is the exact rotation has ε_H = 3.1e-3 against the true H;
its correction H_θ + h² H₂[H_θ] 5.0e-5, while H_θ − h² H₂[H_θ] doubles the error (6.1e-3).
:class:`InverseModifiedHamiltonian` goes the other way: the H′ with H̃_h[H′] = H, what a model
trained through Φ_h on the flow of H converges to.

With {F, G} = F_q·G_p − F_p·G_q, f = X_H = (H_p, −H_q), K = H_pp(H_q, H_q) + H_qq(H_p, H_p) +
4 Σ_ij ∂²H/∂q_i∂p_j H_{p_i} H_{q_j}, the series implemented here (HLW IX.1–IX.4, derived for
this library's conventions; the tests check each against the exact modified Hamiltonian of the
harmonic oscillator and by conservation along the method's own trajectories):

* ``symplectic_euler`` (H at (q_k, p_{k+1}))   H̃ = H − (h/2) H_p·H_q + (h²/12) K + O(h³)
* ``symplectic_euler_adjoint``               H̃ = H + (h/2) H_p·H_q + (h²/12) K + O(h³)
* ``verlet`` (= symplectic Euler ∘ its adjoint at h/2; kick–drift–kick for H = T + V)
                                            H̃ = H + h² (K/48 − {H, H_p·H_q}/16) + O(h⁴)
  (for H = T(p) + V(q): H + h² (V''(T', T')/12 − T''(V', V')/24))
* ``implicit_midpoint``                      H̃ = H − (h²/24) H''(f, f) + O(h⁴)

The inverse series (:class:`InverseModifiedHamiltonian`) is solved by fixed-point iteration,
H⁽⁰⁾ = H, H⁽ᵏ⁺¹⁾ = H − Δ_h[H⁽ᵏ⁾] with Δ_h[F] = (the truncated series of F) − F; each iteration
gains h^p, and the default number of iterations reaches the truncation order (one for verlet
and midpoint: H + O(h⁴); two for symplectic Euler: H + O(h³)).  Every term is computed with
autograd (gradients, Hessian–vector products) and keeps the graph, so a corrected H has an
autograd field X_H like any model.
Higher-order compositions (yoshida4, …) have an O(h⁴) leading term not implemented here: asking
for their correction is an error.
"""
from __future__ import annotations

import math

import torch

from .._autograd import grad_inputs
from .._validate import check_nonzero
from ..constraints import ConstrainedSystem
from ..forced import ForcedSystem
from ..integrators import Integrator
from ..rollout import as_system
from ..systems import Hamiltonian, SeparableHamiltonian, System

Tensor = torch.Tensor

#: method → (order p of the leading term, order of the truncation error: the first term not
#: implemented; a symmetric method's series has even powers of h only)
SERIES = {"symplectic_euler": (1, 3), "symplectic_euler_adjoint": (1, 3), "verlet": (2, 4),
          "implicit_midpoint": (2, 4)}


def _method_name(method) -> str:
    name = method.name if isinstance(method, Integrator) else method
    if not isinstance(name, str) or name not in SERIES:
        raise ValueError(f"no modified-Hamiltonian series for method {name!r}: it is implemented for "
                         f"{', '.join(SERIES)} (a higher-order method's leading term is O(h⁴) or "
                         "smaller; train through one of these to correct the model)")
    return name


def _grad(outputs, inputs, grad_outputs=None):
    """torch.autograd.grad with the graph kept, where an output that does not require grad (a
    constant derivative: H_q of uniform gravity, H_pp of p²/2) or an input it does not reach
    contributes zeros: the series of a free particle is exact, not an error."""
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    if grad_outputs is None:
        grad_outputs = tuple(torch.ones_like(o) for o in outputs)
    pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if o.requires_grad]
    if not pairs:
        return tuple(torch.zeros_like(x) for x in inputs)
    got = torch.autograd.grad([o for o, _ in pairs], inputs, grad_outputs=[g for _, g in pairs],
                              create_graph=True, allow_unused=True)
    return tuple(torch.zeros_like(x) if g is None else g for x, g in zip(inputs, got))


def _derivatives(H, q, p):
    """H, ∇H = (H_q, H_p) with the graph kept (so everything built on them is differentiable)."""
    with torch.enable_grad():
        q, p = grad_inputs((q, p), True)
        E = H(q, p)
        Hq, Hp = _grad(E.sum(), (q, p))
    return q, p, E, Hq, Hp


def _hvp(Hq, Hp, q, p, vq, vp):
    """H''·v for v = (vq, vp): the (q, p) parts of ∇(∇H·v) with v held fixed; differentiable in v
    too (autograd treats grad_outputs as inputs of the double-backward graph)."""
    return _grad((Hq, Hp), (q, p), (vq, vp))


def _K(Hq, Hp, q, p):
    """H_pp(H_q, H_q) + H_qq(H_p, H_p) + 4 Σ H_{q_i p_j} H_{p_i} H_{q_j}."""
    aq, ap = _hvp(Hq, Hp, q, p, torch.zeros_like(Hq), Hq)     # (H_qp H_q, H_pp H_q)
    bq, _ = _hvp(Hq, Hp, q, p, Hp, torch.zeros_like(Hp))      # (H_qq H_p, ·)
    dot = lambda a, b: (a * b).sum(-1)                         # noqa: E731
    return dot(ap, Hq) + dot(bq, Hp) + 4 * dot(aq, Hp)


def _verlet_separable(T, V, q, p, h):
    """Verlet's h² term for H = T(p) + V(q): h² (V''(T', T')/12 − T''(V', V')/24), two
    Hessian–vector products of one network each (what the general formula reduces to)."""
    with torch.enable_grad():
        q, p = grad_inputs((q, p), True)
        dV, = _grad(V(q).sum(), (q,))
        dT, = _grad(T(p).sum(), (p,))
        VT, = _grad(dV, (q,), (dT,))
        TV, = _grad(dT, (p,), (dV,))
    return h * h * ((VT * dT).sum(-1) / 12 - (TV * dV).sum(-1) / 24)


def _split(H):
    """(T, V) of an autonomous SeparableHamiltonian, else None."""
    if isinstance(H, SeparableHamiltonian) and not H.time_dependent:
        return H.kinetic, H.potential
    return None


def series_terms(H, q: Tensor, p: Tensor, method, h: float) -> Tensor:
    r"""Δ_h[H](q, p) = H̃_h − H, the implemented terms of the modified-Hamiltonian series of
    ``method`` at step ``h`` (see the module docstring), shape ``q.shape[:-1]``.  ``H`` is a
    callable H(q, p) (a model, a System's ``energy``); for verlet on an autonomous
    :class:`~torchgeo_int.SeparableHamiltonian` (a ``SeparableHNN``) the separable form is used."""
    name = _method_name(method)
    if isinstance(H, System) and not isinstance(H, Hamiltonian):
        H = H.energy     # a Lagrangian's forward is L(q, v), not its energy H(q, p)
    parts = _split(H) if name == "verlet" else None
    if parts is not None:
        return _verlet_separable(*parts, q, p, h)
    with torch.enable_grad():
        q, p, E, Hq, Hp = _derivatives(H, q, p)
        dot = lambda a, b: (a * b).sum(-1)                     # noqa: E731
        if name in ("symplectic_euler", "symplectic_euler_adjoint"):
            sign = -1.0 if name == "symplectic_euler" else 1.0
            return sign * (h / 2) * dot(Hp, Hq) + (h * h / 12) * _K(Hq, Hp, q, p)
        if name == "verlet":
            G = dot(Hp, Hq)
            Gq, Gp = _grad(G.sum(), (q, p))
            bracket = dot(Hq, Gp) - dot(Hp, Gq)                # {H, H_p·H_q}
            return h * h * (_K(Hq, Hp, q, p) / 48 - bracket / 16)
        # implicit midpoint: −(h²/24) H''(f, f), f = (H_p, −H_q)
        fq, fp = Hp, -Hq
        gq, gp = _hvp(Hq, Hp, q, p, fq, fp)
        return -(h * h / 24) * (dot(gq, fq) + dot(gp, fp))


def _energy(H):
    system = as_system(H)
    if isinstance(system, (ForcedSystem, ConstrainedSystem)):
        # the series are those of the methods on a Hamiltonian flow; forced, damped or
        # constrained steps have other modified equations (and no forward H(q, p) to expand)
        hint = "; pass its Hamiltonian, model.system" if isinstance(system, ForcedSystem) else ""
        raise TypeError(f"the modified-Hamiltonian series are for Hamiltonian flows, not a "
                        f"{type(system).__name__} (forces, damping, controls or constraints change "
                        f"the modified equations){hint}")
    if getattr(system, "time_dependent", False):
        raise NotImplementedError("the modified-Hamiltonian series here are for autonomous H(q, p)")
    if not hasattr(system, "energy"):
        raise TypeError(f"{type(system).__name__} has no energy: a Hamiltonian is needed")
    return system, (lambda q, p: system.energy(q, p))


def _check_h(h):
    return check_nonzero(h, "h", "step size")     # as rollout's h (a 0-d tensor included)


class ModifiedHamiltonian(Hamiltonian):
    r"""H̃_h = H + Δ_h[H]: the truncated modified Hamiltonian of ``method`` at step ``h`` for a
    Hamiltonian ``H`` (a System or a callable H(q, p)); a :class:`~torchgeo_int.Hamiltonian`, so it
    can be rolled out, and its ``energy`` is (nearly) conserved by ``method`` at step ``h``:
    to O(h^r) over bounded times, r the truncation order (``SERIES[method][1]``)."""

    def __init__(self, H, method, h: float):
        super().__init__(None, time_dependent=False)
        self.method, self.h = _method_name(method), _check_h(h)
        self.base, self._E = _energy(H)

    def hamiltonian(self, q, p, t=0.0):
        return self._E(q, p) + series_terms(self.base, q, p, self.method, self.h)


class CorrectedHamiltonian(ModifiedHamiltonian):
    r"""The correction of a Hamiltonian ``model`` learned through ``method`` at step ``h``
    (David & Méhats 2023): H_θ + Δ_h[H_θ] = H̃_h[H_θ], the Hamiltonian whose exact flow the
    model's steps Φ_h[H_θ] follow, which the training matched to the data's flow; it recovers
    H_true to O(h^r), r = ``SERIES[method][1]`` (module docstring).  For verlet / implicit
    midpoint: H_θ + h² H₂[H_θ].  Roll it out with any method or step (dopri5 at tight tolerance
    reads off its flow), or evaluate its energy.  Parameters stay the model's: gradients reach
    them (each term adds two orders of autograd, so prefer it for evaluation)."""

    @property
    def model(self):
        """The corrected model (the series' ``base``)."""
        return self.base


class InverseModifiedHamiltonian(Hamiltonian):
    r"""The H′ with H̃_h[H′] = ``H`` to the order of the implemented series: what a model trained
    through ``method`` at step ``h`` on the exact flow of ``H`` converges to (module docstring),
    H′ = H − h^p H_p[H] + …, by ``iterations`` fixed-point steps H⁽ᵏ⁺¹⁾ = H − Δ_h[H⁽ᵏ⁾]
    (default: enough to reach the truncation order; one for verlet / implicit midpoint,
    where H⁽¹⁾ = H − h² H₂[H]).  :class:`CorrectedHamiltonian` of it recovers ``H``."""

    def __init__(self, H, method, h: float, *, iterations: int | None = None):
        super().__init__(None, time_dependent=False)
        self.method, self.h = _method_name(method), _check_h(h)
        self.base, self._E = _energy(H)
        p, rest = SERIES[self.method]
        need = math.ceil(rest / p) - 1
        if iterations is None:
            iterations = need
        if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
            raise ValueError(f"iterations must be an int >= 1, got {iterations!r}")
        self.iterations = iterations

    def hamiltonian(self, q, p, t=0.0):
        E = self._E
        F = self.base             # the first iteration sees H itself (separable forms)
        for _ in range(self.iterations):
            F = (lambda prev: (lambda q_, p_: E(q_, p_) - series_terms(prev, q_, p_, self.method, self.h)))(F)
        return F(q, p)


def modified_hamiltonian(H, method, h: float) -> ModifiedHamiltonian:
    """:class:`ModifiedHamiltonian` (H̃_h of ``method`` for ``H``)."""
    return ModifiedHamiltonian(H, method, h)


def correct_hamiltonian(model, method, h: float) -> CorrectedHamiltonian:
    """:class:`CorrectedHamiltonian` (H̃_h of a ``model`` learned through ``method``: H_true to
    the next order)."""
    return CorrectedHamiltonian(model, method, h)


__all__ = ["ModifiedHamiltonian", "CorrectedHamiltonian", "InverseModifiedHamiltonian",
           "modified_hamiltonian", "correct_hamiltonian", "series_terms", "SERIES"]
