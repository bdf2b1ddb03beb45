"""The agent's HTTPS API (mutual TLS): each node answers for its own database. See server.py."""
