"""kiln - Python client for kilnd, the kiln training service (standard library only).

    import kiln
    est = kiln.Estimator(model={"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 64, "seq_len": 64},
                         data="/data/tinyshakespeare.txt",
                         hyperparameters={"lr": 1e-3, "global_batch_size": 8, "max_steps": 50},
                         resources={"nodes": 1, "slots_per_node": 1, "slot_type": "cpu"})
    job = est.fit(wait=False)
    job.wait()
    print(job.state, job.metrics("train_loss"))
"""

from . import config
from .config import DEFAULT_URL
from .client import MODEL_ARTIFACT, TERMINAL_STATES, Client, Job, JSONObject, LogLine, parse_sse
from .errors import JobFailedError, KilnError
from .estimator import Estimator

__version__ = "0.1.0"
__all__ = ["Client", "Job", "LogLine", "Estimator", "KilnError", "JobFailedError", "parse_sse", "config", "JSONObject",
           "MODEL_ARTIFACT",
           "DEFAULT_URL", "TERMINAL_STATES", "__version__"]
