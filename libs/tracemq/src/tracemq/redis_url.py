"""The routing database's URL: the one thing that says where Redis is and how to log in.

``redis://[[user]:password@]host[:port][/db]`` — a password (``requirepass``) or an ACL user and
its password; ``rediss://…`` — the same over TLS, with the options below as URL query
parameters (so every process, the CLI and compose carry one variable, ``TRACEMQ_REDIS_URL``):

* ``ssl_ca_certs=/path/ca.pem`` — the CA that signed the server's certificate (default: the
  system's trust store);
* ``ssl_certfile=…``, ``ssl_keyfile=…`` — a client certificate, when Redis asks for one
  (``tls-auth-clients``);
* ``ssl_cert_reqs=required|optional|none`` (default ``required``) and
  ``ssl_check_hostname=true|false`` (default ``true``).

Any other query parameter, a TLS option on a plain ``redis://`` URL, or another scheme is
refused with :class:`ValueError` up front (settings turn it into a ``ConfigError`` naming
``TRACEMQ_REDIS_URL``), rather than at the first connection. :func:`redact` is the form that
goes into logs and error lines: the password never does.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

_TLS_PATHS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
_CERT_REQS = ("required", "optional", "none")
_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (user, host, port, path and query kept)."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.hostname or ""
        if ":" in host:  # IPv6
            host = f"[{host}]"
        port = f":{parts.port}" if parts.port else ""
        return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}{port}"))
    except ValueError:
        return "(unparsable URL)"


def split(url: str) -> tuple[str, dict[str, Any]]:
    """``(url without the TLS query, TLS keyword arguments)``; ValueError naming the problem."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        raise ValueError(f"not a Redis URL ({exc})") from None
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError(
            f"scheme {parts.scheme!r}: a Redis URL starts with redis://, rediss:// (TLS) or unix://"
        )
    if parts.scheme != "unix" and not parts.hostname:
        raise ValueError("a Redis URL needs a host (redis://host:6379/0)")
    options: dict[str, Any] = {}
    kept: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in _TLS_PATHS or key in ("ssl_cert_reqs", "ssl_check_hostname"):
            if parts.scheme != "rediss":
                raise ValueError(f"{key} is a TLS option: use rediss:// to connect with TLS")
            if key in _TLS_PATHS:
                if not value:
                    raise ValueError(f"{key} needs a file path")
                options[key] = value
            elif key == "ssl_cert_reqs":
                if value not in _CERT_REQS:
                    raise ValueError(f"ssl_cert_reqs={value!r}: one of {', '.join(_CERT_REQS)}")
                options[key] = value
            else:
                if value.lower() not in _BOOLS:
                    raise ValueError(f"ssl_check_hostname={value!r}: true or false")
                options[key] = _BOOLS[value.lower()]
        elif key == "db":  # (a password only in the user part: that is what redact hides)
            kept.append((key, value))
        else:
            raise ValueError(f"unknown Redis URL option {key!r}")
    if options.get("ssl_cert_reqs") == "none" and "ssl_check_hostname" not in options:
        options["ssl_check_hostname"] = False  # no certificate check means no name to check
    query = "&".join(f"{k}={v}" for k, v in kept)
    return urlunsplit(parts._replace(query=query)), options
