"""Estimator: describe a training job once, then fit() it, in the manner of SageMaker's
Python SDK (``Estimator(...).fit(inputs, wait=False)``, ``Estimator.attach(job_id)``,
``latest_training_job``, ``model_data``). It builds a kiln job spec (docs/contracts.md) and
submits it through a Client; it does no training itself.
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Mapping
from typing import Any, cast

from .client import Client, Job, JSONObject, ModelData
from .errors import JobFailedError, KilnError

# The spec sections Estimator takes by name; every other one goes through **spec_sections.
_NAMED = ("model", "data", "hyperparameters", "resources", "distribution", "name")


def _data_section(data: str | Mapping[str, Any] | None) -> JSONObject:
    """A str is the training file; a dict is the data section as is."""
    if data is None:
        return {}
    section: JSONObject = {"train": data} if isinstance(data, str) else dict(data)
    for key in ("train", "val"):
        path = section.get(key)
        # A relative path that exists here is made absolute, so an agent on this machine
        # finds it whatever its working directory is.
        if isinstance(path, str) and "://" not in path and not os.path.isabs(path) and os.path.exists(path):
            section[key] = os.path.abspath(path)
    return section


class Estimator:
    """A training job description.

    model            {"type": "gpt", "n_layer": 4, ...} (the spec's model section)
    data             the training text file, or the data section {"train": ..., "val_fraction": ...}
    hyperparameters  {"lr": 3e-4, "global_batch_size": 16, "max_steps": 1000, ...}
    resources        {"nodes": 2, "slots_per_node": 1, "slot_type": "cpu"}; instance_count and
                     instance_type ("cpu" | "gpu") are accepted as SageMaker-style shorthands
    distribution     {"data_parallel": {...}, "model_parallel": {...}, ...}
    name             the job name (also the default name of every fit())
    Any other job-spec section (checkpoint, tags, priority, project, retry, stopping,
    metric_definitions, queue) can be given as a keyword argument of the same name.
    ``client`` (or ``url``) says which kilnd to use (default: as Client() finds it).
    """

    def __init__(self, model: Mapping[str, Any], data: str | Mapping[str, Any] | None = None,
                 hyperparameters: Mapping[str, Any] | None = None, resources: Mapping[str, Any] | None = None,
                 distribution: Mapping[str, Any] | None = None, name: str | None = None,
                 client: Client | None = None, url: str | None = None, instance_count: int | None = None,
                 instance_type: str | None = None, **spec_sections: Any) -> None:
        self.model: JSONObject = dict(model)
        self.data = data
        self.hyperparameters: JSONObject = dict(hyperparameters or {})
        self.resources: JSONObject = dict(resources or {})
        if instance_count is not None:
            self.resources["nodes"] = int(instance_count)
        if instance_type is not None:
            self.resources["slot_type"] = instance_type
        self.distribution: JSONObject | None = copy.deepcopy(dict(distribution)) if distribution else None
        self.name = name
        self.extra: JSONObject = spec_sections
        self.client = client or Client(url)
        self.latest_job: Job | None = None

    @classmethod
    def attach(cls, job_id: str, client: Client | None = None, url: str | None = None) -> Estimator:
        """An Estimator for a job submitted earlier (from anywhere: the CLI, another process),
        like SageMaker's ``Estimator.attach(training_job_name)``: its spec becomes the
        Estimator's, and the job its ``latest_training_job``, so ``logs()``, ``model_data`` and
        ``describe()`` work on it and ``fit()`` submits the same spec again. ``job_id`` may be a
        unique prefix of the id."""
        c = client or Client(url)
        job = c.job(job_id)
        spec = job.spec
        model = spec.get("model")
        if not isinstance(model, dict):
            raise KilnError("job %s has no model in its spec" % job.id, code="failed_precondition")
        model = cast("dict[str, Any]", model)
        extra = {k: copy.deepcopy(v) for k, v in spec.items() if k not in _NAMED}
        est = cls(model=copy.deepcopy(model), data=copy.deepcopy(spec.get("data")),
                  hyperparameters=spec.get("hyperparameters"), resources=spec.get("resources"),
                  distribution=spec.get("distribution"), name=spec.get("name") or job.name or None,
                  client=c, **extra)
        est.latest_job = job
        return est

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
        """The job spec fit() would submit (a new dict). ``inputs`` as in fit()."""
        spec: JSONObject = {"model": copy.deepcopy(self.model)}
        data = _data_section(self.data)
        if inputs is not None:
            data.update(_data_section(inputs))
        if data:
            spec["data"] = data
        if self.hyperparameters:
            spec["hyperparameters"] = dict(self.hyperparameters)
        if self.resources:
            spec["resources"] = dict(self.resources)
        if self.distribution:
            spec["distribution"] = copy.deepcopy(self.distribution)
        if name or self.name:
            spec["name"] = name or self.name
        for key, value in self.extra.items():
            spec[key] = copy.deepcopy(value)
        return spec

    def fit(self, inputs: str | Mapping[str, Any] | None = None, wait: bool = True, logs: bool = True,
            job_name: str | None = None, idempotency_key: str | None = None, timeout: float | None = None) -> Job:
        """Submits the job and returns its Job.

        inputs   overrides the data: a training file path, or {"train": ..., "val": ...}
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
