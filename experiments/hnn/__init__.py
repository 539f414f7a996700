"""HNN study: Greydanus et al.'s tasks, trained by derivative matching, through symplectic
rollouts, with estimated states (TrajectoryFit), with the discretization-map residual loss, and
as a Neural ODE.

``python -m experiments.hnn.run --task spring|pendulum|twobody|twobody_noisy [--quick]``;
``experiments.hnn.demo_hnn(steps=600)`` for the main demo.
"""


def demo_hnn(steps: int = 600, progress: bool = True, **options) -> dict:
    """See :func:`experiments.hnn.demo.demo_hnn` (imported lazily: scipy, torchdiffeq)."""
    from .demo import demo_hnn as _demo
    return _demo(steps, progress, **options)


__all__ = ["demo_hnn"]
