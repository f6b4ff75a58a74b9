"""What swapkl supports, measured: one model type checked on a tiny random model (check) and the support table of
every model type of the installed transformers (table)."""
