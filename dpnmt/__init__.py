"""dpnmt: differentially-private neural machine translation in JAX."""

__version__ = "0.1.0"
