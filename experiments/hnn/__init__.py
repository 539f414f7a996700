"""HNN study: Greydanus et al.'s tasks, trained by derivative matching, through symplectic
rollouts, with the discretization-map residual loss, and as a Neural ODE.

``python -m experiments.hnn.run --task spring|pendulum|twobody [--quick]``;
``experiments.hnn.demo_pendulum(seconds=60)`` for the main demo.
"""


def demo_pendulum(seconds: float = 60.0, progress: bool = True, **options) -> dict:
    """See :func:`experiments.hnn.demo.demo_pendulum` (imported lazily: scipy, torchdiffeq)."""
    from .demo import demo_pendulum as _demo
    return _demo(seconds, progress, **options)


__all__ = ["demo_pendulum"]
