"""PySyft 0.2's import path ``syft.federated.floptimizer``: ``from
pointers.federated.floptimizer import Optims`` (Part 2). A re-export of
:class:`pointers.Optims` (:mod:`pointers.compat`)."""

from pointers.compat import Optims

__all__ = ["Optims"]
