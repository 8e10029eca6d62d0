"""Adapter memory on a replica: the paged device slab and the host tier in front of it."""
