"""Amaranth 0.5 gateware of the inagg switch."""
