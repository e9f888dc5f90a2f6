"""Functions the parties' and the dealer's workers run (registered with each worker).

These run *where the data lives*: the dealer (crypto provider) expands every party's seed
to compute correlated randomness and ships one correction tensor to the last party; each
party expands its own seed locally. The orchestrating client only passes object ids and
public parameters (shapes, nonces); it never sees a seed, a triple or a mask.

Seed expansion: a party's 16-byte seed ``s`` and a public ``(nonce, tag)`` give the key
``AES_s(nonce || tag)`` of a fresh AES counter-mode stream (AES as a PRF), so each piece of
material has its own stream and both sides derive it without talking.
"""

from __future__ import annotations

from mpc.material.dealer import (
    dealer_compare,
    dealer_fourier,
    dealer_triple,
    dealer_trunc,
    new_seed,
)
from mpc.material.fss import dealer_fss, fss_eval, fss_unpack
from mpc.material.fss_relu import FUNCTIONS as FSS_RELU_FUNCTIONS
from mpc.material.held import FUNCTIONS as HELD_FUNCTIONS
from mpc.material.owned import release_sum
from mpc.material.party import (
    beaver_combine,
    beaver_mask,
    bilinear_public,
    carry_step,
    cmp_bit_finish,
    cmp_bit_mask,
    cmp_init,
    cmp_mask,
    cmp_select_finish,
    dabit_mask,
    dabit_product,
    fourier_finish,
    group_mask,
    group_select,
    open_unpack,
    pack,
    party_derive,
    share_from_seed,
    trunc_finish,
    trunc_mask,
    unpack,
)
from mpc.material.sizes import declare
from mpc.material.streams import TAG_T_ARITH, consume, derive
from mpc.material.tprod import dealer_trunc_products, trunc_products
from mpc.material.weights import (
    dealer_weight,
    dealer_weight_triple,
    weight_mask,
    weight_product,
    weight_product_mask,
)

FUNCTIONS = {
    "mpc.cmp_select_finish": cmp_select_finish,
    "mpc.cmp_mask": cmp_mask,
    "mpc.dabit_mask": dabit_mask,
    "mpc.dabit_product": dabit_product,
    "mpc.cmp_init": cmp_init,
    "mpc.carry_step": carry_step,
    "mpc.cmp_bit_mask": cmp_bit_mask,
    "mpc.cmp_bit_finish": cmp_bit_finish,
    "mpc.bilinear_public": bilinear_public,
    "mpc.new_seed": new_seed,
    "mpc.dealer_triple": dealer_triple,
    "mpc.dealer_trunc": dealer_trunc,
    "mpc.dealer_compare": dealer_compare,
    "mpc.dealer_fourier": dealer_fourier,
    "mpc.fourier_finish": fourier_finish,
    "mpc.derive": party_derive,
    "mpc.beaver_mask": beaver_mask,
    "mpc.beaver_combine": beaver_combine,
    "mpc.trunc_mask": trunc_mask,
    "mpc.trunc_finish": trunc_finish,
    "mpc.share_from_seed": share_from_seed,
    "mpc.pack": pack,
    "mpc.open_unpack": open_unpack,
    "mpc.unpack": unpack,
    "mpc.release_sum": release_sum,
    "mpc.group_mask": group_mask,
    "mpc.group_select": group_select,
    "mpc.dealer_weight": dealer_weight,
    "mpc.dealer_weight_triple": dealer_weight_triple,
    "mpc.weight_mask": weight_mask,
    "mpc.weight_product_mask": weight_product_mask,
    "mpc.weight_product": weight_product,
}

FUNCTIONS.update(
    {"mpc.dealer_fss": dealer_fss, "mpc.fss_unpack": fss_unpack, "mpc.fss_eval": fss_eval}
)
FUNCTIONS.update(
    {"mpc.dealer_trunc_products": dealer_trunc_products, "mpc.trunc_products": trunc_products}
)

FUNCTIONS.update(FSS_RELU_FUNCTIONS)  # (the one-round ReLU of a product; sized there)
FUNCTIONS.update(HELD_FUNCTIONS)  # (the model owner's step: sized where it is defined)

declare(FUNCTIONS)  # what each allocates, checked before it runs (mpc.material.sizes)

# the steps whose outputs are protocol material (sealed at the workers; see rules.py)
MAKES_MATERIAL = frozenset(
    {
        "mpc.dealer_fss",
        "mpc.dealer_fss_relu",
        "mpc.dealer_trunc_products",
        "mpc.fss_unpack",  # (mpc.fss_eval: sealed only when it selects; see rules.py)
        "mpc.new_seed",
        "mpc.dealer_triple",
        "mpc.dealer_trunc",
        "mpc.dealer_compare",
        "mpc.dealer_fourier",
        "mpc.dealer_weight",
        "mpc.dealer_weight_triple",
        "mpc.weight_mask",
        "mpc.weight_product_mask",
        "mpc.derive",
        "mpc.beaver_mask",
        "mpc.trunc_mask",
        "mpc.cmp_mask",
        "mpc.cmp_init",
        "mpc.carry_step",
        "mpc.cmp_bit_mask",
        "mpc.dabit_mask",
        "mpc.dabit_product",
        "mpc.pack",
        "mpc.unpack",
        "mpc.open_unpack",
        "mpc.group_mask",
    }
)

__all__ = ["FUNCTIONS", "MAKES_MATERIAL", "TAG_T_ARITH", "consume", "derive"]
