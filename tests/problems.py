"""Test problems shared across test files (float64)."""
import numpy as np
import torch

import torchgeo_int as tgi
from experiments.problems import kepler_energy, kepler_initial  # noqa: F401 (re-exported)


def kepler(separable=True, analytic=False):
    """H = |p|²/2 − 1/|q| as a SeparableHamiltonian (explicit paths) or a generic Hamiltonian."""
    if not separable:
        grad = (lambda q, p: (q / q.norm(dim=-1, keepdim=True) ** 3, p)) if analytic else None
        return tgi.Hamiltonian(kepler_energy, grad=grad)
    if analytic:
        return tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: -1.0 / q.norm(dim=-1),
                                        kinetic_grad=lambda p: p,
                                        potential_grad=lambda q: q / q.norm(dim=-1, keepdim=True) ** 3)
    return tgi.SeparableHamiltonian(lambda p: 0.5 * (p * p).sum(-1), lambda q: -1.0 / q.norm(dim=-1))


_REF = {}


def kepler_reference(e, T):
    """(q, p) at time T from scipy's DOP853 at rtol = atol = 1e-13."""
    key = (e, T)
    if key not in _REF:
        from scipy.integrate import solve_ivp

        q0, p0 = kepler_initial(e)

        def f(t, y):
            q, p = y[:2], y[2:]
            return np.concatenate([p, -q / np.linalg.norm(q) ** 3])

        sol = solve_ivp(f, (0.0, T), np.concatenate([q0.numpy(), p0.numpy()]), method="DOP853",
                        rtol=1e-13, atol=1e-13)
        y = torch.tensor(sol.y[:, -1])
        _REF[key] = (y[:2], y[2:])
    return _REF[key]


def pendulum_nonseparable():
    """H = |p|²/2 + (1 − cos q)(1 + 0.3|p|²): non-separable (the issue's symplecticity test)."""
    return tgi.Hamiltonian(lambda q, p: 0.5 * (p * p).sum(-1)
                           + (1.0 - torch.cos(q)).sum(-1) * (1.0 + 0.3 * (p * p).sum(-1)))


def outer_solar_system():
    """HLW I.2.3: (system, q0, p0) with q, p of shape (6, 3) in AU, solar masses and days."""
    from experiments.problems import outer_solar_system as load

    system, q0, p0, _ = load()
    return system, q0, p0
