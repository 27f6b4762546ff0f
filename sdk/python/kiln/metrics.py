"""log_metrics: the metric records of kiln's rank contract (docs/contracts.md, "Metric records";
rank/rank.h), written from a script a kiln job runs, so its metrics land as kiln-train's do: in
the job's metric store, summaries, search, charts and ``kiln compare``; pause_at_step: the step
the contract tells a rank to pause at. Standard library only, so a training script can import it
with nothing else installed; it talks to no server.
"""

from __future__ import annotations

import json
import math
import operator
import os
import re
import sys
import threading
import time
from collections.abc import Mapping
from typing import SupportsFloat

#: The variable holding the metric records' file descriptor (rank/rank.h RANK_ENV_METRICS_FD).
METRICS_FD_ENV = "KILN_METRICS_FD"
#: The variable holding the step to pause at (rank/rank.h RANK_ENV_PAUSE_AT_STEP).
PAUSE_AT_STEP_ENV = "KILN_PAUSE_AT_STEP"
#: Bytes of a metric's name, at most (RANK_METRIC_NAME_MAX).
NAME_MAX = 127
#: What a name may not hold (kiln_text_control): C0 controls, DEL, C1 controls, bidirectional
#: overrides and isolates, which would act on the terminal of whoever reads the metric's name.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def shown(text: str) -> str:
    """``text`` as kiln's CLI shows others' text on a terminal: each control character (as above;
    tab kept) written as ``\\uXXXX``, so that no escape sequence in a job's log line can clear the
    screen, set the window title or the clipboard, overwrite a line (CR) or reorder one."""
    return _CONTROL.sub(lambda m: m.group() if m.group() == "\t" else "\\u%04x" % ord(m.group()), text)


#: Bytes of one record line, newline included, at most (RANK_METRIC_RECORD_MAX).
RECORD_MAX = 1 << 20

_lock = threading.Lock()
_warned = False


def _number(name: str, value: object) -> float | str:
    """value as the contract writes it: a finite float, or "NaN", "Infinity", "-Infinity"."""
    # checked at run time too: scripts are often untyped
    if isinstance(value, bool) or not isinstance(value, SupportsFloat):
        raise TypeError("metric %r: a number is needed (got %s)" % (name, type(value).__name__))
    v = float(value)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def format_record(step: int, values: Mapping[str, SupportsFloat], when: float | None = None) -> bytes:
    """One metric record, newline-terminated: {"step", "time", "metrics"}. ``when`` is the Unix
    time in seconds (default now). Raises TypeError for a step that is not an int or a value
    that is not a number, ValueError for a negative step, a name empty, longer than NAME_MAX
    bytes or with a control character, or a record longer than RECORD_MAX bytes."""
    # checked at run time too: scripts are often untyped (numpy's integers are ints here, bools not)
    if isinstance(step, bool):
        raise TypeError("step: an int is needed (got bool)")
    try:
        step = operator.index(step)
    except TypeError:
        raise TypeError("step: an int is needed (got %s)" % type(step).__name__) from None
    if step < 0:
        raise ValueError("step must be 0 or more (got %d)" % step)
    metrics: dict[str, float | str] = {}
    for name, value in values.items():
        size = len(name.encode("utf-8", "surrogatepass"))
        if not 1 <= size <= NAME_MAX:
            raise ValueError("metric name %r is %d bytes; a name is 1 to %d bytes of UTF-8" % (name[:40], size, NAME_MAX))
        if _CONTROL.search(name):
            raise ValueError("metric name %r has a control character; a name has none (no tab, CR, ESC, other C0 or "
                             "C1 codes, DEL or bidirectional overrides)" % name[:40])
        metrics[name] = _number(name, value)
    record = {"step": step, "time": time.time() if when is None else float(when), "metrics": metrics}
    line = (json.dumps(record, allow_nan=False, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
    if len(line) > RECORD_MAX:
        raise ValueError("the record of step %d is %d bytes; at most %d fit in one" % (step, len(line), RECORD_MAX))
    return line


def log_metrics(step: int, **values: SupportsFloat) -> bool:
    """Records ``values`` (name=number) at optimizer step ``step`` (1-based, as kiln-train counts),
    stamped with the time now: ``kiln.log_metrics(120, train_loss=2.41, val_acc=0.93)``. Rank 0
    writes the job's metrics; another rank's points are tagged with its rank. NaN and infinities
    are written as the contract spells them (kiln keeps finite values only).

    Returns True when the record went to the job (the rank's $KILN_METRICS_FD), False outside a
    kiln job (no $KILN_METRICS_FD: a note on stderr the first time, nothing else). Raises as
    format_record does, and OSError when the descriptor cannot be written. Thread-safe: one
    record is one write."""
    global _warned
    line = format_record(step, values)
    fd_text = os.environ.get(METRICS_FD_ENV, "")
    if not fd_text:
        if not _warned:
            _warned = True
            print("kiln.log_metrics: %s is not set (not running as a kiln job); metrics are not recorded"
                  % METRICS_FD_ENV, file=sys.stderr)
        return False
    try:
        fd = int(fd_text)
    except ValueError:
        raise ValueError("%s=%r is not a file descriptor" % (METRICS_FD_ENV, fd_text[:20])) from None
    with _lock:
        view = memoryview(line)
        while view:
            n = os.write(fd, view)
            view = view[n:]
    return True


def pause_at_step() -> int | None:
    """The step this rank pauses at ($KILN_PAUSE_AT_STEP: the job's stopping.max_steps, such as a
    hyperband trial's rung), or None when there is none (train to max_steps). At that step write
    the checkpoint, report that step's metrics (the search's objective) and exit 0 on every rank:
    kiln marks the job PAUSED, and a promoted trial's next attempt resumes from the checkpoint
    with a later step here (or None). Raises ValueError when the variable is not a step from 1."""
    text = os.environ.get(PAUSE_AT_STEP_ENV, "")
    if not text:
        return None
    try:
        step = int(text)
    except ValueError:
        step = 0
    if step < 1:
        raise ValueError("%s=%r is not a step from 1" % (PAUSE_AT_STEP_ENV, text[:20]))
    return step
