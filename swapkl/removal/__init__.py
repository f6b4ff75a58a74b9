"""Layer removal: scores to removal sets (selection), the regime verdict, perplexity evaluation and its memo, the
removal-curve runner, the recommendation and the removal methods (one file each)."""
