"""tune_space.py - the search space and the base job of issue 29's tuning benchmark, shared by
bench/tune_bench.py (the searches through kilnd) and bench/tune_sim.py (kiln's decisions replayed
over recorded curves): the issue's space over a 2-layer GPT of seq_len 32, batch 8, byte
vocabulary, on tinyshakespeare with a tenth held out for val_loss."""


def space(warmup_max, max_steps):
    """lr log-uniform 1e-4..3e-2, warmup_steps 0..warmup_max (below max_steps), weight_decay
    0..0.2, model.n_embd {64, 128}."""
    return {"lr": {"type": "continuous", "min": 1e-4, "max": 3e-2, "scaling": "log"},
            "warmup_steps": {"type": "integer", "min": 0, "max": min(warmup_max, max_steps - 1)},
            "weight_decay": {"type": "continuous", "min": 0.0, "max": 0.2},
            "model.n_embd": {"type": "categorical", "values": [64, 128]}}


def base_job(name, data, max_steps, eval_every):
    return {"name": name,
            "model": {"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 64, "seq_len": 32, "vocab": "bytes"},
            "data": {"train": data, "val_fraction": 0.1},
            "hyperparameters": {"lr": 3e-3, "global_batch_size": 8, "max_steps": max_steps, "warmup_steps": 0,
                                "weight_decay": 0.0, "seed": 7, "eval_every": eval_every, "sample_every": 0},
            "resources": {"nodes": 1, "slots_per_node": 1, "slot_type": "cpu"},
            "tags": {"bench": "tune"}}
