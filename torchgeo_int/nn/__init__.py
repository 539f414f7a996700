"""Hamiltonian neural networks trained through structure-preserving steps.

modules (learned Hamiltonians) → layers (steps and rollouts as nn.Modules) → losses
(rollout, discretization-map residual, derivative matching), shooting (whole trajectories with
learned initial / shooting-node states) and correction (modified-Hamiltonian series, backward
error analysis) → training (fit, checkpoints) and
metrics (rollout/energy errors, ε_H).  Everything steps through ``torchgeo_int``'s integrators.
"""
from .dissipative import (InputMap, PSDMatrix, PortHamiltonianNN, StateDamping,
                          forced_derivative_loss, forced_residual_loss, forced_rollout_loss)
from .layers import SymplecticRollout, SymplecticStep
from .losses import (derivative_loss, finite_differences, make_windows, residual_loss,
                     rollout_loss)
from .metrics import (energy_drift, energy_mse, hamiltonian_error, predict, rollout_mse,
                      state_mse)
from .modules import HNN, MLP, MLPVectorField, MechanicalHNN, PairDistances, ScalarMLP, SeparableHNN
from .correction import (CorrectedHamiltonian, InverseModifiedHamiltonian, ModifiedHamiltonian,
                         correct_hamiltonian, modified_hamiltonian)
from .optim import LazyAdam
from .shooting import TrajectoryFit
from .training import (TensorBatches, fit, load_checkpoint, make_optimizer, save_checkpoint,
                       seed_everything)

__all__ = [
    "HNN", "SeparableHNN", "MechanicalHNN", "MLPVectorField", "MLP", "ScalarMLP", "PairDistances",
    "SymplecticStep", "SymplecticRollout",
    "rollout_loss", "residual_loss", "derivative_loss", "finite_differences", "make_windows",
    "fit", "seed_everything", "make_optimizer", "TensorBatches", "save_checkpoint",
    "load_checkpoint",
    "TrajectoryFit", "LazyAdam", "ModifiedHamiltonian", "CorrectedHamiltonian",
    "InverseModifiedHamiltonian", "modified_hamiltonian", "correct_hamiltonian",
    "predict", "state_mse", "rollout_mse", "energy_mse", "energy_drift", "hamiltonian_error",
    "PortHamiltonianNN", "PSDMatrix", "StateDamping", "InputMap", "forced_rollout_loss",
    "forced_residual_loss", "forced_derivative_loss",
]
