"""mpc: additive secret sharing over Z/2^64 beneath torch tensors and models.

>>> import torch, pointers as pt, mpc
>>> alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))
>>> x = mpc.share(torch.tensor([1.5, -2.0]), alice, bob, crypto_provider=carol)
>>> (x * x + 1).get()
tensor([3.2500, 5.0000])
"""

from mpc import ops as _ops  # noqa: F401  (fills the op registry)
from mpc.accounting import Recorder, stats
from mpc.api import get, share
from mpc.authenticated import AuthenticatedTensor
from mpc.config import MPCConfig
from mpc.debugging import DebugMismatch, DebugRefused, DebugRevealWarning, debug
from mpc.errors import (
    CryptoProviderRequired,
    MACCheckError,
    MPCError,
    PartyMismatchError,
    ShapeError,
    UnsupportedOpError,
)
from mpc.generation import approve_generation, generate
from mpc.held import Approval, HeldError, HeldShared, approve, offer, plan, save_offer
from mpc.math.encoding import EncodingError, FixedPointRangeWarning
from mpc.offered import offered
from mpc.plan import SharedPlan, preprocess
from mpc.release import OwnedShared, OwnedSum, ReleaseRuleError
from mpc.secure_aggregation import SecureAggregator, secure_fedavg
from mpc.session import Session
from mpc.shared import SharedTensor

__all__ = [
    "Approval",
    "AuthenticatedTensor",
    "CryptoProviderRequired",
    "DebugMismatch",
    "DebugRefused",
    "DebugRevealWarning",
    "EncodingError",
    "FixedPointRangeWarning",
    "HeldError",
    "HeldShared",
    "MACCheckError",
    "MPCConfig",
    "MPCError",
    "OwnedShared",
    "OwnedSum",
    "PartyMismatchError",
    "Recorder",
    "ReleaseRuleError",
    "SecureAggregator",
    "Session",
    "ShapeError",
    "SharedPlan",
    "SharedTensor",
    "UnsupportedOpError",
    "approve",
    "approve_generation",
    "debug",
    "generate",
    "get",
    "offer",
    "offered",
    "secure_fedavg",
    "plan",
    "preprocess",
    "save_offer",
    "share",
    "stats",
]
