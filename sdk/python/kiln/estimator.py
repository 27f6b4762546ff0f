"""Estimator: describe a training job once, then fit() it, in the manner of SageMaker's
Python SDK (``Estimator(...).fit(inputs, wait=False)``). It builds a kiln job spec
(docs/contracts.md) and submits it through a Client; it does no training itself.
"""

import copy
import os
import sys

from .client import Client
from .errors import JobFailedError


def _data_section(data):
    """A str is the training file; a dict is the data section as is."""
    if data is None:
        return {}
    if isinstance(data, str):
        data = {"train": data}
    data = dict(data)
    for key in ("train", "val"):
        path = data.get(key)
        # A relative path that exists here is made absolute, so an agent on this machine
        # finds it whatever its working directory is.
        if isinstance(path, str) and "://" not in path and not os.path.isabs(path) and os.path.exists(path):
            data[key] = os.path.abspath(path)
    return data


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
    ``client`` (or ``url``) says which kilnd to use (default: $KILN_URL).
    """

    def __init__(self, model, data=None, hyperparameters=None, resources=None, distribution=None, name=None,
                 client=None, url=None, instance_count=None, instance_type=None, **spec_sections):
        self.model = dict(model)
        self.data = data
        self.hyperparameters = dict(hyperparameters or {})
        self.resources = dict(resources or {})
        if instance_count is not None:
            self.resources["nodes"] = int(instance_count)
        if instance_type is not None:
            self.resources["slot_type"] = instance_type
        self.distribution = copy.deepcopy(distribution) if distribution else None
        self.name = name
        self.extra = spec_sections
        self.client = client or Client(url)
        self.latest_job = None

    def spec(self, inputs=None, name=None):
        """The job spec fit() would submit (a new dict). ``inputs`` as in fit()."""
        spec = {"model": copy.deepcopy(self.model)}
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

    def fit(self, inputs=None, wait=True, logs=True, job_name=None, idempotency_key=None, timeout=None):
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

    @property
    def model_data(self):
        """The latest job's trained model (see Job.model_data), or None."""
        if self.latest_job is None:
            raise ValueError("fit() has not been called")
        return self.latest_job.model_data

    def logs(self, follow=True):
        """Prints the latest job's logs (following them until it ends by default)."""
        if self.latest_job is None:
            raise ValueError("fit() has not been called")
        for line in self.latest_job.logs(follow=follow):
            print(line, flush=True)
