"""Where a node keeps things and where it listens, defined once: the agent, the API, the fleet
client, the CLI and the Ansible collection (its plugins read these; its roles' and playbooks'
defaults are checked against them by the tests) all take their defaults from here.

Nothing but constants: no imports from the rest of straggler.
"""
import os

AGENT_PORT = 7433                                   # the agent's HTTPS API (straggler serve / trace --listen)
LISTEN = f"0.0.0.0:{AGENT_PORT}"
METRICS_LISTEN = "127.0.0.1:9433"                   # the optional plain /metrics port (loopback only by default)
DB_PATH = "/var/lib/straggler/straggler.db"         # the node's store

# A node's TLS files (written by the pki role; read by the agent and any client on the node)
TLS_DIR = "/etc/straggler/tls"
CA_FILE_NAME = "ca.crt"                             # the fleet CA's certificate
CERT_FILE_NAME = "node.crt"                         # this node's certificate ...
KEY_FILE_NAME = "node.key"                          # ... and its key (0600)
CRL_FILE_NAME = "crl.pem"                           # the fleet CA's revocation list, beside ca.crt
CA_FILE = os.path.join(TLS_DIR, CA_FILE_NAME)
CERT_FILE = os.path.join(TLS_DIR, CERT_FILE_NAME)
KEY_FILE = os.path.join(TLS_DIR, KEY_FILE_NAME)
CRL_FILE = os.path.join(TLS_DIR, CRL_FILE_NAME)
