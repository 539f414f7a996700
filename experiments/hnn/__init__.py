"""HNN study: Greydanus et al.'s tasks, trained by derivative matching, through symplectic
rollouts, with the discretization-map residual loss, and as a Neural ODE.

``python -m experiments.hnn.run --task spring|pendulum|twobody [--quick]``;
``experiments.hnn.demo_pendulum(steps=3000)`` for the main demo.
"""


def demo_pendulum(steps: int = 3000, progress: bool = True, **options) -> dict:
    """See :func:`experiments.hnn.demo.demo_pendulum` (imported lazily: scipy, torchdiffeq)."""
    from .demo import demo_pendulum as _demo
    return _demo(steps, progress, **options)


__all__ = ["demo_pendulum"]
