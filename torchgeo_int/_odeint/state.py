"""How odeint's y0 and func become a System and states (q, p) or x: the user's function wrapped
once, the flat and partitioned layouts, the two System subclasses, and the cache of systems
built for compiled calls."""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

from .._cache import IdentityCache
from .._validate import check_own_methods, check_placement
from ..systems import Hamiltonian, VectorFieldSystem, check_energy, grad_of
from .contract import perturbed
from .methods import FIRST_ORDER_METHOD_NAMES

class TimePool:
    """Fresh 0-d CPU tensors holding given times, ``SIZE`` at a time: the 0-d views of one
    numpy-backed buffer (one ``unbind``), each slot written once, when handed out, and never
    reused (a func that keeps its t keeps its value), as torchdiffeq's t[i] are views of its
    grid.  Why: a tensor made per call (``torch.from_numpy(np.array(t))``, the cheapest single
    one) costs ≈ 0.9 µs with its release; a slot costs a numpy store and a list index plus its
    share of the ``unbind`` (≈ 0.6 µs in all).  Against a tensor made per call, in one
    process: 3 % off a 64-trajectory Kepler Verlet step of odeint (issue 20's gap to a hand
    loop that passes one t throughout)."""

    SIZE = 1024

    def __init__(self, np_dtype):
        self.np_dtype, self.i, self.values, self.views = np_dtype, self.SIZE, None, ()

    def __call__(self, t):
        i = self.i
        if i == self.SIZE:
            self.values = np.empty(self.SIZE, dtype=self.np_dtype)
            self.views, i = torch.from_numpy(self.values).unbind(0), 0
        self.values[i] = t      # (one IEEE rounding of the float to the dtype, as np.array's)
        self.i = i + 1
        return self.views[i]


class UserFunc:
    """Calls func(t, y) the way torchdiffeq does: t a 0-d tensor of y's dtype, grad mode as at
    the call of odeint.  Inside the solvers' no-grad iterations of a grad-mode call the state is
    handed over as a fresh leaf that requires grad, so a func that differentiates itself with
    torch.autograd.grad (torchdiffeq issue #154) runs; its outputs are detached again."""

    def __init__(self, func, dtype, device, grad):
        self.func, self.dtype, self.device, self.grad = func, dtype, device, grad
        self.window = None      # (start, end) of the step being taken, under options['perturb']
        self.time_map = None    # a contract.TimeMap, when t requires grad
        # Every call of func needs a fresh 0-d t (a func may keep it); on the CPU it comes from
        # a TimePool (below), on other devices from torch.full
        np_dtype = (None if torch.device(device).type != "cpu" else
                    {torch.float64: np.float64, torch.float32: np.float32}.get(dtype))
        self.pool = None if np_dtype is None else TimePool(np_dtype)

    def scale(self, out):
        """out multiplied by the time map's c (the field of a rescaled step; contract.TimeMap)."""
        return out if self.time_map is None else self.time_map.scale(out)

    def tensor_time(self, t):
        """A fresh 0-d tensor t of y's dtype (compiled graphs pass t as a tensor already)."""
        if isinstance(t, torch.Tensor):
            return t.to(self.dtype)
        if self.pool is not None:
            return self.pool(t)
        return torch.full((), t, dtype=self.dtype, device=self.device)

    def plain(self):
        """Whether a call is func(t, y) itself: no perturbed window, no time map, and not a
        no-grad iteration of a grad-mode call."""
        return (self.window is None and self.time_map is None
                and (not self.grad or torch.is_grad_enabled()))

    def __call__(self, t, y):
        tt = self.tensor_time(t)
        if self.plain():
            return self.func(tt, y)   # the usual call, without the frames below
        if self.window is not None:
            tt = perturbed(tt, self.window)
        if self.time_map is not None:
            return self.scale(self._call(self.time_map.time(tt), y))
        return self._call(tt, y)

    def _call(self, tt, y):
        if not self.grad or torch.is_grad_enabled():
            return self.func(tt, y)
        with torch.enable_grad():
            ys = y if isinstance(y, tuple) else (y,)
            ys = tuple(c.detach().requires_grad_() for c in ys)
            out = self.func(tt, ys if isinstance(y, tuple) else ys[0])
        if isinstance(out, torch.Tensor):
            return out.detach()
        if isinstance(out, (tuple, list)):
            items = [o.detach() if isinstance(o, torch.Tensor) else o for o in out]
            return type(out)(*items) if hasattr(out, "_fields") else type(out)(items)  # (a namedtuple)
        return out


def check_out(out, shape, what):
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{what} must return tensors like y0, got {type(out).__name__}")
    if out.shape != shape:
        raise ValueError(f"{what} returned shape {tuple(out.shape)}, expected {tuple(shape)} "
                         f"(the shape of the corresponding part of y0)")
    return out


class FlatState:
    """y0 (tensor or tuple) as x (*batch, N): the first batch_dims dims index samples."""

    def __init__(self, y0, batch_dims):
        self.is_tuple = isinstance(y0, tuple)
        parts = y0 if self.is_tuple else (y0,)
        for i, c in enumerate(parts):
            if c.dim() < batch_dims:
                raise ValueError(f"options['batch_dims'] = {batch_dims} exceeds the dims of y0 "
                                 f"part {i}, shape {tuple(c.shape)}")
        self.batch = parts[0].shape[:batch_dims]
        if any(c.shape[:batch_dims] != self.batch for c in parts):
            raise ValueError(f"the parts of y0 must share their first {batch_dims} (batch) dims, got "
                             f"{[tuple(c.shape) for c in parts]}")
        self.shapes = [c.shape for c in parts]
        self.sizes = [c.numel() // max(1, math.prod(self.batch)) for c in parts]
        self.x0 = torch.cat([c.reshape(*self.batch, n) for c, n in zip(parts, self.sizes)], -1)

    def unflatten(self, x):
        batch = x.shape[:-1]  # (*batch) inside a step, (L, *batch) for a trajectory
        lead = batch[:len(batch) - len(self.batch)]
        parts = tuple(c.reshape((*lead, *s)) for c, s in zip(torch.split(x, self.sizes, -1), self.shapes))
        return parts if self.is_tuple else parts[0]

    def flatten(self, out, what):
        if self.is_tuple:
            if not isinstance(out, (tuple, list)) or len(out) != len(self.shapes):
                raise TypeError(f"{what} must return a tuple of {len(self.shapes)} tensors like y0")
        parts = tuple(out) if self.is_tuple else (out,)
        return torch.cat([check_out(o, s, what).reshape(*self.batch, n)
                          for o, s, n in zip(parts, self.shapes, self.sizes)], -1)

    def assemble(self, X):
        return self.unflatten(X)


class PartitionedState:
    """(q0, p0) from a 2-tuple or the split of a tensor, each as (*batch, n)."""

    def __init__(self, y0, split, batch_dims, natural=False):
        self.is_tuple = isinstance(y0, tuple)
        # natural: (q, p) kept in the user's shapes — the parts of a tuple, the halves of a
        # tensor along its last dim — so no reshapes around each call of func
        self.natural = natural
        if self.is_tuple:
            if len(y0) != 2:
                raise ValueError(f"a partitioned method needs y0 = (q0, p0) or a tensor to split, "
                                 f"got a tuple of {len(y0)}; use a first-order method "
                                 f"({', '.join(FIRST_ORDER_METHOD_NAMES)}) for other states")
            if split is not None:
                raise ValueError("options['split'] applies to a tensor y0, not to y0 = (q0, p0)")
            q0, p0 = y0
        else:
            if y0.dim() == 0:
                raise ValueError("a partitioned method needs y0 with a last dim to split into (q, p)")
            m = y0.shape[-1]
            if split is None:
                if m % 2:
                    raise ValueError(f"y0's last dim is {m}, odd: pass options['split'] = k "
                                     f"(q = y[..., :k]) or y0 = (q0, p0)")
                split = m // 2
            if isinstance(split, bool) or not isinstance(split, int) or not 0 < split < m:
                raise ValueError(f"options['split'] must be an int in (0, {m}), got {split!r}")
            q0, p0 = y0[..., :split], y0[..., split:]
        self.split, self.y_shape = split, (None if self.is_tuple else y0.shape)
        # the halves (0: dq, 1: dp) whose output func has returned correctly once: later calls
        # skip the checks (its output layout does not change between calls; a step makes two)
        self.checked = set()
        dims = min(q0.dim(), p0.dim()) - (0 if self.is_tuple else 1)
        if batch_dims > dims:
            raise ValueError(f"options['batch_dims'] = {batch_dims} exceeds the batch dims "
                             f"available in y0 ({dims})")
        self.batch = q0.shape[:batch_dims]
        if p0.shape[:batch_dims] != self.batch:
            raise ValueError(f"q0 and p0 must share their first {batch_dims} (batch) dims, got "
                             f"{tuple(q0.shape)} and {tuple(p0.shape)}")
        self.q_shape, self.p_shape = q0.shape, p0.shape
        nb = max(1, math.prod(self.batch))
        self.nq, self.np = q0.numel() // nb, p0.numel() // nb
        if self.natural:
            self.q0, self.p0 = q0, p0
        else:
            self.q0, self.p0 = q0.reshape(*self.batch, self.nq), p0.reshape(*self.batch, self.np)

    def user(self, qi, pi):
        if self.natural:
            return qi, pi
        lead = qi.shape[:qi.dim() - 1 - len(self.batch)]
        return qi.reshape((*lead, *self.q_shape)), pi.reshape((*lead, *self.p_shape))

    def field(self, caller, func, t, qi, pi, part=None):
        """(dq, dp) of func at (qi, pi), checked; ``part`` 0 or 1: dq or dp alone (a kick or a
        drift of a separable field uses one half: the other is neither sliced, checked nor
        reshaped).  A half checked once is then called through :meth:`direct`, except where
        that declines (see there)."""
        out = self._field(caller, func, t, qi, pi, part)
        # (not while torch.compile traces: its graphs would guard on the set and recompile)
        if part is not None and self.natural and not torch.compiler.is_compiling():
            self.checked.add(part)
        return out

    def direct(self, caller, func, zeros, slow):
        """(velocity, force): functions of (x, t) that call func in one frame, or None for a
        state not in the user's own layout.  Each hands the call to its ``slow`` twin (the
        system's checked methods, through :meth:`field`) where its half is not yet checked, or
        the call needs UserFunc's other frames (not ``caller.plain()``), or torch.compile
        traces, or the output is unlike the checked one.  The other half is a kept zero tensor
        of the user's shape, from ``zeros`` (PartitionedSystem's, keyed as there).  Why: the
        checked path's five frames cost ~5 µs a call, as much as the whole 1.1× margin over a
        hand-written loop leaves at B = 4096 on Kepler (a step of two calls: ~160 µs)."""
        if not self.natural:
            return None
        checked, split, y_shape, is_tuple = self.checked, self.split, self.y_shape, self.is_tuple
        compiling, plain, Tensor = torch.compiler.is_compiling, caller.plain, torch.Tensor
        # (t is a float from the steppers: the pool's tensor without tensor_time's frame)
        pool, tensor_time = caller.pool, caller.tensor_time
        kept = [None, None]

        def make(part, slow):
            shape = (self.q_shape, self.p_shape)[part]     # the zero half's and the output's

            def call(x, t=0.0):
                if compiling() or part not in checked or not plain():
                    return slow(x, t)
                z = kept[part]
                if z is None:   # (a natural state keeps its shapes: one lookup per system)
                    z = kept[part] = zeros.setdefault((part, x.shape), x.new_zeros(shape))
                tt = pool(t) if pool is not None and type(t) is float else tensor_time(t)
                if is_tuple:
                    out = func(tt, (z, x) if part == 0 else (x, z))
                    if isinstance(out, (tuple, list)) and len(out) == 2:
                        d = out[part]
                        if isinstance(d, Tensor) and d.shape == shape:
                            return d
                    return slow(x, t)    # (the checks there name what is wrong)
                dy = func(tt, torch.cat([z, x] if part == 0 else [x, z], -1))
                if isinstance(dy, Tensor) and dy.shape == y_shape:
                    return dy[..., :split] if part == 0 else dy[..., split:]
                return slow(x, t)
            return call
        return make(0, slow[0]), make(1, slow[1])

    def _field(self, caller, func, t, qi, pi, part):
        q, p = (qi, pi) if self.natural else self.user(qi, pi)
        if self.is_tuple:
            out = caller(t, (q, p))
            if not isinstance(out, (tuple, list)) or len(out) != 2:
                raise TypeError("func must return a pair (dq, dp) for y0 = (q0, p0)")
            dq, dp = out
        else:
            # the output's shape is checked whole: its halves then have q's and p's shapes
            dy = check_out(caller(t, torch.cat([q, p], -1)), self.y_shape, "func")
            if part is not None:
                d = dy[..., :self.split] if part == 0 else dy[..., self.split:]
                return d if self.natural else d.reshape((qi, pi)[part].shape)
            dq, dp = dy[..., :self.split], dy[..., self.split:]
        if part is not None:
            d = check_out((dq, dp)[part], (q, p)[part].shape, "func")
            return d if self.natural else d.reshape((qi, pi)[part].shape)
        dq, dp = check_out(dq, q.shape, "func"), check_out(dp, p.shape, "func")
        if self.natural:
            return dq, dp
        return dq.reshape(qi.shape), dp.reshape(pi.shape)

    def assemble(self, Q, P):
        q, p = self.user(Q, P)
        return (q, p) if self.is_tuple else torch.cat([q, p], -1)


class PartitionedSystem(VectorFieldSystem):
    """The field (dq, dp) of the user's func; with separable=True each half comes from one call
    with the other half zero (q and p may differ in size, unlike VectorFieldSystem's zeros_like)."""

    tensor_time = True   # func takes t as a tensor anyway (torch.compile keeps it so)

    def __init__(self, f, separable, nq, np_, shapes=None, half=None):
        super().__init__(f, separable=separable)
        self.nq, self.np_ = nq, np_
        self.shapes = shapes        # (q, p) shapes when the state keeps the user's shapes
        self.half = half            # half(t, q, p, i): part i of f's output alone
        self._zeros = {}

    def use_direct(self, direct):
        """Take ``direct`` = (velocity, force) (``PartitionedState.direct``: func called in one
        frame, falling back to the methods below) as this system's velocity and force, where
        it is not None."""
        if direct is not None:
            self.velocity, self.force = direct
            self.force_term = self.force

    def _zeros_for(self, like, i):
        """The zeros func sees as the unused half: one tensor per shape, reused from step to
        step (a kick or drift otherwise allocates and fills one per call of func); made anew
        while torch.compile traces (a kept tensor would become a graph constant)."""
        key = (i, like.shape)   # one system per dtype and device (odeint's call, or system_for)
        z = self._zeros.get(key)
        if z is None or torch.compiler.is_compiling():
            shape = self.shapes[i] if self.shapes else (*like.shape[:-1], (self.nq, self.np_)[i])
            z = like.new_zeros(shape)
            if not torch.compiler.is_compiling():
                self._zeros[key] = z
        return z

    def velocity(self, p, t=0.0):
        if not self.separable:
            return super().velocity(p, t)
        return self.half(t, self._zeros_for(p, 0), p, 0)

    def force(self, q, t=0.0):
        if not self.separable:
            return super().force(q, t)
        return self.half(t, q, self._zeros_for(q, 1), 1)

    force_term = force   # force_sign 1: the kicks call it without a frame more


class EnergySystem(Hamiltonian):
    """X_H of the user's H(q, p); separable: ∂H/∂p at q = 0 and ∂H/∂q at p = 0, each by
    autograd in the one variable (H's gradient in the other never enters)."""

    def __init__(self, H, state, separable):
        super().__init__(lambda qi, pi: H(*state.user(qi, pi)), time_dependent=False)
        self.separable = bool(separable)
        self.nq, self.np_ = state.nq, state.np

    def velocity(self, p, t=0.0):
        if not self.separable:
            return super().velocity(p, t)
        qz = p.new_zeros(*p.shape[:-1], self.nq)
        return grad_of(lambda p_: self.energy(qz, p_), (p,))[0]

    def force(self, q, t=0.0):
        if not self.separable:
            return super().force(q, t)
        pz = q.new_zeros(*q.shape[:-1], self.np_)
        return -grad_of(lambda q_: self.energy(q_, pz), (q,))[0]


def _identity(fn) -> tuple:
    """The objects that make ``fn`` the field it is, for :data:`_SEPARABLE_CHECKED`: a bound
    method's object and function; a function's code and the objects its closure and defaults
    hold (a lambda made anew around the same model at each call of odeint is the same field);
    else fn itself."""
    if getattr(fn, "__self__", None) is not None and hasattr(fn, "__func__"):
        return (fn.__self__, fn.__func__)
    code = getattr(fn, "__code__", None)
    if code is None:
        return (fn,)
    try:
        cells = tuple(c.cell_contents for c in (fn.__closure__ or ()))
    except ValueError:        # an empty cell (a name bound later)
        return (fn,)
    return (code, *cells, *(fn.__defaults__ or ()))


#: the fields whose separable=True passed :func:`check_separable` (for states of that layout)
_SEPARABLE_CHECKED = IdentityCache(32)


def check_separable(system, fn, q, p, t, what):
    """``options['separable'] = True`` checked once per field: the halves the kicks and drifts
    take — dq/dt with q set to 0, dp/dt with p set to 0 — must equal the whole field's, at
    (t0, y0) and at y0 shifted by ⅛(1 + |y0|) (a coupling can vanish at y0: p0 = 0, a system
    started at rest), to √eps of the field's size.  A coupled field would otherwise be stepped
    as another, separable one without an error.  Seven calls of the field and one host sync,
    the first time a field is met (:func:`_identity`); a field that gives other numbers when
    called again at y0 (dropout in training mode) cannot be checked and is taken as promised."""
    key, extra = _identity(fn), (tuple(q.shape), tuple(p.shape), q.dtype, q.device)
    if _SEPARABLE_CHECKED.get(key, extra):
        return
    # (in the caller's grad mode: func sees what the steps will show it)
    q, p = q.detach(), p.detach()
    points = ((q, p), (q + 0.125 * (1 + q.abs()), p + 0.125 * (1 + p.abs())))

    def gap(a, b):             # (max |a − b|, max |a|) over the entries finite in both
        a, b = a.detach().reshape(b.shape), b.detach()
        ok = torch.isfinite(a) & torch.isfinite(b)
        zero = torch.zeros((), dtype=a.dtype, device=a.device)
        return torch.stack([torch.where(ok, (a - b).abs(), zero).amax(),
                            torch.where(ok, a.abs(), zero).amax()])
    flat = lambda f: torch.cat([x.reshape(-1) for x in f])      # noqa: E731
    first, rows = system.vector_field(q, p, t), []
    for i, (qi, pi) in enumerate(points):
        full = system.vector_field(qi, pi, t)
        rows += [gap(full[0], system.velocity(pi, t)), gap(full[1], system.force(qi, t))]
        if i == 0:             # the field called again at y0: the same numbers?
            again = gap(flat(first), flat(full))
    rows.append(again)
    tol = torch.finfo(q.dtype).eps ** 0.5
    *halves, again = [(g, max(1.0, m)) for g, m in torch.stack(rows).tolist()]
    if again[0] > tol * again[1]:     # not reproducible: nothing to compare with
        return
    for i, (g, m) in enumerate(halves):
        if g > tol * m:
            name, other = (("dq/dt", "q"), ("dp/dt", "p"))[i % 2]
            where = "y0" if i < 2 else "y0 shifted by (1 + |y0|)/8"
            raise ValueError(
                f"options['separable'] = True promises that dq/dt depends on p only and dp/dt "
                f"on q only, but {what} at t0 breaks it: at {where}, {name} with {other} set to 0 "
                f"differs from {name} by {g:.3g} (max |Δ|). Leave separable out for a coupled "
                "field (the generalized leapfrog, or implicit steps, take it whole)")
    _SEPARABLE_CHECKED.put(key, extra, True)


def partitioned_system(func, caller, state, options, t0=0.0):
    separable = options.get("separable", False)
    if not isinstance(separable, bool):
        raise ValueError(f"options['separable'] must be a bool, got {separable!r}")
    H = options.get("hamiltonian")
    if H is not None:
        if not callable(H):
            raise TypeError("options['hamiltonian'] must be callable as H(q, p) -> energy")
        if func is not None:
            raise ValueError("with options['hamiltonian'] pass func=None: the field is X_H")
        check_own_methods(H, "odeint (its methods step H's flow in R^n)")
        # H sees the user's shapes here: its output is checked against them (one value per
        # sample; per-coordinate values would be summed by the gradient into another system)
        system = EnergySystem(lambda q, p: caller.scale(
            check_energy(H(q, p), p, "options['hamiltonian']", H)), state, separable)
        register_module(system, "user_hamiltonian", H)
        # an H that is a module (or a method of one) in another dtype or on another device than
        # y0 would fail deep inside its first layer: the error rollout gives, before the run
        check_placement(system, state.q0, "y0")
        if separable:
            check_separable(system, H, state.q0, state.p0, t0, "options['hamiltonian']")
        return system
    if func is None:
        raise TypeError("func must be callable (or pass options['hamiltonian'] with func=None)")
    system = PartitionedSystem(lambda t, qi, pi: state.field(caller, func, t, qi, pi), separable,
                               state.nq, state.np,
                               (state.q_shape, state.p_shape) if state.natural else None,
                               functools.partial(state.field, caller, func))
    if separable:
        system.use_direct(state.direct(caller, func, system._zeros, (system.velocity, system.force)))
        check_separable(system, func, state.q0, state.p0, t0, "func")
    register_module(system, "user_func", func)
    return system


def register_module(system, name, fn):
    """Make the user's module (fn itself, or the module a bound method belongs to) a submodule
    of the system, so the lean gradient modes find its parameters."""
    owner = fn if isinstance(fn, torch.nn.Module) else getattr(fn, "__self__", None)
    if isinstance(owner, torch.nn.Module) and owner is not system:
        system.add_module(name, owner)


# each entry keeps its func (and compiled graphs) alive: bounded
_SYSTEMS = IdentityCache(8)


def system_for(compile, kind, func, options, state, y0, caller, build):
    """The system odeint steps: ``build()``; with ``compile`` the one an earlier call with the
    same func, options and layout of y0 built (its compiled graphs are kept per system, so a
    loop of odeint calls compiles once).  Its closures use the layout only, never y0's values.
    func and options['hamiltonian'] are matched by identity (weakly held, see ``_cache``)."""
    if not compile:
        return build()
    parts = y0 if isinstance(y0, tuple) else (y0,)
    H = options.get("hamiltonian")
    extra = (kind, options.get("separable", False), options.get("split"),
             options.get("batch_dims", 0), isinstance(y0, tuple), tuple(c.shape for c in parts),
             getattr(state, "natural", False),   # the layout its closures were built for
             caller.dtype, caller.device, caller.grad)
    hit = _SYSTEMS.get((func, H), extra)
    if hit is not None:
        return hit
    return _SYSTEMS.put((func, H), extra, build())
