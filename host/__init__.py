"""The host side: RoCEv2 workers that all-reduce through an inagg switch."""
