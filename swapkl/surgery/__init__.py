"""Model surgery: pruned copies (blocks removed), merged copies (blocks averaged) and writing them as model folders."""
