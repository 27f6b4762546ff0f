"""HyperparameterTuner: run a tuning job over an Estimator, in the manner of SageMaker's
``HyperparameterTuner(estimator, objective_metric_name, hyperparameter_ranges, ...).fit()``.
It builds a tuning job spec (POST /v1/tuning-jobs, docs/contracts.md) from the Estimator's job
spec and the ranges; kilnd's controller runs the search (random, grid, or hyperband whose
trials pause at a rung and resume when promoted). Trials are ordinary kiln jobs.

    tuner = kiln.HyperparameterTuner(
        est, objective_metric_name="val_loss", objective_type="Minimize",
        hyperparameter_ranges={"lr": kiln.ContinuousParameter(1e-4, 1e-2, scaling_type="Logarithmic"),
                               "warmup_steps": kiln.IntegerParameter(0, 300),
                               "model.n_embd": kiln.CategoricalParameter([64, 128])},
        strategy="Hyperband", strategy_config=kiln.HyperbandStrategyConfig(min_resource=50, max_resource=1000),
        max_jobs=20, max_parallel_jobs=4, random_seed=1)
    tuner.fit(wait=True)
    best = tuner.best_training_job()         # the best trial's kiln.Job
    best.model_data.download("model.bin")     # its trained model

A warm start (SageMaker's WarmStartConfig) continues from earlier tuning jobs: their trials are the
new search's history, so none of their configurations is tried again and their best stays best
until a trial beats it:

    again = kiln.HyperparameterTuner(est, "val_loss", ranges, max_jobs=10, warm_start_config=kiln.WarmStartConfig(
        kiln.WarmStartTypes.IDENTICAL_DATA_AND_ALGORITHM, parents={tuner.latest_tuning_job.id}))
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union, cast

from .client import Client, Job, JSONObject, TuningJob
from .errors import KilnError
from .estimator import Estimator

# SageMaker's scaling types (and kiln's own names), keyed without case, "_" or "-".
_SCALING = {"auto": "auto", "linear": "linear", "logarithmic": "log", "log": "log",
            "reverselogarithmic": "reverse_log", "reverselog": "reverse_log"}
_SCALING_BACK = {"auto": "Auto", "linear": "Linear", "log": "Logarithmic", "reverse_log": "ReverseLogarithmic"}


def _scaling(value: str) -> str:
    s = _SCALING.get(value.lower().replace("_", "").replace("-", ""))
    if s is None:
        raise KilnError('unknown scaling_type "%s"' % value, code="invalid_argument", field="scaling_type",
                        hint='use "Auto", "Linear", "Logarithmic" or "ReverseLogarithmic"')
    return s


@dataclass(frozen=True)
class ContinuousParameter:
    """A real-valued range [min_value, max_value]; ``scaling_type`` "Auto", "Linear",
    "Logarithmic" (min_value > 0) or "ReverseLogarithmic" (0 <= min_value < max_value < 1)."""
    min_value: float
    max_value: float
    scaling_type: str = "Auto"

    def to_json(self) -> JSONObject:
        return {"type": "continuous", "min": self.min_value, "max": self.max_value,
                "scaling": _scaling(self.scaling_type)}


@dataclass(frozen=True)
class IntegerParameter:
    """An integer range [min_value, max_value]; ``scaling_type`` as ContinuousParameter's."""
    min_value: int
    max_value: int
    scaling_type: str = "Auto"

    def to_json(self) -> JSONObject:
        return {"type": "integer", "min": self.min_value, "max": self.max_value,
                "scaling": _scaling(self.scaling_type)}


@dataclass(frozen=True)
class CategoricalParameter:
    """One of ``values`` (numbers, strings or booleans; at most 100)."""
    values: Sequence[float | int | str | bool]

    def to_json(self) -> JSONObject:
        return {"type": "categorical", "values": list(self.values)}


#: What hyperparameter_ranges maps a parameter to.
ParameterRange = Union[ContinuousParameter, IntegerParameter, CategoricalParameter]


def _range_from_json(j: Mapping[str, Any]) -> ParameterRange:
    kind = j.get("type")
    scaling = _SCALING_BACK.get(str(j.get("scaling") or "auto"), "Auto")
    if kind == "categorical":
        return CategoricalParameter(list(cast("list[Any]", j.get("values") or [])))
    if kind == "integer":
        return IntegerParameter(int(j.get("min") or 0), int(j.get("max") or 0), scaling)
    return ContinuousParameter(float(j.get("min") or 0), float(j.get("max") or 0), scaling)


@dataclass(frozen=True)
class HyperbandStrategyConfig:
    """Hyperband's resources, in training steps: a trial first runs ``min_resource`` steps, and
    the promoted ones continue (from their checkpoint) up to ``max_resource``; the top
    1/``reduction_factor`` of a rung is promoted. With ``brackets`` b > 1, trials are spread over
    b brackets of about equal budgets, bracket k's trials starting at rung k (Hyperband). With
    ``max_rungs`` m, a trial has at most m rungs, ``max_resource`` included: the lowest m - 1 of
    ``min_resource`` x ``reduction_factor``^k, then ``max_resource`` (None: every rung).
    ``sampler`` (kiln's): "random" draws new trials as random search does, "tpe" by TPE over every
    trial with a result, ranked by the rung it reached, then by its objective there."""
    min_resource: int
    max_resource: int
    reduction_factor: int = 3
    brackets: int = 1
    sampler: str = "random"
    max_rungs: Optional[int] = None

    def to_json(self) -> JSONObject:
        out: JSONObject = {"min_resource": self.min_resource, "max_resource": self.max_resource,
                           "reduction_factor": self.reduction_factor, "brackets": self.brackets,
                           "sampler": self.sampler}
        if self.max_rungs is not None:
            out["max_rungs"] = self.max_rungs
        return out


@dataclass(frozen=True)
class StrategyConfig:
    """SageMaker's wrapper around HyperbandStrategyConfig; kiln takes either."""
    hyperband_strategy_config: HyperbandStrategyConfig


@dataclass(frozen=True)
class TuningJobCompletionCriteriaConfig:
    """When the search ends before max_jobs: a trial reaches ``target_objective_metric_value``,
    or ``max_number_training_jobs_not_improving`` trials in a row do not improve on the best.
    (SageMaker's ``complete_on_convergence`` has no kiln counterpart.)"""
    max_number_training_jobs_not_improving: int | None = None
    target_objective_metric_value: float | None = None
    complete_on_convergence: bool | None = None

    def to_json(self) -> JSONObject:
        if self.complete_on_convergence:
            raise KilnError("kiln's tuning jobs have no convergence criterion", code="invalid_argument",
                            field="completion_criteria_config.complete_on_convergence",
                            hint="use max_number_training_jobs_not_improving or target_objective_metric_value")
        out: JSONObject = {}
        if self.target_objective_metric_value is not None:
            out["target_objective"] = self.target_objective_metric_value
        if self.max_number_training_jobs_not_improving is not None:
            out["no_improvement_trials"] = self.max_number_training_jobs_not_improving
        return out


class WarmStartTypes:
    """SageMaker's warm start types: the parents ran the same base job (model, data, code) with the
    same parameter names, or (TransferLearning) parameters were added or removed or the base job
    changed. kiln's own names ("identical_data_and_algorithm", "transfer_learning") work too."""
    IDENTICAL_DATA_AND_ALGORITHM = "IdenticalDataAndAlgorithm"
    TRANSFER_LEARNING = "TransferLearning"


_WARM_TYPES = {"identicaldataandalgorithm": "identical_data_and_algorithm", "transferlearning": "transfer_learning"}
_WARM_TYPES_BACK = {"identical_data_and_algorithm": WarmStartTypes.IDENTICAL_DATA_AND_ALGORITHM,
                    "transfer_learning": WarmStartTypes.TRANSFER_LEARNING}


class WarmStartConfig:
    """A warm start from 1 to 5 earlier tuning jobs (``parents``: ids, TuningJob objects or tuners
    that ran one) of the same project, ended with trials and with the same objective."""

    def __init__(self, warm_start_type: str, parents: Sequence[Any] | set[Any] | frozenset[Any]) -> None:
        t = _WARM_TYPES.get(str(warm_start_type).lower().replace("_", "").replace("-", ""))
        if t is None:
            raise KilnError('unknown warm_start_type "%s"' % warm_start_type, code="invalid_argument",
                            field="warm_start_type",
                            hint="use WarmStartTypes.IDENTICAL_DATA_AND_ALGORITHM or WarmStartTypes.TRANSFER_LEARNING")
        ids: list[str] = []
        for p in parents:
            if isinstance(p, HyperparameterTuner):
                if p.latest_tuning_job is None:
                    raise KilnError("a warm start parent tuner has no tuning job yet: call its fit() first",
                                    code="failed_precondition", field="parents")
                p = p.latest_tuning_job
            pid = p if isinstance(p, str) else getattr(p, "id", None)
            if not isinstance(pid, str) or not pid:
                raise KilnError("a warm start parent is a tuning job id, a TuningJob or a tuner that ran one, "
                                "not %r" % (p,), code="invalid_argument", field="parents")
            if pid not in ids:
                ids.append(pid)
        self.type = _WARM_TYPES_BACK[t]
        self.parents: list[str] = sorted(ids) if isinstance(parents, (set, frozenset)) else ids

    def to_json(self) -> JSONObject:
        return {"parents": list(self.parents),
                "type": _WARM_TYPES[self.type.lower().replace("_", "")]}

    @classmethod
    def from_json(cls, j: Mapping[str, Any]) -> WarmStartConfig:
        return cls(str(j.get("type") or ""), list(cast("list[str]", j.get("parents") or [])))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WarmStartConfig) and (self.type, self.parents) == (other.type, other.parents)

    def __repr__(self) -> str:
        return "WarmStartConfig(%r, parents=%r)" % (self.type, self.parents)


_STRATEGIES = ("random", "grid", "hyperband", "bayesian")


class HyperparameterTuner:
    """A search over an Estimator's hyperparameters, run by kilnd.

      estimator              the base job (an engine job or a script job); fit() submits its spec
      objective_metric_name  a metric the trials report: val_loss, or one of metric_definitions
      hyperparameter_ranges  {name: ContinuousParameter | IntegerParameter | CategoricalParameter};
                             a bare name is hyperparameters.<name>, a dotted one a path in the job
                             spec ("model.n_embd"); at most 30
      objective_type         "Minimize" or "Maximize" (default: kiln's, Minimize; SageMaker's
                             default is Maximize, so say which when porting)
      strategy               "Random" (default), "Grid", "Hyperband" or "Bayesian" (TPE: its first
                             10 trials random, the later ones drawn by TPE over the ended trials)
      strategy_config        HyperbandStrategyConfig (or SageMaker's StrategyConfig around it)
      max_jobs, max_parallel_jobs, random_seed (the same seed gives the same trials)
      completion_criteria_config  TuningJobCompletionCriteriaConfig
      early_stopping_type    "Off" (default) or "Auto"
      metric_definitions     [{"Name": ..., "Regex": ...}] added to the base job's
      base_tuning_job_name   the tuning job's name
      max_failed_trials, trial_priority  kiln's: failed trials that end the search (default 3),
                             and the trials' priority (default: the base job's minus 1)
      warm_start_config      WarmStartConfig: earlier tuning jobs whose trials are history
    """

    def __init__(self, estimator: Estimator, objective_metric_name: str,
                 hyperparameter_ranges: Mapping[str, ParameterRange], *,
                 metric_definitions: Sequence[Mapping[str, str]] | None = None, strategy: str = "Random",
                 objective_type: str | None = None, max_jobs: int | None = None, max_parallel_jobs: int = 1,
                 base_tuning_job_name: str | None = None,
                 strategy_config: HyperbandStrategyConfig | StrategyConfig | None = None,
                 completion_criteria_config: TuningJobCompletionCriteriaConfig | None = None,
                 early_stopping_type: str = "Off", random_seed: int | None = None,
                 max_failed_trials: int | None = None, trial_priority: int | None = None,
                 warm_start_config: WarmStartConfig | None = None) -> None:
        s = strategy.lower()
        if s not in _STRATEGIES:
            raise KilnError('kiln has no tuning strategy "%s"' % strategy, code="invalid_argument", field="strategy",
                            hint='use "Random", "Grid", "Hyperband" (Hyperband pauses trials at a rung and '
                                 'resumes the promoted ones) or "Bayesian" (TPE)')
        if objective_type is not None and objective_type.lower() not in ("minimize", "maximize"):
            raise KilnError('objective_type must be "Minimize" or "Maximize", not "%s"' % objective_type,
                            code="invalid_argument", field="objective_type")
        if early_stopping_type.lower() not in ("off", "auto"):
            raise KilnError('early_stopping_type must be "Off" or "Auto", not "%s"' % early_stopping_type,
                            code="invalid_argument", field="early_stopping_type")
        self.estimator = estimator
        self.objective_metric_name = objective_metric_name
        self.hyperparameter_ranges: dict[str, ParameterRange] = dict(hyperparameter_ranges)
        self.metric_definitions = [dict(d) for d in metric_definitions] if metric_definitions is not None else None
        self.strategy = s
        self.objective_type = objective_type
        self.max_jobs = max_jobs
        self.max_parallel_jobs = max_parallel_jobs
        self.base_tuning_job_name = base_tuning_job_name
        if isinstance(strategy_config, StrategyConfig):
            strategy_config = strategy_config.hyperband_strategy_config
        self.strategy_config = strategy_config
        self.completion_criteria_config = completion_criteria_config
        self.early_stopping_type = early_stopping_type
        self.random_seed = random_seed
        self.max_failed_trials = max_failed_trials
        self.trial_priority = trial_priority
        self.warm_start_config = warm_start_config
        self.latest_tuning_job: TuningJob | None = None

    @property
    def client(self) -> Client:
        return self.estimator.client

    def spec(self, inputs: str | Mapping[str, Any] | None = None, job_name: str | None = None) -> JSONObject:
        """The tuning job spec fit() would submit (a new dict); ``inputs`` as in Estimator.fit()."""
        job = self.estimator.spec(inputs)
        if self.metric_definitions is not None:
            job["metric_definitions"] = list(cast("list[Any]", job.get("metric_definitions") or [])) + \
                copy.deepcopy(self.metric_definitions)
        spec: JSONObject = {"job": job,
                            "parameters": {k: r.to_json() for k, r in self.hyperparameter_ranges.items()},
                            "objective": {"metric": self.objective_metric_name},
                            "strategy": self.strategy, "max_parallel_jobs": self.max_parallel_jobs,
                            "early_stopping": self.early_stopping_type.lower()}
        if self.objective_type is not None:
            spec["objective"]["goal"] = self.objective_type.lower()
        name = job_name or self.base_tuning_job_name
        if name:
            spec["name"] = name
        if self.max_jobs is not None:
            spec["max_jobs"] = self.max_jobs
        if self.random_seed is not None:
            spec["seed"] = self.random_seed
        if self.strategy_config is not None:
            spec["hyperband"] = self.strategy_config.to_json()
        if self.completion_criteria_config is not None:
            spec["completion"] = self.completion_criteria_config.to_json()
        if self.max_failed_trials is not None:
            spec["max_failed_trials"] = self.max_failed_trials
        if self.trial_priority is not None:
            spec["trial_priority"] = self.trial_priority
        if self.warm_start_config is not None:
            spec["warm_start"] = self.warm_start_config.to_json()
        return spec

    def fit(self, inputs: str | Mapping[str, Any] | None = None, job_name: str | None = None, wait: bool = True,
            timeout: float | None = None) -> TuningJob:
        """Starts the tuning job (uploading the estimator's source_dir first) and returns it;
        with ``wait`` (the default, as SageMaker's) blocks until it ends."""
        t = self.client.create_tuning_job(self.spec(inputs, job_name))
        self.latest_tuning_job = t
        if wait:
            t.wait(timeout=timeout)
        return t

    def _latest(self) -> TuningJob:
        if self.latest_tuning_job is None:
            raise KilnError("this tuner has no tuning job yet: call fit() or HyperparameterTuner.attach(id)",
                            code="failed_precondition")
        return self.latest_tuning_job

    def wait(self, timeout: float | None = None) -> TuningJob:
        """Blocks until the latest tuning job ends; returns it."""
        return self._latest().wait(timeout=timeout)

    def describe(self) -> JSONObject:
        """The latest tuning job as kilnd describes it: state, reason, trials, best, events."""
        return self._latest().refresh().to_dict()

    def stop_tuning_job(self) -> TuningJob:
        """Stops the latest tuning job and its trials."""
        return self._latest().stop()

    stop = stop_tuning_job

    def best_training_job(self) -> Job:
        """The best trial's Job so far (its ``model_data`` is the trained model). Raises KilnError
        while no trial has reported the objective."""
        job = self._latest().refresh().best_job()
        if job is None:
            t = self._latest()
            raise KilnError("tuning job %s has no best trial yet: no trial has reported %s" %
                            (t.id, t.objective.get("metric") or self.objective_metric_name),
                            code="failed_precondition", hint="wait() for it, or look at its trials' states")
        return job

    def best_estimator(self) -> Estimator:
        """An Estimator attached to the best trial's job (its spec, with the best parameters), so
        ``best_estimator().model_data`` is the best model and ``fit()`` trains it again."""
        return Estimator.attach(self.best_training_job().id, client=self.client)

    def analytics(self) -> TuningJob:
        """The latest tuning job, refreshed: ``analytics().dataframe()`` has a row per trial
        (SageMaker's HyperparameterTuningJobAnalytics)."""
        return self._latest().refresh()

    @classmethod
    def attach(cls, tuning_job_name: str, client: Client | None = None, url: str | None = None) -> HyperparameterTuner:
        """A tuner for a tuning job started earlier (anywhere), found by id, id prefix or a name
        only it has: its base job becomes the estimator, its ranges and settings the tuner's."""
        c = client or Client(url)
        t = c.find_tuning_job(tuning_job_name)
        spec = t.to_dict().get("spec")
        if not isinstance(spec, dict):
            raise KilnError("tuning job %s came back without its spec" % t.id, code="internal")
        sp = cast(JSONObject, spec)
        est = Estimator.from_spec(cast(JSONObject, sp.get("job") or {}), client=c)
        params = cast("dict[str, Any]", sp.get("parameters") or {})
        hb = sp.get("hyperband")
        done = cast("dict[str, Any]", sp.get("completion") or {})
        obj = cast("dict[str, Any]", sp.get("objective") or {})
        tuner = cls(est, str(obj.get("metric") or ""), {k: _range_from_json(v) for k, v in params.items()},
                    strategy=str(sp.get("strategy") or "random"), objective_type=str(obj.get("goal") or "minimize"),
                    max_jobs=cast("int | None", sp.get("max_jobs")),
                    max_parallel_jobs=int(sp.get("max_parallel_jobs") or 1),
                    base_tuning_job_name=str(sp.get("name") or t.name) or None,
                    strategy_config=HyperbandStrategyConfig(**cast("dict[str, Any]", hb))
                    if isinstance(hb, dict) else None,
                    completion_criteria_config=TuningJobCompletionCriteriaConfig(
                        max_number_training_jobs_not_improving=done.get("no_improvement_trials"),
                        target_objective_metric_value=done.get("target_objective")) if done else None,
                    early_stopping_type=str(sp.get("early_stopping") or "off"),
                    random_seed=cast("int | None", sp.get("seed")),
                    max_failed_trials=cast("int | None", sp.get("max_failed_trials")),
                    trial_priority=cast("int | None", sp.get("trial_priority")),
                    warm_start_config=WarmStartConfig.from_json(cast("dict[str, Any]", sp["warm_start"]))
                    if isinstance(sp.get("warm_start"), dict) else None)
        tuner.latest_tuning_job = t
        return tuner
