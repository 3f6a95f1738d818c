"""Opacus -> JAX bridge: Poisson lots as fixed-shape, masked, sharded arrays."""
