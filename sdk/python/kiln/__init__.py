"""kiln - Python client for kilnd, the kiln training service (standard library only).

    import kiln
    est = kiln.Estimator(model={"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 64, "seq_len": 64},
                         data="/data/tinyshakespeare.txt",
                         hyperparameters={"lr": 1e-3, "global_batch_size": 8, "max_steps": 50},
                         resources={"nodes": 1, "slots_per_node": 1, "slot_type": "cpu"})
    job = est.fit(wait=False)
    job.wait()
    print(job.state, job.metrics("train_loss"))
    job.model_data.download("model.bin")   # the trained model (llm.c format), checked

    # your own code (a script job), SageMaker's way
    est = kiln.Estimator(entry_point="train.py", source_dir="./scripts", hyperparameters={"epochs": 3},
                         instance_count=2, distribution={"torch_distributed": {"enabled": True}},
                         metric_definitions=[{"Name": "val_acc", "Regex": "val_acc=([0-9.]+)"}])
    job = est.fit(inputs={"train": "/data/mnist/train", "validation": "/data/mnist/val"}, wait=False)
    job.dataframe()                        # every metric by step and time (pandas)
    kiln.log_metrics(step, val_acc=0.93)   # inside train.py: metrics straight to kiln

    # a hyperparameter search over an Estimator, SageMaker's way (kilnd runs it)
    tuner = kiln.HyperparameterTuner(est, objective_metric_name="val_loss", objective_type="Minimize",
                                     hyperparameter_ranges={"lr": kiln.ContinuousParameter(1e-4, 1e-2, "Logarithmic")},
                                     strategy="Hyperband", strategy_config=kiln.HyperbandStrategyConfig(50, 1000),
                                     max_jobs=20, max_parallel_jobs=4)
    tuner.fit()
    tuner.best_training_job().model_data.download("best.bin")
"""

from . import code, config
from .code import KilnIgnore, pack_dir
from .config import DEFAULT_URL
from .client import (METRIC_COLUMNS, MODEL_ARTIFACT, SCRIPT_MODEL_ARTIFACT, TERMINAL_STATES, TRIAL_COLUMNS,
                     TUNING_TERMINAL_STATES, Artifact, CheckpointFile, Checkpoints, Client, Job, JSONObject, LogLine,
                     MetricPoint, ModelData, Trial, TuningJob, parse_sse)
from .errors import JobFailedError, KilnError
from .estimator import INSTANCE_TYPES, Estimator
from .metrics import log_metrics, pause_at_step
from .tuner import (CategoricalParameter, ContinuousParameter, HyperbandStrategyConfig, HyperparameterTuner,
                    IntegerParameter, ParameterRange, StrategyConfig, TuningJobCompletionCriteriaConfig, WarmStartConfig,
                    WarmStartTypes)

__version__ = "0.1.0"
__all__ = ["Client", "Job", "LogLine", "Artifact", "CheckpointFile", "Checkpoints", "ModelData", "MetricPoint", "METRIC_COLUMNS", "Estimator",
           "INSTANCE_TYPES", "log_metrics", "pause_at_step", "KilnError", "JobFailedError",
           "parse_sse", "config", "code", "KilnIgnore", "pack_dir", "JSONObject", "DEFAULT_URL", "MODEL_ARTIFACT", "SCRIPT_MODEL_ARTIFACT",
           "TERMINAL_STATES", "TuningJob", "Trial", "TRIAL_COLUMNS", "TUNING_TERMINAL_STATES", "HyperparameterTuner",
           "ContinuousParameter", "IntegerParameter", "CategoricalParameter", "ParameterRange", "HyperbandStrategyConfig",
           "StrategyConfig", "TuningJobCompletionCriteriaConfig", "WarmStartConfig", "WarmStartTypes", "__version__"]
