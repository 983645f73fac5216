"""The parameter store's URL (`--ps redis://[[user]:password@]host:port[/db]`), torch-free: checked
when the config is built, and its password kept off disk and out of every message.

A password given in the URL is masked (`***`) in the manifest, the saved command line, errors and
reports. The ranks get the real URL from the launching process's environment (PS_URL_ENV), which
they inherit, never from the run folder.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from urllib.parse import urlparse

PS_URL_ENV = "HARNESS_PS_URL"
"""The store URL as given, password included: set by the launching process for its ranks."""
ALLOW_EVICTION_ENV = "HARNESS_PS_ALLOW_EVICTION"
"""=1: accept a Redis whose maxmemory-policy may evict keys (a row lost then still fails the run)."""
MASK = "***"

# user:password@ in any redis:// or rediss:// URL inside a longer text (a command line, an error).
_SECRET = re.compile(r"(rediss?://[^\s:@/'\"]*):([^\s@/'\"]+)@")


def mask_secrets(text: str) -> str:
    """`text` with the password of every redis URL in it replaced by ***."""
    return _SECRET.sub(rf"\1:{MASK}@", text)


def check_store_url(url: str) -> None:
    """One line (ValueError) for a URL the ranks could not use: checked before any folder is made."""
    shown = mask_secrets(url)
    hint = "give redis://host:port[/db], or leave it out for the embedded store"
    parsed = urlparse(url)
    if parsed.scheme != "redis" or not parsed.hostname:
        raise ValueError(f"dynamic.ps {shown!r}: {hint}")
    try:
        port = parsed.port
    except ValueError:  # urllib's own check: a port outside 0..65535 or not a number
        port = -1
    if port is None or not 1 <= port <= 65535:
        raise ValueError(f"dynamic.ps {shown!r}: the port must be a number 1..65535; {hint}")
    if parsed.path not in ("", "/") and not re.fullmatch(r"/\d+", parsed.path):
        raise ValueError(f"dynamic.ps {shown!r}: the database must be a number (/0, /1, ...); {hint}")
    if parsed.query or parsed.params or parsed.fragment:
        raise ValueError(f"dynamic.ps {shown!r}: options after the database are not taken; {hint}")


def real_store_url(recorded: str, environ: Mapping[str, str] = os.environ) -> str:
    """The URL a rank connects with: the recorded one, or, when its password was masked, the one the
    launching process passed in the environment (one line when that is missing or another store's)."""
    if f":{MASK}@" not in recorded:
        return recorded
    given = environ.get(PS_URL_ENV)
    if given is None or mask_secrets(given) != recorded:
        raise ValueError(f"parameter store {recorded}: its password is not in this rank's environment ({PS_URL_ENV}); "
                         "start the run with harness bench, which passes it to the ranks")
    return given


def pass_to_ranks(url: str | None) -> None:
    """Put the store URL, password included, where the ranks started from this process find it."""
    if url is not None:
        os.environ[PS_URL_ENV] = url
