"""Audit tools over a batch's log: the digest chain, replay with checks, export, completion.

Library code for the `replay`, `verify`, `export` and `audit` commands; it reads
events (from a store or an export) and git, and writes nothing but what it is asked to.
"""
