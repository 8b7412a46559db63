"""HTML and PDF reports: results -> analysis tables -> charts -> templates -> one file.

``data`` loads a results folder, ``content`` turns its tables into sections (tables and neutral
chart specs), ``plotly_charts`` / ``svg_charts`` draw the specs for HTML / PDF, and ``render``
fills the Jinja2 templates and writes the file atomically.
"""
