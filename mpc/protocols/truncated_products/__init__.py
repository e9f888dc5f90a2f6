"""Truncate values and multiply the results in the same round: after a truncation each
party's share is a public value plus a mask the dealer knows up to a public bit, so the
products of freshly truncated values need no opening of their own. The client side is
:mod:`mpc.protocols.truncated_products.run`, the steps
:mod:`mpc.protocols.truncated_products.steps`."""
