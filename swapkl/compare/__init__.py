"""Two checkpoints side by side (docs/compare.md): the rank agreement of their swap-KL, the transfer of the pruning
decision from one to the other, and the demo bundle of a finished analysis."""
