"""Estimator: describe a training job once, then fit() it, in the manner of SageMaker's
Python SDK (``Estimator(entry_point=..., source_dir=...).fit(inputs, wait=False)``,
``Estimator.attach(name)``, ``latest_training_job``, ``model_data``). It builds a kiln job spec
(docs/contracts.md): a script job (your own code: entry_point and its source) or an engine job
(kiln's own model), and submits it through a Client; it does no training itself.
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, cast

from .client import Client, Job, JSONObject, ModelData
from .errors import JobFailedError, KilnError

#: The slot types kiln places ranks on: what ``instance_type`` may name.
INSTANCE_TYPES = ("cpu", "gpu")

#: The channel a str ``inputs`` becomes in a script job (SageMaker's name for it).
DEFAULT_CHANNEL = "training"


def _local_path(path: Any) -> Any:
    """A relative path that exists here, made absolute, so an agent on this machine finds it
    whatever its working directory is; anything else as it is."""
    if isinstance(path, str) and "://" not in path and not os.path.isabs(path) and os.path.exists(path):
        return os.path.abspath(path)
    return path


def _data_section(data: str | Mapping[str, Any] | None) -> JSONObject:
    """An engine job's data: a str is the training file; a dict is the data section as is."""
    if data is None:
        return {}
    section: JSONObject = {"train": data} if isinstance(data, str) else dict(data)
    for key in ("train", "val", "validation"):
        if key in section:
            section[key] = _local_path(section[key])
    return section


def _channels(data: str | Mapping[str, Any] | None) -> JSONObject:
    """A script job's channels: a str is the "training" channel; a dict names channels (or is
    the data section, {"channels": {...}})."""
    if data is None:
        return {}
    if isinstance(data, str):
        return {DEFAULT_CHANNEL: _local_path(data)}
    inner = data.get("channels")
    chans = cast("Mapping[str, Any]", inner) if isinstance(inner, Mapping) and len(data) == 1 else data
    return {k: _local_path(v) for k, v in chans.items()}


def _instance_type(value: str) -> str:
    """value when kiln knows it as a slot type; else KilnError saying what kiln uses instead."""
    if value in INSTANCE_TYPES:
        return value
    lower = value.lower()
    gpu = lower.startswith(("ml.p", "ml.g", "ml.trn", "ml.inf")) or "gpu" in lower
    raise KilnError('kiln has no instance type "%s": it places ranks on slots of type "cpu" or "gpu"' % value,
                    code="invalid_argument", field="instance_type",
                    detail="kiln runs on the agents registered with it, each offering slots of one type; a job asks "
                           "for instance_count nodes with resources={\"slots_per_node\": N} slots on each",
                    hint='use instance_type="%s"' % ("gpu" if gpu else "cpu"))


class Estimator:
    """A training job description: your own script (``entry_point``) or kiln's engine (``model``),
    one or the other.

    Script jobs (SageMaker's script mode, torchrun's contract; docs/contracts.md):
      entry_point       the file to run, relative to the code: "train.py", "run.sh", a binary;
                        a local file alone (no source_dir) ships its own directory
      source_dir        a local directory, packed (honouring .kilnignore) and uploaded by fit()
      source            or code already uploaded ("code:sha256:...") or a directory inside the
                        agents' data roots
      hyperparameters   free-form JSON, passed as --key value arguments and SM_HPS
      python            a Python inside the data roots to run a .py entry point with
      environment       {"NAME": "value"} for the ranks
    Engine jobs:
      model             {"type": "gpt", "n_layer": 4, ...} (the spec's model section)
      data              the training text file, or the data section {"train": ..., "val_fraction": ...}
      hyperparameters   {"lr": 3e-4, "global_batch_size": 16, "max_steps": 1000, ...}
    Either:
      instance_count    nodes (resources.nodes)
      instance_type     "cpu" or "gpu" (resources.slot_type); a cloud instance type is refused
                        with a message saying which of the two to use
      resources         {"nodes": 2, "slots_per_node": 1, "slot_type": "cpu", "memory_limit_mb": ...}
      distribution      {"torch_distributed": {"enabled": True}} (scripts), or
                        {"data_parallel": {...}, "model_parallel": {...}} (the engine)
      metric_definitions [{"Name": "val_acc", "Regex": "val_acc=([0-9.]+)"}] (SageMaker's keys or
                        kiln's name/regex)
      name, project, queue, priority, tags, checkpoint, stopping, retry: the spec's sections of
                        the same names
    ``client`` (or ``url``) says which kilnd to use (default: as Client() finds it). Every
    keyword is declared, so a type checker flags a misspelled one.
    """

    def __init__(self, model: Mapping[str, Any] | None = None, data: str | Mapping[str, Any] | None = None,
                 hyperparameters: Mapping[str, Any] | None = None, resources: Mapping[str, Any] | None = None,
                 distribution: Mapping[str, Any] | None = None, name: str | None = None,
                 client: Client | None = None, url: str | None = None, instance_count: int | None = None,
                 instance_type: str | None = None, *, entry_point: str | None = None, source_dir: str | None = None,
                 source: str | None = None, python: str | None = None, environment: Mapping[str, str] | None = None,
                 metric_definitions: Sequence[Mapping[str, str]] | None = None, project: str | None = None,
                 queue: str | None = None, priority: int | None = None, tags: Mapping[str, str] | None = None,
                 checkpoint: Mapping[str, Any] | None = None, stopping: Mapping[str, Any] | None = None,
                 retry: Mapping[str, Any] | None = None) -> None:
        if (model is None) == (entry_point is None):
            raise KilnError("a job names either model (kiln's engine trains it) or entry_point (your own script)%s"
                            % (", not both" if model is not None else "; this one names neither"),
                            code="invalid_argument", field="entry_point" if model is not None else "model",
                            hint='entry_point="train.py" with source_dir="." runs your script; '
                                 'model={"type": "gpt"} trains kiln\'s model')
        if source_dir is not None and source is not None:
            raise KilnError("source_dir and source both name the code; give one of them", code="invalid_argument",
                            field="source_dir")
        if entry_point is not None and source_dir is None and source is None and os.path.isfile(entry_point):
            # SageMaker's habit: an entry point alone ships the directory it is in
            source_dir = os.path.dirname(os.path.abspath(entry_point))
            entry_point = os.path.basename(entry_point)
        self.model: JSONObject | None = copy.deepcopy(dict(model)) if model is not None else None
        self.entry_point = entry_point
        self.source_dir = source_dir
        self.source = source
        self.python = python
        self.environment: dict[str, str] | None = dict(environment) if environment is not None else None
        self.data = data
        self.hyperparameters: JSONObject = copy.deepcopy(dict(hyperparameters or {}))
        self.resources: JSONObject = dict(resources or {})
        if instance_count is not None:
            self.resources["nodes"] = int(instance_count)
        if instance_type is not None:
            self.resources["slot_type"] = _instance_type(instance_type)
        self.distribution: JSONObject | None = copy.deepcopy(dict(distribution)) if distribution else None
        self.metric_definitions: list[dict[str, str]] | None = (
            [dict(d) for d in metric_definitions] if metric_definitions is not None else None)
        self.name = name
        self.project = project
        self.queue = queue
        self.priority = priority
        self.tags: dict[str, str] | None = dict(tags) if tags is not None else None
        self.checkpoint: JSONObject | None = copy.deepcopy(dict(checkpoint)) if checkpoint is not None else None
        self.stopping: JSONObject | None = copy.deepcopy(dict(stopping)) if stopping is not None else None
        self.retry: JSONObject | None = copy.deepcopy(dict(retry)) if retry is not None else None
        self.client = client or Client(url)
        self.latest_job: Job | None = None

    @classmethod
    def attach(cls, training_job_name: str, client: Client | None = None, url: str | None = None) -> Estimator:
        """An Estimator for a job submitted earlier (from anywhere: the CLI, another process),
        like SageMaker's ``Estimator.attach(training_job_name)``: its spec becomes the
        Estimator's, and the job its ``latest_training_job``, so ``logs()``, ``model_data`` and
        ``describe()`` work on it and ``fit()`` submits the same spec again.
        ``training_job_name`` is the job's id, a unique prefix of it, or its name when one job has
        it (Client.find_job)."""
        c = client or Client(url)
        job = c.find_job(training_job_name)
        est = cls.from_spec(job.spec, client=c, name=job.name or None)
        est.latest_job = job
        return est

    @classmethod
    def from_spec(cls, job_spec: Mapping[str, Any], client: Client | None = None, url: str | None = None,
                  name: str | None = None) -> Estimator:
        """An Estimator whose fit() submits ``job_spec`` (a job spec as kilnd stores it, e.g. a
        job's ``spec`` or a tuning job's base job); ``name`` when the spec has none."""
        spec = copy.deepcopy(dict(job_spec))

        def obj(key: str) -> JSONObject | None:
            v = spec.get(key)
            return cast(JSONObject, v) if isinstance(v, dict) else None

        def text(key: str) -> str | None:
            v = spec.get(key)
            return v if isinstance(v, str) else None

        model, entry_point = obj("model"), text("entry_point")
        if model is None and entry_point is None:
            raise KilnError("the job spec names neither a model nor an entry_point", code="failed_precondition")
        defs = spec.get("metric_definitions")
        priority = spec.get("priority")
        return cls(model=model, entry_point=entry_point, source=text("source"), python=text("python") or None,
                   environment=cast("dict[str, str] | None", obj("environment")), data=obj("data"),
                   hyperparameters=obj("hyperparameters"), resources=obj("resources"),
                   distribution=obj("distribution"), name=text("name") or name,
                   metric_definitions=cast("list[dict[str, str]]", defs) if isinstance(defs, list) else None,
                   project=text("project"), queue=text("queue") or None,
                   priority=priority if isinstance(priority, int) else None,
                   tags=cast("dict[str, str] | None", obj("tags")), checkpoint=obj("checkpoint"),
                   stopping=obj("stopping"), retry=obj("retry"), client=client or Client(url))

    @property
    def latest_training_job(self) -> Job | None:
        """The job the last fit() submitted (or attach() found); None before either."""
        return self.latest_job

    def _job(self) -> Job:
        if self.latest_job is None:
            raise KilnError("this Estimator has no job yet: call fit() or Estimator.attach(job_id)",
                            code="failed_precondition")
        return self.latest_job

    @property
    def model_data(self) -> ModelData | None:
        """Where the latest job's final model is, like SageMaker's ``estimator.model_data``: a
        ModelData (a str holding its artifact's URL, with size, sha256 and download(path)), or
        None while the job has no model. Raises KilnError before a job."""
        return self._job().model_data

    def describe(self) -> JSONObject:
        """The latest job as kilnd describes it, with its events (Client.describe)."""
        return self._job().describe()

    def spec(self, inputs: str | Mapping[str, Any] | None = None, name: str | None = None) -> JSONObject:
        """The job spec fit() would submit (a new dict). ``inputs`` as in fit(). A script job
        with a ``source_dir`` uploads it here (Client.upload_code: the same files upload once)."""
        spec: JSONObject = {}
        if self.entry_point is not None:
            spec["entry_point"] = self.entry_point
            source = self.source
            if self.source_dir is not None:
                source = self.client.upload_code(self.source_dir, project=self.project)
            if source is not None:
                spec["source"] = source
            if self.python:
                spec["python"] = self.python
            if self.environment is not None:
                spec["environment"] = dict(self.environment)
            chans = _channels(self.data)
            chans.update(_channels(inputs))
            if chans:
                spec["data"] = {"channels": chans}
        else:
            spec["model"] = copy.deepcopy(self.model)
            data = _data_section(self.data)
            if inputs is not None:
                data.update(_data_section(inputs))
            if data:
                spec["data"] = data
        if self.hyperparameters:
            spec["hyperparameters"] = copy.deepcopy(self.hyperparameters)
        if self.resources:
            spec["resources"] = dict(self.resources)
        if self.distribution:
            spec["distribution"] = copy.deepcopy(self.distribution)
        if name or self.name:
            spec["name"] = name or self.name
        sections: dict[str, Any] = {"metric_definitions": self.metric_definitions, "project": self.project,
                                    "queue": self.queue, "priority": self.priority, "tags": self.tags,
                                    "checkpoint": self.checkpoint, "stopping": self.stopping, "retry": self.retry}
        for key, value in sections.items():
            if value is not None:
                spec[key] = copy.deepcopy(value)
        return spec

    def fit(self, inputs: str | Mapping[str, Any] | None = None, wait: bool = True, logs: bool = True,
            job_name: str | None = None, idempotency_key: str | None = None, timeout: float | None = None) -> Job:
        """Submits the job (uploading source_dir first) and returns its Job.

        inputs   the data: for a script job {"train": "/data/train", "validation": ...} (channels,
                 each a directory or file inside the agents' data roots) or a path (the
                 "training" channel); for an engine job a training file path, or
                 {"train": ..., "val": ...}
        wait     block until the job ends; raises JobFailedError unless it COMPLETED
        logs     while waiting, print the ranks' log lines to stdout as they come
        """
        job = self.client.submit(self.spec(inputs, job_name), idempotency_key=idempotency_key)
        self.latest_job = job
        if not wait:
            return job
        if logs:
            for line in job.logs(follow=True):
                print(line, file=sys.stdout, flush=True)
        job.wait(timeout=timeout, raise_on_failure=False)
        if job.state != "COMPLETED":
            raise JobFailedError(job)
        return job

    def logs(self, follow: bool = True) -> None:
        """Prints the latest job's logs (following them until it ends by default)."""
        for line in self._job().logs(follow=follow):
            print(line, flush=True)
