"""Layer removal: scores to removal sets (selection), the regime verdict, the removal-curve runner, the
recommendation and the removal methods (one file each); what they measure with is :mod:`swapkl.measure`."""
