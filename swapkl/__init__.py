"""swapkl: protocol-aware layer redundancy (replacement vs interchange swap-KL) for transformer LMs."""
__version__ = "0.1.0"
