r"""Memory-lean exact gradients through long rollouts: ``rollout(..., grad=...)``, and the same
modes in ``odeint(..., options=dict(grad=...))`` and the nn layers/losses (which forward
``grad=`` to ``rollout``).

* ``"backprop"`` (rollout's default): autograd keeps every step's graph, memory O(steps).
* ``"checkpoint"``: the rollout runs in segments of ``segment`` steps (default ⌈√steps⌉) without
  a graph; only segment boundaries are kept and each segment is recomputed, with its graph,
  during backward.  The gradient is the backprop gradient of the same discrete map (each segment
  restarts its FSAL/warm-start cache, so forward and recomputation take identical steps).
  A segment of at least ``save_every`` steps is rounded down to a multiple of it; a shorter
  one (sparse outputs, e.g. only the final state) keeps its own states while it runs and hands
  on the saved frames that fall in it.  Memory O(√steps) graph + the outputs; time ≈ 2× forward.
  Any method, implicit ones included.
* ``"reversible"``: for symmetric methods, Φ_{−h} = Φ_h⁻¹, so the backward pass reconstructs
  x_k = Φ_{−h}(x_{k+1}) from the final state and backpropagates one step at a time (a
  vector–Jacobian product of Φ_h at x_k, through the solver's implicit backward for implicit
  steps): graph memory O(1) in the number of steps (MALI-style, but exact for the discrete map
  up to the error of the reconstruction).  Methods: the explicit kick/drift ones on separable
  systems (verlet and its compositions), where Φ_{−h} is explicit; and the implicit symmetric
  cotangent-lift methods on any Hamiltonian or partitioned field (implicit midpoint and its
  compositions, verlet = generalized leapfrog on a non-separable H, symmetric maps R_d), where
  Φ_{−h} is one more implicit solve, accurate to the solver's tolerance: this is the discrete
  adjoint of the symplectic map with states recomputed backwards instead of checkpointed (the
  symplectic adjoint method of Matsubara et al. 2021 checkpoints them; ``"checkpoint"`` with
  ``segment=1`` has its memory profile).  For an implicit method each backward step is the −h
  solve, the step with its graph and the adjoint solve: a training step took 1.2× backprop's
  time at 1000 steps (``python -m experiments.bench.memory --implicit``).  After
  the backward pass the reconstructed x₀ is compared with the true x₀ and a ``RuntimeWarning``
  is raised when they differ by more than ``reconstruction_tol`` (default 1e3·eps relative to
  max|x₀| + 1, for implicit steps at least steps·τ with τ the solver's tolerance), since the
  gradient is then no better than that reconstruction.  Other
  methods (not symmetric; second-order, Lie-group, variational or first-order steps) raise
  ValueError (use ``"checkpoint"``).

Round-off of the reconstruction, measured (``python -m experiments.bench.memory``, 2026-12-01;
verlet, h = 0.01, a separable tanh-MLP Hamiltonian, |x₀| ~ 1, 64 samples): max|x̂₀ − x₀| after
N steps forward and N back is

    N          100       1000      10⁴       10⁵
    float64    2.4e-16   6.4e-15   3.1e-13   8.0e-11
    float32    4.8e-7    1.9e-6    4.3e-4    —

i.e. it grows faster than linearly in N (the round-off of each step is carried by the
linearised flow, which for a nonlinear orbit amplifies it polynomially, and exponentially for a
chaotic one).  The gradients follow: on the rollout loss of a separable HNN (width 32,
h = 0.05) they equal backprop's to 1e-15 relative in float64 and 6e-7 / 2e-6 in float32 over
200 / 2000 steps (the tests assert 1e-8 in float64 over 200 steps).  In float32 the
reconstruction error reaches the default ``reconstruction_tol`` (≈ 1.2e-4 relative) around 10⁴
steps, where the warning may fire: use float64 or ``"checkpoint"`` for such rollouts.

For implicit midpoint on a non-separable tanh-MLP Hamiltonian (same set-up, default solver
tolerances; ``python -m experiments.bench.memory --implicit``, 2026-12-02) the −h solves
reconstruct x₀ as well:

    N          100       1000      10⁴
    float64    1.3e-15   4.0e-15   1.9e-14
    float32    4.8e-7    1.7e-6    8.9e-6

and the gradients equal backprop's to 1e-15 (200 steps) – 5e-14 (1000 steps) relative in
float64 (tests: 1e-8 at 200 steps, 1e-3 in float32 at 100).

The outputs the user asks for (every ``save_every``-th state) are always stored: O(steps/save_every).
Both lean modes differentiate w.r.t. the state and the system module's parameters (or the tensors
given as ``params=[...]``; in odeint ``options["params"]``); a step that depends on any other
tensor requiring grad is refused with a ValueError (it would silently get no gradient).
"""
from __future__ import annotations

import copy
import math
import numbers
import warnings

import torch

from ._loop import run_loop
from .integrators.base import explicit_splitting
from .solvers import ConvergenceError, default_tol, first_order_only

#: The names ``rollout(..., grad=...)`` and ``odeint``'s ``options["grad"]`` take.
GRAD_MODES = ("backprop", "checkpoint", "reversible")


def not_reversible(integrator, system) -> str | None:
    """Why ``grad="reversible"`` cannot run ``integrator`` on ``system``, or None if it can."""
    if not integrator.symmetric:
        return "it is not symmetric (its −h step does not invert it)"
    if explicit_splitting(integrator, system):
        return None                                   # explicit: Φ_{−h} is explicit
    if all(m.steps_backward for m, _ in integrator.stages()):
        return None                                   # implicit: Φ_{−h} is one more solve
    return "its steps are not cotangent-lift steps of (q, p)"


#: The options of each gradient mode (``rollout(..., grad=mode, **options)``, odeint's options).
MODE_OPTIONS = {"backprop": (), "checkpoint": ("segment", "params"),
                "reversible": ("reconstruction_tol", "params")}


def check_mode_options(grad, options, where="rollout") -> None:
    """Refuse an option that ``grad`` does not take, naming the accepted ones (odeint's wording)."""
    unknown = sorted(set(options) - set(MODE_OPTIONS[grad]))
    if unknown:
        accepted = ", ".join(MODE_OPTIONS[grad]) or "none"
        raise ValueError(f"unknown option(s) {unknown} for grad={grad!r} in {where}; accepted: "
                         f"{accepted} (segment: grad='checkpoint'; reconstruction_tol: "
                         f"grad='reversible'; params: both)")


def check_reconstruction_tol(tol) -> float | None:
    """None, or a finite number >= 0 (a NaN would disable the check silently)."""
    if tol is None:
        return None
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not 0 <= tol < float("inf"):
        raise ValueError(f"reconstruction_tol must be a finite number >= 0, got {tol!r}")
    return float(tol)


class GradMode:
    """How gradients flow through a rollout: a small object that owns its variant of the loop.

    ``run(integrator, step, q0, p0, *, cache=None, return_cache=False, **loop)`` returns what
    :func:`run_loop` returns; ``loop`` is run_loop's ``system, h, steps, t0, save_every,
    check_every, step_offset``.  A new mode is one subclass here (and its name in
    :func:`grad_mode` if it is to be chosen by name)."""

    name = "backprop"
    #: Whether ``compile=True`` may run this mode's steps in blocks (the rollout's plan, see
    #: ``torchgeo_int._compile``).  A lean mode recomputes or inverts steps in its backward
    #: pass one step at a time, which must take the forward's operations: one compiled step
    #: per call.
    compiled_blocks = False

    def run(self, integrator, step, q0, p0, *, cache=None, return_cache=False, **loop):
        raise NotImplementedError

    def with_params(self, step, system, states, t0, h) -> "GradMode":
        """The mode with its parameters resolved once (a driver running several segments)."""
        return self


class Backprop(GradMode):
    """Plain autograd through every step: memory O(steps)."""

    name = "backprop"
    compiled_blocks = True

    def run(self, integrator, step, q0, p0, *, cache=None, return_cache=False, **loop):
        return run_loop(step, q0, p0, cache=cache, return_cache=return_cache, **loop)


class _Lean(GradMode):
    """A memory-lean mode: differentiates w.r.t. the state and ``params`` (default: the system
    module's parameters, resolved by a probe step); each run starts a fresh FSAL cache."""

    option = ""   # the mode's own option (its one keyword besides ``params``)

    def __init__(self, params=None, **option):
        check_mode_options(self.name, {**option, "params": params})
        setattr(self, self.option, option.get(self.option))
        self.params, self.params_checked = params, False

    def with_params(self, step, system, states, t0, h):
        if not torch.is_grad_enabled():
            return self
        out = copy.copy(self)
        out.params = resolve_params(step, system, states, t0, h, self.params)
        out.params_checked = True
        return out

    def run(self, integrator, step, q0, p0, *, cache=None, return_cache=False, **loop):
        res = self._run(integrator, step, q0, p0, params_checked=self.params_checked,
                        params=self.params, **loop)
        return (res, None) if return_cache else res


class Checkpoint(_Lean):
    """Segments of ``segment`` steps (default ⌈√steps⌉) recomputed in backward: O(√steps)."""

    name, option = "checkpoint", "segment"

    def _run(self, integrator, step, q0, p0, *, system, h, steps, t0, save_every, check_every,
             step_offset, params_checked, params, progress=None):
        segment = self.segment
        if segment is None:
            segment = max(1, math.isqrt(max(steps, 1) - 1) + 1)   # ⌈√steps⌉
        if isinstance(segment, bool) or not isinstance(segment, int) or segment < 1:
            raise ValueError(f"segment must be a positive int, got {segment!r}")
        # A segment at least save_every long is rounded down to a multiple of it, so every
        # segment's saved frames line up with the global ones (run_loop saves them itself).  A
        # shorter one (sparse outputs, e.g. only the final state) runs its steps with every state
        # kept and hands on only the global frames that fall in it and its final state: rounding it
        # up to save_every instead would make one segment of the whole rollout (plain backprop).
        aligned = segment >= save_every
        if aligned:
            segment -= segment % save_every
        states = (q0,) if p0 is None else (q0, p0)
        if not torch.is_grad_enabled():
            return run_loop(step, q0, p0, system=system, h=h, steps=steps, t0=t0,
                            save_every=save_every, check_every=check_every, step_offset=step_offset,
                            progress=progress)
        params = (list(params) if params_checked
                  else resolve_params(step, system, states, t0, h, params, step_offset))
        if not any(x.requires_grad for x in (*states, *params)):
            return untracked_run(step, q0, p0, params, system=system, h=h, steps=steps, t0=t0,
                                 save_every=save_every, check_every=check_every,
                                 step_offset=step_offset, progress=progress)
        outs = [[x.unsqueeze(0)] for x in states]
        for done in range(0, steps, segment):
            n = min(segment, steps - done)
            if aligned:
                keep = None
                n_frames = n // save_every
            else:
                # local indices (1..n) of the global frames k·save_every in (done, done + n], then n
                first = (done // save_every + 1) * save_every - done
                frames = list(range(first, n + 1, save_every))
                n_frames = len(frames)
                keep = frames if frames and frames[-1] == n else frames + [n]

            def run(*xs, n=n, done=done, keep=keep):
                traj = run_loop(step, xs[0], xs[1] if len(xs) > 1 else None, system=system, h=h,
                                steps=n, t0=t0 + done * h, save_every=save_every if keep is None else 1,
                                check_every=check_every, step_offset=step_offset + done)
                traj = [x for x in traj if x is not None]
                if keep is None:
                    return tuple(x[1:] for x in traj)
                return tuple(x[keep] for x in traj)

            traj = SegmentFunction.apply(run, len(states), *states, *params)
            if progress is not None:
                progress.update(n)
            last = done + n == steps
            for o, x in zip(outs, traj):
                if n_frames:
                    o.append(x[:n_frames])
                if last and steps % save_every:   # the final state, after the last saved frame
                    o.append(x[-1:])
            if done + n < steps:   # not the last segment: its final state starts the next one
                states = tuple(x[-1] for x in traj)
        result = tuple(torch.cat(o) for o in outs)
        return (result[0], None) if p0 is None else result


class Reversible(_Lean):
    """States reconstructed backwards by Φ_{−h} (symmetric methods): graph memory O(1)."""

    name, option = "reversible", "reconstruction_tol"

    def __init__(self, params=None, **option):
        super().__init__(params, **option)
        self.reconstruction_tol = check_reconstruction_tol(self.reconstruction_tol)

    def _run(self, integrator, step, q0, p0, *, system, h, steps, t0, save_every, check_every,
             step_offset, params_checked, params, progress=None):
        reconstruction_tol = self.reconstruction_tol
        why = "its state has no p" if p0 is None else not_reversible(integrator, system)
        if why:
            raise ValueError(
                f"grad='reversible' needs a symmetric method of (q, p): verlet and its compositions, "
                f"implicit midpoint and its compositions; {integrator.name!r} cannot: {why}. "
                "Use grad='checkpoint' (exact, O(√steps) memory).")
        if reconstruction_tol is None:
            reconstruction_tol = 1e3 * torch.finfo(q0.dtype).eps
            if not explicit_splitting(integrator, system):
                # each −h solve stops within the solver's tolerance τ: allow steps·τ (backprop's
                # implicit gradients are no more accurate than τ either)
                tau = max(m.tol if m.tol is not None else default_tol(q0.dtype)
                          for m, _ in integrator.stages())
                reconstruction_tol = max(reconstruction_tol, steps * tau)
        if not torch.is_grad_enabled():
            params = []
        else:
            params = (list(params) if params_checked
                      else resolve_params(step, system, (q0, p0), t0, h, params, step_offset))
            if not any(x.requires_grad for x in (q0, p0, *params)):
                return untracked_run(step, q0, p0, params, system=system, h=h, steps=steps, t0=t0,
                                     save_every=save_every, check_every=check_every,
                                     step_offset=step_offset, progress=progress)
        spec = (step, system, h, steps, t0, save_every, check_every, reconstruction_tol, step_offset,
                progress)
        return _Reversible.apply(spec, q0, p0, *params)


def untracked_run(step, q0, p0, params, *, system, h, steps, t0, step_offset, **loop):
    """A lean mode's run with nothing to differentiate (no state or parameter requires grad):
    the plain loop without a graph, as the lean forward runs it, then one probe step at its
    final state and time (:func:`resolve_params`'s, which the run's first step had).  A tensor
    requiring grad that the steps read only after the start — a closure entering at some t, a
    force switched on later — is refused there: the lean modes would give it no gradient, and
    with nothing else requiring grad no backward pass runs to find it.  (A tensor read only in
    between is not seen: pass such tensors as ``params``.)"""
    with torch.no_grad():
        res = run_loop(step, q0, p0, system=system, h=h, steps=steps, t0=t0,
                       step_offset=step_offset, **loop)
    if steps:
        # the final state at the last step's start time: the probe reads the field inside
        # [t0, t_end], where the run read it
        last = [x[-1] for x in res[:2] if x is not None]
        resolve_params(step, system, last, t0 + (steps - 1) * h, h, list(params),
                       step_offset + steps - 1)
    return res


_MODES = {"backprop": Backprop, "checkpoint": Checkpoint, "reversible": Reversible}


def grad_mode(grad="backprop", **options) -> GradMode:
    """The mode object of a name in ``GRAD_MODES`` (options: ``segment``, ``params`` for
    checkpoint; ``reconstruction_tol``, ``params`` for reversible), or a GradMode itself."""
    if isinstance(grad, GradMode):
        if options:
            raise TypeError(f"options go to the GradMode's constructor, got {sorted(options)}")
        return grad
    if grad not in GRAD_MODES:
        raise ValueError(f"grad must be one of {GRAD_MODES}, got {grad!r}")
    check_mode_options(grad, options)
    return _MODES[grad](**options)


class SegmentFunction(torch.autograd.Function):
    """A segment of the rollout whose graph is rebuilt in backward (gradient checkpointing).

    Written out instead of ``torch.utils.checkpoint``: the force inside a step is itself an
    ``autograd.grad`` call, and under the non-reentrant checkpoint each such call unpacks saved
    tensors and re-triggers the recomputation (quadratic time and memory)."""

    @staticmethod
    def forward(ctx, run, n_states, *tensors):
        with torch.no_grad():
            traj = run(*tensors[:n_states])
        ctx.run, ctx.n_states = run, n_states
        ctx.save_for_backward(*tensors[:n_states])
        # the parameters are kept as they are, not saved: under saved-tensor hooks (e.g.
        # torch.autograd.graph.save_on_cpu) a saved leaf comes back as another tensor, and the
        # recomputed graph, which reaches the parameters themselves, would give it no gradient
        ctx.params = tensors[n_states:]
        return traj

    @staticmethod
    def backward(ctx, *grads):
        first_order_only("grad='checkpoint'", "grad='backprop'")
        with torch.enable_grad():
            states = [x.detach().requires_grad_() for x in ctx.saved_tensors]
            traj = ctx.run(*states)
            inputs = [*states, *ctx.params]
            check_tracked(traj, inputs)
            out = torch.autograd.grad(traj, inputs, grads, allow_unused=True)
        return (None, None, *out)


def resolve_params(step, system, states, t0, h, params=None, step_offset=0):
    """The tensors the backward pass differentiates besides the state: the system module's
    parameters, or ``params`` (tensors, each once: a repeated one would get its gradient
    twice).  A tensor the step depends on that is in neither would silently get no gradient, so
    one probe step's graph is searched for such leaves."""
    if params is None:
        params = [w for w in system.parameters() if w.requires_grad]
    elif isinstance(params, torch.Tensor) or not hasattr(params, "__iter__"):
        raise TypeError("params must be a list of tensors (e.g. list(module.parameters())), got "
                        f"{type(params).__name__}")
    params = list({id(w): w for w in params}.values())
    for w in params:
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"params must be tensors, got a {type(w).__name__}")
    # those that do not require grad have no gradient to get (torchdiffeq's adjoint_params too)
    params = [w for w in params if w.requires_grad]
    ids = {id(w) for w in params}
    for w in params:   # k = raw.exp() and raw both: raw's gradient would be counted twice
        if w.grad_fn is not None and any(id(x) in ids for x in _untracked_leaves([w], [])):
            raise ValueError("params holds a tensor and a tensor it is computed from; pass one "
                             "of them (the derived one's gradient flows on to its leaves)")
    with torch.enable_grad():
        xs = [x.detach().requires_grad_() for x in states]
        try:
            out = step(system, xs[0], xs[1] if len(xs) > 1 else None, t0, h, None)
        except ConvergenceError as err:   # the probe is the run's first step
            raise err.with_step(step_offset) from None
    check_tracked(out[:2], [*xs, *params])
    return params


def check_tracked(outputs, known):
    """Raise where ``outputs`` depend on a tensor that requires grad and is not in ``known``:
    the lean modes differentiate only the state and the parameters they were given, so such a
    tensor would get no gradient.  :func:`resolve_params` checks one probe step before the run;
    the backward passes check every recomputed segment and step again, since a tensor may enter
    only later (a force switched on at some t, a branch on the state)."""
    if isinstance(outputs, torch.Tensor):
        outputs = (outputs,)
    missing = _untracked_leaves([o for o in outputs if o is not None], known)
    if missing:
        raise ValueError(f"the step depends on {len(missing)} tensor(s) that require grad but are "
                         "not parameters of the system module; pass them as params=[...] "
                         "(odeint: options['params'], like torchdiffeq's adjoint_params) or "
                         "register them in an nn.Module so that they get their gradient")


def _untracked_leaves(outputs, known):
    """Leaf tensors requiring grad that ``outputs`` depend on but that are not in ``known``.
    The walk stops at a known tensor's own node: a derived tensor given as a parameter (k =
    raw.exp()) gets its gradient, which flows on to its leaves."""
    known_ids = {id(x) for x in known}
    stops = {x.grad_fn for x in known if x.grad_fn is not None}
    seen, stack, found = set(), [o.grad_fn for o in outputs if o.grad_fn is not None], []
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen or fn in stops:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)
        if var is not None and id(var) not in known_ids and not getattr(var, "internal", False):
            found.append(var)
        stack.extend(f for f, _ in fn.next_functions)
    return found


class _Reversible(torch.autograd.Function):
    @staticmethod
    def forward(ctx, spec, q0, p0, *params):
        step, system, h, steps, t0, save_every, check_every, tol, step_offset, progress = spec
        with torch.no_grad():
            qs, ps = run_loop(step, q0, p0, system=system, h=h, steps=steps, t0=t0,
                              save_every=save_every, check_every=check_every,
                              step_offset=step_offset, progress=progress)
        ctx.spec = spec
        ctx.save_for_backward(q0, p0, qs[-1], ps[-1])
        ctx.params = params
        return qs, ps

    @staticmethod
    def backward(ctx, gqs, gps):
        first_order_only("grad='reversible'", "grad='backprop'")
        step, system, h, steps, t0, save_every, check_every, tol, _, _ = ctx.spec
        q0, p0, qN, pN = ctx.saved_tensors
        back = None   # the −h steps' own cache (FSAL force, warm start) carries from step to step

        def inverse(k, x):                                          # x_k = Φ_{−h}(x_{k+1})
            nonlocal back
            q, p, back = step(system, *x, t0 + k * h + h, -h, back)
            return [q, p]

        def forward(k, x):
            return step(system, *x, t0 + k * h, h, None)[:2]

        x, (gq, gp), gparams = reverse_sweep(steps, [qN, pN], (gqs, gps), ctx.params, save_every,
                                             inverse, forward)
        check_reconstruction(x, (q0, p0), tol, f"{steps} steps")
        return (None, gq, gp, *gparams)


def reverse_sweep(n, x, gframes, params, save_every, inverse, forward):
    """The backward pass of a reversible run of ``n`` steps, from its final state ``x`` (a list
    of tensors): for k = n − 1 … 0, x_k = ``inverse(k, x_{k+1})`` without a graph, then the
    vector–Jacobian product of ``forward(k, x_k)`` (the step's outputs, like x) with the running
    cotangent; the cotangents of the saved frames (``gframes``: one stacked tensor per state,
    a frame every ``save_every`` steps, the last one the final state) are added where they were
    saved.  Returns the reconstructed x_0, its cotangent and those of ``params``."""
    g = [gf[-1].clone() for gf in gframes]
    gparams = [torch.zeros_like(w) for w in params]
    m = len(x)
    for k in range(n - 1, -1, -1):
        with torch.no_grad():
            x = inverse(k, x)
        with torch.enable_grad():
            xi = [y.detach().requires_grad_() for y in x]
            out = forward(k, xi)
            check_tracked(out, [*xi, *params])
            grads = torch.autograd.grad(out, (*xi, *params), g, allow_unused=True)
        g = [gi if gi is not None else torch.zeros_like(y) for gi, y in zip(grads[:m], x)]
        for i, gw in enumerate(grads[m:]):
            if gw is not None:
                gparams[i] += gw
        if k % save_every == 0:
            g = [gi + gf[k // save_every] for gi, gf in zip(g, gframes)]
    return x, g, gparams


def check_reconstruction(x, x0, tol, what):
    """Warn when the reconstructed initial (q, p) (the first two of ``x``) is off from ``x0`` by
    more than ``tol``, relative to the state's scale; ``what``: the run ("1000 steps")."""
    q0, p0 = x0
    if q0.numel() == 0:   # an empty batch: nothing to reconstruct
        return
    q0, p0 = q0.detach(), p0.detach()
    scale = float(torch.maximum(q0.abs().max(), p0.abs().max())) + 1.0
    err = max(float((a - b).abs().max()) for a, b in zip(x[:2], x0)) / scale
    if err > tol:
        warnings.warn(f"grad='reversible': the backward reconstruction of the initial state is off "
                      f"by {err:.2e} (relative) after {what}, above {tol:.1e}; the gradient is no "
                      "more accurate than that. Use grad='checkpoint' for exact gradients.",
                      RuntimeWarning, stacklevel=3)
