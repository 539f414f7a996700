"""Maps shared by the property tests: every DiscretizationMap the library can build."""
import torch

import torchgeo_int as tgi


def warped(x, v):
    """A nonlinear retraction on Rⁿ: R_x(0) = x and D_vR_x(0) = Id, but curved."""
    return x + v + 0.3 * torch.tanh(x) * v ** 2 + 0.1 * v ** 3


class GenericLinear(tgi.DiscretizationMap):
    """The α-map forced through the generic (torch.func + dense solve) code paths."""

    def __init__(self, alpha):
        super().__init__()
        self.inner = tgi.AlphaMap(alpha)

    def _forward(self, x, v):
        return self.inner._forward(x, v)


def base_maps():
    return {
        "forward_euler": tgi.ForwardEulerMap(),
        "midpoint": tgi.MidpointMap(),
        "backward_euler": tgi.BackwardEulerMap(),
        "alpha0.3": tgi.AlphaMap(0.3),
        "generic_alpha0.3": GenericLinear(0.3),
        "retraction_mid": tgi.RetractionMap(warped, 0.5),
        "retraction_0.2": tgi.RetractionMap(warped, 0.2),
        "adjoint_retraction_0.2": tgi.AdjointMap(tgi.RetractionMap(warped, 0.2)),
    }


def all_maps():
    maps = dict(base_maps())
    for name, R in base_maps().items():
        maps[f"T({name})"] = tgi.TangentLift(R)
        maps[f"T*({name})"] = tgi.CotangentLift(R)
    maps["T(T(alpha0.3))"] = tgi.TangentLift(tgi.TangentLift(tgi.AlphaMap(0.3)))
    maps["T(T(retraction_mid))"] = tgi.TangentLift(tgi.TangentLift(tgi.RetractionMap(warped, 0.5)))
    return maps


def dim_of(R, n=3):
    """Coordinate dimension of a point for map R, built from base dim n."""
    if isinstance(R, (tgi.TangentLift, tgi.CotangentLift)):
        return 2 * dim_of(R.base, n)
    return n
