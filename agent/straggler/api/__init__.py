"""The agent's HTTPS API (mutual TLS): each node answers for its own database.

transport.py: the bytes on the wire (streams, TLS, HTTP/1.1 heads, sending under a deadline);
routes.py: what a request means (routes, roles, JSON bodies, the answers); server.py: which
connections are served and how (accept loop, per-peer caps, pools, start_background); metrics.py:
the Prometheus exposition and its plain loopback port. The command is cli/serve.py: no argparse here.
"""
