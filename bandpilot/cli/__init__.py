"""Command-line interface: thin wrappers over library functions (one module per command group)."""
