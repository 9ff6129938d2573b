"""storage_node package."""
