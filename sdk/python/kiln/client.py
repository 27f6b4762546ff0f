"""The REST client: Client (jobs, search and compare, artifacts, tuning jobs, workers, users,
tokens, projects), Job (a handle on one training job) and TuningJob (one tuning job).

Standard library only (urllib, json). Shapes follow docs/contracts.md: a Job is the
JSON object kilnd returns, exposed through properties; logs and metrics are read
from the job's sub-resources; ``logs(follow=True)`` reads the Server-Sent Events
stream and reconnects with Last-Event-ID if the connection drops mid-job.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import importlib
import json
import os
import socket
import ssl
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.client import HTTPResponse
from typing import Any, cast

from . import code, config
from .errors import JobFailedError, KilnError
from .metrics import shown

TERMINAL_STATES = frozenset(("COMPLETED", "FAILED", "STOPPED"))

#: A JSON object as kilnd sends it (docs/contracts.md, api/openapi.yaml).
JSONObject = dict[str, Any]

#: The artifact that holds a job's final model (kiln-train writes it in llm.c's format).
MODEL_ARTIFACT = "model_llmc.bin"
#: The artifact that holds a script job's model: its SM_MODEL_DIR, packed as a gzip'd tar.
SCRIPT_MODEL_ARTIFACT = "model.tar.gz"

# The jobs Client.find_job names when a name is not unique.
_CANDIDATES = 5


def _obj(v: Any) -> JSONObject:
    """v when it is a JSON object, else {}."""
    return cast(JSONObject, v) if isinstance(v, dict) else {}


def _preemption(within_queue: str | None, reclaim_within_cohort: str | None) -> JSONObject:
    """A queue's "preemption" object with the values given (kilnd checks them)."""
    out: JSONObject = {}
    if within_queue is not None:
        out["within_queue"] = within_queue
    if reclaim_within_cohort is not None:
        out["reclaim_within_cohort"] = reclaim_within_cohort
    return out


def _objs(v: Any) -> list[JSONObject]:
    """The JSON objects of the list v (nothing when v is not a list)."""
    return [cast(JSONObject, x) for x in cast("list[object]", v) if isinstance(x, dict)] if isinstance(v, list) else []


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _pages(fetch: Callable[[int, str], JSONObject], key: str, limit: int | None,
           page_size: int | None = None) -> list[JSONObject]:
    """Every object of a paged list, newest first: fetch(size, token) answers one page (its
    objects under key, then next_page_token), page_size (1 to 500, default 500) a request; at most
    limit of them (None: all). A limit below 1 raises KilnError 400 before any request, as kiln's
    --limit is refused; a page_size kilnd does not take (0 too) is sent, and kilnd refuses it."""
    if limit is not None and limit < 1:
        raise KilnError("limit must be a positive number (got %r)" % limit, code="invalid_argument",
                        field="limit", status=400, hint="leave limit out (None) for all of them")
    out: list[JSONObject] = []
    token = ""
    while True:
        size = 500 if page_size is None else page_size
        if limit is not None:
            size = max(1, min(size, limit - len(out)))
        page = fetch(size, token)
        out.extend(_objs(page.get(key)))
        token = _str(page.get("next_page_token"))
        if not token or (limit is not None and len(out) >= limit):
            return out[:limit] if limit is not None else out


def _int(v: Any) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


@dataclass(frozen=True)
class LogLine:
    """One line a rank wrote. ``str(line)`` gives "[rank N] text" ("[rank N, attempt A] text"
    for the lines of a restarted job's later attempts)."""

    seq: int
    rank: int
    stream: str
    time: str
    line: str
    attempt: int = 0

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> LogLine:
        return cls(seq=_int(j.get("seq")), rank=_int(j.get("rank")), stream=_str(j.get("stream")) or "stdout",
                   time=_str(j.get("time")), line=_str(j.get("line")), attempt=_int(j.get("attempt")))

    def __str__(self) -> str:
        """The line as printed (``Estimator.fit(logs=True)``, ``Estimator.logs()``): its control
        characters escaped as kiln's CLI escapes them (metrics.shown); ``line`` keeps the text."""
        if self.attempt > 1:
            return "[rank %d, attempt %d] %s" % (self.rank, self.attempt, shown(self.line))
        return "[rank %d] %s" % (self.rank, shown(self.line))


@dataclass(frozen=True)
class Artifact:
    """One file a job's rank 0 left in its output directory, kept by kilnd."""

    name: str
    size: int
    sha256: str
    created_at: str
    attempt: int = 0

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> Artifact:
        return cls(name=_str(j.get("name")), size=_int(j.get("size")), sha256=_str(j.get("sha256")),
                   created_at=_str(j.get("created_at")), attempt=_int(j.get("attempt")))


@dataclass(frozen=True)
class CheckpointFile:
    """One file of a job's synced checkpoint directory: ``name`` is its path in the directory
    (``checkpoint-500/optimizer.pt``), ``attempt`` the attempt that wrote this content and
    ``worker_id`` the worker that synced it."""

    name: str
    size: int
    sha256: str
    attempt: int = 0
    worker_id: str = ""

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> CheckpointFile:
        return cls(name=_str(j.get("name")), size=_int(j.get("size")), sha256=_str(j.get("sha256")),
                   attempt=_int(j.get("attempt")), worker_id=_str(j.get("worker_id")))


@dataclass(frozen=True)
class Checkpoints:
    """The last state of a job's checkpoint directory that kilnd holds whole (what its next
    attempt finds restored): ``files`` by path, ``attempt`` (the latest attempt whose content it
    holds; 0 when nothing was synced) and ``synced_at`` (RFC 3339; "" when nothing was synced)."""

    files: list[CheckpointFile]
    attempt: int
    synced_at: str

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> Checkpoints:
        return cls(files=[CheckpointFile.from_json(f) for f in _objs(j.get("files"))], attempt=_int(j.get("attempt")),
                   synced_at=_str(j.get("synced_at")))


class ModelData(str):
    """Where a job's trained model is, as SageMaker's ``model_data`` says: the string is the URL
    kilnd serves the model at (GET it with the API token), and the object also knows its
    ``job_id``, ``name``, ``size`` and ``sha256`` and can ``download(path)`` itself (checked)."""

    client: Client
    job_id: str
    name: str
    size: int
    sha256: str

    def __new__(cls, client: Client, job_id: str, artifact: Artifact) -> ModelData:
        url = "%s/v1/jobs/%s/artifacts/%s" % (client.url, _seg(job_id), _seg(artifact.name))
        self = super().__new__(cls, url)
        self.client = client
        self.job_id = job_id
        self.name = artifact.name
        self.size = artifact.size
        self.sha256 = artifact.sha256
        return self

    @property
    def url(self) -> str:
        return str(self)

    def download(self, path: str | None = None) -> str:
        """Saves the model to path (default: its name in the current directory); returns the path."""
        return self.client.download(self.job_id, self.name, path)


class MetricPoint(tuple[int, float]):
    """One point of a metric: a ``(step, value)`` pair (it unpacks and compares as one) that
    also carries ``time`` (when it was recorded: an aware datetime in UTC), ``rank`` (the rank
    that reported it) and ``attempt``. ``value`` is NaN where kilnd sent null (a non-finite
    value)."""

    time: datetime.datetime
    rank: int
    attempt: int

    def __new__(cls, step: int, value: float, time: datetime.datetime, rank: int = 0, attempt: int = 1) -> MetricPoint:
        self = super().__new__(cls, cast("Iterable[Any]", (step, value)))
        self.time = time
        self.rank = rank
        self.attempt = attempt
        return self

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> MetricPoint:
        """A point of the REST reply ({step, value, time, time_us, rank, attempt})."""
        v = j.get("value")
        value = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float("nan")
        us = _int(j.get("time_us"))
        when = datetime.datetime.fromtimestamp(us // 1000000, datetime.timezone.utc) + \
            datetime.timedelta(microseconds=us % 1000000)
        return cls(_int(j.get("step")), value, when, _int(j.get("rank")), _int(j.get("attempt")) or 1)

    @property
    def step(self) -> int:
        return self[0]

    @property
    def value(self) -> float:
        return self[1]

    def __repr__(self) -> str:
        return "MetricPoint(step=%d, value=%r, time=%s, rank=%d, attempt=%d)" % (
            self.step, self.value, self.time.isoformat(), self.rank, self.attempt)


#: The columns of Job.metric_rows() and Job.dataframe(), in order.
METRIC_COLUMNS = ("metric_name", "step", "value", "time", "timestamp", "rank", "attempt")


def parse_sse(lines: Iterable[str]) -> Iterator[tuple[str, str, str]]:
    """Parses an iterable of text lines (without or with their line ends) of a
    text/event-stream into (event, data, id) tuples. Comments (": ping") are skipped;
    an event without a name is "message"."""
    event, last_id = "", ""
    data: list[str] = []
    for raw in lines:
        line = raw.rstrip("\r\n")
        if line == "":
            if data:
                yield (event or "message", "\n".join(data), last_id)
            event, data = "", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            data.append(value)
        elif field == "event":
            event = value
        elif field == "id":
            last_id = value


class Client:
    """A connection to kilnd's REST API.

    ``url`` is kilnd's address, ``token`` the API token sent with every request, ``ca`` a CA
    file to verify an https kilnd against instead of the system's CAs. Each not given comes
    from $KILN_URL / $KILN_TOKEN / $KILN_TLS_CA, then from the profile ``kiln login`` saved
    (``profile``, default $KILN_PROFILE, then the current one; see kiln.config), and the URL
    last from https://127.0.0.1:8080. ``timeout`` bounds each ordinary request in seconds.
    Methods raise KilnError on API errors and when kilnd cannot be reached; the constructor
    raises it for a config file others may read.
    """

    def __init__(self, url: str | None = None, timeout: float = 30.0, token: str | None = None, ca: str | None = None,
                 profile: str | None = None) -> None:
        s = config.resolve(url=url, token=token, ca=ca, profile=profile)
        self.url = s.url
        self.timeout = timeout
        self.profile = s.profile or None
        self._token = s.token
        self._ssl = ssl.create_default_context(cafile=s.ca) if s.ca else None

    def __repr__(self) -> str:
        return "kiln.Client(%r)" % self.url

    # ---- plumbing -----------------------------------------------------------------------
    def _open(self, method: str, path: str, body: Any = None, headers: Mapping[str, str] | None = None,
              timeout: float | None = None, accept: str = "application/json") -> HTTPResponse:
        data: bytes | None = None
        hdrs = {"Accept": accept, "User-Agent": "kiln-python/0.1"}
        if self._token:
            hdrs["Authorization"] = "Bearer " + self._token
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            hdrs["Content-Type"] = "application/json"
        elif method == "POST":
            data = b""
        hdrs.update(headers or {})
        req = urllib.request.Request(self.url + path, data=data, headers=hdrs, method=method)
        try:
            return cast(HTTPResponse, urllib.request.urlopen(req, timeout=timeout or self.timeout, context=self._ssl))
        except urllib.error.HTTPError as e:
            raw = e.read()
            e.close()
            raise KilnError.from_reply(e.code, raw) from None
        except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError) as e:
            reason: object = getattr(e, "reason", e)
            raise KilnError("could not connect to kilnd at %s: %s (is kilnd running? set KILN_URL)" % (self.url, reason),
                            code="unavailable", status=0) from None

    def _call(self, method: str, path: str, body: Any = None, headers: Mapping[str, str] | None = None,
              query: Mapping[str, object] | None = None) -> tuple[int, JSONObject]:
        if query:
            q = {k: v for k, v in query.items() if v is not None}
            if q:
                path += "?" + urllib.parse.urlencode(q)
        with self._open(method, path, body, headers) as r:
            raw = r.read()
            status = r.status
        try:
            return status, (_obj(json.loads(raw)) if raw else {})
        except ValueError:
            raise KilnError("kilnd sent a reply that is not JSON", code="bad_format", status=status) from None

    # ---- jobs ---------------------------------------------------------------------------
    def submit(self, spec: Mapping[str, Any], idempotency_key: str | None = None) -> Job:
        """Submits a job spec (a dict shaped like the JSON job spec) and returns its Job.
        With ``idempotency_key`` a retry returns the job the first call created."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        status, j = self._call("POST", "/v1/jobs", body=spec, headers=headers)
        job = Job(self, j)
        job.created = status == 201
        return job

    def job(self, job_id: str) -> Job:
        """The job with this id. Like every method that takes a job id, a unique prefix of one
        (4 characters or more, as ``kiln jobs`` shows them) works too: kilnd resolves it."""
        _, j = self._call("GET", "/v1/jobs/" + _seg(job_id))
        return Job(self, j)

    def find_job(self, ref: str) -> Job:
        """The job ``ref`` names: its id, a unique prefix of its id (4 characters or more), or its
        name, when exactly one job you can see has that name (as SageMaker's training job names
        are). A name that is also a prefix of another job's id, and a name several jobs share,
        raise KilnError (status 400) listing the candidates; nothing found raises status 404."""
        named: list[Job] = []
        if ref and all(c.isascii() and (c.isalnum() or c in "-_.") for c in ref):
            named = self.search('name = "%s"' % ref, limit=_CANDIDATES + 1)
        by_id: Job | None = None
        id_error: KilnError | None = None
        if len(ref) >= 4 and all(c in "0123456789abcdefABCDEF-" for c in ref):
            try:
                by_id = self.job(ref)
            except KilnError as e:
                if e.status not in (400, 404):
                    raise
                id_error = e
        if len(named) > 1 or (named and by_id is not None and by_id.id != named[0].id):
            ids = [j.id for j in named[:_CANDIDATES]] + ([by_id.id] if by_id is not None else [])
            what = "the name of %s%d jobs" % ("more than " if len(named) > _CANDIDATES else "", len(named)) \
                if len(named) > 1 else "the name of one job and a prefix of another's id"
            raise KilnError('"%s" is %s' % (ref, what), code="invalid_argument", status=400,
                            detail="candidates: " + ", ".join(ids), hint="give the job's id (or a prefix only it has)")
        if named:
            return named[0]
        if by_id is not None:
            return by_id
        if id_error is not None and id_error.status == 400:
            raise id_error
        raise KilnError('no job has the id, id prefix or name "%s"' % ref, code="not_found", status=404,
                        hint="kiln jobs lists the jobs you can see")

    def describe(self, job_id: str) -> JSONObject:
        """Everything kilnd says about the job, like SageMaker's describe_training_job: the job
        (state, reason, attempt, progress, latest metrics, workers, normalised spec) with its
        ``events`` (every state change)."""
        d = self.job(job_id).to_dict()
        d["events"] = self.events(_str(d.get("id")) or job_id)
        return d

    def jobs(self, status: str | Iterable[str] | None = None, tag: str | tuple[str, str] | None = None,
             limit: int | None = None) -> list[Job]:
        """Jobs, newest first. ``status``: a state or a list of states; ``tag``: "key:value"
        (or a (key, value) pair); ``limit``: at most this many (default: all)."""
        if status is not None and not isinstance(status, str):
            status = ",".join(status)
        if isinstance(tag, tuple):
            tag = "%s:%s" % tag
        def fetch(size: int, token: str) -> JSONObject:
            return self._call("GET", "/v1/jobs", query={"status": status, "tag": tag, "page_size": size,
                                                        "page_token": token or None})[1]
        return [Job(self, j) for j in _pages(fetch, "jobs", limit)]

    def search(self, filter: str | None = None, order_by: str | Iterable[str] | None = None,
               columns: str | Iterable[str] | None = None, limit: int | None = None,
               page_size: int | None = None) -> list[Job]:
        """Jobs matching ``filter`` (the filter language of docs/search.md), as a list of Job, in
        the order ``order_by`` asks ("FIELD [asc|desc], ...", or a list of such strings; default
        newest first). ``columns`` (a comma-separated string or a list: "hp.lr",
        "metrics.val_loss.min", "metrics.val_loss", "hp.*", "metrics.*") come back with each job
        as ``job.columns`` ({"hp.lr": 0.0003, ...}, None where it has no value), and the named
        metrics' summaries as ``job.summaries``. ``limit``: at most this many (default: all).

            client.search('hp.lr < 1e-3 AND (metrics.val_loss.min < 1.6 OR tags.team = "nlp")',
                          order_by="metrics.val_loss.min", columns=["hp.lr", "metrics.val_loss.min"])

        An invalid filter raises KilnError whose ``detail`` shows the filter with a caret under the
        mistake and whose ``hint`` names the nearest field."""
        order = order_by if order_by is None or isinstance(order_by, str) else ", ".join(order_by)
        cols = [c.strip() for c in columns.split(",") if c.strip()] if isinstance(columns, str) else list(columns or [])
        def fetch(size: int, token: str) -> JSONObject:
            body: JSONObject = {"filter": filter or "", "page_size": size}
            if order:
                body["order_by"] = order
            if cols:
                body["columns"] = cols
            if token:
                body["page_token"] = token
            return self._call("POST", "/v1/jobs:search", body=body)[1]
        return [Job(self, j) for j in _pages(fetch, "jobs", limit, page_size)]

    def compare(self, job_ids: Iterable[str], metrics: Iterable[str] | None = None,
                max_points: int = 200) -> JSONObject:
        """Jobs side by side. Returns a dict:

        - "jobs": the Job of each id (in the order given), with its summaries;
        - "hyperparameters": {name: [value of each job, None where absent]}, every hyperparameter
          any of them has; "differing": the names whose values are not all equal;
        - "summaries": {metric: [summary of each job ({count, min, max, last, min_step, max_step,
          last_step, ...}) or None]}, for ``metrics`` (default: every metric any job reported);
        - "curves": {metric: [[(step, value), ...] of each job]}, downsampled by kilnd to at most
          ``max_points`` per job keeping each bucket's lowest and highest point, for ``metrics``
          (default: train_loss and val_loss where the jobs have them)."""
        jobs = [self.job(i) for i in job_ids]
        names: list[str] = []
        for j in jobs:
            for k in _obj(j.spec.get("hyperparameters")):
                if k not in names:
                    names.append(k)
        hps: dict[str, list[Any]] = {k: [_obj(j.spec.get("hyperparameters")).get(k) for j in jobs] for k in names}
        differing = [k for k, v in hps.items() if any(x != v[0] for x in v)]
        if metrics is None:
            summarised: list[str] = []
            for j in jobs:
                for m in j.summaries:
                    if m not in summarised:
                        summarised.append(m)
            charted = [m for m in ("train_loss", "val_loss") if m in summarised] or summarised[:1]
        else:
            summarised = list(metrics)
            charted = summarised
        summaries: dict[str, list[JSONObject | None]] = {m: [j.summaries.get(m) for j in jobs] for m in summarised}
        curves = {m: [self.metrics(j.id, name=m, max_points=max_points).get(m, []) for j in jobs] for m in charted}
        return {"jobs": jobs, "hyperparameters": hps, "differing": differing, "summaries": summaries,
                "curves": curves}

    def stop(self, job_id: str, reason: str | None = None) -> Job:
        """Requests a stop; returns the Job (STOPPING, or STOPPED if it had not started)."""
        body = {"reason": reason} if reason else {}
        _, j = self._call("POST", "/v1/jobs/%s:stop" % _seg(job_id), body=body)
        return Job(self, j)

    def events(self, job_id: str) -> list[JSONObject]:
        """The job's state changes, oldest first: dicts with seq, from_state, to_state, reason,
        time, attempt, actor (from_state equals to_state for what leaves its state as it was: a
        waiting job preempting others)."""
        _, j = self._call("GET", "/v1/jobs/%s/events" % _seg(job_id))
        return _objs(j.get("events"))

    def logs(self, job_id: str, follow: bool = False, rank: int | None = None,
             since: str | None = None) -> Iterator[LogLine]:
        """A generator of LogLine. Without follow: the history. With follow: the history,
        then live lines until the job ends (the generator then returns)."""
        if follow:
            return self._follow(job_id, rank, since)
        return self._history(job_id, rank, since)

    def _history(self, job_id: str, rank: int | None = None, since: str | None = None,
                 after_seq: int = 0) -> Iterator[LogLine]:
        path = "/v1/jobs/%s/logs" % _seg(job_id)
        while True:
            _, page = self._call("GET", path, query={"rank": rank, "limit": 1000,
                                                     "since": since if not after_seq else None,
                                                     "after_seq": after_seq or None})
            lines = _objs(page.get("lines"))
            fresh = 0
            for j in lines:
                line = LogLine.from_json(j)
                if line.seq and line.seq <= after_seq:
                    continue
                fresh += 1
                after_seq = max(after_seq, line.seq)
                yield line
            if len(lines) < 1000 or not fresh:
                return

    def _follow(self, job_id: str, rank: int | None = None, since: str | None = None) -> Iterator[LogLine]:
        last_seq, backoff = 0, 0.2
        failing_since: float | None = None
        path = "/v1/jobs/%s/logs" % _seg(job_id)
        while True:
            query: dict[str, object] = {"follow": "true", "rank": rank, "since": since if not last_seq else None}
            q = urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
            headers = {"Last-Event-ID": str(last_seq)} if last_seq else None
            dropped: Exception | None = None
            try:
                # kilnd pings every 15 s: 60 s of silence means the connection is gone.
                with self._open("GET", path + "?" + q, headers=headers, timeout=60,
                                accept="text/event-stream") as r:
                    failing_since = None
                    text = (raw.decode("utf-8", "replace") for raw in r)
                    for event, data, _ in parse_sse(text):
                        if event == "end":
                            return
                        if event not in ("log", "message"):
                            continue
                        try:
                            line = LogLine.from_json(_obj(json.loads(data)))
                        except ValueError:
                            continue
                        if line.seq and line.seq <= last_seq:
                            continue
                        last_seq = max(last_seq, line.seq)
                        yield line
            except KilnError as e:
                if e.status:  # an API error: retrying will not help
                    raise
                dropped = e
            except (OSError, socket.timeout, TimeoutError, ValueError) as e:
                dropped = e
            # Closed or dropped before the end event: finished, or reconnect?
            job: Job | None
            try:
                job = self.job(job_id)
            except KilnError as e:
                if e.status:
                    raise
                job = None
            if job is not None and job.done:
                yield from self._history(job_id, rank, since, after_seq=last_seq)
                return
            now = time.monotonic()
            if dropped is not None:
                failing_since = failing_since or now
                if now - failing_since > 120:
                    if isinstance(dropped, KilnError):
                        raise dropped
                    raise KilnError("lost the log stream of job %s: %s" % (job_id, dropped), code="unavailable")
            time.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    def metrics(self, job_id: str, name: str | None = None, max_points: int | None = None,
                attempt: int | str = "latest") -> dict[str, list[MetricPoint]]:
        """The job's metric histories: {name: [MetricPoint, ...]} in step order; a point unpacks
        as ``(step, value)`` and carries ``time``, ``rank`` and ``attempt``.
        ``max_points`` asks kilnd to downsample each series: the first and last point and each
        bucket's lowest and highest survive. ``attempt``: "latest" (per step the points of the
        latest attempt that reached it, so a step a retried attempt trained again appears once),
        "all" (every attempt's points, by step then attempt), or an attempt number."""
        _, j = self._call("GET", "/v1/jobs/%s/metrics" % _seg(job_id),
                          query={"name": name, "max_points": max_points or 100000, "attempt": attempt})
        return {_str(s.get("name")): [MetricPoint.from_json(p) for p in _objs(s.get("points"))]
                for s in _objs(j.get("metrics"))}

    def metric_rows(self, job_id: str, name: str | None = None, attempt: int | str = "latest") -> list[JSONObject]:
        """Every point of every metric (or of ``name``) as a row: {"metric_name", "step",
        "value", "time" (a datetime in UTC), "timestamp" (seconds since the job's first point),
        "rank", "attempt"}, by metric name, then step. What Job.dataframe() holds, without pandas."""
        series = self.metrics(job_id, name=name, attempt=attempt)
        times = [p.time for points in series.values() for p in points]
        t0 = min(times) if times else None
        return [{"metric_name": metric, "step": p.step, "value": p.value, "time": p.time,
                 "timestamp": (p.time - t0).total_seconds() if t0 else 0.0, "rank": p.rank, "attempt": p.attempt}
                for metric in sorted(series) for p in series[metric]]

    def dataframe(self, job_id: str, name: str | None = None, attempt: int | str = "latest") -> Any:
        """Client.metric_rows() as a pandas DataFrame with the columns METRIC_COLUMNS, in the
        manner of SageMaker's ``TrainingJobAnalytics(...).dataframe()``: one row per point, with
        its step and time. A table of every metric by step is
        ``df.pivot_table(index="step", columns="metric_name", values="value")``. Needs pandas
        (Debian's python3-pandas, or ``pip install pandas``); ImportError without it."""
        try:
            pandas = importlib.import_module("pandas")
        except ImportError:
            raise ImportError("dataframe() needs pandas (apt-get install python3-pandas, or pip install pandas); "
                              "metric_rows() gives the same rows as dicts without it") from None
        rows = self.metric_rows(job_id, name=name, attempt=attempt)
        return pandas.DataFrame(rows, columns=list(METRIC_COLUMNS))

    def delete(self, job_id: str) -> JSONObject:
        """Deletes an ended job with its events, logs, metrics and artifacts (editors). Returns
        {"id", "removed": {"<table>": rows}, "artifact_bytes"}. A job that has not ended gets a
        KilnError with status 409: stop it first."""
        return self._call("DELETE", "/v1/jobs/%s" % _seg(job_id))[1]

    # ---- artifacts ----------------------------------------------------------------------
    def artifacts(self, job_id: str) -> list[Artifact]:
        """The files the job's rank 0 left in its output directory (final model, partition plan,
        samples), uploaded when the job ended: a list of Artifact, by name."""
        _, j = self._call("GET", "/v1/jobs/%s/artifacts" % _seg(job_id))
        return [Artifact.from_json(a) for a in _objs(j.get("artifacts"))]

    def download(self, job_id: str, name: str, path: str | None = None) -> str:
        """Saves artifact ``name`` of the job to ``path`` (a file, or a directory to put it in;
        default: the current directory) and returns the file's path. The bytes stream to disk
        and are checked against the artifact's SHA-256; a failed download leaves no file."""
        path = path or name
        if os.path.isdir(path):
            path = os.path.join(path, name)
        tmp = path + ".part"
        digest = hashlib.sha256()
        try:
            # a big file takes as long as it takes: the timeout bounds each read, not the whole
            with self._open("GET", "/v1/jobs/%s/artifacts/%s" % (_seg(job_id), _seg(name)),
                            accept="application/octet-stream", timeout=max(self.timeout, 60)) as r, \
                    open(tmp, "wb") as out:
                etag = (r.headers.get("ETag") or "").strip('"')
                while True:
                    block = r.read(1 << 20)
                    if not block:
                        break
                    digest.update(block)
                    out.write(block)
            if digest.hexdigest() != etag:
                raise KilnError('the download of "%s" has SHA-256 %s, but kilnd says the artifact\'s is %s'
                                % (name, digest.hexdigest(), etag or "(none)"), code="data_loss")
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return path

    def model_data(self, job_id: str) -> ModelData | None:
        """The job's trained model (a ModelData: its URL, with size, sha256 and download()), or
        None when the job has no model artifact (yet: it is uploaded when the job ends). An
        engine job's model is MODEL_ARTIFACT; a script job's is its SM_MODEL_DIR packed as
        SCRIPT_MODEL_ARTIFACT (model.tar.gz)."""
        for a in self.artifacts(job_id):
            if a.name in (MODEL_ARTIFACT, SCRIPT_MODEL_ARTIFACT):
                return ModelData(self, job_id, a)
        return None

    def checkpoints(self, job_id: str) -> Checkpoints:
        """The job's synced checkpoint directory (a job with no ``checkpoint.path``: the
        ``$SM_CHECKPOINT_DIR`` a script writes to), as kilnd last holds it whole: a Checkpoints
        with its files by path, the attempt and when it was synced. Raises KilnError 503
        (``unavailable``) when kilnd keeps no artifacts."""
        _, j = self._call("GET", "/v1/jobs/%s/checkpoints" % _seg(job_id))
        return Checkpoints.from_json(j)

    # ---- code -----------------------------------------------------------------------------
    def upload_code(self, directory: str, project: str | None = None) -> str:
        """Packs ``directory`` (honouring its ``.kilnignore``; see kiln.code) into a gzip'd tar,
        uploads it into ``project`` (default: "default") and returns the source a script job
        names: "code:sha256:<digest>", the SHA-256 of the archive. The same tree packs to the same
        bytes, which kilnd keeps once; only the project's members see them."""
        with tempfile.TemporaryFile() as f:
            code.pack_dir(directory, f)
            size = f.tell()
            f.seek(0)
            path = "/v1/code"
            if project:
                path += "?" + urllib.parse.urlencode({"project": project})
            hdrs = {"Accept": "application/json", "User-Agent": "kiln-python/0.1",
                    "Content-Type": "application/gzip", "Content-Length": str(size)}
            if self._token:
                hdrs["Authorization"] = "Bearer " + self._token
            req = urllib.request.Request(self.url + path, data=f, headers=hdrs, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=max(self.timeout, 60), context=self._ssl) as r:
                    raw = r.read()
            except urllib.error.HTTPError as e:
                body = e.read()
                e.close()
                raise KilnError.from_reply(e.code, body) from None
            except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError) as e:
                reason: object = getattr(e, "reason", e)
                raise KilnError("could not connect to kilnd at %s: %s (is kilnd running? set KILN_URL)"
                                % (self.url, reason), code="unavailable", status=0) from None
        return _str(_obj(json.loads(raw)).get("source"))

    # ---- tuning jobs --------------------------------------------------------------------
    def create_tuning_job(self, spec: Mapping[str, Any]) -> TuningJob:
        """Starts a tuning job (POST /v1/tuning-jobs: {"name", "job", "parameters", "objective",
        "strategy", ...}, docs/contracts.md) and returns its TuningJob. A bad spec raises
        KilnError naming the field (status 400). HyperparameterTuner builds the spec."""
        _, j = self._call("POST", "/v1/tuning-jobs", body=spec)
        return TuningJob(self, j)

    def tuning_job(self, tuning_job_id: str) -> TuningJob:
        """The tuning job with this id, with its trials, best trial and events."""
        _, j = self._call("GET", "/v1/tuning-jobs/" + _seg(tuning_job_id))
        return TuningJob(self, j)

    def tuning_jobs(self, limit: int | None = None, page_size: int | None = None) -> list[TuningJob]:
        """The tuning jobs of the projects you can see, newest first, page by page (GET
        /v1/tuning-jobs, ``page_size`` of them a request: 1 to 500, default 500). ``limit``: at most
        this many (default: all)."""
        def fetch(size: int, token: str) -> JSONObject:
            return self._call("GET", "/v1/tuning-jobs", query={"page_size": size, "page_token": token or None})[1]
        return [TuningJob(self, t) for t in _pages(fetch, "tuning_jobs", limit, page_size)]

    def find_tuning_job(self, ref: str, page_size: int | None = None) -> TuningJob:
        """The tuning job ``ref`` names: its id, a unique prefix of its id (4 characters or more, in
        either case), or its name when one tuning job you can see has it (a name may be as long as an
        id: only 36 characters shaped as an id are one), looked for among every tuning job you can
        see (``page_size`` of them a request, as tuning_jobs reads them). Several matches raise
        KilnError (status 400) listing them; none, status 404."""
        if len(ref) == 36 and all(c == "-" if i in (8, 13, 18, 23) else c in "0123456789abcdefABCDEF"
                                  for i, c in enumerate(ref)):
            return self.tuning_job(ref)
        low = ref.lower()
        found = [t for t in self.tuning_jobs(page_size=page_size)
                 if t.name == ref or (len(ref) >= 4 and t.id.startswith(low))]
        if len(found) > 1:
            raise KilnError('"%s" names %d tuning jobs' % (ref, len(found)), code="invalid_argument", status=400,
                            detail="candidates: " + ", ".join(t.id for t in found[:_CANDIDATES]),
                            hint="give the tuning job's id (or a prefix only it has)")
        if not found:
            raise KilnError('no tuning job has the id, id prefix or name "%s"' % ref, code="not_found", status=404,
                            hint="kiln tune list lists the tuning jobs you can see")
        return self.tuning_job(found[0].id)

    def stop_tuning_job(self, tuning_job_id: str) -> TuningJob:
        """Stops a tuning job and its trials (editors); returns it STOPPING (or already ended)."""
        _, j = self._call("POST", "/v1/tuning-jobs/%s:stop" % _seg(tuning_job_id), body={})
        return TuningJob(self, j)

    # ---- cluster ------------------------------------------------------------------------
    def workers(self) -> list[JSONObject]:
        """Registered workers: dicts with id, hostname, address, slots, slots_free, slot_type,
        state ("ALIVE" | "DEAD"), last_heartbeat, registered_at, gpus, data_roots, and how each
        registered: approval ("APPROVED" | "PENDING": waits for a cluster admin), join_token (its
        id, "file" for kilnd's --join-token-file), cert_sha256 (the client certificate it is bound
        to, "" without mutual TLS) and registered_from."""
        _, j = self._call("GET", "/v1/workers")
        return _objs(j.get("workers"))

    def queues(self) -> list[JSONObject]:
        """The queues jobs wait in (everyone reads them): dicts with name, cohort, quota
        ({"cpu": N, "gpu": N}; None: no limit), borrowing_limit, lending_limit, weight, projects
        (["*"]: every project), fair_sharing, preemption ({"within_queue": "lower_priority" |
        "never", "reclaim_within_cohort": "any" | "lower_priority" | "never"}), usage (slots in use),
        pending (jobs waiting), admitted (jobs holding slots), created_at, created_by, updated_at
        (docs/contracts.md, "Queues")."""
        return _objs(self._call("GET", "/v1/queues")[1].get("queues"))

    def queue(self, name: str) -> JSONObject:
        """One queue, as queues() lists it; KilnError 404 when there is none of that name."""
        return self._call("GET", "/v1/queues/%s" % _seg(name))[1]

    def create_queue(self, name: str, quota: Mapping[str, int] | None, *, cohort: str | None = None,
                     borrowing_limit: Mapping[str, int] | None = None,
                     lending_limit: Mapping[str, int] | None = None, weight: float | None = None,
                     projects: Sequence[str] | None = None, fair_sharing: bool | None = None,
                     preempt_within_queue: str | None = None,
                     reclaim_within_cohort: str | None = None) -> JSONObject:
        """Creates a queue (cluster admins; as `kiln queues create`): quota per slot type
        ({"cpu": 8, "gpu": 0}; None: no limit), a cohort whose queues lend each other their unused
        quota within the limits, a fair-sharing weight, the projects that may submit to it (default:
        every project), and its preemption policy: which of its own jobs its jobs may preempt
        (preempt_within_queue "lower_priority", the default, or "never") and which jobs of its
        cohort's borrowing queues (reclaim_within_cohort "any", the default, "lower_priority" or
        "never"). Returns it; a bad field raises KilnError 400 naming it."""
        body: JSONObject = {"name": name, "quota": dict(quota) if quota is not None else None}
        if cohort is not None:
            body["cohort"] = cohort
        if borrowing_limit is not None:
            body["borrowing_limit"] = dict(borrowing_limit)
        if lending_limit is not None:
            body["lending_limit"] = dict(lending_limit)
        if weight is not None:
            body["weight"] = weight
        if projects is not None:
            body["projects"] = list(projects)
        if fair_sharing is not None:
            body["fair_sharing"] = bool(fair_sharing)
        preemption = _preemption(preempt_within_queue, reclaim_within_cohort)
        if preemption:
            body["preemption"] = preemption
        return self._call("POST", "/v1/queues", body=body)[1]

    def update_queue(self, name: str, **changes: Any) -> JSONObject:
        """Changes the fields given by keyword (quota, cohort, borrowing_limit, lending_limit,
        weight, projects, fair_sharing, preemption, or preempt_within_queue and
        reclaim_within_cohort as create_queue takes them), as PATCH /v1/queues/{name} does: None
        clears a cohort or a limit, makes the quota unlimited, or sets the preemption policy's
        defaults (preemption=None: both; preempt_within_queue=None: that one). Returns the queue
        (cluster admins)."""
        body = dict(changes)
        fields = {"preempt_within_queue": "within_queue", "reclaim_within_cohort": "reclaim_within_cohort"}
        policy = {fields[k]: body.pop(k) for k in fields if k in body}
        if policy:
            # None is the field's default, as null is in PATCH; preemption=None resets the other too
            base = body.get("preemption", {})
            preemption: JSONObject = dict.fromkeys(fields.values()) if base is None else dict(base)
            preemption.update(policy)
            body["preemption"] = preemption
        return self._call("PATCH", "/v1/queues/%s" % _seg(name), body=body)[1]

    def delete_queue(self, name: str) -> JSONObject:
        """Deletes a queue none of whose jobs waits, runs or is paused, and that is no project's
        default queue (else KilnError 409 saying which); cluster admins."""
        return self._call("DELETE", "/v1/queues/%s" % _seg(name))[1]

    def health(self) -> bool:
        """True when kilnd answers /readyz (database reachable, migrations applied)."""
        try:
            self._call("GET", "/readyz")
            return True
        except KilnError:
            return False

    # ---- identity: who am I, users, tokens, projects, members ---------------------------
    def whoami(self) -> JSONObject:
        """Who the token belongs to: {"user", "cluster_admin", "projects": [{"project", "role"}],
        "token_id", "token_expires_at" ("" when it does not expire)}."""
        return self._call("GET", "/v1/whoami")[1]

    def users(self) -> list[JSONObject]:
        """Every user (cluster admins only): dicts with name, cluster_admin, created_at, created_by."""
        return _objs(self._call("GET", "/v1/users")[1].get("users"))

    def create_user(self, name: str, cluster_admin: bool = False) -> JSONObject:
        """Creates a user (cluster admins only); returns it. Give it a token with create_token()."""
        return self._call("POST", "/v1/users", body={"name": name, "cluster_admin": bool(cluster_admin)})[1]

    def create_token(self, user: str | None = None, expires_in_s: int | None = None,
                     description: str | None = None) -> JSONObject:
        """Creates an API token for user (default: the caller; others' need a cluster admin) and
        returns {"id", "token", "expires_at", "user", "created_by", "parent_id",
        "expires_with_parent"}. "token" is the secret, which kilnd never shows again. The token is
        made with this client's token (parent_id): it never outlives it and is revoked with it.
        expires_in_s None (or 0) makes one valid until revoked, or, when this client's token
        expires, until then (expires_with_parent True); a longer expires_in_s than this client's
        token has left raises KilnError 400. A web UI session token makes none (403)."""
        body: JSONObject = {}
        if expires_in_s:
            body["expires_in_s"] = int(expires_in_s)
        if description is not None:
            body["description"] = description
        return self._call("POST", "/v1/users/%s/tokens" % _seg(user or _str(self.whoami().get("user"))), body=body)[1]

    def tokens(self, user: str | None = None) -> list[JSONObject]:
        """The tokens of user (default: the caller), without their secrets: dicts with id, user,
        description, kind ("api" or "session": a web UI login's), created_by and parent_id (who
        made it, with which token; "" for none), created_at, expires_at, revoked_at, last_used_at
        (None when unset)."""
        path = "/v1/users/%s/tokens" % _seg(user or _str(self.whoami().get("user")))
        return _objs(self._call("GET", path)[1].get("tokens"))

    def revoke_token(self, id: str) -> JSONObject:
        """Revokes a token (yours, or anyone's for a cluster admin) and every token made with it;
        returns it, with descendants_revoked (how many of those were valid). The next request made
        with any of them gets 401."""
        return self._call("DELETE", "/v1/tokens/%s" % _seg(id))[1]

    def projects(self) -> list[JSONObject]:
        """The projects the caller belongs to, with its role (a cluster admin: all of them, with
        role "" where it is not a member): dicts with name, role, created_at, created_by, default_queue."""
        return _objs(self._call("GET", "/v1/projects")[1].get("projects"))

    def create_project(self, name: str, default_queue: str | None = None) -> JSONObject:
        """Creates a project (cluster admins only); returns it. Its jobs that name no queue go to
        default_queue (None: the queue "default")."""
        body: JSONObject = {"name": name}
        if default_queue is not None:
            body["default_queue"] = default_queue
        return self._call("POST", "/v1/projects", body=body)[1]

    def update_project(self, project: str, default_queue: str | None) -> JSONObject:
        """Sets the project's default queue (None: "default"); needs the project's admin role.
        Returns the project, with its "default_queue"."""
        return self._call("PATCH", "/v1/projects/%s" % _seg(project), body={"default_queue": default_queue})[1]

    def members(self, project: str) -> list[JSONObject]:
        """The members of project: dicts with project, user, role."""
        return _objs(self._call("GET", "/v1/projects/%s/members" % _seg(project))[1].get("members"))

    def set_member(self, project: str, user: str, role: str) -> JSONObject:
        """Gives user the role "viewer", "editor" or "admin" in project (or changes it); needs the
        project's admin role. Returns {"project", "user", "role"}."""
        return self._call("PUT", "/v1/projects/%s/members/%s" % (_seg(project), _seg(user)), body={"role": role})[1]

    def remove_member(self, project: str, user: str) -> JSONObject:
        """Takes user out of project; needs the project's admin role. Returns {"project", "user"}."""
        return self._call("DELETE", "/v1/projects/%s/members/%s" % (_seg(project), _seg(user)))[1]


def _seg(s: object) -> str:
    """s as one URL path segment. "", "." and ".." are none (a URL drops them: "" asked for the
    list the path's parent names) and raise KilnError before any request, as the CLI refuses them."""
    text = str(s)
    if text in ("", ".", ".."):
        raise KilnError('"%s" names nothing' % text, code="invalid_argument", status=0,
                        hint="give the id or name of what you mean")
    return urllib.parse.quote(text, safe="")


class _Handle:
    """What a Job and a TuningJob share: the JSON of the last fetch behind properties, its
    state, and polling until it ends. Subclasses say how to fetch (refresh) and which states end."""

    _terminal: frozenset[str] = frozenset()
    _kind = "job"

    def __init__(self, client: Client, data: JSONObject) -> None:
        self.client = client
        self._data = data

    def __repr__(self) -> str:
        return "<kiln.%s %s %r %s>" % (type(self).__name__, self.id[:8], self.name, self.state)

    @property
    def id(self) -> str:
        return _str(self._data.get("id"))

    @property
    def name(self) -> str:
        return _str(self._data.get("name"))

    @property
    def state(self) -> str:
        return _str(self._data.get("state"))

    @property
    def reason(self) -> str:
        return _str(self._data.get("reason"))

    @property
    def done(self) -> bool:
        return self.state in self._terminal

    def to_dict(self) -> JSONObject:
        return dict(self._data)

    def _fetch(self) -> JSONObject:
        raise NotImplementedError

    def _poll(self, timeout: float | None, poll: float) -> None:
        """Fetches until the state is one that ends; TimeoutError after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._data = self._fetch()
            if self.done:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError("%s %s still %s after %.0f s" % (self._kind, self.id, self.state, timeout or 0.0))
            time.sleep(poll)


class Job(_Handle):
    """A handle on one job. Properties read the JSON from the last fetch; call refresh()
    (or wait()) to update them."""

    _terminal = TERMINAL_STATES

    def __init__(self, client: Client, data: JSONObject) -> None:
        super().__init__(client, data)
        self.created = True

    def _fetch(self) -> JSONObject:
        return self.client.job(self.id)._data

    @property
    def state(self) -> str:
        """"QUEUED", "SCHEDULED", "STARTING", "RUNNING", "STOPPING", "RESTARTING",
        "COMPLETED", "FAILED", "STOPPED", "PREEMPTED" or "PAUSED" (as of the last refresh)."""
        return _str(self._data.get("state"))

    @property
    def attempt(self) -> int:
        return _int(self._data.get("attempt"))

    @property
    def progress(self) -> JSONObject:
        """{"step", "total_steps", "eta_s"}."""
        return _obj(self._data.get("progress"))

    @property
    def pending(self) -> JSONObject | None:
        """While the job waits to be placed: {"position", "missing", "blocking_jobs",
        "estimated_start"} (estimated_start absent when unknown); None once it is placed."""
        p = self._data.get("pending")
        return _obj(p) if isinstance(p, dict) else None

    @property
    def latest_metrics(self) -> dict[str, float]:
        """The latest value of each metric: {"train_loss": 2.41, ...}."""
        return {k: float(v) for k, v in _obj(self._data.get("metrics")).items() if isinstance(v, (int, float))}

    @property
    def workers(self) -> list[str]:
        w = self._data.get("workers")
        return [x for x in cast("list[object]", w) if isinstance(x, str)] if isinstance(w, list) else []

    @property
    def summaries(self) -> dict[str, JSONObject]:
        """Metric summaries: {"val_loss": {"count", "min", "max", "last", "min_step", "max_step",
        "last_step", "rank", "attempt"}, ...}: every metric for a job read by id; for a job from
        search(), the metrics its columns named."""
        return {k: _obj(v) for k, v in _obj(self._data.get("summaries")).items()}

    @property
    def columns(self) -> dict[str, float | None]:
        """The columns a search asked for: {"hp.lr": 0.0003, "metrics.val_loss.min": 1.52, ...}
        (None where the job has no value); {} for a job not read by search()."""
        return {k: (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None)
                for k, v in _obj(self._data.get("columns")).items()}

    @property
    def spec(self) -> JSONObject:
        """The normalised spec kilnd stored (defaults filled in)."""
        return _obj(self._data.get("spec"))

    @property
    def model_data(self) -> ModelData | None:
        """Where the trained model is, SageMaker-style: a ModelData (a str holding its URL, with
        size, sha256 and download(path)), or None while the job has no model artifact."""
        return self.client.model_data(self.id)

    def describe(self) -> JSONObject:
        """The job with its events (Client.describe)."""
        return self.client.describe(self.id)

    # ---- actions ------------------------------------------------------------------------
    def refresh(self) -> Job:
        self._data = self._fetch()
        return self

    def wait(self, timeout: float | None = None, poll: float = 0.5, raise_on_failure: bool = False) -> Job:
        """Polls until the job ends; returns self. Raises TimeoutError after ``timeout``
        seconds, and JobFailedError when ``raise_on_failure`` and it did not COMPLETE."""
        self._poll(timeout, poll)
        if raise_on_failure and self.state != "COMPLETED":
            raise JobFailedError(self)
        return self

    def stop(self, reason: str | None = None) -> Job:
        self._data = self.client.stop(self.id, reason).to_dict()
        return self

    def events(self) -> list[JSONObject]:
        return self.client.events(self.id)

    def delete(self) -> JSONObject:
        """Deletes the job (it must have ended) and everything it left; returns kilnd's summary."""
        return self.client.delete(self.id)

    def artifacts(self) -> list[Artifact]:
        """The job's artifacts (a list of Artifact); see Client.artifacts."""
        return self.client.artifacts(self.id)

    def checkpoints(self) -> Checkpoints:
        """The job's synced checkpoint directory (a Checkpoints); see Client.checkpoints."""
        return self.client.checkpoints(self.id)

    def download(self, name: str, path: str | None = None) -> str:
        """Saves one of the job's artifacts (checked against its SHA-256); returns the path."""
        return self.client.download(self.id, name, path)

    def logs(self, follow: bool = False, rank: int | None = None, since: str | None = None) -> Iterator[LogLine]:
        """A generator of LogLine (str(line) is "[rank N] text"); see Client.logs."""
        return self.client.logs(self.id, follow=follow, rank=rank, since=since)

    def metrics(self, name: str | None = None, max_points: int | None = None,
                attempt: int | str = "latest") -> dict[str, list[MetricPoint]]:
        """{name: [MetricPoint, ...]}: each point unpacks as (step, value) and carries its time,
        rank and attempt; with ``name`` only that metric (see Client.metrics)."""
        return self.client.metrics(self.id, name=name, max_points=max_points, attempt=attempt)

    def metric_rows(self, name: str | None = None, attempt: int | str = "latest") -> list[JSONObject]:
        """Every point as a dict with its step and time (Client.metric_rows)."""
        return self.client.metric_rows(self.id, name=name, attempt=attempt)

    def dataframe(self, name: str | None = None, attempt: int | str = "latest") -> Any:
        """Every metric by step and time as a pandas DataFrame (Client.dataframe)."""
        return self.client.dataframe(self.id, name=name, attempt=attempt)


#: The states a tuning job ends in.
TUNING_TERMINAL_STATES = frozenset(("COMPLETED", "FAILED", "STOPPED"))


@dataclass(frozen=True)
class Trial:
    """One trial of a tuning job: an ordinary job (``job_id``) trained with ``parameters``;
    ``objective`` is its latest value of the objective metric (None before it reports one),
    ``steps`` the steps it trained, ``rung`` its hyperband rung, ``state`` its job's state;
    ``parent`` the warm start parent tuning job whose trial it is (history), None for its own."""
    trial: int
    job_id: str
    parameters: JSONObject
    objective: float | None
    steps: int
    rung: int
    state: str
    parent: str | None = None

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> Trial:
        o = j.get("objective")
        return cls(trial=_int(j.get("trial")), job_id=_str(j.get("job_id")), parameters=_obj(j.get("parameters")),
                   objective=float(o) if isinstance(o, (int, float)) and not isinstance(o, bool) else None,
                   steps=_int(j.get("steps")), rung=_int(j.get("rung")), state=_str(j.get("state")),
                   parent=j["parent"] if isinstance(j.get("parent"), str) else None)


#: The columns of TuningJob.dataframe() besides one per parameter.
TRIAL_COLUMNS = ("trial", "job_id", "objective", "steps", "rung", "state", "parent")


class TuningJob(_Handle):
    """A handle on one tuning job (its trials are ordinary jobs tagged ``tuning_job``).
    Properties read the JSON from the last fetch; refresh() or wait() updates them. ``state``
    is "RUNNING", "STOPPING", "COMPLETED", "FAILED" or "STOPPED"."""

    _terminal = TUNING_TERMINAL_STATES
    _kind = "tuning job"

    def _fetch(self) -> JSONObject:
        return self.client.tuning_job(self.id)._data

    @property
    def objective(self) -> JSONObject:
        """{"metric": ..., "goal": "minimize" | "maximize"}."""
        return _obj(self._data.get("objective"))

    @property
    def trials(self) -> list[Trial]:
        """Every trial so far, in the order the search made them."""
        return [Trial.from_json(t) for t in _objs(self._data.get("trials"))]

    @property
    def best(self) -> JSONObject | None:
        """{"job_id", "objective", "parameters"} of the best trial so far, or None before any
        trial reported the objective."""
        b = self._data.get("best")
        return _obj(b) if isinstance(b, dict) else None

    def best_job(self) -> Job | None:
        """The best trial's Job (its model through ``model_data``), or None before there is one."""
        b = self.best
        return self.client.job(_str(b.get("job_id"))) if b else None

    def refresh(self) -> TuningJob:
        self._data = self._fetch()
        return self

    def wait(self, timeout: float | None = None, poll: float = 1.0) -> TuningJob:
        """Polls until the tuning job ends; returns self. Raises TimeoutError after ``timeout``
        seconds. A tuning job that ends FAILED is returned as it is: its reason says why."""
        self._poll(timeout, poll)
        return self

    def stop(self) -> TuningJob:
        self._data = self.client.stop_tuning_job(self.id)._data
        return self

    def trial_rows(self) -> list[JSONObject]:
        """One dict per trial: TRIAL_COLUMNS and each parameter by its name."""
        rows: list[JSONObject] = []
        for t in self.trials:
            row: JSONObject = {"trial": t.trial, "job_id": t.job_id, "objective": t.objective, "steps": t.steps,
                               "rung": t.rung, "state": t.state, "parent": t.parent}
            row.update(t.parameters)
            rows.append(row)
        return rows

    def dataframe(self) -> Any:
        """The trials as a pandas DataFrame (trial_rows()), in the manner of SageMaker's
        ``HyperparameterTuningJobAnalytics(...).dataframe()``. Needs pandas."""
        try:
            pandas = importlib.import_module("pandas")
        except ImportError:
            raise ImportError("dataframe() needs pandas (apt-get install python3-pandas, or pip install pandas); "
                              "trial_rows() gives the same rows as dicts without it") from None
        return pandas.DataFrame(self.trial_rows())
