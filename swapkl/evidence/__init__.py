"""How far to trust a ranking: ground truth, agreement and stability for every layer signal (docs/evidence.md)."""
