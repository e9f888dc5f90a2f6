"""CrypTen's ``crypten.common``: ``serial.register_safe_class``."""

from mpc.crypten.common import serial

__all__ = ["serial"]
