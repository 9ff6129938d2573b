"""smartnic package."""
