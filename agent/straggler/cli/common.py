"""What several commands share: the node database option (--db), the TLS options
(--ca/--cert/--key/--no-tls/…) with the TLSOptions they make, and the plain /metrics port's options."""
from .. import defaults
from ..tls import DEFAULT_CA, DEFAULT_CERT, DEFAULT_CRL, DEFAULT_KEY, TLSOptions


def add_db_argument(parser):
    """Add --db/-d, the node's database (status, query, snapshot)."""
    parser.add_argument("--db", "-d", default=defaults.DB_PATH,
                        help=f"the node's database (default {defaults.DB_PATH})")


def add_tls_arguments(parser):
    """Add --ca --cert --key --no-tls --no-tls-any-address (and --tls-server-name) to a parser."""
    group = parser.add_argument_group("TLS (mutual, TLS 1.3 only)")
    group.add_argument("--ca", default=DEFAULT_CA, metavar="FILE",
                       help=f"the fleet CA certificate that signs every node and client certificate (default {DEFAULT_CA})")
    group.add_argument("--cert", default=DEFAULT_CERT, metavar="FILE",
                       help=f"this side's certificate, signed by the fleet CA (default {DEFAULT_CERT})")
    group.add_argument("--key", default=DEFAULT_KEY, metavar="FILE",
                       help=f"this side's private key (default {DEFAULT_KEY})")
    group.add_argument("--no-tls", action="store_true",
                       help="plain HTTP, no certificates (a server then binds to loopback only)")
    group.add_argument("--no-tls-any-address", action="store_true",
                       help="with --no-tls: let the server bind to a non-loopback address anyway")
    group.add_argument("--tls-server-name", default=None, metavar="NAME",
                       help="client: verify the server's certificate against NAME instead of the address connected to")
    group.add_argument("--crl", default=None, metavar="FILE",
                       help="server: the fleet CA's certificate revocation list; a revoked client certificate fails "
                            "at the handshake, and a changed file takes effect without a restart (default: crl.pem "
                            f"beside the CA certificate, {DEFAULT_CRL} for the default --ca, when it exists)")
    return group


def tls_options(args) -> TLSOptions:
    """The TLSOptions of parsed arguments (from add_tls_arguments; absent ones take the defaults)."""
    return TLSOptions(
        ca=getattr(args, "ca", None) or DEFAULT_CA,
        cert=getattr(args, "cert", None) or DEFAULT_CERT,
        key=getattr(args, "key", None) or DEFAULT_KEY,
        no_tls=bool(getattr(args, "no_tls", False)),
        any_address=bool(getattr(args, "no_tls_any_address", False)),
        server_name=getattr(args, "tls_server_name", None),
        crl=getattr(args, "crl", None) or None,
    )


def add_metrics_arguments(parser):
    parser.add_argument("--metrics-listen", metavar="ADDR:PORT",
                        help="also serve /metrics over plain HTTP here, for a local Prometheus agent "
                             f"(loopback only; e.g. {defaults.METRICS_LISTEN})")
    parser.add_argument("--metrics-any-address", action="store_true",
                        help="allow --metrics-listen on a non-loopback address (plain HTTP, no authentication)")
