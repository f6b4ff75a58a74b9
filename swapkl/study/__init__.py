"""A study across models: one contract, one analysis per model (cached, resumable, shardable), the table and
its statements (docs/study.md)."""
