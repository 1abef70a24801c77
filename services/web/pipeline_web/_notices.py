"""The line an action leaves at the top of the page it redirects to, signed by the server.

An action redirects to ``?notice=<text>&notice_sig=<issued>.<hmac>``: the HMAC
(:meth:`~._security.Gate.mac`) covers the text and the time it was issued, so a page shows
a notice only if this dashboard (or a replica with the same credentials) wrote it, within
:data:`NOTICE_MAX_AGE_S`. A link that carries words of its own ("Your session expired, call
...") shows nothing; so does an old bookmark of a redirect.
"""

from __future__ import annotations

import hmac
import re
from typing import TYPE_CHECKING

from pipeline._failures import utf8_safe

from ._security import CLOCK_SKEW_S

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._security import Gate

NOTICE = "notice"
NOTICE_SIG = "notice_sig"
NOTICE_MAX_AGE_S = 600
"""How long after its action a notice is shown: a redirect is followed at once."""
_SIGNATURE = re.compile(r"([0-9]{1,12})\.([0-9a-f]{64})")


def _signed(issued: str, text: str) -> str:
    return f"{issued}\n{text}"


def signed_notice(gate: Gate, text: str) -> dict[str, str]:
    """The query fields that show ``text`` on the page redirected to."""
    # An error's text may hold what UTF-8 cannot encode (a lone surrogate): escaped, so that
    # what is signed is what the URL carries.
    text = utf8_safe(text)
    issued = str(int(gate.clock()))
    return {NOTICE: text, NOTICE_SIG: f"{issued}.{gate.mac('notice', _signed(issued, text))}"}


def notice_of(gate: Gate, query: Mapping[str, str]) -> str | None:
    """The notice ``query`` carries, if this dashboard signed it lately; None otherwise."""
    text = query.get(NOTICE)
    found = _SIGNATURE.fullmatch(query.get(NOTICE_SIG) or "")
    if text is None or found is None:
        return None
    issued, mac = found.groups()
    try:
        expected = gate.mac("notice", _signed(issued, text))
    except UnicodeEncodeError:  # not text this dashboard wrote
        return None
    if not hmac.compare_digest(mac, expected):  # both hex digits
        return None
    age = gate.clock() - int(issued)
    return text if -CLOCK_SKEW_S <= age <= NOTICE_MAX_AGE_S else None
