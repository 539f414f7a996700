r"""Learned Hamiltonians (and one unstructured baseline) that every integrator accepts.

* :class:`HNN`            H_θ(q, p) = MLP(cat[q, p])                       (Greydanus et al. 2019)
  (each network optionally of features φ(x) the user gives: invariants of the symmetries)
* :class:`SeparableHNN`   H_θ(q, p) = T_θ(p) + V_θ(q), ``separable = True``: explicit kick/drift
  methods (Verlet, Yoshida, …) apply                                    (Chen et al. 2020, SRNN)
* :class:`MechanicalHNN`  H_θ(q, p) = ½ pᵀ M_θ(q)⁻¹ p + V_θ(q),  M_θ(q) = L_θ(q) L_θ(q)ᵀ + εI with
  L_θ lower triangular and a softplus diagonal, so M_θ is symmetric positive definite for every
  θ and q (Lutter et al. 2019, DeLaN; Zhong et al. 2020, SymODEN)
* :class:`MLPVectorField` an unstructured field f_θ(q, p) (the Neural ODE baseline; Chen et al.
  2018), usable by torchdiffeq (``forward(t, x)``) and by the integrators (``vector_field``).

The Hamiltonian modules subclass :class:`torchgeo_int.Hamiltonian` /
:class:`torchgeo_int.SeparableHamiltonian`, so ``tgi.rollout``, every integrator, the losses and
the layers take them as they take a hand-written H.  X_H of ``HNN``, ``SeparableHNN`` and
``MechanicalHNN(constant_mass=True)`` is the MLPs' closed-form input gradient
(:meth:`MLP.input_grad`, the reverse sweep written out: plain tensor operations, so a loss
differentiates through it with one backward pass) wherever the network has one now — for a
network of features φ, pulled back by φ's ``input_vjp`` where φ has one — else (and for a
learned mass matrix) autograd's, with ``create_graph`` under grad mode.

States are ``q, p`` of shape ``(..., dim)``; batch dims lead and are free.  The MLPs default to
the HNN paper's 2 hidden layers × 200, tanh, orthogonal weight initialisation.
"""
from __future__ import annotations

import math
import numbers
from typing import Callable

import torch
from torch import nn

from .._validate import check_int
from ..systems import Hamiltonian, SeparableHamiltonian, System, grad_of

Tensor = torch.Tensor


class Sin(nn.Module):
    """sin(x): a smooth periodic activation (SIREN-style)."""

    def forward(self, x):
        return torch.sin(x)


#: Activations by name.  All are smooth: X_H = J∇H needs ∇H to be at least continuous, and the
#: rollout losses differentiate ∇H once more (ReLU would make the learned field piecewise
#: constant; pass a module factory if you really want it).
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "tanh": nn.Tanh, "softplus": nn.Softplus, "sigmoid": nn.Sigmoid, "silu": nn.SiLU,
    "gelu": nn.GELU, "elu": nn.ELU, "sin": Sin,
}
INITS = ("orthogonal", "default")


# Each rule is g ↦ g ⊙ σ'(z) for an activation module σ with input z and output a = σ(z): one
# step of the reverse sweep of MLP.input_grad.  tanh and sigmoid use the kernels of their own
# autograd backward (one op instead of three; differentiable again, so losses train through
# them).
def _softplus_vjp(act, g, z, a):
    bz = act.beta * z                  # torch's softplus is linear where βz > threshold
    return g * torch.where(bz > act.threshold, torch.ones_like(z), torch.sigmoid(bz))


def _silu_vjp(act, g, z, a):
    s = torch.sigmoid(z)
    return g * (s * (1 + z * (1 - s)))


def _gelu_vjp(act, g, z, a):           # exact GELU z Φ(z) (the tanh approximation: autograd)
    return g * (0.5 * (1 + torch.erf(z * math.sqrt(0.5)))
                + z * torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi))


def _elu_vjp(act, g, z, a):
    return g * torch.where(z > 0, torch.ones_like(z), a + act.alpha)


def _rule(act):
    """The DERIVATIVES rule of an activation module, None if it has none (an in-place one
    overwrites the z its rule reads; hooks may change what it returns)."""
    if (isinstance(act, nn.GELU) and act.approximate != "none") or getattr(act, "inplace", False) \
            or _hooked(act):
        return None
    return DERIVATIVES.get(type(act))


def _hooked(module) -> bool:
    """Whether forward (pre-)hooks may change what ``module`` computes (the old
    ``weight_norm``/``spectral_norm`` recompute weights in one): the closed form, which reads
    the weights and skips the calls, would miss them."""
    return bool(module._forward_hooks or module._forward_pre_hooks)


#: The activations with a closed-form derivative (:meth:`MLP.input_grad`): type → the rule
#: g ↦ g ⊙ σ'(z) given (module, g, z, a = σ(z)).  A type not listed (or GELU's tanh
#: approximation) leaves the gradient to autograd.
DERIVATIVES: dict[type, Callable] = {
    nn.Tanh: lambda act, g, z, a: torch.ops.aten.tanh_backward(g, a),
    nn.Sigmoid: lambda act, g, z, a: torch.ops.aten.sigmoid_backward(g, a),
    nn.Softplus: _softplus_vjp, nn.SiLU: _silu_vjp, nn.GELU: _gelu_vjp, nn.ELU: _elu_vjp,
    Sin: lambda act, g, z, a: g * torch.cos(z),
}


def _times(d1, f):
    """(σ', σ' ⊙ f): σ'' where it is σ' times a factor (σ' computed once)."""
    return d1, d1 * f


def _softplus_d2(act, z, a):
    bz = act.beta * z
    s = torch.sigmoid(bz)
    linear = bz > act.threshold
    return (torch.where(linear, torch.ones_like(z), s),
            torch.where(linear, torch.zeros_like(z), act.beta * s * (1 - s)))


def _silu_d2(act, z, a):
    s = torch.sigmoid(z)
    return s * (1 + z * (1 - s)), s * (1 - s) * (2 + z * (1 - 2 * s))


def _gelu_d2(act, z, a):               # exact GELU z Φ(z)
    phi = torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    return 0.5 * (1 + torch.erf(z * math.sqrt(0.5))) + z * phi, phi * (2 - z * z)


def _elu_d2(act, z, a):
    d = torch.where(z > 0, torch.zeros_like(z), a + act.alpha)
    return torch.where(z > 0, torch.ones_like(z), d), d


#: (σ'(z), σ''(z)) of the activations of DERIVATIVES, given (module, z, a = σ(z)):
#: :meth:`MLP.input_grad_hessian`'s rules.
SECOND: dict[type, Callable] = {
    nn.Tanh: lambda act, z, a: _times(1 - a * a, -2 * a),              # (σ', σ' ⊙ (−2a))
    nn.Sigmoid: lambda act, z, a: _times(a * (1 - a), 1 - 2 * a),
    nn.Softplus: _softplus_d2, nn.SiLU: _silu_d2, nn.GELU: _gelu_d2, nn.ELU: _elu_d2,
    Sin: lambda act, z, a: (torch.cos(z), -a),
}


def _activation(activation) -> Callable[[], nn.Module]:
    if isinstance(activation, str):
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; known: {', '.join(ACTIVATIONS)}, "
                             "or pass a factory returning an nn.Module")
        return ACTIVATIONS[activation]
    if callable(activation):
        return activation
    raise TypeError(f"activation must be a name or a callable returning an nn.Module, got {activation!r}")


class MLP(nn.Sequential):
    """``in_dim → width → … → width → out_dim`` with ``depth`` hidden layers.

    ``init="orthogonal"`` gives every weight matrix an orthogonal initialisation (as the HNN
    paper's code does; it keeps the scale of ∇H at initialisation near 1 whatever the width),
    biases keep PyTorch's default; ``init="default"`` keeps PyTorch's defaults throughout.
    The output layer has no bias: a constant in H is invisible to the dynamics."""

    def __init__(self, in_dim: int, out_dim: int, *, width: int = 200, depth: int = 2,
                 activation="tanh", init: str = "orthogonal"):
        check_int(in_dim, "in_dim", 1)
        check_int(out_dim, "out_dim", 1)
        check_int(width, "width", 1)
        check_int(depth, "depth", 1)
        if init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {init!r}")
        act = _activation(activation)
        layers, d = [], in_dim
        for _ in range(depth):
            layers += [nn.Linear(d, width), act()]
            d = width
        layers.append(nn.Linear(d, out_dim, bias=False))
        super().__init__(*layers)
        self.in_dim, self.out_dim = in_dim, out_dim
        if init == "orthogonal":
            for m in self:
                if isinstance(m, nn.Linear):
                    nn.init.orthogonal_(m.weight)

    def _check_input(self, x):
        if x.shape[-1] != self.in_dim:
            raise ValueError(f"this network takes inputs of shape (..., {self.in_dim}), "
                             f"got shape {tuple(x.shape)}")

    def forward(self, x):
        self._check_input(x)
        return super().forward(x)

    @property
    def closed_form_grad(self) -> bool:
        """Whether :meth:`input_grad` applies now: one output, every activation one of
        ``DERIVATIVES`` (not in place), no forward hooks on the network or its layers.  Asked
        at each use, so a layer swapped in later counts; where it is False the HNN modules take
        their forces by autograd."""
        layers = list(self)
        return (self.out_dim == 1 and not _hooked(self)
                and all(not _hooked(m) for m in layers[0::2])
                and all(_rule(m) is not None for m in layers[1::2]))

    @property
    def closed_form_hessian(self) -> bool:
        """:attr:`closed_form_grad`, every activation's σ'' in ``SECOND``, and ``input_grad``
        and ``input_grad_hessian`` defined by the same class (:meth:`input_grad_hessian`
        applies now, and is the Hessian of what :meth:`input_grad` computes)."""
        return (self.closed_form_grad and _own_pair(type(self))
                and all(type(m) in SECOND for m in list(self)[1::2]))

    def input_grad(self, x: Tensor) -> Tensor:
        r"""∂f/∂x of the scalar output f = w_Lᵀ σ(z_L), z_k = W_k a_{k−1} + b_k, a_0 = x, in
        closed form: the reverse sweep written out,

            ∂f/∂z_L = w_L ⊙ σ'(z_L),   ∂f/∂z_{k−1} = (∂f/∂z_k W_k) ⊙ σ'(z_{k−1}),   ∂f/∂x = ∂f/∂z_1 W_1,

        shape ``x.shape``.  The same numbers as ``torch.autograd.grad`` of the output (up to
        rounding) without the autograd engine: the forces of a learned H cost plain tensor
        operations, and under grad mode a loss differentiates them with one backward pass
        instead of a double backward.  Needs :attr:`closed_form_grad` (a clear error if not)."""
        acts = self._sweep(x, "input_grad")
        g = self[-1].weight[0]                            # ∂f/∂a_L; then the reverse sweep
        for k in range(len(acts) - 1, -1, -1):
            lin, act, rule, z, a = acts[k]
            g = rule(act, g.expand_as(a) if k == len(acts) - 1 else g, z, a) @ lin.weight
        return g

    def _sweep(self, x: Tensor, method: str):
        """The forward pass of :meth:`input_grad` (``method="input_grad"``) or
        :meth:`input_grad_hessian` (whose activations need σ'' too) with the checks of
        :attr:`closed_form_grad` / :attr:`closed_form_hessian`, made in the pass over the
        layers (the rules are looked up there anyway: one pass a force on the rollout's hot
        path): ``[(linear_k, σ_k, rule_k, z_k, a_k)]``."""
        self._check_input(x)
        if x.is_complex():
            raise TypeError(f"this network takes real inputs, got {x.dtype}: split a complex z "
                            "into torch.cat([z.real, z.imag], -1)")
        layers = list(self)
        if self.out_dim != 1:
            raise _refusal(f"out_dim = {self.out_dim}", method)
        if _hooked(self) or _hooked(layers[-1]):
            raise _refusal("a forward hook", method)
        second = method != "input_grad"
        acts, a = [], x
        for lin, act in zip(layers[:-1:2], layers[1::2]):
            rule = _rule(act)
            unknown = rule is None or (second and type(act) not in SECOND)
            if unknown or _hooked(lin):
                raise _refusal(f"the activation {act!r}" if unknown else "a forward hook", method)
            z = nn.functional.linear(a, lin.weight, lin.bias)
            a = act(z)
            acts.append((lin, act, rule, z, a))
        return acts

    def input_grad_hessian(self, x: Tensor) -> tuple[Tensor, Tensor]:
        r"""(∂f/∂x, ∂²f/∂x²) of the scalar output (see :meth:`input_grad`) in closed form, shapes
        ``x.shape`` and ``x.shape + x.shape[-1:]``, for inputs ``(…, d)``:

            ∂²f/∂x² = Σ_k J_kᵀ diag(σ''(z_k) ⊙ u_k) J_k,   J_1 = W_1,  J_k = W_k diag(σ'(z_{k−1})) J_{k−1},

        u_k = ∂f/∂a_k the reverse sweep's vector at layer k (exact: z_k is affine in a_{k−1},
        so every second derivative comes from an activation's σ'').  J_k costs d products of a
        width × width matrix a layer after the first, the Hessian d(d + 1)/2 dot products; the
        forward differences of :meth:`input_grad` would cost d more gradients (2 such products a
        layer each): for d = 4 and two hidden layers, 6 instead of 10.  Not differentiated
        again (call it under ``torch.no_grad()`` or on inputs without a graph where speed
        matters); needs :attr:`closed_form_hessian` (a clear error if not)."""
        self._check_input(x)                              # (named in the caller's shape)
        lead, d = x.shape[:-1], x.shape[-1]
        acts = [(lin.weight, *SECOND[type(act)](act, z, a))               # (W_k, σ'(z_k), σ''(z_k))
                for lin, act, _, z, a in self._sweep(x.reshape(-1, d), "input_grad_hessian")]
        u = self[-1].weight[0].expand_as(acts[-1][1])                     # u_L = ∂f/∂a_L
        grads = []
        for k in range(len(acts) - 1, -1, -1):                            # the reverse sweep
            W, d1, d2 = acts[k]
            grads.append(d2 * u)                                          # σ''(z_k) ⊙ u_k
            u = (d1 * u) @ W                                              # u_{k−1}; finally ∂f/∂x
        Jt = None                                                         # J_kᵀ: (N, d, width)
        for k, (W, d1, _) in enumerate(acts):
            c = grads[len(acts) - 1 - k]
            if Jt is None:            # J_1 = W_1, shared: Σ_a c_a W_ai W_aj as one product
                hess = (c @ (W.unsqueeze(2) * W.unsqueeze(1)).reshape(W.shape[0], d * d)).view(-1, d, d)
                Jt = W.t().contiguous()
            else:
                Jt = Jt @ W.t()
                hess += (Jt * c.unsqueeze(1)) @ Jt.transpose(-1, -2)
            if k < len(acts) - 1:
                Jt = Jt * d1.unsqueeze(1)                                 # diag(σ'(z_k)) J_k
        return u.reshape(x.shape), hess.reshape(*lead, d, d)


def _refusal(why: str, method: str = "input_grad") -> ValueError:
    first = method == "input_grad"
    return ValueError(
        f"{method} needs a one-output network without forward hooks whose activations have a "
        f"closed-form {'' if first else 'second '}derivative "
        f"({', '.join(t.__name__ for t in (DERIVATIVES if first else SECOND))}; GELU exact only; "
        f"not in place); this one has {why}: take its "
        + ("gradient with torch.autograd.grad" if first else "Hessian with torch.func.hessian"))


def _own_pair(cls, first: str = "input_grad", second: str = "input_grad_hessian") -> bool:
    """Whether the class of ``cls``'s MRO that defines ``first`` defines ``second`` too: a
    subclass that redefines the gradient (another function) and inherits the Hessian would
    pair a Hessian with the wrong gradient (likewise a feature map's ``input_vjp`` with its
    ``forward``)."""
    for c in cls.__mro__:
        if first in c.__dict__:
            return second in c.__dict__
    return False

class ScalarMLP(nn.Module):
    """A scalar function of one argument, f(x) = MLP(x) with shape ``x.shape[:-1]``
    (the T_θ and V_θ of the separable and mechanical HNNs).  ``input_grad(x)`` is ∂f/∂x in
    closed form where ``closed_form_grad`` (:meth:`MLP.input_grad`): the protocol by which
    :class:`~torchgeo_int.SeparableHamiltonian` takes an energy module's gradient without
    autograd.

    ``features``: f(x) = MLP(φ(x)) for a callable (or module) φ: ``(…, dim) → (…, k)``, e.g. an
    invariant of a symmetry the energy has (the distance |q₁ − q₂| of a two-body potential is
    invariant under translations and rotations, so V_θ = MLP(|q₁ − q₂|) has both built in).  φ is
    called once on zeros of shape ``(1, dim)`` here to read k (in its own dtype and device where it
    is a module, in eval mode).  ∂f/∂x is in closed form where φ gives its vector–Jacobian
    product, ``φ.input_vjp(x, g) = J_φ(x)ᵀ g`` (as :class:`PairDistances` does): J_φ(x)ᵀ ∇MLP(φ(x)),
    plain tensor operations; else autograd's (``closed_form_grad`` is False).  A φ with
    parameters is a module, or a module's bound method (its module is then registered here
    too); a function that closes over a module hides its parameters from the model (they are
    not trained, saved or converted)."""

    def __init__(self, dim: int, *, features: Callable[[Tensor], Tensor] | None = None, **mlp_options):
        super().__init__()
        check_int(dim, "dim", 1)
        self.dim = dim
        _set_features(self, features)
        self.net = MLP(dim if features is None else _feature_width(features, dim), 1, **mlp_options)

    def forward(self, x):
        if self.features is not None:
            if x.shape[-1:] != (self.dim,):
                raise ValueError(f"this network takes inputs of shape (..., {self.dim}) (its features' "
                                 f"argument), got shape {tuple(x.shape)}")
            x = self.features(x)
        return self.net(x).squeeze(-1)

    @property
    def closed_form_grad(self) -> bool:
        """:attr:`MLP.closed_form_grad` of the network, no forward hook on this module, and no
        ``features`` or features with ``input_vjp``."""
        return _vjp_of(self.features) and not _hooked(self) and self.net.closed_form_grad

    @property
    def closed_form_hessian(self) -> bool:
        """:attr:`MLP.closed_form_hessian` of the network, no forward hook on this module, no
        ``features``, and ``input_grad`` and ``input_grad_hessian`` defined by the same class."""
        return (self.features is None and not _hooked(self) and _own_pair(type(self))
                and self.net.closed_form_hessian)

    def _no_features(self, method):
        if self.features is not None and (method != "input_grad" or not _vjp_of(self.features)):
            extra = ("" if method != "input_grad" else
                     " whose features have no input_vjp(x, g) (J_φ(x)ᵀ g, as PairDistances has)")
            raise ValueError(f"{method} is the closed form of a network of x; this one is a network of "
                             f"features(x){extra}: take its derivatives with torch.autograd "
                             "(torch.func.hessian for the Hessian)")

    def input_grad(self, x):
        """∂f/∂x, shape ``x.shape`` (closed form; see :meth:`MLP.input_grad`); with features
        that have ``input_vjp``, J_φ(x)ᵀ ∇MLP(φ(x))."""
        self._no_features("input_grad")
        return _input_grad(self.features, self.net, x, self.dim)

    def input_grad_hessian(self, x):
        """(∂f/∂x, ∂²f/∂x²) in closed form (see :meth:`MLP.input_grad_hessian`)."""
        self._no_features("input_grad_hessian")
        return self.net.input_grad_hessian(x)


class PairDistances(nn.Module):
    r"""The distances |q_i − q_j|, i < j, of ``bodies`` points in ``space_dim`` dimensions:
    ``q (…, bodies · space_dim) → (…, bodies (bodies − 1) / 2)``, the points' coordinates one
    after the other (q = (x₁, y₁, x₂, y₂, …)).  Invariant under translations, rotations and
    reflections of space; a potential of them (``SeparableHNN(potential_features=
    PairDistances(n, d))``) has those symmetries built in, so its forces conserve the total
    momentum and, with a kinetic energy that is rotation-invariant, the angular momentum.  A
    module without parameters: a model holding it can be pickled whole (a lambda cannot)."""

    def __init__(self, bodies: int, space_dim: int = 3):
        super().__init__()
        check_int(bodies, "bodies", 2)
        check_int(space_dim, "space_dim", 1)
        self.bodies, self.space_dim = bodies, space_dim
        i, j = torch.triu_indices(bodies, bodies, 1)
        self.register_buffer("i", i, persistent=False)
        self.register_buffer("j", j, persistent=False)

    def forward(self, q: Tensor) -> Tensor:
        n = self.bodies * self.space_dim
        if q.shape[-1:] != (n,):
            raise ValueError(f"PairDistances({self.bodies}, {self.space_dim}) takes q of shape (..., {n}) "
                             f"({self.bodies} points of {self.space_dim} coordinates), got {tuple(q.shape)}")
        x = q.unflatten(-1, (self.bodies, self.space_dim))
        return (x[..., self.i, :] - x[..., self.j, :]).norm(dim=-1)

    def input_vjp(self, q: Tensor, g: Tensor) -> Tensor:
        r"""J(q)ᵀ g, shape ``q.shape``, for g of the distances' shape: each pair's g_ij (q_i − q_j)
        / |q_i − q_j| added to point i and taken from point j (autograd's numbers, 0 where two
        points coincide, as the norm's gradient there), in plain tensor operations: the
        features' half of a closed-form force (:class:`ScalarMLP`'s ``features``)."""
        x = q.unflatten(-1, (self.bodies, self.space_dim))
        i, j = self.i.to(q.device), self.j.to(q.device)   # (index_add wants them on q's device)
        d = x[..., i, :] - x[..., j, :]                             # (…, pairs, space_dim)
        r = d.norm(dim=-1, keepdim=True)
        # (d = 0 where r = 0: w = 0 there, and no 0/0 for a backward to meet)
        w = g.unsqueeze(-1) * d / torch.where(r > 0, r, torch.ones_like(r))
        if self.bodies == 2:                                       # one pair: +w, −w
            return torch.cat([w, -w], -2).flatten(-2)
        out = torch.zeros_like(x)
        out = out.index_add(-2, i, w).index_add(-2, j, -w)
        return out.flatten(-2)

    def extra_repr(self) -> str:
        return f"bodies={self.bodies}, space_dim={self.space_dim}"


def _set_features(module: nn.Module, features) -> None:
    """``module.features = features``; a bound method of a module registers that module too
    (``features_owner``), so its parameters are the model's (trained, saved, converted)."""
    module.features = features
    owner = getattr(features, "__self__", None)
    if isinstance(owner, nn.Module) and not isinstance(features, nn.Module):
        module.features_owner = owner


def _vjp_of(features) -> bool:
    """Whether a network of ``features`` can give its input gradient in closed form: none, or
    a φ with ``input_vjp(x, g)`` (J_φ(x)ᵀ g) that differentiates what φ computes now: the class
    that defines its ``forward`` (``__call__`` for a plain callable) defines ``input_vjp`` too,
    so a subclass that changes the map and inherits the vjp does not count, and, for a module,
    no forward hooks (which may change its output)."""
    if features is None:
        return True
    if not callable(getattr(features, "input_vjp", None)):
        return False
    if isinstance(features, nn.Module):
        return not _hooked(features) and _own_pair(type(features), "forward", "input_vjp")
    return _own_pair(type(features), "__call__", "input_vjp")


def _input_grad(features, net, x: Tensor, dim: int) -> Tensor:
    """∂/∂x of net(x), or of net(φ(x)) = J_φ(x)ᵀ ∇net(φ(x)): the network's closed-form gradient
    (at the features, pulled back by φ's own ``input_vjp``)."""
    if features is None:
        return net.input_grad(x)
    if x.shape[-1:] != (dim,):
        raise ValueError(f"this network takes inputs of shape (..., {dim}) (its features' "
                         f"argument), got shape {tuple(x.shape)}")
    out = features.input_vjp(x, net.input_grad(features(x)))
    if not isinstance(out, Tensor) or out.shape != x.shape:
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"features.input_vjp(x, g) must give J_φ(x)ᵀ g of x's shape "
                         f"{tuple(x.shape)}, got {got}")
    return out


def _feature_width(features, dim: int) -> int:
    """k of a feature map φ: (…, dim) → (…, k), read from φ on zeros (1, dim) — in the dtype and
    on the device of φ's module (a module or a module's bound method), in eval mode."""
    if not callable(features):
        raise TypeError(f"features must be a callable (..., {dim}) -> (..., k), got {features!r}")
    owner = features if isinstance(features, nn.Module) else getattr(features, "__self__", None)
    like = None
    if isinstance(owner, nn.Module):
        like = next((t for t in (*owner.parameters(), *owner.buffers()) if t.is_floating_point()), None)
    zeros = torch.zeros(1, dim) if like is None else torch.zeros(1, dim, dtype=like.dtype, device=like.device)
    training = isinstance(owner, nn.Module) and owner.training
    try:
        if training:
            owner.eval()               # no batch statistics, no running averages moved by the probe
        with torch.no_grad():
            z = features(zeros)
    except Exception as err:
        raise ValueError(f"features must map (..., {dim}) to (..., k): on zeros of shape (1, {dim}) it "
                         f"raised {type(err).__name__}: {err}") from err
    finally:
        if training:
            owner.train()
    if not isinstance(z, Tensor) or z.dim() != 2 or z.shape[0] != 1 or z.shape[1] < 1:
        got = tuple(z.shape) if isinstance(z, Tensor) else type(z).__name__
        hint = (" (a reduction over the last dim, as .norm(dim=-1), needs keepdim=True)"
                if isinstance(z, Tensor) and z.shape == (1,) else "")
        raise ValueError(f"features must map (..., {dim}) to (..., k), keeping the leading dims: "
                         f"on zeros of shape (1, {dim}) it gave {got}{hint}")
    return int(z.shape[1])


def _check_state(q: Tensor, p: Tensor, dim: int) -> None:
    if q.shape != p.shape:
        raise ValueError(f"q and p must have the same shape, got {tuple(q.shape)} and {tuple(p.shape)}")
    if q.shape[-1:] != (dim,):
        raise ValueError(f"this model has dim = {dim}: q and p must have shape (..., {dim}), "
                         f"got {tuple(q.shape)}")


class HNN(Hamiltonian):
    r"""Hamiltonian neural network H_θ(q, p) = MLP(cat[q, p]) (Greydanus, Dzamba & Yosinski,
    NeurIPS 2019), for states of dimension ``dim`` (q and p each ``(..., dim)``).

    Not separable: explicit kick/drift methods fall back to their implicit form (a composition of
    symplectic Euler steps solved by fixed point); ``implicit_midpoint`` is the natural method.
    ∇H is the network's closed-form input gradient (:meth:`MLP.input_grad`) where its
    activation has one (all of ``ACTIVATIONS``), else autograd's.

    ``features``: H_θ = MLP(φ(cat[q, p])) for a callable φ: ``(…, 2·dim) → (…, k)`` (an invariant
    of the system's symmetries, as :class:`ScalarMLP`'s); ∇H is then J_φᵀ ∇MLP(φ) in closed form
    where φ has ``input_vjp``, else autograd's."""

    def __init__(self, dim: int, *, width: int = 200, depth: int = 2, activation="tanh",
                 init: str = "orthogonal", features: Callable[[Tensor], Tensor] | None = None):
        super().__init__(None, time_dependent=False)
        check_int(dim, "dim", 1)
        self.dim = dim
        _set_features(self, features)
        k = 2 * dim if features is None else _feature_width(features, 2 * dim)
        self.net = MLP(k, 1, width=width, depth=depth, activation=activation, init=init)

    def hamiltonian(self, q, p, t=0.0):
        _check_state(q, p, self.dim)
        x = torch.cat([q, p], -1)
        return self.net(x if self.features is None else self.features(x)).squeeze(-1)

    def gradients(self, q, p, t=0.0):
        if (not _vjp_of(self.features) or not self.net.closed_form_grad
                or q.is_complex() or p.is_complex()):
            return super().gradients(q, p, t)       # autograd's (and its errors)
        _check_state(q, p, self.dim)
        g = _input_grad(self.features, self.net, torch.cat([q, p], -1), 2 * self.dim)
        return g[..., :self.dim], g[..., self.dim:]


class SeparableHNN(SeparableHamiltonian):
    r"""H_θ(q, p) = T_θ(p) + V_θ(q), two MLPs (as in SRNN, Chen et al., ICLR 2020).

    ``separable = True``: the explicit methods (``verlet``, ``yoshida4``, …) evaluate ∂T_θ/∂p and
    ∂V_θ/∂q only, one network each, with FSAL reuse of the last force; both in closed form
    (:meth:`MLP.input_grad`, through :class:`~torchgeo_int.SeparableHamiltonian`'s
    ``input_grad`` protocol) where the network has one, else by autograd.

    ``kinetic_features``, ``potential_features``: T_θ = MLP(φ_T(p)), V_θ = MLP(φ_V(q))
    (:class:`ScalarMLP`'s ``features``), e.g. ``potential_features=PairDistances(2, space_dim=2)``
    (|q₁ − q₂|) for a potential of two bodies in the plane that is invariant under translations
    and rotations; that energy's forces are then in closed form too (``PairDistances.input_vjp``;
    autograd's for a φ without ``input_vjp``)."""

    def __init__(self, dim: int, *, width: int = 200, depth: int = 2, activation="tanh",
                 init: str = "orthogonal", kinetic_features: Callable[[Tensor], Tensor] | None = None,
                 potential_features: Callable[[Tensor], Tensor] | None = None):
        check_int(dim, "dim", 1)
        opts = dict(width=width, depth=depth, activation=activation, init=init)
        super().__init__(ScalarMLP(dim, features=kinetic_features, **opts),
                         ScalarMLP(dim, features=potential_features, **opts), time_dependent=False)
        self.dim = dim

    def hamiltonian(self, q, p, t=0.0):
        _check_state(q, p, self.dim)
        return super().hamiltonian(q, p, t)


def _inv_softplus(y: float) -> float:
    return math.log(math.expm1(y))


class MechanicalHNN(Hamiltonian):
    r"""H_θ(q, p) = ½ pᵀ M_θ(q)⁻¹ p + V_θ(q), a mechanical system with a learned mass matrix.

    M_θ(q) = L_θ(q) L_θ(q)ᵀ + ε I, with L_θ lower triangular: its strictly lower part and the
    pre-activations of its diagonal are the outputs of an MLP of q, the diagonal goes through a
    softplus.  So M_θ(q) is symmetric with eigenvalues ≥ ε > 0 for every θ and q (positive
    definite by construction), and T is a positive definite quadratic form in p.
    Initialisation: the output layer of the mass network is zero and its bias puts softplus = 1 on
    the diagonal, so M_θ ≡ (1 + ε) I at first; V_θ is an orthogonally initialised MLP.

    ``constant_mass=True`` learns one constant M (no network): H is then separable and the
    explicit methods apply (``separable`` is True, ``velocity(p) = M⁻¹p``).
    """

    def __init__(self, dim: int, *, width: int = 200, depth: int = 2, activation="tanh",
                 init: str = "orthogonal", eps: float = 1e-3, constant_mass: bool = False):
        super().__init__(None, time_dependent=False)
        check_int(dim, "dim", 1)
        if not (isinstance(eps, numbers.Real) and eps > 0 and math.isfinite(eps)):
            raise ValueError(f"eps must be a finite positive number, got {eps!r}")
        self.dim, self.eps, self.constant_mass = dim, float(eps), bool(constant_mass)
        self.separable = self.constant_mass
        opts = dict(width=width, depth=depth, activation=activation, init=init)
        self.potential = ScalarMLP(dim, **opts)
        self.tril = TrilFill(dim)
        bias = self.tril.diagonal_values(_inv_softplus(1.0))
        if self.constant_mass:
            self.mass_params = nn.Parameter(bias.clone())
            self.mass_net = None
        else:
            self.mass_net = MLP(dim, self.tril.size, **opts)
            last = self.mass_net[-1]
            nn.init.zeros_(last.weight)
            # The output layer of MLP has no bias; the offset that makes M = (1+ε)I lives here.
            self.mass_bias = nn.Parameter(bias.clone())

    def cholesky_factor(self, q: Tensor) -> Tensor:
        """L_θ(q), shape ``(..., dim, dim)``, lower triangular with a positive diagonal."""
        if q.shape[-1:] != (self.dim,):
            raise ValueError(f"q must have shape (..., {self.dim}), got {tuple(q.shape)}")
        if self.constant_mass:
            raw = self.mass_params.expand(*q.shape[:-1], -1)
        else:
            raw = self.mass_net(q) + self.mass_bias
        raw = torch.where(self.tril.diagonal_mask(), nn.functional.softplus(raw), raw)
        return self.tril(raw)

    def mass_matrix(self, q: Tensor) -> Tensor:
        """M_θ(q) = L Lᵀ + εI, shape ``(..., dim, dim)``: symmetric positive definite."""
        L = self.cholesky_factor(q)
        eye = torch.eye(self.dim, dtype=L.dtype, device=L.device)
        return L @ L.mT + self.eps * eye

    def kinetic(self, q: Tensor, p: Tensor) -> Tensor:
        """½ pᵀ M_θ(q)⁻¹ p."""
        M = self.mass_matrix(q)
        v = torch.linalg.solve(M, p.unsqueeze(-1)).squeeze(-1)
        return 0.5 * (p * v).sum(-1)

    def hamiltonian(self, q, p, t=0.0):
        _check_state(q, p, self.dim)
        return self.kinetic(q, p) + self.potential(q)

    # Constant mass: H = ½ pᵀM⁻¹p + V(q) is separable; the kick/drift halves in closed form.
    def velocity(self, p, t=0.0):
        if not self.constant_mass:
            return super().velocity(p, t)
        M = self.mass_matrix(p.new_zeros(p.shape[:-1] + (self.dim,)))
        return torch.linalg.solve(M, p.unsqueeze(-1)).squeeze(-1)

    def force(self, q, t=0.0):
        if not self.constant_mass:
            return super().force(q, t)
        if self.potential.closed_form_grad and not q.is_complex():
            return -self.potential.input_grad(q)
        return -grad_of(self.potential, (q,))[0]

    def gradients(self, q, p, t=0.0):
        if self.constant_mass:
            _check_state(q, p, self.dim)
            return -self.force(q, t), self.velocity(p, t)
        return super().gradients(q, p, t)


class TrilFill(nn.Module):
    r"""values (..., n(n+1)/2) ↦ L (..., n, n), lower triangular with the values in
    ``torch.tril_indices`` order: the factor of every learned SPD/PSD matrix here
    (M_θ = LLᵀ + εI of :class:`MechanicalHNN`, the dampings C_θ = LLᵀ of ``nn.dissipative``)."""

    def __init__(self, n: int):
        super().__init__()
        rows, cols = torch.tril_indices(n, n)
        self.n = n
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)

    @property
    def size(self) -> int:
        """n(n+1)/2, the number of values."""
        return len(self.rows)

    def diagonal_mask(self) -> Tensor:
        return self.rows == self.cols

    def diagonal_values(self, value: float) -> Tensor:
        """The values of L = value·I (default dtype): the start of a learned factor."""
        return torch.where(self.rows == self.cols, value, 0.0).to(torch.get_default_dtype())

    def forward(self, values: Tensor) -> Tensor:
        L = values.new_zeros(*values.shape[:-1], self.n, self.n)
        # An out-of-place scatter keeps the graph simple (no in-place write on a leaf-derived view).
        flat = L.reshape(*L.shape[:-2], -1)
        idx = (self.rows * self.n + self.cols).expand(*values.shape[:-1], -1)
        return flat.scatter(-1, idx, values).reshape(L.shape)


class MLPVectorField(System):
    r"""An unstructured learned field (dq, dp) = f_θ(q, p) = MLP(cat[q, p]) split in two halves:
    the Neural ODE baseline (Chen et al., NeurIPS 2018).  No energy, not symplectic.

    ``forward(t, x)`` takes the flat state x = cat[q, p] (torchdiffeq's ``func(t, y)``);
    ``vector_field(q, p, t)`` lets the integrators and :func:`rollout` step it."""

    def __init__(self, dim: int, *, width: int = 200, depth: int = 2, activation="tanh",
                 init: str = "orthogonal"):
        super().__init__()
        check_int(dim, "dim", 1)
        self.dim = dim
        self.net = MLP(2 * dim, 2 * dim, width=width, depth=depth, activation=activation, init=init)

    def forward(self, t, x):
        return self.net(x)

    def vector_field(self, q, p, t=0.0):
        _check_state(q, p, self.dim)
        out = self.net(torch.cat([q, p], -1))
        return out[..., :self.dim], out[..., self.dim:]


__all__ = ["HNN", "SeparableHNN", "MechanicalHNN", "MLPVectorField", "MLP", "ScalarMLP",
           "ACTIVATIONS", "TrilFill"]
