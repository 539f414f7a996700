r"""Structure-preserving steps as layers: (q₀, p₀) ↦ Φ_h(q₀, p₀) and whole trajectories.

Thin ``nn.Module`` wrappers over :func:`torchgeo_int.get_method` and :func:`torchgeo_int.rollout`
(the loop is written once, there).  The Hamiltonian is a registered submodule, so
``layer.parameters()`` are the Hamiltonian's; gradients reach them and the initial state
through every step, implicit steps included (the solver's implicit-function-theorem backward).
With a symplectic method the layer is a symplectic map for every value of the parameters.
"""
from __future__ import annotations

from torch import nn

from .._validate import check_int, check_nonzero
from ..integrators import get_method
from ..rollout import as_system, rollout


class SymplecticStep(nn.Module):
    r"""One step Φ_h of ``method`` for ``hamiltonian``: ``forward(q, p, t=0.0) -> (q₁, p₁)``.

    ``substeps`` splits the step into that many steps of h/substeps (same map as a rollout of
    ``substeps`` steps); the order, symplecticity and symmetry are the method's
    (``self.integrator.order`` …).
    """

    def __init__(self, hamiltonian, method="verlet", h: float = 0.1, *, substeps: int = 1):
        super().__init__()
        self.hamiltonian = as_system(hamiltonian)
        self.integrator = get_method(method)
        self.h = check_nonzero(h, "h", "step size")
        check_int(substeps, "substeps", 1)
        self.substeps = substeps

    def extra_repr(self) -> str:
        return f"method={self.integrator.name!r}, h={self.h}, substeps={self.substeps}"

    def forward(self, q, p, t: float = 0.0):
        qs, ps = rollout(self.hamiltonian, q, p, h=self.h / self.substeps, steps=self.substeps,
                         method=self.integrator, t0=t, save_every=self.substeps)
        return qs[-1], ps[-1]


class SymplecticRollout(nn.Module):
    r"""``steps`` steps of ``method`` from (q₀, p₀): ``forward(q0, p0, t0=0.0) -> (q, p)``, each
    of shape ``(⌈steps / save_every⌉ + 1, *q0.shape)`` (time leads, and the final state is
    always kept, as in :func:`rollout`).

    ``rollout_options`` go to :func:`torchgeo_int.rollout` (``grad=``, ``check_every=``, …).
    """

    def __init__(self, hamiltonian, method="verlet", h: float = 0.1, steps: int = 1,
                 save_every: int = 1, **rollout_options):
        super().__init__()
        self.hamiltonian = as_system(hamiltonian)
        self.integrator = get_method(method)
        self.h = check_nonzero(h, "h", "step size")
        check_int(steps, "steps", 0)
        check_int(save_every, "save_every", 1)
        self.steps, self.save_every = steps, save_every
        self.rollout_options = rollout_options

    def extra_repr(self) -> str:
        return (f"method={self.integrator.name!r}, h={self.h}, steps={self.steps}, "
                f"save_every={self.save_every}")

    def forward(self, q0, p0, t0: float = 0.0):
        return rollout(self.hamiltonian, q0, p0, h=self.h, steps=self.steps,
                       method=self.integrator, t0=t0, save_every=self.save_every,
                       **self.rollout_options)


__all__ = ["SymplecticStep", "SymplecticRollout"]
