"""The experiments' write-ups and checks: the position study, the length study, the synthetic
length-generalization check."""
