"""compute_node package."""
