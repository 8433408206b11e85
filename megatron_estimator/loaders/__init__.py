"""Readers of launch inputs other than a plain command line (launch scripts, ...)."""
