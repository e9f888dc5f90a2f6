"""The malicious mode (``security="malicious"``): authenticated shares, SPDZ2k-style, with
material dealt and authenticated by the crypto provider. A party that deviates from the
protocol is caught by the MAC check before any output reaches the client
(docs/security.md). :class:`AuthenticatedTensor` is its shared tensor; its ops are
:mod:`mpc.authenticated.ops` and :mod:`mpc.authenticated.nonlinear`, its protocols the
``auth_*`` and ``mac_check`` folders of :mod:`mpc.protocols`."""

from mpc.authenticated import nonlinear as _nonlinear  # noqa: F401  (fills the op table)
from mpc.authenticated import ops as _ops  # noqa: F401
from mpc.authenticated.share import share_authenticated_any
from mpc.authenticated.tensor import AuthenticatedTensor, share_authenticated

__all__ = ["AuthenticatedTensor", "share_authenticated", "share_authenticated_any"]
