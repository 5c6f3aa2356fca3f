"""Checks of a running server (catalogs, probes) and the nmt-eval wrapper."""
