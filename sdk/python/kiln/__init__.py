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
"""

from . import code, config
from .code import KilnIgnore, pack_dir
from .config import DEFAULT_URL
from .client import MODEL_ARTIFACT, TERMINAL_STATES, Artifact, Client, Job, JSONObject, LogLine, ModelData, parse_sse
from .errors import JobFailedError, KilnError
from .estimator import Estimator

__version__ = "0.1.0"
__all__ = ["Client", "Job", "LogLine", "Artifact", "ModelData", "Estimator", "KilnError", "JobFailedError",
           "parse_sse", "config", "code", "KilnIgnore", "pack_dir", "JSONObject", "DEFAULT_URL", "MODEL_ARTIFACT",
           "TERMINAL_STATES", "__version__"]
