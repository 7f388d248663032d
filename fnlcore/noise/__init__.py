"""Label noise for federated learning: client-level schedules, sample-level flips, H-IDN, partial labels.

Public API
----------
Specs and registry (what a config entry becomes):
    NoiseSpec, CleanNoise, FedCorrNoise, FedNoRoHIDN, FedNCLBernoulli, FedNCLGaussian,
    FedGRNoise, SymmetricNoise, AsymmetricNoise, FedMLPPartial,
    NOISE_MODELS, noise_spec_from_dict, noise_models_markdown
Generators (functions the specs call):
    clean_noise, fedcorr_noise, fedncl_bernoulli_noise, fedncl_gaussian_noise, fedgr_noise,
    symmetric_noise, asymmetric_noise, hidn_noise, fednoro_noisy_clients,
    fedmlp_active_classes, apply_partial_labels, fedmlp_partial_noise
Result and artifacts:
    NoiseResult, noise_summary, transition_counts, write_noise_artifacts, noise_frame,
    read_noise, NoiseTable
Building blocks: modules ``schedules``, ``flips``, ``maps``.

Seed convention (fnlcore.rng): a generator called with seed s draws what the
official code draws right after ``np.random.seed(s)`` (``random.seed(s)`` for
FedMLP's class sets), from a private RandomState, in the official order.
"""

from . import flips, maps, schedules
from .artifacts import NoiseTable, noise_frame, read_noise, write_noise_artifacts
from .generators import (
    asymmetric_noise,
    clean_noise,
    fedcorr_noise,
    fedgr_noise,
    fedncl_bernoulli_noise,
    fedncl_gaussian_noise,
    symmetric_noise,
)
from .hidn import fednoro_noisy_clients, hidn_noise
from .partial import apply_partial_labels, fedmlp_active_classes, fedmlp_partial_noise
from .registry import NOISE_MODELS, noise_models_markdown, noise_spec_from_dict
from .result import NoiseResult
from .specs import (
    AsymmetricNoise,
    CleanNoise,
    FedCorrNoise,
    FedGRNoise,
    FedMLPPartial,
    FedNCLBernoulli,
    FedNCLGaussian,
    FedNoRoHIDN,
    NoiseSpec,
    SymmetricNoise,
)
from .summary import noise_summary, transition_counts

__all__ = [
    "NOISE_MODELS",
    "AsymmetricNoise",
    "CleanNoise",
    "FedCorrNoise",
    "FedGRNoise",
    "FedMLPPartial",
    "FedNCLBernoulli",
    "FedNCLGaussian",
    "FedNoRoHIDN",
    "NoiseResult",
    "NoiseSpec",
    "NoiseTable",
    "SymmetricNoise",
    "apply_partial_labels",
    "asymmetric_noise",
    "clean_noise",
    "fedcorr_noise",
    "fedgr_noise",
    "fedmlp_active_classes",
    "fedmlp_partial_noise",
    "fedncl_bernoulli_noise",
    "fedncl_gaussian_noise",
    "fednoro_noisy_clients",
    "flips",
    "hidn_noise",
    "maps",
    "noise_frame",
    "noise_models_markdown",
    "noise_spec_from_dict",
    "noise_summary",
    "read_noise",
    "schedules",
    "symmetric_noise",
    "transition_counts",
    "write_noise_artifacts",
]
