r"""Batched rollouts: the front-end that validates its input and calls :func:`torchgeo_int.solve.solve`.

``rollout(system, q0, p0, h=..., steps=..., method=...)`` returns the trajectory
``(q, p)``, each of shape ``(n_saved(steps, save_every), *q0.shape)`` — the states at steps
0, save_every, 2·save_every, ... and always the final state (at step ``steps``: one more frame
when save_every does not divide steps); for a first-order system
(``p0=None``, an eq. (1) integrator) it returns the trajectory of x alone.  Batch dims are free
(the integrators act on every sample at once); there is no per-sample Python loop.
"""
from __future__ import annotations

import torch

from ._loop import n_saved, progress_bar
from ._loop import run_loop  # noqa: F401  (its historical home: tests and experiments import it here)
from ._validate import (check_even_last_dim, check_finite, check_int, check_nonzero,
                        check_own_methods, check_pair, check_placement, check_scalar, check_tensor)
from .integrators import Integrator, get_method
from .solve import grad_mode, solve
from .systems import Hamiltonian, System


def as_system(system) -> System:
    if isinstance(system, System):
        return system
    if isinstance(system, Integrator):   # rollout(METHODS["verlet"], q0, ...): arguments swapped
        raise TypeError(f"system is an integrator ({system.name!r}); the system (a Hamiltonian, "
                        f"an HNN, a callable H(q, p)) goes first and the method in method=...")
    if callable(system):
        return Hamiltonian(system)
    raise TypeError(f"system must be a torchgeo_int System or a callable H(q, p), got {type(system).__name__}")


def rollout(system, q0: torch.Tensor, p0: torch.Tensor | None = None, *, h: float, steps: int,
            method="verlet", t0: float = 0.0, save_every: int = 1, check_every: int = 64,
            grad: str = "backprop", compile: bool = False, progress: bool = False,
            step_control=None, **grad_options):
    r"""Integrate from (q0, p0) at t0 with ``steps`` steps of size ``h`` (negative h integrates
    backwards) and return the states every ``save_every`` steps, the initial one included.

    ``system``: a :class:`System` (Hamiltonian, SeparableHamiltonian, VectorFieldSystem, an HNN) or
    a callable H(q, p).  ``method``: a name in ``METHODS`` or an Integrator.
    Gradients flow to q0, p0 and the system's parameters (through implicit steps by the solver's
    implicit backward).  ``grad`` chooses how: ``"backprop"`` (plain autograd), or a memory-lean
    mode of :mod:`torchgeo_int.gradients` (options in ``grad_options``).  ``compile=True`` runs
    the steps through ``torch.compile`` (:mod:`torchgeo_int._compile`): explicit splittings on
    separable systems as compiled blocks of steps (without autograd) or compiled single steps
    (with it), implicit methods with compiled fused iterations (fixed point) or a compiled
    vector field (Newton, large states); explicit results equal the eager ones to round-off,
    implicit ones to about the solver's tolerance (long rollouts run blocks of steps of a fixed
    iteration count, checked against the tolerance).
    Under grad mode with nothing the steps touch requiring grad (a fixed system rolled out
    without ``torch.no_grad()``) the rollout costs what it costs under ``no_grad``: the states go
    into preallocated outputs, which carry no graph (with ``compile=True``: the no_grad blocks,
    decided from one eager step, :func:`torchgeo_int._compile.needs_graph`).
    ``progress=True`` shows a tqdm bar over the steps (labelled with the method).
    A rollout whose outputs (and, under autograd with ``grad="backprop"``, the states its graph
    keeps) cannot fit in the free memory of the device is refused before the first step with a
    ``MemoryError`` that gives the numbers and the remedies (``save_every``, ``grad="checkpoint"``).
    Non-finite states are detected every ``check_every`` steps (one host sync each) and raise
    ``FloatingPointError`` naming the steps; an implicit step that does not converge raises
    ``ConvergenceError`` naming the step.

    ``step_control=σ`` (a :class:`~torchgeo_int.adaptive.StepControl` or a callable σ(q) /
    σ(q, p) > 0, per sample) takes time-reversible variable steps instead (Hairer–Söderlind
    2005; HLW VIII.3): ``h`` is then the fictive step ε, the physical step of each sample is
    ≈ ε σ(q, p), and the call is :func:`~torchgeo_int.adaptive.adaptive_rollout` (the one
    implementation; its keywords ``until`` (with ``steps=None``), ``max_steps``, ``rho0``,
    ``state_dims``, ``h_min`` and ``form`` pass through).  It returns an
    :class:`~torchgeo_int.adaptive.AdaptiveTrajectory`: ``q, p = rollout(...)`` unpacks the same
    frames as a fixed-step rollout (steps 0, save_every, ..., the final step), ``.t`` holds each
    sample's own times (L, *batch) (samples advance in their own time), ``.at(times)`` the
    states at common times by dense output (cubic Hermite, needs ``save_every=1``).  The method
    must be symmetric; ``grad`` ``"backprop"``, ``"checkpoint"`` and ``"reversible"`` apply
    (see adaptive_rollout); ``compile=True`` and a first-order system are refused (ValueError).
    """
    system = as_system(system)
    if step_control is not None:
        return _variable_steps(system, q0, p0, h=h, steps=steps, method=method, t0=t0,
                               save_every=save_every, check_every=check_every, grad=grad,
                               compile=compile, progress=progress, step_control=step_control,
                               **grad_options)
    stray = sorted(set(grad_options) & set(ADAPTIVE_KEYWORDS))
    if stray:
        raise ValueError(f"{stray} are options of variable steps: they need step_control=σ")
    first_order = p0 is None
    if getattr(system, "first_order", False) and not first_order:
        raise ValueError(f"{type(system).__name__} is a first-order system x' = f(t, x): call "
                         "rollout(system, x0, method=<a first-order method>) without p0")
    try:
        integrator = get_method(method, first_order=first_order)
    except ValueError as err:
        if first_order and isinstance(method, str) and _is_method(method):
            # a Hamiltonian method without p0: "unknown first-order method 'verlet'" misled
            raise ValueError(f"p0 is None (a first-order system) but {method!r} is a Hamiltonian "
                             "method; pass p0 or a first-order method") from None
        raise err
    if first_order:
        check_tensor(q0, "x0")
        check_finite(q0, "x0")
        if not integrator.first_order:
            raise ValueError(f"p0 is None (a first-order system) but {integrator.name!r} is a "
                             "Hamiltonian method; pass p0 or a first-order method")
    elif integrator.check_state is not None:
        integrator.check_state(system, q0, p0)  # e.g. Lie groups: g (..., 3, 3) with μ (..., 3)
    else:
        check_own_methods(system, f"{integrator.name!r}")
        check_pair(q0, p0, ("q0", "p0"))
        check_finite(q0, "q0")
        check_finite(p0, "p0")
        if integrator.first_order:
            raise ValueError(f"{integrator.name!r} integrates first-order systems: call rollout(system, x0)")
    if getattr(getattr(integrator, "state_map", None), "bundle", False):
        # a map on a tangent/cotangent bundle steps points cat([q, v|p], -1): an odd last dim
        # was split into unequal halves, broadcast together (garbage, or a solver's shape error)
        check_even_last_dim(q0, "x0" if first_order else "q0")
    check_placement(system, q0, "x0" if first_order else "q0")
    check_int(steps, "steps", 0)
    check_int(save_every, "save_every", 1)
    check_int(check_every, "check_every", 1)
    h = check_nonzero(h, "h", "step size")
    t0 = check_scalar(t0, "t0", "time")
    for name, flag in (("progress", progress), ("compile", compile)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name} must be a bool, got {flag!r}")
    mode = grad_mode(grad, **grad_options)
    _check_memory(q0, p0, steps, save_every, mode.name)
    bar = progress_bar(steps, f"rollout {integrator.name}") if progress else None
    try:
        out = solve(integrator, system, q0, p0, h=h, steps=steps, t0=t0,
                    save_every=save_every, check_every=check_every, grad=mode, compile=compile,
                    progress=bar)
    finally:
        if bar is not None:
            bar.close()
    return out[0] if first_order else out


#: adaptive_rollout's own keywords that ``rollout(..., step_control=...)`` passes through.
ADAPTIVE_KEYWORDS = ("until", "max_steps", "rho0", "state_dims", "h_min", "form")


def _is_method(name: str) -> bool:
    """Whether ``name`` is a method of (q, p) (any family but the first-order one)."""
    try:
        get_method(name, first_order=False)
    except ValueError:
        return False
    return True


def _variable_steps(system, q0, p0, *, h, steps, method, t0, save_every, check_every, grad,
                    compile, progress, step_control, **options):
    """``rollout(..., step_control=...)``: the combinations that have no meaning for variable
    steps are refused here, the rest is :func:`~torchgeo_int.adaptive.adaptive_rollout`."""
    from .adaptive import adaptive_rollout
    if p0 is None or getattr(system, "first_order", False):
        raise ValueError("step_control needs a Hamiltonian state (q0, p0): reversible variable steps "
                         "run a symmetric method of (q, p), and first-order systems have none")
    if compile:
        raise ValueError("step_control does not support compile=True: the step sizes change every "
                         "step and per sample (the variable-step loop runs eagerly); drop compile")
    # the fixed-step path's check: float(h) took a string, detached an h that requires grad
    # and failed on an h of several elements with torch's "only one element tensors" message
    h = check_nonzero(h, "h (with step_control: the fictive step ε)", "step size")
    adaptive = {k: options.pop(k) for k in ADAPTIVE_KEYWORDS if k in options}
    return adaptive_rollout(system, q0, p0, eps=h, steps=steps, control=step_control,
                            method=method, t0=t0, save_every=save_every, check_every=check_every,
                            grad=grad, progress=progress, **adaptive, **options)


def _free_bytes(device) -> int | None:
    """Free memory of the device (CUDA: the driver's free memory plus what torch caches; CPU:
    MemAvailable of /proc/meminfo), or None when unknown."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None


def _check_memory(q0, p0, steps, save_every, grad):
    """Refuse, before stepping, a rollout whose stored states cannot fit: the saved frames
    (always), and under autograd with grad='backprop' the graph's states — at least one
    state per step (a lower bound: each step keeps its inputs for the backward pass)."""
    state = sum(x.numel() * x.element_size() for x in (q0, p0) if x is not None)
    outputs = n_saved(steps, save_every) * state
    tracked = torch.is_grad_enabled() and grad == "backprop" and any(
        x is not None and x.requires_grad for x in (q0, p0))
    graph = steps * state if tracked else 0
    need = outputs + graph
    if need < 2 ** 30:        # below 1 GiB: not worth a look at the free memory
        return
    free = _free_bytes(q0.device)
    if free is None or need <= free:
        return
    gib = lambda b: f"{b / 2 ** 30:.3g} GiB"   # noqa: E731
    remedies = [f"save fewer frames (save_every={save_every} stores {n_saved(steps, save_every)} "
                f"frames of {gib(state)}; the outputs alone need {gib(outputs)})"]
    if graph:
        remedies.append(f"grad='checkpoint' (keeps ~√steps states instead of the {gib(graph)} "
                        "graph of every step) or grad='reversible' for symmetric methods")
    remedies.append("fewer trajectories or steps per call (chunks: continue from the last state)")
    raise MemoryError(f"this rollout would store at least {gib(need)} on {q0.device} "
                      f"({steps} steps of a state of {gib(state)}{', under autograd' if graph else ''}); "
                      f"{gib(free)} is free. Remedies: " + "; ".join(remedies) + ".")
