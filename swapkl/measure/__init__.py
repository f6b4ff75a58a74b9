"""Measuring a model, whatever chose it: held-out perplexity (the evaluator, its windows, its memo and prefix
sharing), lm-eval task accuracy (the runner and its cache) and what a removal gains (speed, memory, parameters)."""
