"""The performance history: every run in a database (SQLite or PostgreSQL), change points in
each series with their cause, and views of it (docs/history.md)."""
