"""Benchmarks of torchgeo_int: ``python -m experiments.bench [--quick]`` runs them all.

* ``work_precision``  error vs wall time / force evaluations, every method, Kepler and the outer
  solar system; long-time energy error.
* ``throughput``      steps·trajectories/s vs batch size, against a hand-written loop and
  torchdiffeq; eager and ``compile=True``.
* ``training_cost``   time and memory of one HNN training step: rollout loss vs derivative
  matching vs Neural ODE (torchdiffeq, backprop and adjoint).
* ``gpu``             the throughput table on CUDA (batches up to 10⁶–10⁷, float32/float64).

Not in the default run: ``compare_trees`` (``python experiments/bench/compare_trees.py --before
PATH --after PATH``), representative throughput and memory rows of two checkouts, interleaved
(a refactor's before/after).

Results go to ``results/bench/`` (markdown, JSON, PNG).  Timings on a shared machine are noisy:
every ratio is measured side by side in one run, best of several repeats.
"""
