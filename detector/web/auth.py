"""Who is asking: bearer tokens (the API), a login session (the pages), a trusted proxy header.

- ``Authorization: Bearer <token>``: the owner of a token of ``DETECTOR_WEB__TOKENS``
  (compared in constant time: ``token_owner``);
- a session cookie set by ``POST /login`` with such a token (signed by Starlette's
  ``SessionMiddleware``; ``HttpOnly``, ``SameSite=strict``, ``Secure`` behind https), bound to
  the credential that opened it (an HMAC of the owner's token: removing or rotating the token
  ends its sessions) and ended server-side by logout (its random ``sid`` is recorded,
  ``detector.web.sessions``);
- the header ``DETECTOR_WEB__TRUSTED_PROXY_HEADER`` (e.g. ``X-Forwarded-Email`` from
  oauth2-proxy), honoured only from a peer address in ``DETECTOR_WEB__TRUSTED_PROXIES``.

Reading needs an identity unless the server binds to loopback or ``DETECTOR_WEB__PUBLIC_READ``
is set; acting always needs one on the approver allow-list, and a page's form carries a CSRF
token: an HMAC of the identity with the session secret (``csrf_token``), compared in constant
time.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from fastapi import HTTPException, Request

from detector.config import WebSettings

SESSION_KEY = "who"
CREDENTIAL_KEY = "cred"  # the session's credential binding (``Auth.credential``)
SID_KEY = "sid"  # the session's random id, recorded when it ends
LOGIN_CSRF_KEY = "login_csrf"  # the login form's token, before anyone is logged in
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="detector"'}
LOOPBACK_NAMES = frozenset({"localhost"})


def token_owner(tokens: Mapping[str, str], presented: str) -> str | None:
    """Return the owner of ``presented`` among ``tokens`` (owner -> token), or None.

    Every token is compared with ``hmac.compare_digest``, with no early exit, so the time
    taken does not tell which token or how much of it matched.
    """
    found = None
    given = presented.encode()
    for owner, token in tokens.items():
        if hmac.compare_digest(given, token.encode()):
            found = owner
    return found


def is_loopback(host: str) -> bool:
    """Return True when ``host`` (a bind address or name) is the loopback interface."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Auth:
    """Resolve the identity of a request from the web settings."""

    def __init__(
        self, web: WebSettings, secret: bytes, ended: Callable[[str], bool] = lambda _: False
    ) -> None:
        """``ended(sid)`` tells whether a session was ended by logout (the store's record)."""
        self._web = web
        self._tokens = {owner: s.get_secret_value() for owner, s in web.tokens.items()}
        self._secret = secret
        self.ended = ended
        self.open_read = web.public_read or is_loopback(web.host)

    def bearer(self, request: Request) -> str:
        """Return the owner of the request's bearer token; raises HTTPException(401)."""
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            raise HTTPException(401, "a bearer token is required", headers=CHALLENGE)
        owner = token_owner(self._tokens, presented.strip())
        if owner is None:
            raise HTTPException(401, "invalid token", headers=CHALLENGE)
        return owner

    def login(self, presented: str) -> str | None:
        """Return the owner of a token given at the login form, or None."""
        return token_owner(self._tokens, presented.strip()) if presented.strip() else None

    def start_session(self, request: Request, who: str) -> None:
        """Open ``who``'s login session: bound to their token now, with a new random id."""
        request.session.clear()
        request.session.update(
            {SESSION_KEY: who, CREDENTIAL_KEY: self.credential(who), SID_KEY: secrets.token_hex(16)}
        )

    def login_csrf(self, request: Request) -> str:
        """Return the login form's CSRF token, kept in the (not yet logged in) session: a
        login posted from another site cannot know it (login CSRF)."""
        token = request.session.get(LOGIN_CSRF_KEY)
        if not isinstance(token, str) or not token:
            token = request.session[LOGIN_CSRF_KEY] = secrets.token_hex(16)
        return token

    def check_login_csrf(self, request: Request, presented: str) -> bool:
        """Return True when ``presented`` is the session's login form token."""
        token = request.session.get(LOGIN_CSRF_KEY)
        return (
            isinstance(token, str)
            and bool(token)
            and hmac.compare_digest(token.encode(), presented.encode())
        )

    def same_origin(self, request: Request) -> bool:
        """Return True unless the browser says the form came from another site: its
        ``Origin`` (else ``Referer``) must be this site, ``DETECTOR_WEB__BASE_URL`` when set,
        else the request's ``Host``. A request with neither header is no browser's form."""
        source = request.headers.get("origin") or request.headers.get("referer")
        if not source:
            return True
        if source == "null":
            return False
        seen = urlsplit(source)
        if self._web.base_url:
            site = urlsplit(self._web.base_url)
            return (seen.scheme, seen.netloc) == (site.scheme, site.netloc)
        return seen.netloc == request.headers.get("host", "")

    def credential(self, who: str) -> str:
        """Return the binding of ``who``'s sessions to their current token ("" without one):
        an HMAC-SHA256 of the owner and the token with the session secret."""
        token = self._tokens.get(who)
        if token is None:
            return ""
        text = f"credential:{who}:{token}".encode()
        return hmac.new(self._secret, text, hashlib.sha256).hexdigest()

    def identity(self, request: Request) -> str | None:
        """Return who is asking: the trusted proxy's header, else a login session whose token
        is still the owner's and that no logout ended (a stale one is cleared)."""
        header = self._web.trusted_proxy_header
        if header and self._from_trusted_proxy(request):
            forwarded = request.headers.get(header, "").strip()
            if forwarded:
                return forwarded
        session = request.session
        if SESSION_KEY not in session:
            return None  # nobody logged in (a login form's token may be there)
        who, cred, sid = (str(session.get(k) or "") for k in (SESSION_KEY, CREDENTIAL_KEY, SID_KEY))
        current = self.credential(who) if who else ""
        if not (current and cred and sid and hmac.compare_digest(current, cred)) or self.ended(sid):
            session.clear()
            return None
        return who

    def may_read(self, request: Request) -> bool:
        """Return True when the request may read the pages and the JSON API."""
        return self.open_read or self.identity(request) is not None

    def csrf_token(self, who: str) -> str:
        """Return the CSRF token of ``who``'s forms (HMAC-SHA256 of the identity)."""
        return hmac.new(self._secret, f"csrf:{who}".encode(), hashlib.sha256).hexdigest()

    def check_csrf(self, who: str, presented: str) -> bool:
        """Return True when ``presented`` is ``who``'s CSRF token."""
        return hmac.compare_digest(self.csrf_token(who).encode(), presented.encode())

    def _from_trusted_proxy(self, request: Request) -> bool:
        peer = request.client.host if request.client else ""
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        for entry in self._web.trusted_proxies:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                continue
        return False
