"""Errors raised by the kiln SDK.

Every failure the API reports becomes a KilnError carrying the API's error fields
(code, message, field, detail, hint) and the HTTP status; failures to reach kilnd
are KilnError too, with code "unavailable".
"""


from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from .client import Job


class KilnError(Exception):
    """An error reported by kilnd (or the failure to reach it).

    Attributes mirror the REST error body: ``code`` ("invalid_argument", "not_found",
    ...), ``message``, ``field`` (the dotted path of the offending spec field, or
    None), ``detail``, ``hint``, and ``status`` (the HTTP status, 0 when kilnd could
    not be reached).
    """

    def __init__(self, message: str, code: str = "internal", field: str | None = None, detail: str | None = None,
                 hint: str | None = None, status: int = 0) -> None:
        self.code = code
        self.message = message
        self.field = field or None
        self.detail = detail or None
        self.hint = hint or None
        self.status = status
        super().__init__(str(self))

    def __str__(self) -> str:
        text = self.message
        if self.field:
            # "field: what is wrong", without repeating a field the message already starts with.
            if text.startswith(self.field) and text[len(self.field):len(self.field) + 1] in (" ", ":"):
                text = text[len(self.field):].lstrip(" :")
            text = "%s: %s" % (self.field, text)
        if self.hint:
            text += " (hint: %s)" % self.hint
        return text

    @classmethod
    def from_reply(cls, status: int, body: bytes | str | None) -> KilnError:
        """Builds the error from an HTTP status and a reply body (bytes or str)."""
        if isinstance(body, bytes):
            body = body.decode("utf-8", "replace")
        try:
            j: Any = json.loads(body) if body else None
        except ValueError:
            j = None
        fields = cast("dict[str, Any]", j) if isinstance(j, dict) else {}
        if isinstance(fields.get("message"), str):

            def text(key: str) -> str | None:
                v = fields.get(key)
                return v if isinstance(v, str) else None

            return cls(str(fields["message"]), code=text("code") or "internal", field=text("field"),
                       detail=text("detail"), hint=text("hint"), status=status)
        first = (body or "").strip().splitlines()[0][:200] if (body or "").strip() else ""
        return cls("kilnd answered HTTP %d%s" % (status, ": " + first if first else ""),
                   code={400: "invalid_argument", 404: "not_found", 409: "failed_precondition",
                         503: "unavailable"}.get(status, "internal"), status=status)


class JobFailedError(KilnError):
    """Raised by ``Estimator.fit(wait=True)`` and ``Job.wait(raise_on_failure=True)``
    when the job ends FAILED (or STOPPED). ``job`` is the finished Job."""

    def __init__(self, job: Job) -> None:
        self.job = job
        super().__init__("job %s (%s) ended %s: %s" % (job.id, job.name, job.state, job.reason or "no reason given"),
                         code="job_failed")
