"""Who may reach serve-mcp over HTTP: Host and Origin checks by binding, and bearer tokens.

The rule (:func:`transport_security`), by the address the server listens on:

* **A loopback binding** (any address of 127.0.0.0/8, ``::1``, or the name
  ``localhost``): DNS-rebinding protection. A request's ``Host`` must name the
  bound address, ``127.0.0.1``, ``localhost`` or ``[::1]`` (any port, or none),
  else it is answered 421; an ``Origin``, when sent, must be ``http://`` one of
  those, else 403. Either way nothing runs. This holds for every loopback
  address, not only the default one.
* **Any other binding** (``0.0.0.0``, ``::``, a LAN address, a host name):
  refused with a :class:`~nous_sched.ConfigError` naming ``token_verifier``
  (``--auth-token-file`` on the command line) unless bearer-token authorization
  is configured. A ``Host`` header proves nothing about a client that is not a
  browser, and a browser led there by DNS rebinding has no token; with tokens,
  every request without a valid one is answered 401 and nothing runs.

Bearer tokens go through the MCP SDK's own authorization
(``AuthenticationMiddleware`` with a ``TokenVerifier``): :class:`BearerTokens`
is a verifier over a fixed set of named tokens (``--auth-token-file``); any
SDK ``TokenVerifier`` (OAuth introspection, JWTs) may be given instead. The
authenticated principal is also who a client is for its fair share
(:mod:`.shares`).
"""

from __future__ import annotations

import hmac
import ipaddress
from pathlib import Path
from typing import Optional, Union

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.transport_security import TransportSecuritySettings

from ..errors import ConfigError

__all__ = ["BearerTokens", "auth_settings", "is_loopback", "transport_security", "MIN_TOKEN_CHARS"]

#: The shortest bearer token :class:`BearerTokens` accepts.
MIN_TOKEN_CHARS = 16
_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``, IPv6 with or without brackets) is a loopback binding."""
    bare = host.strip("[]")
    if bare.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))


def transport_security(host: str, authorized: bool) -> TransportSecuritySettings:
    """The Host and Origin checks for a server bound to ``host`` (see the module docstring).

    :raises ConfigError: ``host`` is not a loopback binding and ``authorized`` is false.
    """
    if is_loopback(host):
        bare = host.strip("[]")
        shown = f"[{bare}]" if ":" in bare else bare
        names = sorted({shown, *_LOOPBACK_NAMES})
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=[h for name in names for h in (name, f"{name}:*")],
            allowed_origins=[o for name in names for o in (f"http://{name}", f"http://{name}:*")],
        )
    if not authorized:
        raise ConfigError(
            f"serve-mcp over HTTP on {host!r}, which is not a loopback address, needs bearer-token "
            "authorization (token_verifier; --auth-token-file on the command line): anyone who can reach "
            "the address could otherwise run programs"
        )
    return TransportSecuritySettings(enable_dns_rebinding_protection=False)


def auth_settings() -> AuthSettings:
    """The SDK's auth settings for a resource server that only checks bearer tokens
    (no authorization-server routes and no protected-resource metadata are served,
    so the issuer URL is never shown to a client)."""
    return AuthSettings(issuer_url="http://localhost", resource_server_url=None)  # type: ignore[arg-type]


class BearerTokens:
    """An SDK ``TokenVerifier`` over a fixed set of named bearer tokens.

    ``tokens`` maps each client's name to its token (at least
    :data:`MIN_TOKEN_CHARS` characters, no whitespace; names and tokens
    unique). A request whose ``Authorization: Bearer TOKEN`` carries one of
    them is that client (the principal's client id is its name); any other is
    answered 401 by the SDK. Each token given is compared with every known
    one by ``hmac.compare_digest``.
    """

    def __init__(self, tokens: dict[str, str], *, source: str = "tokens") -> None:
        if not tokens:
            raise ConfigError(f"{source}: no bearer tokens given")
        seen: set[str] = set()
        for name, token in tokens.items():
            if not isinstance(name, str) or not name or any(c.isspace() for c in name):
                raise ConfigError(f"{source}: a client name must be a non-empty string without spaces")
            if not isinstance(token, str) or len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
                raise ConfigError(
                    f"{source}: the token of {name!r} must be at least {MIN_TOKEN_CHARS} characters, without spaces"
                )
            if token in seen:
                raise ConfigError(f"{source}: two clients have the same token")
            seen.add(token)
        self._tokens = [(name, token.encode("utf-8", "surrogatepass")) for name, token in tokens.items()]

    @classmethod
    def from_file(cls, path: Union[str, Path], *, option: str = "--auth-token-file") -> "BearerTokens":
        """Tokens from a file of lines ``NAME TOKEN`` (blank lines and ``#`` comments skipped).

        :raises ConfigError: naming ``option``: the file cannot be read, or a line or token is malformed.
        """
        source = f"{option} {path}"
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{source}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
        tokens: dict[str, str] = {}
        for number, line in enumerate(text.splitlines(), 1):
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            if len(fields) != 2:
                raise ConfigError(f"{source}: line {number}: expected NAME TOKEN")
            if fields[0] in tokens:
                raise ConfigError(f"{source}: line {number}: client {fields[0]!r} is named twice")
            tokens[fields[0]] = fields[1]
        return cls(tokens, source=source)

    @property
    def names(self) -> list[str]:
        """The clients' names, in the order given."""
        return [name for name, _ in self._tokens]

    async def verify_token(self, token: str) -> Optional[AccessToken]:
        """The principal ``token`` belongs to, or ``None`` (the SDK answers 401)."""
        given = token.encode("utf-8", "surrogatepass")
        found: Optional[str] = None
        for name, known in self._tokens:
            if hmac.compare_digest(given, known):  # every entry compared: the time does not say which matched
                found = name
        if found is None:
            return None
        return AccessToken(token=token, client_id=found, scopes=[])
