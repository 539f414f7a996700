r"""Systems the integrators step: Hamiltonians on T*Q and partitioned vector fields.

Every system gives the integrators the same small interface, in (q, p) kept apart:

* ``vector_field(q, p, t) -> (dq, dp)``   the full field; X_H = (∂H/∂p, −∂H/∂q) for a Hamiltonian,
* ``velocity(p, t)`` and ``force(q, t)``  its two halves when ``separable`` (dq depends on p only,
  dp on q only): the kick/drift fast paths evaluate only the half they need.
* ``force_term(q, t)`` and ``force_sign``  force = force_sign · force_term, so that a kick
  p + a h F is one fused ``torch.add(p, force_term, alpha=force_sign·a·h)`` (for H = T + V the
  term is ∂V/∂q and the sign −1: no separate negation kernel on the hot path).

Gradients of H come from autograd.  When grad mode is on and something they depend on requires
grad they are taken with ``create_graph`` so a loss on a rollout differentiates through them
(training HNNs); under ``torch.no_grad()``, or when nothing requires grad, no graph is kept.
"""
from __future__ import annotations

import copy
import inspect
import numbers
from typing import Callable

import torch
from torch import nn

from ._autograd import grad_inputs, reaches_other_leaves
from ._validate import timed_call

Tensor = torch.Tensor


#: names of a defaulted parameter that is still taken as the time (``H(q, p, t=0.0)``)
TIME_NAMES = ("t", "time", "tau")


def takes_time(fn: Callable, n_state_args: int, *, defaults_count: bool = False) -> bool:
    """Whether ``fn`` accepts a time argument after its state arguments: a next positional
    parameter without a default, or one named ``t``/``time``/``tau`` (``H(q, p, omega=2.0)``
    is a constant's default, not a time: it was taken as t, and ω became t).
    ``defaults_count``: any next positional parameter counts (an arity test)."""
    try:
        sig = inspect.signature(fn.forward if isinstance(fn, nn.Module) else fn)
    except (TypeError, ValueError):
        return False
    params = list(sig.parameters.values())
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) <= n_state_args:
        return False
    nxt = positional[n_state_args]
    return defaults_count or nxt.default is nxt.empty or nxt.name in TIME_NAMES


def call_signature(fn: Callable) -> inspect.Signature | None:
    """The signature ``fn`` is called with: a module's ``forward`` unless its class defines its
    own ``__call__``; None where there is none to read (a builtin)."""
    own_call = isinstance(fn, nn.Module) and type(fn).__call__ is nn.Module.__call__
    try:
        return inspect.signature(fn.forward if own_call else fn)
    except (TypeError, ValueError):
        return None


def _check_arity(fn: Callable, n: int, form: str) -> None:
    """A field that cannot take n positional arguments is refused when the system is built
    (it failed at the first step, with Python's arity message)."""
    sig = call_signature(fn)
    if sig is None:      # (taken as it is)
        return
    try:
        sig.bind(*range(n))
    except TypeError:
        raise TypeError(f"the field {_fn_name(fn)} must be callable as {form} ({n} positional "
                        f"arguments), got the signature {sig}") from None


def _fn_name(fn) -> str:
    """How the user's function is called in error messages."""
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    return "(a lambda)" if name.endswith("<lambda>") else repr(name)


def _what(label: str, fn=None) -> str:
    return label if fn is None else f"{label} {_fn_name(fn)}"


def _is_user(fn) -> bool:
    """Whether ``fn`` is the user's (its shapes are checked), not one of the package's own
    functions or modules: those are tested, and some (odeint's wrapper of a user's H) see
    reshaped tensors, so their output shapes are checked where the user's shapes are known."""
    module = getattr(fn, "__module__", None) or ""
    return fn is not None and not (module == "torchgeo_int" or module.startswith("torchgeo_int."))


def check_energy(out, batch_of: Tensor, label: str = "the energy function", fn=None) -> Tensor:
    """The output of a user's energy (H, T, V): a real tensor with one value per sample, i.e.
    ``batch_of.shape[:-1]`` (``batch_of``: the input whose last dim holds the coordinates), or
    fewer (an N-body state (..., bodies, 3) has one energy per system).

    Checked on every evaluation: an integer comparison of shapes (no kernel, no host sync),
    nothing next to the autograd call it guards.  Without it, per-coordinate values (shape
    ``(..., n)``) are summed by the gradient into a *different* system, and the rollout runs.
    ``label`` and ``fn`` name the user's function in the message (formatted on error only); the
    shape is checked when ``fn`` is the user's (:func:`_is_user`)."""
    if not isinstance(out, torch.Tensor):
        what = _what(label, fn)
        raise TypeError(f"{what} must return a tensor, got {type(out).__name__}")
    if out.is_complex():
        what = _what(label, fn)
        raise TypeError(f"{what} returned a complex tensor ({out.dtype}): an energy is real; "
                        "for complex states z integrate real coordinates, e.g. "
                        "q = torch.cat([z.real, z.imag], -1)")
    batch = batch_of.shape[:-1]
    # The batch shape, or a prefix of it (leading dims of one system's state, bodies ×
    # coordinates, summed into its energy).  Values per coordinate are summed by the gradient
    # into another system; a trailing singleton (keepdim) broadcasts T + V to (B, B).
    if _is_user(fn) and tuple(out.shape) != tuple(batch[:out.dim()]):
        what = _what(label, fn)
        raise ValueError(f"{what} returned shape {tuple(out.shape)} for an input of shape "
                         f"{tuple(batch_of.shape)}: it must return one value per sample, shape "
                         f"{tuple(batch)} (or a total over leading dims), not one per coordinate: "
                         "sum over the last dim, e.g. (p * p).sum(-1) / 2, and take norms with "
                         "dim=-1 but without keepdim (a (B, 1) energy broadcasts T + V to (B, B))")
    return out


def check_like(out, x: Tensor, label: str, fn=None, *, dtype: bool = False) -> Tensor:
    """A user function's output that must have the shape of its input ``x`` (a velocity, a
    force, a field component): broadcasting would integrate another system silently.
    ``dtype``: a wider dtype than the input's is refused too (a closed-form gradient; a vector
    field keeps torchdiffeq's leniency)."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{_what(label, fn)} must return a tensor, got {type(out).__name__}")
    if out.shape != x.shape:
        what = _what(label, fn)
        raise ValueError(f"{what} returned shape {tuple(out.shape)} for an input of shape "
                         f"{tuple(x.shape)}: it must return the shape of its input")
    if dtype and out.dtype != x.dtype and torch.promote_types(out.dtype, x.dtype) != x.dtype:
        # (a wider dtype promoted the states, or failed inside an implicit solve; a narrower
        # one, as under autocast, is the input's once added to it)
        raise TypeError(f"{_what(label, fn)} returned {out.dtype} for an input of {x.dtype}: it "
                        "must return its input's dtype")
    return out


def _checked_once(fn: Callable[[Tensor], Tensor], label: str) -> Callable[[Tensor], Tensor]:
    """``fn`` whose output shape is checked against its input on the first call only: the bound
    kick/drift loops call the halves of a rollout with one state shape, so one check suffices
    and later steps pay a flag test."""
    checked = False

    def call(x):
        nonlocal checked
        out = fn(x)
        if not checked:
            check_like(out, x, label, fn, dtype=True)
            checked = True
        return out
    return call


#: True only while the compiled stepper runs an explicit step under grad mode and no saved-
#: tensor hooks are active (``_compile.CompiledStep.step``, reset after the call; dynamo guards
#: on it): there a traced force is torch.func.grad, which the outer backward differentiates
#: through.  Elsewhere under grad mode it stays torch.autograd.grad, which dynamo does not
#: trace, so that step runs eagerly: Newton's Jacobians through a compiled vector field (kept
#: for a second backward by backward="unroll", which compiled graphs do not support), and
#: under saved-tensor hooks, which torch.func.grad refuses (its failure inside dynamo left them
#: disabled for the whole process).
TRACE_FUNC_GRAD = False


def saved_tensor_hooks_active() -> bool:
    """Whether saved-tensor hooks are active in this thread (``grad="checkpoint"``,
    ``save_on_cpu``, ``saved_tensors_hooks``); True where this torch cannot say."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top is None:
        return True
    try:
        return top(False) is not None
    except TypeError:        # torch < 2.8: no argument
        return top() is not None


def grad_of(fn: Callable[..., Tensor], inputs: tuple[Tensor, ...],
            label: str = "the energy function", user_fn=None, *,
            constant_ok: bool = False) -> tuple[Tensor, ...]:
    """∇ of a per-sample scalar ``fn(*inputs)`` (shape = batch shape) w.r.t. each input.

    Samples are independent, so the gradient of the sum is the per-sample gradient.  The graph is
    kept (create_graph) when the caller has grad mode on and the gradient can depend on something
    that requires grad: an input that does, or a parameter / captured tensor that ``fn`` uses
    (:func:`~torchgeo_int._autograd.reaches_other_leaves`).  Otherwise — a fixed H rolled out
    without ``torch.no_grad()`` — no graph is built and the result does not require grad.
    ``constant_ok``: an ``fn`` that does not depend on its inputs (a constant step-size control)
    has zero gradients instead of raising (an energy that ignores q and p is a user's mistake;
    a constant control is not)."""
    keep = torch.is_grad_enabled()
    if torch.compiler.is_compiling() and (not keep or TRACE_FUNC_GRAD):
        # Traced into a graph without autograd (compile=True's blocks and loops, fused
        # fixed-point iterations) or into an explicit step under grad mode (TRACE_FUNC_GRAD):
        # torch.func.grad of the batch sum, which dynamo traces on every torch version and
        # inside a while_loop body, where torch.autograd.grad does not trace, and torch < 2.13
        # refuses its inputs' requires_grad_; under grad mode the outer backward differentiates
        # through it (the parameters' graph kept, as create_graph would).  (The first, eager
        # call of a compiled rollout has run the checks below.)
        return torch.func.grad(lambda *xs: fn(*xs).sum(), argnums=tuple(range(len(inputs))))(*inputs)
    # enable_grad cannot lift inference mode: the message below ("does not depend on its
    # inputs") misled
    if torch.is_inference_mode_enabled():
        raise RuntimeError(f"{_what(label, user_fn)}'s gradient (the vector field) needs autograd "
                           "and cannot run under torch.inference_mode(); use torch.no_grad()")
    if inputs[0].is_complex() or inputs[-1].is_complex():
        raise TypeError(f"{_what(label, user_fn)} got complex states ({inputs[-1].dtype}): "
                        "Hamiltonian systems take real coordinates; split a complex z into "
                        "torch.cat([z.real, z.imag], -1)")
    return _autograd_grad(fn, inputs, keep, label, user_fn, constant_ok)


def _autograd_grad(fn, inputs, keep, label, user_fn, constant_ok=False):
    """grad_of by torch.autograd.grad, with the output checks (and the graph when ``keep``)."""
    with torch.enable_grad():
        xs = grad_inputs(inputs, keep)
        out = check_energy(fn(*xs), xs[-1], label, user_fn)  # (q, p) or (g, μ): last is (..., n)
        if not out.requires_grad and constant_ok:
            return tuple(torch.zeros_like(x) for x in inputs)
        if not out.requires_grad:
            raise RuntimeError(f"{_what(label, user_fn)} returned a tensor that does not depend "
                               "on its inputs through autograd, so its gradient (the vector field) cannot be "
                               "taken: it detaches them (.detach(), .item(), .numpy(), "
                               "torch.no_grad(), a new tensor built from values). Compute it "
                               "with torch operations on q and p")
        if keep and not any(x.requires_grad for x in inputs):
            keep = reaches_other_leaves(out, xs)
        grads = torch.autograd.grad(out.sum(), xs, create_graph=keep, allow_unused=True)
    return tuple(torch.zeros_like(x) if g is None else g for x, g in zip(xs, grads))


class System(nn.Module):
    """Base class of what the integrators step (see module docstring)."""

    separable: bool = False
    #: force(q, t) = force_sign · force_term(q, t)
    force_sign: float = 1.0

    def vector_field(self, q: Tensor, p: Tensor, t: float = 0.0) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def velocity(self, p: Tensor, t: float = 0.0) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} is not separable")

    def force(self, q: Tensor, t: float = 0.0) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} is not separable")

    def force_term(self, q: Tensor, t: float = 0.0) -> Tensor:
        """The tensor whose multiple by ``force_sign`` is the force (what kicks add)."""
        return self.force(q, t)

    def halves(self):
        """``(velocity(p), force_term(q))`` as plain functions without t when the system is
        separable and time-independent and has them cheaper than the methods (bound loops
        call them directly), else ``None``."""
        return None

    def energy(self, q: Tensor, p: Tensor, t: float = 0.0) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no energy")


class Hamiltonian(System):
    r"""A Hamiltonian H(q, p) or H(q, p, t) → energy of shape ``q.shape[:-1]``; X_H by autograd.

    Pass ``fn``, or subclass and override ``hamiltonian(q, p[, t])`` (the HNN modules do).
    ``grad(q, p[, t]) -> (H_q, H_p)`` may supply the gradient in closed form.
    Time dependence is detected from fn's signature (:func:`takes_time`: a third positional
    parameter without a default, or one named ``t``/``time``/``tau``; override with
    ``time_dependent``).
    """

    def __init__(self, fn: Callable | None = None, *, grad: Callable | None = None,
                 time_dependent: bool | None = None):
        super().__init__()
        if fn is not None and not callable(fn):
            raise TypeError("fn must be callable as fn(q, p) or fn(q, p, t)")
        self.fn = fn
        self._grad = grad
        target = fn if fn is not None else self.hamiltonian
        self.time_dependent = takes_time(target, 2) if time_dependent is None else time_dependent

    def hamiltonian(self, q: Tensor, p: Tensor, t: float = 0.0) -> Tensor:
        if self.fn is None:
            raise NotImplementedError("pass fn or override hamiltonian(q, p)")
        return self.fn(q, p, t) if self.time_dependent else self.fn(q, p)

    def energy(self, q, p, t=0.0):
        H = (timed_call(self.hamiltonian, "the Hamiltonian H(q, p, t)", t, q, p, t)
             if self.time_dependent else self.hamiltonian(q, p))
        return check_energy(H, p, "the Hamiltonian", self._user_fn())

    def _user_fn(self):
        return self.fn if self.fn is not None else type(self)

    def forward(self, q, p, t=0.0):
        return self.energy(q, p, t)

    def gradients(self, q, p, t=0.0) -> tuple[Tensor, Tensor]:
        """(∂H/∂q, ∂H/∂p)."""
        if self._grad is not None:
            out = self._grad(q, p, t) if self.time_dependent else self._grad(q, p)
            if not (isinstance(out, (tuple, list)) and len(out) == 2):
                raise TypeError(f"{_what('the grad', self._grad)} must return a pair "
                                "(dH/dq, dH/dp)")
            return (check_like(out[0], q, "dH/dq of the grad", self._grad, dtype=True),
                    check_like(out[1], p, "dH/dp of the grad", self._grad, dtype=True))
        return grad_of(lambda q_, p_: self.energy(q_, p_, t), (q, p), "the Hamiltonian",
                       self._user_fn())

    def vector_field(self, q, p, t=0.0):
        Hq, Hp = self.gradients(q, p, t)
        return Hp, -Hq


class SeparableHamiltonian(Hamiltonian):
    r"""H(q, p) = T(p) + V(q) (or T(p, t) + V(q, t)): the explicit methods evaluate only
    ∂T/∂p (drifts) and ∂V/∂q (kicks).  ``kinetic_grad`` / ``potential_grad`` may give them in
    closed form (the fastest path; the benchmarks use it for the hand-written comparison).
    Without them, a time-independent energy module that has ``closed_form_grad`` (true when
    asked) and ``input_grad(x)`` — the networks of ``torchgeo_int.nn`` — gives its own; else
    autograd does.

    ``mass=m`` (with ``kinetic=None``) is the quadratic kinetic energy T(p) = ½ Σ p²/m, m a
    positive number or a tensor of positive masses broadcast against one sample's p (summed
    over its last ``max(1, m.dim())`` dims): ∂T/∂p = p/m in closed form (p itself for m = 1,
    no kernel), so an energy-defined system pays autograd for ∂V/∂q only."""

    separable = True
    force_sign = -1.0       # force = −∂V/∂q; kicks add ∂V/∂q with a negative coefficient

    def __init__(self, kinetic: Callable | None, potential: Callable, *,
                 kinetic_grad: Callable | None = None, potential_grad: Callable | None = None,
                 mass=None, time_dependent: bool | None = None):
        if mass is not None:
            if kinetic is not None or kinetic_grad is not None:
                raise ValueError("pass either kinetic (and kinetic_grad) or mass=, not both")
            kinetic = QuadraticKinetic(mass)
            kinetic_grad = kinetic.grad
        if not (callable(kinetic) and callable(potential)):
            raise TypeError("kinetic and potential must be callable: kinetic(p), potential(q)")
        super().__init__(None, time_dependent=False)
        self.kinetic, self.potential = kinetic, potential
        self.kinetic_grad, self.potential_grad = kinetic_grad, potential_grad
        # Each part may or may not take t; `time_dependent` forces both.
        self._T_td = takes_time(kinetic, 1) if time_dependent is None else time_dependent
        self._V_td = takes_time(potential, 1) if time_dependent is None else time_dependent
        self.time_dependent = self._T_td or self._V_td

    def _T(self, p, t):
        T = self.kinetic(p, t) if self._T_td else self.kinetic(p)
        return check_energy(T, p, "the kinetic energy", self.kinetic)

    def _V(self, q, t):
        V = self.potential(q, t) if self._V_td else self.potential(q)
        return check_energy(V, q, "the potential", self.potential)

    def hamiltonian(self, q, p, t=0.0):
        return self._T(p, t) + self._V(q, t)

    def energy(self, q, p, t=0.0):
        return self.hamiltonian(q, p, t)

    def velocity(self, p, t=0.0):
        if self.kinetic_grad is not None:
            v = self.kinetic_grad(p, t) if self._T_td else self.kinetic_grad(p)
            return check_like(v, p, "kinetic_grad", self.kinetic_grad, dtype=True)
        if not self._T_td and _closed_form(self.kinetic, p):
            return self.kinetic.input_grad(p)
        return grad_of(lambda p_: self._T(p_, t), (p,), "the kinetic energy", self.kinetic)[0]

    def force_term(self, q, t=0.0):
        """∂V/∂q (override this, not ``force``, to give it another way)."""
        if self.potential_grad is not None:
            f = self.potential_grad(q, t) if self._V_td else self.potential_grad(q)
            return check_like(f, q, "potential_grad", self.potential_grad, dtype=True)
        if not self._V_td and _closed_form(self.potential, q):
            return self.potential.input_grad(q)
        return grad_of(lambda q_: self._V(q_, t), (q,), "the potential", self.potential)[0]

    def force(self, q, t=0.0):
        return -self.force_term(q, t)

    def halves(self):
        cls = type(self)
        if (self.time_dependent or cls.velocity is not SeparableHamiltonian.velocity
                or cls.force_term is not SeparableHamiltonian.force_term):
            return None   # (a subclass that gives the halves another way keeps its methods)
        T, V, dT, dV = self.kinetic, self.potential, self.kinetic_grad, self.potential_grad
        # (decided once a bind: a rollout's halves see one network and one state dtype)
        vel = (_checked_once(dT, "kinetic_grad") if dT is not None else
               T.input_grad if _closed_form(T) else
               (lambda p: grad_of(T, (p,), "the kinetic energy", T)[0]))
        pot = (_checked_once(dV, "potential_grad") if dV is not None else
               V.input_grad if _closed_form(V) else
               (lambda q: grad_of(V, (q,), "the potential", V)[0]))
        return vel, pot

    def gradients(self, q, p, t=0.0):
        return self.force_term(q, t), self.velocity(p, t)

    def vector_field(self, q, p, t=0.0):
        return self.velocity(p, t), self.force(q, t)


def _closed_form(energy, x: Tensor | None = None) -> bool:
    """Whether an energy module gives its gradient in closed form now: the protocol of
    ``torchgeo_int.nn.ScalarMLP`` (a ``closed_form_grad`` flag, true at the time of asking, and
    ``input_grad(x)``); complex states go to autograd's path and its error."""
    return bool(getattr(energy, "closed_form_grad", False)) and not (x is not None and x.is_complex())


class QuadraticKinetic(nn.Module):
    """T(p) = ½ Σ p²/m and ∂T/∂p = p/m (:meth:`grad`): SeparableHamiltonian's ``mass=``.  A
    module, so a system holding it pickles whole (``torch.save(system)``; a lambda does not).
    m is kept as given — not a buffer or a parameter, so ``.to()``, ``state_dict`` and
    ``parameters()`` leave it alone (a learned m is the caller's to optimise) — and used in
    the state's dtype and device; a deep copy shares an m that carries a graph (a tensor
    computed from parameters, which cannot be deep-copied)."""

    def __init__(self, mass):
        super().__init__()
        if isinstance(mass, torch.Tensor):
            if not (mass.is_floating_point() and mass.numel() > 0
                    and bool(torch.isfinite(mass).all()) and bool((mass > 0).all())):
                raise ValueError("mass must hold finite positive floating-point values")
            dims = tuple(range(-max(1, mass.dim()), 0))
        elif isinstance(mass, bool) or not isinstance(mass, numbers.Real) or not 0 < mass < float("inf"):
            raise ValueError(f"mass must be a finite positive number or tensor, got {mass!r}")
        else:
            mass, dims = float(mass), (-1,)
        # (object.__setattr__: an nn.Parameter would otherwise be registered as this module's)
        object.__setattr__(self, "mass", mass)
        self.dims = dims

    def __deepcopy__(self, memo):
        m = self.mass
        if isinstance(m, torch.Tensor) and not m.is_leaf:
            memo[id(m)] = m
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new

    def forward(self, p: Tensor) -> Tensor:
        m = self.mass
        if isinstance(m, torch.Tensor):
            # in the state's dtype and device (a float64 mass made float32 states float64 under
            # backprop only, and implicit solves refuse the mixed dtype)
            return 0.5 * (p * p / m.to(p)).sum(self.dims)
        return 0.5 * (p * p).sum(-1) if m == 1.0 else 0.5 * (p * p).sum(-1) / m

    def grad(self, p: Tensor) -> Tensor:
        m = self.mass
        if isinstance(m, torch.Tensor):
            return p / m.to(p)
        # m = 1: p itself (kicks and drifts make new tensors, nothing writes into it)
        return p if m == 1.0 else p / m


class VectorFieldSystem(System):
    """A partitioned vector field ``f(t, q, p) -> (dq, dp)`` (not necessarily Hamiltonian).

    With ``separable=True`` the user promises dq depends on p only and dp on q only, which turns
    on the explicit kick/drift paths (each half is taken from one call of f)."""

    def __init__(self, f: Callable[[float, Tensor, Tensor], tuple[Tensor, Tensor]], *,
                 separable: bool = False):
        super().__init__()
        if not callable(f):
            raise TypeError("f must be callable as f(t, q, p) -> (dq, dp)")
        _check_arity(f, 3, "f(t, q, p) -> (dq, dp)")
        self.f = f
        self.separable = bool(separable)

    def _call(self, q, p, t):
        out = self.f(t, q, p)
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise TypeError(f"{_what('the vector field', self.f)} must return a pair (dq, dp)")
        return (check_like(out[0], q, "dq of the vector field", self.f),
                check_like(out[1], p, "dp of the vector field", self.f))

    def vector_field(self, q, p, t=0.0):
        return self._call(q, p, t)

    def velocity(self, p, t=0.0):
        if not self.separable:
            return super().velocity(p, t)
        # dq does not depend on q (the user's promise), so any q will do; zeros are cheap.
        return self._call(torch.zeros_like(p), p, t)[0]

    def force(self, q, t=0.0):
        if not self.separable:
            return super().force(q, t)
        return self._call(q, torch.zeros_like(q), t)[1]


class ODESystem(System):
    """A first-order system ẋ = f(t, x) on any state x (eq. (1) integrators step it)."""

    first_order = True

    def __init__(self, f: Callable[[float, Tensor], Tensor]):
        super().__init__()
        if not callable(f):
            raise TypeError("f must be callable as f(t, x) -> dx")
        _check_arity(f, 2, "f(t, x) -> dx")
        self.f = f

    def vector_field(self, x, p=None, t=0.0):
        return check_like(self.f(t, x), x, "the vector field", self.f)
