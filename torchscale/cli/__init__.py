"""The command-line layer: thin Typer commands over the pipeline modules."""
