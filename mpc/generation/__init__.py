"""Private text generation: greedy decoding of a shared causal language model as one
recorded program per party for the prefill and one for every token
(:mod:`mpc.generation.decoding`), on a model the client shared or one its owner shares
from its worker (:mod:`mpc.generation.held`)."""

from mpc.generation.decoding import Decoder, PlainPrograms
from mpc.generation.generate import generate, programs
from mpc.generation.held import HeldPrograms, approve_generation

__all__ = ["Decoder", "HeldPrograms", "PlainPrograms", "approve_generation", "generate", "programs"]
