"""The per-node SQLite store: schema (a contract users write SQL against), writer, read-only queries."""
