"""``reproduce three-spaces``: one MLP, its function-, parameter- and activation-space decompositions read in its
input space, against ground truth (toys) and against each other (all settings)."""
