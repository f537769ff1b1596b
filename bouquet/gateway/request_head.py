"""What RFC 9112 and RFC 9110 require of a server about a request's head, where the HTTP parser
(llhttp, through httptools) does not enforce it already.

llhttp already refuses (400, tested in tests/integration/test_http_front.py): a request line that is not
``method SP target SP HTTP/x.y``, a method outside its table, a target with spaces, controls or
non-ASCII bytes, whitespace between a field name and its colon (RFC 9112 §5.1), obs-fold (§5.2),
whitespace before the first field line (§2.2), a bare CR (§2.2), NUL or other controls in a field
value (RFC 9110 §5.5), an invalid or repeated ``Content-Length`` (§6.3), ``Transfer-Encoding``
with ``Content-Length`` (§6.3: it then closes the connection), chunked applied twice or not last
(§6.3, §7), and malformed chunk framing. It accepts any ``HTTP/d.d`` version once the protocol
asks it to (protocol.py), so that the version rules below apply.

Checked here, from the parsed head (``check_head``):
- the version: ``HTTP/1.0`` and ``1.1`` are served, a higher 1.x minor as 1.1 (RFC 9112 §2.3);
  any other major (``HTTP/2.0`` in an HTTP/1 request line), and ``HTTP/0.9`` (a request line
  without a version) → 505;
- the method ``CONNECT`` → 501 (RFC 9110 §9.3.6: this is not a proxy);
- the target's form (RFC 9112 §3.2): origin-form (``/path?query``), absolute-form (``http://``
  or ``https://`` with a non-empty host and no userinfo: RFC 9110 §4.2.1, §4.2.4), asterisk-form
  for OPTIONS only; its characters and percent-encodings per RFC 3986 (no fragment) → else 400.
  An absolute-form's host is where the request goes and ``Host`` is to be ignored (§3.2.2): nothing
  in the gateway reads ``Host``, so that needs no code;
- ``Host`` (RFC 9112 §3.2): missing in an HTTP/1.1 request, given more than once, or not
  ``host[:port]`` (RFC 3986 §3.2.2) → 400;
- transfer codings: not ending with chunked → 400 (RFC 9112 §6.3); any other than chunked → 501
  (§6.1); ``Transfer-Encoding`` in an HTTP/1.0 request → 400 (§6.1: its framing is faulty).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Refusal:
    """An answer the front end gives without the app: status, message, code (errors.py) and
    extra response headers. The connection is closed after it."""

    status: int
    message: str
    code: str
    headers: dict[str, str] = field(default_factory=dict)


def bad_request(message: str, code: str = "invalid_http_request") -> Refusal:
    return Refusal(400, message, code)


# RFC 3986 §3.3 / §3.4: pchar = unreserved / pct-encoded / sub-delims / ":" / "@"
_PCHAR = r"A-Za-z0-9\-._~!$&'()*+,;=:@%"
_PATH_QUERY = rf"(?:/[{_PCHAR}/]*)?(?:\?[{_PCHAR}/?]*)?"
_ORIGIN_FORM = re.compile(rf"/[{_PCHAR}/]*(?:\?[{_PCHAR}/?]*)?".encode())
# RFC 3986 §3.2.2 host (IP-literal or reg-name / IPv4) and §3.2.3 port
_HOST = r"(?:\[[0-9A-Za-z:.\-._~!$&'()*+,;=]+\]|[A-Za-z0-9\-._~!$&'()*+,;=%]*)(?::[0-9]*)?"
_HOST_VALUE = re.compile(_HOST.encode())
_ABSOLUTE_FORM = re.compile(rf"(?i:https?)://({_HOST}){_PATH_QUERY}".encode())
_BAD_PERCENT = re.compile(rb"%(?![0-9A-Fa-f]{2})")
_CODINGS = re.compile(rb"[ \t]*,[ \t]*")


def _version(version: str) -> Refusal | None:
    major, _, minor = version.partition(".")
    if major == "1":
        return None  # 1.0, 1.1; a later 1.x is read as 1.1 (RFC 9112 §2.3)
    if version == "0.9":
        return Refusal(505, "HTTP/0.9 (a request line without an HTTP version) is not supported; send HTTP/1.1",
                       "http_version_not_supported")
    return Refusal(505, f"HTTP/{version} is not supported in an HTTP/1 request line; send HTTP/1.1 (this server "
                        "speaks HTTP/1.x only)", "http_version_not_supported")


def _bad_characters(url: bytes) -> Refusal:
    return bad_request(f"request target {url[:100].decode('latin-1')!r} has characters a URI does not allow, a "
                       "fragment ('#') or a '%' not followed by two hex digits: percent-encode it (RFC 3986, RFC 9112 §3.2)")


def _target(method: bytes, url: bytes) -> Refusal | None:
    if url == b"*":
        if method != b"OPTIONS":
            return bad_request(f"the target '*' (asterisk-form) is only for OPTIONS, not {method.decode()} "
                               "(RFC 9112 §3.2.4)")
        return None
    if url[:1] == b"/":
        if _ORIGIN_FORM.fullmatch(url) is None:
            return _bad_characters(url)
    else:
        m = _ABSOLUTE_FORM.fullmatch(url)
        if m is None or m.group(1).split(b":")[0] in (b"", b"[]"):
            return bad_request(f"request target {url[:100].decode('latin-1')!r} is neither a path ('/...') nor an "
                               "absolute http(s) URI with a host and no user info (RFC 9112 §3.2, RFC 9110 §4.2)")
    if b"%" in url and _BAD_PERCENT.search(url):
        return _bad_characters(url)
    return None


def _host(version: str, hosts: list[bytes]) -> Refusal | None:
    if len(hosts) > 1:
        return bad_request(f"the request has {len(hosts)} Host headers; send one (RFC 9112 §3.2)")
    if not hosts:
        return None if version == "1.0" else bad_request("an HTTP/1.1 request needs a Host header (RFC 9112 §3.2)")
    if _HOST_VALUE.fullmatch(hosts[0]) is None or (b"%" in hosts[0] and _BAD_PERCENT.search(hosts[0])):
        return bad_request(f"Host {hosts[0][:100].decode('latin-1')!r} is not host[:port] (RFC 9112 §3.2, RFC 3986 §3.2.2)")
    return None


def _codings(version: str, values: list[bytes]) -> Refusal | None:
    if version == "1.0":
        return bad_request("Transfer-Encoding in an HTTP/1.0 request: its framing cannot be trusted; send "
                           "Content-Length (RFC 9112 §6.1)")
    codings = [c.split(b";", 1)[0].strip().lower() for v in values for c in _CODINGS.split(v.strip())]
    if codings[-1] != b"chunked":  # the body's length is unknown: 400 and close (RFC 9112 §6.3)
        return bad_request("Transfer-Encoding must end with chunked in a request (RFC 9112 §6.3)")
    other = next((c for c in codings if c != b"chunked"), None)
    if other is not None:
        return Refusal(501, f"transfer coding {other.decode('latin-1')!r} is not implemented; send the body with "
                            "Content-Length or 'Transfer-Encoding: chunked' alone (RFC 9112 §6.1)", "not_implemented")
    return None


def check_head(method: bytes, version: str, url: bytes, headers: list[tuple[bytes, bytes]]) -> Refusal | None:
    """The refusal RFC 9112 / RFC 9110 name for this request head, or None to serve it.

    ``method``: as parsed (llhttp only parses the methods it knows); ``version``: ``"1.1"``;
    ``url``: the raw request target; ``headers``: (lowercase name, value) as uvicorn keeps them.
    Runs for every request: the common case (HTTP/1.1, an origin-form target and one Host, neither
    with '%', no Transfer-Encoding) costs one pass over the fields and two matches.
    """
    hosts: list[bytes] = []
    codings: list[bytes] = []
    for name, value in headers:
        if name == b"host":
            hosts.append(value)
        elif name == b"transfer-encoding":
            codings.append(value)
    if (version == "1.1" and len(hosts) == 1 and not codings and method != b"CONNECT"
            and _ORIGIN_FORM.fullmatch(url) and _HOST_VALUE.fullmatch(hosts[0])
            and b"%" not in url and b"%" not in hosts[0]):
        return None
    if version != "1.1" and (refusal := _version(version)) is not None:
        return refusal
    if method == b"CONNECT":
        return Refusal(501, "CONNECT is not implemented: this server is not a proxy (RFC 9110 §9.3.6)", "not_implemented")
    return _target(method, url) or _host(version, hosts) or (_codings(version, codings) if codings else None)
