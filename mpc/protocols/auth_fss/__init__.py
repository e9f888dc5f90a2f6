"""The authenticated comparison with zero by function secret sharing (2 parties,
``security="malicious"`` with ``comparison="fss"``): one checked opening, then a DCF
whose payload is the bit's value and its MAC. The client side is
:mod:`mpc.protocols.auth_fss.run`; the steps and why it is sound,
:mod:`mpc.protocols.auth_fss.steps`."""
