"""Tests of the kiln Python SDK (sdk/python/kiln).

The offline cases (SSE parsing, error decoding, spec building, an unreachable server, the
CLI's config file of saved logins) run anywhere. The live cases need a real kilnd at $KILN_URL
(with $KILN_TOKEN and $KILN_TLS_CA when it has them): Live needs two ALIVE cpu agents too, and
runs from the end-to-end suite (tests/e2e/test_clients.c); Identity needs only kilnd and runs
from there and from tests/e2e/test_identity.c, against a kilnd that checks tokens. Both set
KILN_SDK_REQUIRE_SERVER=1, which turns "no server" into a failure instead of a skip.

    /usr/bin/python3 -m unittest discover -s tests/sdk
"""

import atexit
import contextlib
import io
import json
import os
import shutil
import socket
import sys
import tempfile
import time
import unittest

ROOT = os.environ.get("KILN_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "sdk", "python"))

import kiln  # noqa: E402

# The saved logins of whoever runs the tests stay out of them: clients here get their URL,
# token and CA from the environment the suites set, or from config files the tests write.
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="kiln-sdk-cfg-")
atexit.register(shutil.rmtree, os.environ["XDG_CONFIG_HOME"], True)
os.environ.pop("KILN_PROFILE", None)

DATA = os.path.join(ROOT, "data", "tinyshakespeare.txt")
MAX_STEPS = 20


def tiny_estimator(client, name, **kw):
    """A GPT small enough to train 20 steps in a few seconds on one thread."""
    return kiln.Estimator(
        name=name,
        model={"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 32, "vocab": "bytes"},
        data={"train": DATA, "val_fraction": 0.1},
        hyperparameters={"lr": 3e-3, "global_batch_size": 4, "max_steps": MAX_STEPS, "warmup_steps": 2,
                         "seed": 7, "eval_every": 0, "sample_every": 0},
        resources={"nodes": 1, "slots_per_node": 1, "slot_type": "cpu"},
        tags={"suite": "sdk"},
        client=client, **kw)


class Offline(unittest.TestCase):
    def test_parse_sse(self):
        text = ": ping\r\n\r\nid: 3\nevent: log\ndata: {\"seq\": 3}\n\ndata: a\ndata:b\n\nevent: end\ndata: {}\n\n"
        events = list(kiln.parse_sse(text.splitlines(keepends=True)))
        self.assertEqual(events, [("log", '{"seq": 3}', "3"), ("message", "a\nb", "3"), ("end", "{}", "3")])

    def test_log_line(self):
        line = kiln.LogLine.from_json({"seq": 4, "rank": 1, "stream": "stderr", "line": "hello"})
        self.assertEqual(str(line), "[rank 1] hello")
        line = kiln.LogLine.from_json({"seq": 5, "rank": 0, "attempt": 2, "line": "resumed"})
        self.assertEqual((line.attempt, str(line)), (2, "[rank 0, attempt 2] resumed"))
        # printed, a line's escape sequences and overrides show as text; .line keeps them
        evil = "x\x1b]0;owned\x07\x1b[2J\rfake\u202e\x85\tok caf\u00e9"
        line = kiln.LogLine.from_json({"seq": 6, "rank": 0, "line": evil})
        self.assertEqual(str(line), "[rank 0] x\\u001b]0;owned\\u0007\\u001b[2J\\u000dfake\\u202e\\u0085\tok caf\u00e9")
        self.assertEqual(line.line, evil)

    def test_artifact_and_model_data(self):
        a = kiln.Artifact.from_json({"name": "model_llmc.bin", "size": 139776, "sha256": "af57", "created_at": "t",
                                     "attempt": 2})
        self.assertEqual((a.name, a.size, a.sha256, a.attempt), ("model_llmc.bin", 139776, "af57", 2))
        client = kiln.Client(url="https://kilnd.example:8080", token="kiln_not-a-real-one")
        m = kiln.ModelData(client, "0b6c2f0e-1d3a-4c55-9d7e-2f1e9a7b5c11", a)
        self.assertIsInstance(m, str, "model_data is a string, as SageMaker's is")
        self.assertEqual(m, "https://kilnd.example:8080/v1/jobs/0b6c2f0e-1d3a-4c55-9d7e-2f1e9a7b5c11/artifacts/"
                            "model_llmc.bin")
        self.assertEqual((m.url, m.name, m.size, m.sha256), (str(m), "model_llmc.bin", 139776, "af57"))
        self.assertEqual(kiln.MODEL_ARTIFACT, "model_llmc.bin")

    def test_error_from_reply(self):
        e = kiln.KilnError.from_reply(400, b'{"code": "invalid_argument", "message": "must be positive (got -1)",'
                                           b' "field": "hyperparameters.lr", "hint": "try 3e-4"}')
        self.assertEqual((e.code, e.field, e.status, e.hint), ("invalid_argument", "hyperparameters.lr", 400, "try 3e-4"))
        self.assertEqual(str(e), "hyperparameters.lr: must be positive (got -1) (hint: try 3e-4)")
        e = kiln.KilnError.from_reply(400, '{"code": "invalid_argument", "field": "hyperparameters.lr",'
                                           ' "message": "hyperparameters.lr must be greater than 0 (got -1)"}')
        self.assertEqual(str(e), "hyperparameters.lr: must be greater than 0 (got -1)")
        e = kiln.KilnError.from_reply(502, "<html>bad gateway</html>")
        self.assertEqual((e.code, e.field), ("internal", None))
        self.assertIn("HTTP 502", e.message)

    def test_estimator_spec(self):
        est = kiln.Estimator(model={"type": "gpt", "n_layer": 2}, data="/d/train.txt",
                             hyperparameters={"lr": 1e-3}, instance_count=2, instance_type="cpu",
                             distribution={"data_parallel": {"enabled": True}}, name="n",
                             checkpoint={"every_steps": 10}, client=kiln.Client("http://127.0.0.1:1"))
        spec = est.spec()
        self.assertEqual(spec["data"], {"train": "/d/train.txt"})
        self.assertEqual(spec["resources"], {"nodes": 2, "slot_type": "cpu"})
        self.assertEqual(spec["checkpoint"], {"every_steps": 10})
        self.assertEqual(spec["name"], "n")
        # SageMaker-style channels override the data; the estimator itself is unchanged.
        spec2 = est.spec(inputs={"train": "/other.txt", "val": "/val.txt"}, name="m")
        self.assertEqual(spec2["data"], {"train": "/other.txt", "val": "/val.txt"})
        self.assertEqual(spec2["name"], "m")
        self.assertEqual(est.spec()["data"], {"train": "/d/train.txt"})

    def test_script_estimator_spec(self):
        client = kiln.Client("http://127.0.0.1:1")
        est = kiln.Estimator(entry_point="train.py", source="code:sha256:" + "ab" * 32,
                             hyperparameters={"epochs": 3, "batch-size": 64, "model": {"depth": 4}},
                             instance_count=2, distribution={"torch_distributed": {"enabled": True}},
                             metric_definitions=[{"Name": "val_acc", "Regex": "val_acc=([0-9.]+)"}],
                             environment={"MY_FLAG": "1"}, tags={"suite": "sdk"}, name="ddp", client=client)
        spec = est.spec(inputs={"train": "/data/mnist/train", "validation": "/data/mnist/val"})
        self.assertEqual(spec, {
            "entry_point": "train.py", "source": "code:sha256:" + "ab" * 32, "environment": {"MY_FLAG": "1"},
            "data": {"channels": {"train": "/data/mnist/train", "validation": "/data/mnist/val"}},
            "hyperparameters": {"epochs": 3, "batch-size": 64, "model": {"depth": 4}},
            "resources": {"nodes": 2}, "distribution": {"torch_distributed": {"enabled": True}}, "name": "ddp",
            "metric_definitions": [{"Name": "val_acc", "Regex": "val_acc=([0-9.]+)"}], "tags": {"suite": "sdk"}})
        # a path is SageMaker's "training" channel
        self.assertEqual(est.spec(inputs="/data/all")["data"], {"channels": {"training": "/data/all"}})
        self.assertNotIn("data", est.spec())
        # one of model and entry_point; one of source_dir and source
        for kw, field in (({}, "model"), ({"model": {"type": "gpt"}, "entry_point": "t.py"}, "entry_point"),
                          ({"entry_point": "t.py", "source": "/d", "source_dir": "."}, "source_dir")):
            with self.assertRaises(kiln.KilnError) as cm:
                kiln.Estimator(client=client, **kw)
            self.assertEqual((cm.exception.code, cm.exception.field), ("invalid_argument", field))
        # an entry point alone that is a local file ships its directory, as SageMaker does
        d = tempfile.mkdtemp(prefix="kiln-sdk-ep-")
        self.addCleanup(shutil.rmtree, d, True)
        open(os.path.join(d, "train.py"), "w").close()
        est = kiln.Estimator(entry_point=os.path.join(d, "train.py"), client=client)
        self.assertEqual((est.entry_point, est.source_dir), ("train.py", d))

    def test_tuner_spec(self):
        client = kiln.Client("http://127.0.0.1:1")
        est = kiln.Estimator(model={"type": "gpt", "n_layer": 2}, data="/d/train.txt",
                             hyperparameters={"lr": 1e-3, "max_steps": 100}, name="base", client=client)
        tuner = kiln.HyperparameterTuner(
            est, "val_acc", {"lr": kiln.ContinuousParameter(1e-4, 1e-2, scaling_type="Logarithmic"),
                             "warmup_steps": kiln.IntegerParameter(0, 30),
                             "weight_decay": kiln.ContinuousParameter(0.0, 0.5, "ReverseLogarithmic"),
                             "model.n_embd": kiln.CategoricalParameter([32, 64])},
            metric_definitions=[{"Name": "val_acc", "Regex": "acc=([0-9.]+)"}], strategy="Hyperband",
            objective_type="Maximize", max_jobs=9, max_parallel_jobs=3, base_tuning_job_name="sweep",
            strategy_config=kiln.StrategyConfig(kiln.HyperbandStrategyConfig(min_resource=10, max_resource=90)),
            completion_criteria_config=kiln.TuningJobCompletionCriteriaConfig(
                max_number_training_jobs_not_improving=4, target_objective_metric_value=0.9),
            early_stopping_type="Off", random_seed=5, max_failed_trials=2, trial_priority=-5)
        self.assertEqual(tuner.spec(), {
            "name": "sweep", "job": dict(est.spec(), metric_definitions=[{"Name": "val_acc", "Regex": "acc=([0-9.]+)"}]),
            "parameters": {"lr": {"type": "continuous", "min": 1e-4, "max": 1e-2, "scaling": "log"},
                           "warmup_steps": {"type": "integer", "min": 0, "max": 30, "scaling": "auto"},
                           "weight_decay": {"type": "continuous", "min": 0.0, "max": 0.5, "scaling": "reverse_log"},
                           "model.n_embd": {"type": "categorical", "values": [32, 64]}},
            "objective": {"metric": "val_acc", "goal": "maximize"}, "strategy": "hyperband", "max_jobs": 9,
            "max_parallel_jobs": 3, "seed": 5, "early_stopping": "off",
            "hyperband": {"min_resource": 10, "max_resource": 90, "reduction_factor": 3, "brackets": 1,
                          "sampler": "random"},
            "completion": {"target_objective": 0.9, "no_improvement_trials": 4},
            "max_failed_trials": 2, "trial_priority": -5})
        # the defaults leave kilnd's: no goal, no max_jobs, no seed
        plain = kiln.HyperparameterTuner(est, "val_loss", {"lr": kiln.ContinuousParameter(1e-4, 1e-2)}).spec()
        self.assertEqual((plain["strategy"], plain["objective"]), ("random", {"metric": "val_loss"}))
        self.assertFalse({"goal", "max_jobs", "seed", "hyperband", "name"} & (set(plain) | set(plain["objective"])))
        # what kiln does not have is refused by name, never passed on or ignored
        # SageMaker's Bayesian is kiln's TPE; hyperband's sampler is kiln's own
        bayes = kiln.HyperparameterTuner(est, "val_loss", {"lr": kiln.ContinuousParameter(1e-4, 1e-2)},
                                         strategy="Bayesian", early_stopping_type="Auto").spec()
        self.assertEqual((bayes["strategy"], bayes["early_stopping"]), ("bayesian", "auto"))
        bohb = kiln.HyperparameterTuner(est, "val_loss", {"lr": kiln.ContinuousParameter(1e-4, 1e-2)},
                                        strategy="Hyperband", strategy_config=kiln.HyperbandStrategyConfig(
                                            10, 90, sampler="tpe")).spec()
        self.assertEqual(bohb["hyperband"]["sampler"], "tpe")
        self.assertNotIn("max_rungs", bohb["hyperband"], "left out: every rung")
        sha = kiln.HyperparameterTuner(est, "val_loss", {"lr": kiln.ContinuousParameter(1e-4, 1e-2)},
                                       strategy="Hyperband", strategy_config=kiln.HyperbandStrategyConfig(
                                           100, 2000, reduction_factor=5, max_rungs=2)).spec()
        self.assertEqual((sha["hyperband"]["reduction_factor"], sha["hyperband"]["max_rungs"]), (5, 2))
        for kw, field in (({"strategy": "Optimal"}, "strategy"), ({"objective_type": "Lowest"}, "objective_type"),
                          ({"early_stopping_type": "Sometimes"}, "early_stopping_type")):
            with self.assertRaises(kiln.KilnError) as cm:
                kiln.HyperparameterTuner(est, "val_loss", {"lr": kiln.ContinuousParameter(0.1, 0.2)}, **kw)
            self.assertEqual((cm.exception.code, cm.exception.field), ("invalid_argument", field))
        with self.assertRaises(kiln.KilnError) as cm:
            kiln.HyperparameterTuner(est, "val_loss", {"lr": kiln.ContinuousParameter(0.1, 0.2, "Cubic")}).spec()
        self.assertEqual(cm.exception.field, "scaling_type")
        with self.assertRaises(kiln.KilnError) as cm:
            kiln.HyperparameterTuner(est, "val_loss", {"lr": kiln.ContinuousParameter(0.1, 0.2)},
                                     completion_criteria_config=kiln.TuningJobCompletionCriteriaConfig(
                                         complete_on_convergence=True)).spec()
        self.assertEqual(cm.exception.field, "completion_criteria_config.complete_on_convergence")

    def test_tuner_warm_start(self):
        client = kiln.Client("http://127.0.0.1:1")
        est = kiln.Estimator(model={"type": "gpt"}, data="/d/train.txt", client=client)
        a, b = "00000000-0000-4000-8000-00000000000b", "00000000-0000-4000-8000-00000000000a"
        ws = kiln.WarmStartConfig(kiln.WarmStartTypes.IDENTICAL_DATA_AND_ALGORITHM, parents={a, b})
        tuner = kiln.HyperparameterTuner(est, "val_loss", {"lr": kiln.ContinuousParameter(1e-4, 1e-2)},
                                         warm_start_config=ws)
        self.assertEqual(tuner.spec()["warm_start"], {"parents": [b, a], "type": "identical_data_and_algorithm"})
        # kiln's names, a list's order kept, a repeat once
        ws2 = kiln.WarmStartConfig("transfer_learning", [a, b, a])
        self.assertEqual(ws2.to_json(), {"parents": [a, b], "type": "transfer_learning"})
        self.assertEqual(kiln.WarmStartConfig.from_json(ws2.to_json()), ws2)
        self.assertIsNone(kiln.HyperparameterTuner(est, "val_loss", {"lr": kiln.ContinuousParameter(0.1, 0.2)})
                          .spec().get("warm_start"))
        for bad, field in ((("Bayesian", [a]), "warm_start_type"), ((kiln.WarmStartTypes.TRANSFER_LEARNING, [7]), "parents")):
            with self.assertRaises(kiln.KilnError) as cm:
                kiln.WarmStartConfig(*bad)
            self.assertEqual((cm.exception.code, cm.exception.field), ("invalid_argument", field))

    def test_instance_type(self):
        client = kiln.Client("http://127.0.0.1:1")
        self.assertEqual(kiln.Estimator(model={"type": "gpt"}, instance_type="gpu", client=client).resources,
                         {"slot_type": "gpu"})
        for itype, use in (("ml.m5.xlarge", "cpu"), ("ml.p3.2xlarge", "gpu"), ("ml.g5.xlarge", "gpu")):
            with self.assertRaises(kiln.KilnError) as cm:
                kiln.Estimator(entry_point="t.py", source="/d", instance_type=itype, client=client)
            e = cm.exception
            self.assertEqual((e.code, e.field), ("invalid_argument", "instance_type"))
            self.assertIn('kiln has no instance type "%s"' % itype, e.message)
            self.assertIn('"cpu" or "gpu"', e.message)
            self.assertEqual(e.hint, 'use instance_type="%s"' % use)

    def test_metric_point(self):
        p = kiln.MetricPoint.from_json({"step": 7, "value": 2.5, "time": "2026-11-28T08:00:01.5Z",
                                        "time_us": 1795852801500000, "rank": 1, "attempt": 2})
        step, value = p
        self.assertEqual((step, value), (7, 2.5))
        self.assertEqual(p, (7, 2.5), "a point is still a (step, value) pair")
        self.assertEqual((p.step, p.value, p.rank, p.attempt), (7, 2.5, 1, 2))
        self.assertEqual(p.time.isoformat(), "2026-11-28T08:00:01.500000+00:00")
        self.assertIn("time=2026-11-28T08:00:01.500000+00:00", repr(p))
        nan = kiln.MetricPoint.from_json({"step": 1, "value": None, "time_us": 0, "rank": 0, "attempt": 1})
        self.assertNotEqual(nan.value, nan.value, "null is NaN")

    def test_log_metrics(self):
        import kiln.metrics as km
        r, w = os.pipe()
        self.addCleanup(os.close, r)
        self.addCleanup(os.close, w)
        saved = os.environ.get("KILN_METRICS_FD")
        self.addCleanup(lambda: os.environ.__setitem__("KILN_METRICS_FD", saved) if saved is not None
                        else os.environ.pop("KILN_METRICS_FD", None))
        os.environ["KILN_METRICS_FD"] = str(w)
        before = time.time()
        self.assertTrue(kiln.log_metrics(12, val_acc=0.93, loss=float("inf"), n=3))
        rec = json.loads(os.read(r, 65536))
        self.assertEqual(rec["step"], 12)
        self.assertEqual(rec["metrics"], {"val_acc": 0.93, "loss": "Infinity", "n": 3.0})
        self.assertTrue(before <= rec["time"] <= time.time())
        for args, kw, err in (((-1,), {"x": 1}, ValueError), ((1.5,), {"x": 1}, TypeError), ((True,), {"x": 1}, TypeError),
                              ((1,), {"x": "1"}, TypeError), ((1,), {"y" * 128: 1}, ValueError),
                              ((1,), {"": 1}, ValueError), ((1,), {"loss\x1b]0;owned\x07": 1}, ValueError),
                              ((1,), {"x\u202e": 1}, ValueError), ((1,), {"a\tb": 1}, ValueError)):
            with self.assertRaises(err):
                kiln.log_metrics(*args, **kw)
        with self.assertRaises(ValueError):
            km.format_record(1, {"big": 1.0, **{"m%06d" % i: 0.1 for i in range(100000)}})
        # outside a kiln job: nothing written, a note once
        os.environ.pop("KILN_METRICS_FD")
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.assertFalse(kiln.log_metrics(1, x=1))
            self.assertFalse(kiln.log_metrics(2, x=1))
        self.assertLessEqual(err.getvalue().count("KILN_METRICS_FD is not set"), 1)

    def test_pause_at_step(self):
        saved = os.environ.get("KILN_PAUSE_AT_STEP")
        self.addCleanup(lambda: os.environ.__setitem__("KILN_PAUSE_AT_STEP", saved) if saved is not None
                        else os.environ.pop("KILN_PAUSE_AT_STEP", None))
        os.environ.pop("KILN_PAUSE_AT_STEP", None)
        self.assertIsNone(kiln.pause_at_step(), "unset: train to the end")
        os.environ["KILN_PAUSE_AT_STEP"] = "40"
        self.assertEqual(kiln.pause_at_step(), 40)
        for bad in ("0", "-2", "4x"):
            os.environ["KILN_PAUSE_AT_STEP"] = bad
            with self.assertRaises(ValueError):
                kiln.pause_at_step()

    def test_hyperband_over_a_script_estimator(self):
        # kilnd pauses its trials at their rungs (KILN_PAUSE_AT_STEP); the spec carries the
        # script's max_steps, which must reach max_resource (kilnd checks it)
        client = kiln.Client("http://127.0.0.1:1")
        est = kiln.Estimator(entry_point="train.py", source="/d/code", hyperparameters={"lr": 0.01, "max_steps": 90},
                             client=client)
        spec = kiln.HyperparameterTuner(est, "val_loss", {"lr": kiln.ContinuousParameter(1e-3, 1e-1)},
                                        strategy="Hyperband",
                                        strategy_config=kiln.HyperbandStrategyConfig(10, 90)).spec()
        self.assertEqual((spec["strategy"], spec["job"]["entry_point"], spec["job"]["hyperparameters"]["max_steps"]),
                         ("hyperband", "train.py", 90))
        self.assertEqual((spec["hyperband"]["min_resource"], spec["hyperband"]["max_resource"]), (10, 90))

    def test_unreachable_server(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        client = kiln.Client("http://127.0.0.1:%d" % port, timeout=5)
        with self.assertRaises(kiln.KilnError) as cm:
            client.workers()
        self.assertEqual(cm.exception.code, "unavailable")
        self.assertEqual(cm.exception.status, 0)
        self.assertIn("could not connect to kilnd", str(cm.exception))
        self.assertFalse(client.health())

    def test_a_limit_below_one_is_refused_as_the_cli_refuses_it(self):
        # jobs(limit=0) asked kilnd for a page and gave back nothing; limit=-1 fetched one and
        # dropped it: refused before any request, as kiln's --limit 0 is. A page_size of 0 goes
        # to kilnd (here none: unavailable), which refuses it as it refuses 501, not the default.
        client = kiln.Client("http://127.0.0.1:9", timeout=5)
        for call in (lambda: client.jobs(limit=0), lambda: client.search("", limit=-1),
                     lambda: client.tuning_jobs(limit=0), lambda: client.tuning_jobs(limit=-3, page_size=5)):
            with self.assertRaises(kiln.KilnError) as cm:
                call()
            self.assertEqual((cm.exception.code, cm.exception.status, cm.exception.field),
                             ("invalid_argument", 400, "limit"), str(cm.exception))
        asked: list[int] = []
        def fetch(size: int, token: str) -> dict:
            asked.append(size)
            return {"items": [{"n": 1}]}
        self.assertEqual(kiln.client._pages(fetch, "items", None, 0), [{"n": 1}])
        self.assertEqual(kiln.client._pages(fetch, "items", 1, None), [{"n": 1}])
        self.assertEqual(asked, [0, 1], "page_size 0 is sent as given; None is kilnd's default of 500, capped by limit")

    def test_an_empty_name_or_dot_names_nothing(self):
        # refused before any request, as the CLI refuses them: "" made GET /v1/jobs/, the list,
        # which came back as a Job (and a queue) with no id
        client = kiln.Client("http://127.0.0.1:9", timeout=5)
        for call in (lambda: client.job(""), lambda: client.queue(""), lambda: client.tuning_job("."),
                     lambda: client.delete_queue(".."), lambda: client.stop_tuning_job("")):
            with self.assertRaises(kiln.KilnError) as cm:
                call()
            self.assertEqual(cm.exception.code, "invalid_argument", str(cm.exception))
            self.assertIn("names nothing", str(cm.exception))


def mlp_spec(name, project):
    """A job that needs no data file (agents' data roots do not matter) and trains in a moment."""
    return {"name": name, "project": project,
            "model": {"type": "mlp", "hidden": [8], "n_inputs": 4, "n_classes": 2},
            "data": {"train": "synthetic"},
            "hyperparameters": {"lr": 0.01, "global_batch_size": 8, "max_steps": 5, "seed": 1},
            "resources": {"nodes": 1, "slots_per_node": 1, "slot_type": "cpu"},
            "checkpoint": {"every_steps": 0}}


class Code(unittest.TestCase):
    """.kilnignore (gitignore's syntax) and packing, as kiln code push does them."""

    def test_kilnignore_patterns(self):
        ig = kiln.KilnIgnore("# outputs\n*.pyc\n/data/\n!keep.pyc\nlogs/**\n**/cache\na/**/b\nfile?.txt\n[!0-9]y\n")
        excluded = [("x.pyc", False), ("pkg/y.pyc", False), ("data", True), ("logs/a/b.log", False),
                    ("cache", True), ("deep/er/cache", False), ("a/b", False), ("a/x/y/b", False),
                    ("file1.txt", False), ("zy", False), (".git", True)]
        kept = [("keep.pyc", False), ("pkg/data", True), ("data", False), ("logs", True), ("file12.txt", False),
                ("5y", False), ("a/xb", False), (".gitignore", False), ("# outputs", False)]
        for path, is_dir in excluded:
            self.assertTrue(ig.match(path, is_dir), path)
        for path, is_dir in kept:
            self.assertFalse(ig.match(path, is_dir), path)
        self.assertFalse(kiln.KilnIgnore("!.git/\n").match(".git", True), ".git/ re-included")

    def _tree(self):
        d = tempfile.mkdtemp(prefix="kiln-sdk-code-")
        self.addCleanup(shutil.rmtree, d, True)
        for rel, text in (("train.py", "print(1)\n"), ("pkg/model.py", "x = 1\n"), ("pkg/model.pyc", "junk"),
                          ("data/big.bin", "0" * 100), ("data/keep.txt", "out with its directory"),
                          (".kilnignore", "*.pyc\n/data/\n!data/keep.txt\n")):
            os.makedirs(os.path.dirname(os.path.join(d, rel)) or d, exist_ok=True)
            with open(os.path.join(d, rel), "w") as f:
                f.write(text)
        os.symlink("model.py", os.path.join(d, "pkg", "link.py"))
        return d

    def test_pack_honours_kilnignore_and_is_deterministic(self):
        import tarfile
        d = self._tree()
        a = kiln.code.pack_dir_bytes(d)
        time.sleep(1.1)
        os.utime(os.path.join(d, "train.py"), (1000, 1000))
        self.assertEqual(a, kiln.code.pack_dir_bytes(d), "the same tree packs to the same bytes")
        with tarfile.open(fileobj=io.BytesIO(a), mode="r:gz") as t:
            names = sorted(t.getnames())
            link = t.getmember("pkg/link.py")
        self.assertEqual(names, [".kilnignore", "pkg", "pkg/link.py", "pkg/model.py", "train.py"])
        self.assertTrue(link.issym())

    def test_pack_refuses_what_no_archive_may_hold(self):
        d = self._tree()
        os.mkfifo(os.path.join(d, "pipe"))
        with self.assertRaises(kiln.KilnError) as cm:
            kiln.code.pack_dir_bytes(d)
        self.assertIn('"pipe" is a FIFO', str(cm.exception))
        self.assertIn(".kilnignore", cm.exception.hint)
        os.unlink(os.path.join(d, "pipe"))
        os.symlink("/etc", os.path.join(d, "etc"))
        with self.assertRaises(kiln.KilnError) as cm:
            kiln.code.pack_dir_bytes(d)
        self.assertIn("leads out of the tree", str(cm.exception))


class Config(unittest.TestCase):
    """The CLI's config file (kiln login writes it) as the SDK reads it: same precedence, same
    refusals. Each case has its own XDG_CONFIG_HOME and no KILN_* variables."""

    TOKEN_A = "kiln_AAAAsecretAAAA"
    TOKEN_B = "kiln_BBBBsecretBBBB"

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kiln-sdk-cfg-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.env = {"XDG_CONFIG_HOME": self.dir, "HOME": "/nonexistent"}
        self.path = os.path.join(self.dir, "kiln", "config.json")

    def write(self, cfg, mode=0o600):
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        with open(self.path, "w") as f:
            f.write(cfg if isinstance(cfg, str) else json.dumps(cfg))
        os.chmod(self.path, mode)

    def two_profiles(self):
        self.write({"current": "default", "profiles": {
            "default": {"url": "https://a.example:8443/", "token": self.TOKEN_A, "ca": "/etc/a-ca.pem"},
            "other": {"url": "b.example:8080", "token": self.TOKEN_B}}})

    def resolve(self, **kw):
        return kiln.config.resolve(environ=self.env, **kw)

    def test_path(self):
        self.assertEqual(kiln.config.config_path({"XDG_CONFIG_HOME": "/x"}), "/x/kiln/config.json")
        self.assertEqual(kiln.config.config_path({"XDG_CONFIG_HOME": "rel", "HOME": "/home/ann"}),
                         "/home/ann/.config/kiln/config.json")

    def test_the_current_profile_fills_what_is_missing(self):
        self.two_profiles()
        s = self.resolve()
        self.assertEqual((s.url, s.token, s.ca), ("https://a.example:8443", self.TOKEN_A, "/etc/a-ca.pem"))
        self.assertEqual((s.url_from, s.token_from, s.ca_from, s.profile), ("profile",) * 3 + ("default",))
        self.assertNotIn("AAAA", repr(s))

    def test_arguments_beat_the_environment_which_beats_the_profile(self):
        self.two_profiles()
        self.env.update(KILN_TOKEN="kiln_ENV", KILN_TLS_CA="/env-ca.pem")
        s = self.resolve()
        self.assertEqual((s.token, s.token_from, s.ca, s.url_from), ("kiln_ENV", "environment", "/env-ca.pem", "profile"))
        s = self.resolve(token="kiln_ARG", ca="/arg-ca.pem")
        self.assertEqual((s.token, s.token_from, s.ca, s.ca_from), ("kiln_ARG", "argument", "/arg-ca.pem", "argument"))
        s = self.resolve(token="")  # no token, on purpose
        self.assertEqual((s.token, s.token_from), ("", "argument"))
        del self.env["KILN_TOKEN"]
        s = self.resolve(url="https://a.example:8443")  # the profile's own URL: its token goes
        self.assertEqual(s.token, self.TOKEN_A)

    def test_a_profile_token_goes_only_to_its_own_url(self):
        self.two_profiles()
        for kw, env in (({"url": "https://evil.example"}, {}), ({}, {"KILN_URL": "http://a.example:8443"})):
            self.env.update(env)
            s = self.resolve(**kw)
            self.assertEqual((s.token, s.ca), ("", ""), kw or env)
            self.assertTrue(s.profile_other_url)

    def test_choosing_a_profile(self):
        self.two_profiles()
        self.env["KILN_PROFILE"] = "other"
        s = self.resolve()
        self.assertEqual((s.url, s.token, s.profile), ("https://b.example:8080", self.TOKEN_B, "other"))
        self.assertEqual(self.resolve(profile="default").token, self.TOKEN_A)
        with self.assertRaises(kiln.KilnError) as cm:
            self.resolve(profile="nope")
        self.assertIn('no profile "nope"', str(cm.exception))
        self.assertIn("kiln login --profile nope", str(cm.exception))

    def test_a_file_others_can_read_is_refused(self):
        self.two_profiles()
        for mode in (0o644, 0o640, 0o604):
            os.chmod(self.path, mode)
            with self.assertRaises(kiln.KilnError) as cm:
                self.resolve()
            e = cm.exception
            self.assertEqual(e.code, "permission_denied")
            self.assertIn("chmod 600 " + self.path, e.hint)
            self.assertNotIn("AAAA", str(e))
        # Not read at all when arguments and environment give everything.
        s = self.resolve(url="https://k:1", token="kiln_x", ca="/ca.pem")
        self.assertEqual((s.token, s.config_path), ("kiln_x", ""))

    def test_bad_files_are_named_without_their_text(self):
        self.write('{"profiles": {"default": {"token": "kiln_AAAAsec\nretAAAA"}}}')
        with self.assertRaises(kiln.KilnError) as cm:
            self.resolve()
        self.assertIn("is not valid JSON (line 1, column", str(cm.exception))
        self.assertNotIn("AAAA", str(cm.exception) + repr(cm.exception.__dict__))
        for bad in ('[1]', '{"profiles": []}', '{"profiles": {"p": {"url": 8}}}', '{"current": 3}'):
            self.write(bad)
            with self.assertRaises(kiln.KilnError, msg=bad):
                self.resolve()

    def test_client_uses_the_profile(self):
        self.write({"current": "lab", "profiles": {"lab": {"url": "127.0.0.1:1", "token": self.TOKEN_A}}})
        saved = dict(os.environ)
        try:
            os.environ["XDG_CONFIG_HOME"] = self.dir
            for var in ("KILN_URL", "KILN_TOKEN", "KILN_TLS_CA", "KILN_PROFILE"):
                os.environ.pop(var, None)
            client = kiln.Client(timeout=2)
            self.assertEqual((client.url, client.profile, client._token), ("https://127.0.0.1:1", "lab", self.TOKEN_A))
            self.assertNotIn("AAAA", repr(client))
            self.assertEqual(kiln.Client(token="")._token, "")
            with self.assertRaises(kiln.KilnError) as cm:  # the token was sent there: kilnd is not up
                client.whoami()
            self.assertEqual(cm.exception.code, "unavailable")
        finally:
            os.environ.clear()
            os.environ.update(saved)


class Identity(unittest.TestCase):
    """Users, tokens, projects and members against a real kilnd, as its cluster admin
    ($KILN_TOKEN). Where kilnd checks tokens, also what each role may see and do."""

    @classmethod
    def setUpClass(cls):
        if not os.environ.get("KILN_URL"):
            if os.environ.get("KILN_SDK_REQUIRE_SERVER") == "1":
                raise AssertionError("KILN_URL is not set")
            raise unittest.SkipTest("KILN_URL is not set (run through tests/e2e)")
        cls.client = kiln.Client()
        cls.me = cls.client.whoami()
        # A kilnd started with --no-auth answers as "anonymous", a cluster admin without a token.
        cls.auth = bool(cls.me.get("token_id"))
        cls.tag = "%d" % os.getpid()

    def assertNoSecret(self, secret, text, where):
        # assertNotIn would print the secret itself when it fails
        self.assertFalse(secret in text, "a token's secret appears in " + where)

    def as_user(self, token):
        return kiln.Client(self.client.url, token=token, ca=os.environ.get("KILN_TLS_CA") or None)

    def test_whoami(self):
        me = self.client.whoami()
        self.assertTrue(me["user"])
        self.assertIs(me["cluster_admin"], True)
        self.assertIsInstance(me["projects"], list)
        self.assertEqual(set(me), {"user", "cluster_admin", "projects", "token_id", "token_expires_at"})

    def test_attach_describe_and_id_prefixes(self):
        spec = {"name": "sdk-attach-" + self.tag,
                "model": {"type": "mlp", "hidden": [4], "n_inputs": 2, "n_classes": 2},
                "data": {"train": "synthetic"}, "hyperparameters": {"lr": 0.01, "max_steps": 3},
                "tags": {"suite": "sdk"}}
        job = self.client.submit(spec)
        prefix = job.id[:8]
        # SageMaker's Estimator.attach: the job's spec becomes the Estimator's
        est = kiln.Estimator.attach(prefix, client=self.client)
        self.assertIsNotNone(est.latest_training_job)
        assert est.latest_training_job is not None
        self.assertEqual(est.latest_training_job.id, job.id)
        again = est.spec()
        self.assertEqual((again["name"], again["model"], again["tags"]), (spec["name"], job.spec["model"], spec["tags"]))
        # (with agents about, the job may be placed and even finish while this runs)
        d = est.describe()
        self.assertEqual(d["id"], job.id)
        self.assertEqual(d["events"][0]["to_state"], "QUEUED")
        # every method takes the prefix, resolved by kilnd
        self.assertEqual(self.client.job(prefix).id, job.id)
        self.assertEqual(self.client.describe(prefix)["id"], job.id)
        self.assertEqual(self.client.events(prefix)[0]["to_state"], "QUEUED")
        self.assertIsInstance(list(self.client.logs(prefix)), list)
        self.assertIsInstance(self.client.metrics(prefix), dict)
        # the model: its artifact's URL once there is one, None before
        model = est.model_data
        if model is not None:
            self.assertIn("/v1/jobs/%s/artifacts/" % job.id, model)
        self.assertIsInstance(self.client.artifacts(prefix), list)
        try:
            self.assertIn(self.client.stop(prefix, reason="sdk test").state, ("STOPPED", "STOPPING"))
        except kiln.KilnError as e:
            self.assertEqual(e.code, "failed_precondition")  # it had finished already
        with self.assertRaises(kiln.KilnError) as cm:
            self.client.job(prefix[:3])
        self.assertEqual((cm.exception.status, cm.exception.code), (400, "invalid_argument"))
        self.assertIn("too short", cm.exception.message)
        with self.assertRaises(kiln.KilnError) as cm:
            kiln.Estimator(model={"type": "mlp"}, client=self.client).describe()
        self.assertEqual(cm.exception.code, "failed_precondition")

    def test_attach_by_name(self):
        name = "sdk-byname-" + self.tag
        spec = {"name": name, "model": {"type": "mlp", "hidden": [4], "n_inputs": 2, "n_classes": 2},
                "data": {"train": "synthetic"}, "hyperparameters": {"lr": 0.01, "max_steps": 3}}
        job = self.client.submit(spec)
        est = kiln.Estimator.attach(name, client=self.client)
        assert est.latest_training_job is not None
        self.assertEqual(est.latest_training_job.id, job.id)
        self.assertEqual((est.spec()["name"], est.spec()["model"]), (name, job.spec["model"]))
        self.assertEqual(self.client.find_job(job.id[:6]).id, job.id, "a prefix still works")
        # nothing of that name or id: 404
        with self.assertRaises(kiln.KilnError) as cm:
            kiln.Estimator.attach("sdk-no-such-" + self.tag, client=self.client)
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))
        self.assertIn('no job has the id, id prefix or name "sdk-no-such-', cm.exception.message)
        # a name two jobs share names neither: 400 listing both
        twin = self.client.submit(spec)
        with self.assertRaises(kiln.KilnError) as cm:
            kiln.Estimator.attach(name, client=self.client)
        e = cm.exception
        self.assertEqual((e.status, e.code), (400, "invalid_argument"))
        self.assertIn('"%s" is the name of 2 jobs' % name, e.message)
        self.assertIn(job.id, e.detail or "")
        self.assertIn(twin.id, e.detail or "")
        for j in (job, twin):
            with contextlib.suppress(kiln.KilnError):
                j.stop()

    def test_a_script_estimators_spec_is_accepted_and_read_back(self):
        """The spec a script Estimator submits, as kilnd stores it. The source is a directory
        inside the data roots, which kilnd checks against the alive agents' (when there are any:
        this case runs beside agents too, and stops the job before it matters)."""
        name = "sdk-script-" + self.tag
        roots = [r for w in self.client.workers() if w.get("state") == "ALIVE" for r in w.get("data_roots") or []]
        base = roots[0] if roots else "/srv/kiln"
        est = kiln.Estimator(entry_point="train.py", source=base + "/code/ddp",
                             hyperparameters={"epochs": 3, "batch-size": 64, "lr": 0.01, "model": {"depth": 4}},
                             instance_count=2, distribution={"torch_distributed": {"enabled": True}},
                             metric_definitions=[{"Name": "val_acc", "Regex": "val_acc=([0-9.]+)"}],
                             environment={"MY_FLAG": "1"}, name=name, client=self.client)
        job = est.fit(inputs={"train": base + "/data/train", "validation": base + "/data/val"}, wait=False)
        try:
            got = self.client.job(job.id).spec
            self.assertEqual((got["entry_point"], got["source"]), ("train.py", base + "/code/ddp"))
            self.assertEqual(got["hyperparameters"], {"epochs": 3, "batch-size": 64, "lr": 0.01, "model": {"depth": 4}})
            self.assertEqual(got["data"]["channels"], {"train": base + "/data/train",
                                                       "validation": base + "/data/val"})
            self.assertEqual(got["resources"]["nodes"], 2)
            self.assertIs(got["distribution"]["torch_distributed"]["enabled"], True)
            self.assertEqual(got["metric_definitions"], [{"name": "val_acc", "regex": "val_acc=([0-9.]+)"}],
                             "SageMaker's keys, stored in kiln's spelling")
            self.assertEqual(got["environment"], {"MY_FLAG": "1"})
            # attached by its name, the Estimator submits the same job again
            again = kiln.Estimator.attach(name, client=self.client)
            self.assertEqual((again.entry_point, again.source, again.model), ("train.py", base + "/code/ddp", None))
            spec = again.spec()
            for key in ("entry_point", "source", "hyperparameters", "data", "metric_definitions", "environment"):
                self.assertEqual(spec[key], got[key], key)
            # and kilnd takes its own normal form back
            second = again.fit(wait=False)
            with contextlib.suppress(kiln.KilnError):
                second.stop()
            self.assertNotEqual(second.id, job.id)
            self.assertEqual(self.client.job(second.id).spec, got)
        finally:
            with contextlib.suppress(kiln.KilnError):
                job.stop()

    def test_users_projects_and_members(self):
        name, project = "sdk-u-" + self.tag, "sdk-p-" + self.tag
        u = self.client.create_user(name)
        self.assertEqual((u["name"], u["cluster_admin"]), (name, False))
        self.assertIn(name, [x["name"] for x in self.client.users()])
        with self.assertRaises(kiln.KilnError) as cm:
            self.client.create_user(name)
        self.assertEqual(cm.exception.status, 409)
        self.assertTrue(self.client.create_user(name + "-root", cluster_admin=True)["cluster_admin"])
        self.assertEqual(self.client.create_project(project)["name"], project)
        self.assertIn(project, [p["name"] for p in self.client.projects()])
        # a project's default queue: "default" unless set; one that does not exist is a 400
        self.assertEqual([p["default_queue"] for p in self.client.projects() if p["name"] == project], ["default"])
        with self.assertRaises(kiln.KilnError) as cm:
            self.client.update_project(project, "nowhere-" + self.tag)
        self.assertEqual((cm.exception.status, cm.exception.field), (400, "default_queue"))
        self.assertEqual(self.client.update_project(project, None)["default_queue"], "default")
        self.assertEqual(self.client.set_member(project, name, "viewer"),
                         {"project": project, "user": name, "role": "viewer"})
        self.assertEqual(self.client.set_member(project, name, "editor")["role"], "editor")
        self.assertEqual(self.client.members(project), [{"project": project, "user": name, "role": "editor"}])
        with self.assertRaises(kiln.KilnError) as cm:
            self.client.set_member(project, name, "owner")
        self.assertEqual((cm.exception.status, cm.exception.field), (400, "role"))
        self.assertEqual(self.client.remove_member(project, name), {"project": project, "user": name})
        self.assertEqual(self.client.members(project), [])
        with self.assertRaises(kiln.KilnError) as cm:
            self.client.remove_member(project, name)
        self.assertEqual(cm.exception.status, 404)

    def test_queues_create_list_update_delete(self):
        # a team sharing the cluster from Python, as `kiln queues` does from the shell
        name, project = "sdk-q-" + self.tag, "sdk-qp-" + self.tag
        self.client.create_project(project)
        q = self.client.create_queue(name, {"cpu": 2}, cohort="sdk-c-" + self.tag, borrowing_limit={"cpu": 1},
                                     projects=[project])
        self.assertEqual((q["name"], q["quota"]["cpu"], q["borrowing_limit"], q["projects"]),
                         (name, 2, {"cpu": 1}, [project]))
        self.assertIn(name, [x["name"] for x in self.client.queues()])
        self.assertEqual(self.client.queue(name)["cohort"], "sdk-c-" + self.tag)
        self.assertEqual(self.client.queue("default")["projects"], ["*"])
        with self.assertRaises(kiln.KilnError) as cm:
            self.client.create_queue(name + "-x", {"tpu": 1})
        self.assertEqual((cm.exception.status, cm.exception.field), (400, "quota.tpu"))
        changed = self.client.update_queue(name, quota={"cpu": 4}, borrowing_limit=None, weight=2)
        self.assertEqual((changed["quota"]["cpu"], changed["borrowing_limit"], changed["weight"]), (4, {}, 2))
        self.assertEqual(self.client.update_queue(name, cohort=None)["cohort"], None)
        # the preemption policy: its defaults, then changed field by field
        self.assertEqual(q["preemption"], {"within_queue": "lower_priority", "reclaim_within_cohort": "any"})
        p = self.client.update_queue(name, preempt_within_queue="never")["preemption"]
        self.assertEqual(p, {"within_queue": "never", "reclaim_within_cohort": "any"})
        p = self.client.update_queue(name, reclaim_within_cohort="lower_priority")["preemption"]
        self.assertEqual(p, {"within_queue": "never", "reclaim_within_cohort": "lower_priority"})
        # None is a field's default, as PATCH's null: the other field keeps its value
        p = self.client.update_queue(name, preempt_within_queue=None)["preemption"]
        self.assertEqual(p, {"within_queue": "lower_priority", "reclaim_within_cohort": "lower_priority"})
        p = self.client.update_queue(name, preemption=None, preempt_within_queue="never")["preemption"]
        self.assertEqual(p, {"within_queue": "never", "reclaim_within_cohort": "any"})
        self.assertEqual(self.client.update_queue(name, preemption=None)["preemption"],
                         {"within_queue": "lower_priority", "reclaim_within_cohort": "any"})
        with self.assertRaises(kiln.KilnError) as cm:
            self.client.create_queue(name + "-p", {"cpu": 1}, preempt_within_queue="sometimes")
        self.assertEqual((cm.exception.status, cm.exception.field), (400, "preemption.within_queue"))
        made = self.client.create_queue(name + "-p", {"cpu": 1}, preempt_within_queue="never",
                                        reclaim_within_cohort="never")
        self.assertEqual(made["preemption"], {"within_queue": "never", "reclaim_within_cohort": "never"})
        self.client.delete_queue(name + "-p")
        self.assertEqual(self.client.delete_queue(name)["name"], name)
        with self.assertRaises(kiln.KilnError) as cm:
            self.client.queue(name)
        self.assertEqual(cm.exception.status, 404)

    def test_tokens_create_list_revoke(self):
        name = "sdk-t-" + self.tag
        self.client.create_user(name)
        t = self.client.create_token(name, expires_in_s=3600, description="sdk test")
        self.assertEqual(set(t), {"id", "token", "expires_at", "user", "created_by", "parent_id",
                                  "expires_with_parent"})
        self.assertTrue(t["token"].startswith("kiln_") and t["id"].startswith("tok_") and t["expires_at"])
        # made with this client's token (none without authentication)
        self.assertEqual((t["created_by"], t["parent_id"]), (self.me["user"], self.me["token_id"]))
        forever = self.client.create_token(name)
        self.assertEqual(forever["expires_at"], "")
        listed = self.client.tokens(name)
        self.assertEqual(sorted(x["id"] for x in listed), sorted((t["id"], forever["id"])))
        self.assertEqual([x["description"] for x in listed if x["id"] == t["id"]], ["sdk test"])
        self.assertEqual({(x["kind"], x["created_by"], x["parent_id"]) for x in listed},
                         {("api", self.me["user"], self.me["token_id"])})
        text = json.dumps(listed)
        self.assertNoSecret(t["token"], text, "the token list")
        self.assertNoSecret(forever["token"], text, "the token list")
        if self.auth:
            user = self.as_user(t["token"])
            self.assertEqual(user.whoami()["user"], name)
            self.assertEqual([x["id"] for x in user.tokens()], [x["id"] for x in listed])  # its own
            # A token made with t never outlives it: it expires with t, and a longer one is refused.
            child = user.create_token(description="made with t")
            self.assertEqual((child["expires_at"], child["expires_with_parent"], child["parent_id"]),
                             (t["expires_at"], True, t["id"]))
            with self.assertRaises(kiln.KilnError) as cm:
                user.create_token(expires_in_s=7200)
            self.assertEqual((cm.exception.status, cm.exception.field), (400, "expires_in_s"))
        revoked = self.client.revoke_token(t["id"])
        self.assertEqual(revoked["id"], t["id"])
        self.assertTrue(revoked["revoked_at"])
        self.assertEqual(revoked["descendants_revoked"], 1 if self.auth else 0)
        if self.auth:
            with self.assertRaises(kiln.KilnError) as cm:
                user.whoami()
            self.assertEqual((cm.exception.status, cm.exception.code), (401, "unauthenticated"))
            self.assertIn("revoked", cm.exception.message)
            self.assertNoSecret(t["token"], str(cm.exception), "the 401 error")
            with self.assertRaises(kiln.KilnError) as cm:
                self.as_user(child["token"]).whoami()
            self.assertEqual(cm.exception.status, 401, "revoked with the token that made it")
            # Expired: refused once its second has passed.
            brief = self.client.create_token(name, expires_in_s=1)
            time.sleep(2)
            with self.assertRaises(kiln.KilnError) as cm:
                self.as_user(brief["token"]).whoami()
            self.assertEqual(cm.exception.status, 401)
            self.assertIn("expired", cm.exception.message)

    def test_viewer_sees_only_its_project(self):
        name, mine, theirs = "sdk-v-" + self.tag, "sdk-mine-" + self.tag, "sdk-theirs-" + self.tag
        self.client.create_user(name)
        self.client.create_project(mine)
        self.client.create_project(theirs)
        job_mine = self.client.submit(mlp_spec("sdk-mine", mine))
        job_theirs = self.client.submit(mlp_spec("sdk-theirs", theirs))
        self.client.set_member(mine, name, "viewer")
        token = self.client.create_token(name)["token"]
        try:
            if not self.auth:
                # This kilnd does not check tokens (--no-auth): every caller is the same cluster
                # admin and there is nothing to enforce. test_identity.c runs this case against
                # one that does.
                self.assertEqual(self.me["user"], "anonymous")
                return
            viewer = self.as_user(token)
            me = viewer.whoami()
            self.assertEqual((me["user"], me["cluster_admin"], me["projects"]),
                             (name, False, [{"project": mine, "role": "viewer"}]))
            self.assertEqual([(p["name"], p["role"]) for p in viewer.projects()], [(mine, "viewer")])
            self.assertEqual([j.id for j in viewer.jobs()], [job_mine.id])
            self.assertEqual(viewer.job(job_mine.id).name, "sdk-mine")
            with self.assertRaises(kiln.KilnError) as cm:
                viewer.job(job_theirs.id)
            self.assertEqual(cm.exception.status, 404)
            with self.assertRaises(kiln.KilnError) as cm:
                viewer.submit(mlp_spec("by-viewer", mine))
            self.assertEqual((cm.exception.status, cm.exception.code), (403, "permission_denied"))
            with self.assertRaises(kiln.KilnError) as cm:
                viewer.users()
            self.assertEqual(cm.exception.status, 403)
            with self.assertRaises(kiln.KilnError) as cm:
                viewer.set_member(mine, name, "admin")
            self.assertEqual(cm.exception.status, 403)
            # Its own tokens are its own business.
            own = viewer.create_token(description="mine")
            self.assertEqual(own["user"], name)
            self.assertIn(own["id"], [x["id"] for x in viewer.tokens()])
            self.assertEqual(viewer.revoke_token(own["id"])["id"], own["id"])
            # Out of the project, nothing of it is left to see.
            self.client.remove_member(mine, name)
            self.assertEqual(viewer.jobs(), [])
            self.assertEqual(viewer.projects(), [])
        finally:
            for job in (job_mine, job_theirs):
                with contextlib.suppress(kiln.KilnError):
                    job.stop(reason="sdk identity test done")


class Live(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        url = os.environ.get("KILN_URL")
        if not url:
            if os.environ.get("KILN_SDK_REQUIRE_SERVER") == "1":
                raise AssertionError("KILN_URL is not set")
            raise unittest.SkipTest("KILN_URL is not set (run through tests/e2e)")
        cls.client = kiln.Client(url)

    def test_fit_follow_wait_logs_metrics(self):
        est = tiny_estimator(self.client, "sdk-tiny")
        job = est.fit(wait=False)
        self.assertIs(est.latest_job, job)
        self.assertTrue(job.created)
        self.assertEqual(len(job.id), 36)
        self.assertIn(job.state, ("QUEUED", "SCHEDULED", "STARTING", "RUNNING"))
        # Following ends by itself when the job ends.
        followed = list(job.logs(follow=True))
        job.wait(timeout=120)
        self.assertEqual(job.state, "COMPLETED", job.reason)
        self.assertTrue(followed, "no log line followed")
        self.assertTrue(all(isinstance(l, kiln.LogLine) and l.rank == 0 for l in followed))
        self.assertTrue(str(followed[0]).startswith("[rank 0] "))
        history = list(job.logs())
        self.assertEqual([l.seq for l in history], [l.seq for l in followed])
        self.assertEqual(list(job.logs(rank=1)), [])
        # Progress and latest metrics on the job; the full history through metrics().
        self.assertEqual(job.progress.get("step"), MAX_STEPS)
        self.assertEqual(job.progress.get("total_steps"), MAX_STEPS)
        self.assertIn("train_loss", job.latest_metrics)
        loss = job.metrics("train_loss")
        self.assertEqual(list(loss), ["train_loss"])
        points = loss["train_loss"]
        self.assertEqual(points[-1][0], MAX_STEPS)
        self.assertEqual([s for s, _ in points], sorted(s for s, _ in points))
        self.assertLess(points[-1][1], points[0][1], "training loss did not fall")
        self.assertAlmostEqual(points[-1][1], job.latest_metrics["train_loss"], places=4)
        self.assertIn("train_loss", job.metrics())
        # every point carries its time, in step order as the engine recorded them
        import datetime
        started = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=10)
        self.assertTrue(all(started < p.time <= datetime.datetime.now(datetime.timezone.utc) for p in points))
        self.assertEqual([p.time for p in points], sorted(p.time for p in points))
        self.assertTrue(all((p.rank, p.attempt) == (0, 1) for p in points))
        # and SageMaker's TrainingJobAnalytics: a frame of every metric by step and time
        df = job.dataframe()
        self.assertEqual(list(df.columns), list(kiln.METRIC_COLUMNS))
        every = job.metrics()
        self.assertEqual(sorted(set(df["metric_name"])), sorted(every))
        self.assertEqual(len(df), sum(len(v) for v in every.values()))
        loss_df = df[df["metric_name"] == "train_loss"]
        self.assertEqual(list(loss_df["step"]), [p.step for p in points])
        self.assertEqual(list(loss_df["value"]), [p.value for p in points])
        self.assertEqual(list(loss_df["time"]), [p.time for p in points])
        self.assertEqual(df["timestamp"].min(), 0.0)
        self.assertEqual(job.metric_rows("train_loss")[-1]["step"], MAX_STEPS)
        states = [e["to_state"] for e in job.events()]
        self.assertEqual(states[0], "QUEUED")
        self.assertEqual(states[-1], "COMPLETED")
        for s in ("SCHEDULED", "STARTING", "RUNNING"):
            self.assertIn(s, states)
        # The job is found by listing, by tag, and by a short id.
        self.assertIn(job.id, [j.id for j in self.client.jobs(status="COMPLETED")])
        self.assertIn(job.id, [j.id for j in self.client.jobs(tag="suite:sdk")])
        self.assertEqual(self.client.job(job.id[:8]).id, job.id)
        # Stopping a finished job is refused.
        with self.assertRaises(kiln.KilnError) as cm:
            job.stop()
        self.assertEqual(cm.exception.status, 409)

    def test_search_and_compare(self):
        run = "sdk-sweep-%d-%d" % (os.getpid(), int(time.time() * 1000))
        jobs = []
        for lr in (3e-3, 3e-4):
            est = tiny_estimator(self.client, "sdk-sweep")
            est.hyperparameters["lr"] = lr
            est.tags = {"suite": "sdk", "run": run}
            jobs.append(est.fit(wait=False))
        for j in jobs:
            j.wait(timeout=120)
            self.assertEqual(j.state, "COMPLETED", j.reason)
        found = self.client.search('tags.run = "%s" AND metrics.train_loss.count >= %d' % (run, MAX_STEPS),
                                   order_by="hp.lr asc", columns=["hp.lr", "metrics.train_loss.min"])
        self.assertEqual([j.id for j in found], [jobs[1].id, jobs[0].id])
        self.assertAlmostEqual(found[0].columns["hp.lr"], 3e-4)
        summary = found[0].summaries["train_loss"]
        self.assertEqual(summary["count"], MAX_STEPS)
        self.assertEqual(found[0].columns["metrics.train_loss.min"], summary["min"])
        # Paging by one gives the same jobs; an OR across a hyperparameter and a summary finds both.
        self.assertEqual([j.id for j in self.client.search('tags.run = "%s"' % run, page_size=1, order_by="hp.lr")],
                         [jobs[1].id, jobs[0].id])
        both = self.client.search('tags.run = "%s" AND (hp.lr > 1e-3 OR metrics.train_loss.last < %r)'
                                  % (run, summary["last"] + 1), limit=5)
        self.assertEqual(len(both), 2)
        # The job read by id carries every summary.
        self.assertIn("train_loss", self.client.job(jobs[0].id).summaries)
        with self.assertRaises(kiln.KilnError) as cm:
            self.client.search("hp.lrr < 1")
        e = cm.exception
        self.assertEqual((e.status, e.field, e.hint), (400, "filter", "did you mean hp.lr?"))
        self.assertIn("^^^^^^", e.detail)
        c = self.client.compare([j.id for j in jobs], max_points=10)
        self.assertEqual([j.id for j in c["jobs"]], [j.id for j in jobs])
        self.assertEqual(c["hyperparameters"]["lr"], [3e-3, 3e-4])
        self.assertIn("lr", c["differing"])
        self.assertNotIn("max_steps", c["differing"])
        self.assertEqual(len(c["summaries"]["train_loss"]), 2)
        curves = c["curves"]["train_loss"]
        self.assertEqual(len(curves), 2)
        self.assertTrue(all(2 <= len(points) <= 10 for points in curves), curves)
        self.assertEqual(curves[0][0][0], 1)
        self.assertEqual(curves[0][-1][0], MAX_STEPS)

    def test_bad_spec_raises_with_field(self):
        est = tiny_estimator(self.client, "sdk-bad")
        est.hyperparameters["lr"] = -1
        before = len(self.client.jobs())
        with self.assertRaises(kiln.KilnError) as cm:
            est.fit(wait=False)
        e = cm.exception
        self.assertEqual((e.code, e.status, e.field), ("invalid_argument", 400, "hyperparameters.lr"))
        self.assertTrue(e.message)
        self.assertIsNone(est.latest_job)
        self.assertEqual(len(self.client.jobs()), before, "a rejected job was stored")

    def test_unknown_job(self):
        with self.assertRaises(kiln.KilnError) as cm:
            self.client.job("00000000-0000-4000-8000-000000000000")
        self.assertEqual((cm.exception.code, cm.exception.status), ("not_found", 404))

    def test_idempotent_submit_and_stop(self):
        est = tiny_estimator(self.client, "sdk-idem")
        # Long enough that it is still queued or running when stopped: the tiny model trains
        # hundreds of steps a second, so 20 could be done before the stop arrives.
        est.hyperparameters["max_steps"] = 1000000
        key = "sdk-idem-%d-%f" % (os.getpid(), time.time())
        first = est.fit(wait=False, idempotency_key=key)
        again = est.fit(wait=False, idempotency_key=key)
        self.assertEqual(first.id, again.id)
        self.assertTrue(first.created)
        self.assertFalse(again.created)
        first.stop(reason="sdk test done")
        self.assertIn(first.state, ("STOPPING", "STOPPED"))
        first.wait(timeout=60)
        self.assertEqual(first.state, "STOPPED", first.reason)

    def test_fit_waits_following_logs_on_two_nodes(self):
        # SageMaker style: instance_count nodes, fit() follows the logs and waits.
        est = tiny_estimator(self.client, "sdk-two-nodes", instance_count=2)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            job = est.fit(timeout=120)
        self.assertEqual(job.state, "COMPLETED", job.reason)
        self.assertEqual(len(set(job.workers)), 2)
        printed = buf.getvalue()
        self.assertIn("[rank 0] ", printed)
        self.assertIn("[rank 1] ", printed)
        self.assertTrue(list(job.logs(rank=1)))

    def test_fit_raises_when_the_job_fails(self):
        est = tiny_estimator(self.client, "sdk-fails")
        est.data = {"train": "/nonexistent/kiln-sdk-test/corpus.txt"}
        with self.assertRaises(kiln.KilnError) as cm:
            est.fit(logs=False, timeout=120)
        e = cm.exception
        print("fit() of a job with a missing data file raised: %s" % e, file=sys.stderr)
        if isinstance(e, kiln.JobFailedError):  # accepted, then failed in its rank
            self.assertEqual(e.job.state, "FAILED")
            self.assertTrue(e.job.reason)
            self.assertIn(e.job.id, str(e))
        else:  # or refused at submission, naming the field
            self.assertEqual(e.field, "data.train")

    def test_upload_code_and_a_script_job(self):
        d = tempfile.mkdtemp(prefix="kiln-sdk-live-code-")
        self.addCleanup(shutil.rmtree, d, True)
        with open(os.path.join(d, "train.py"), "w") as f:
            f.write("print('sdk')\n")
        source = self.client.upload_code(d)
        import hashlib
        want = "code:sha256:" + hashlib.sha256(kiln.code.pack_dir_bytes(d)).hexdigest()
        self.assertEqual(source, want, "the source is the SHA-256 of the packed bytes")
        self.assertEqual(self.client.upload_code(d), source, "again: the same source")
        job = self.client.submit({"name": "sdk-script", "entry_point": "train.py", "source": source,
                                  "hyperparameters": {"epochs": 3, "model": {"depth": 4}}})
        spec = job.to_dict()["spec"]
        self.assertEqual(spec["entry_point"], "train.py")
        self.assertEqual(spec["hyperparameters"]["model"]["depth"], 4)
        with contextlib.suppress(kiln.KilnError):
            self.client.stop(job.id)

    def test_a_script_estimator_uploads_its_source_dir(self):
        d = tempfile.mkdtemp(prefix="kiln-sdk-est-code-")
        self.addCleanup(shutil.rmtree, d, True)
        with open(os.path.join(d, "train.py"), "w") as f:
            f.write("import kiln\nkiln.log_metrics(1, acc=0.5)\n")
        with open(os.path.join(d, "notes.log"), "w") as f:
            f.write("left out\n")
        with open(os.path.join(d, ".kilnignore"), "w") as f:
            f.write("*.log\n")
        # a channel inside an agent's data roots, as kilnd checks while agents are alive
        root = self.client.workers()[0]["data_roots"][0]
        est = kiln.Estimator(entry_point="train.py", source_dir=d, hyperparameters={"epochs": 1},
                             instance_count=1, metric_definitions=[{"Name": "acc", "Regex": "acc=([0-9.]+)"}],
                             name="sdk-script-estimator", client=self.client)
        job = est.fit(inputs={"train": root, "validation": root}, wait=False)
        with contextlib.suppress(kiln.KilnError):
            self.client.stop(job.id)
        self.assertEqual(job.spec["entry_point"], "train.py")
        self.assertEqual(job.spec["source"], self.client.upload_code(d), "the packed source_dir, uploaded")
        self.assertEqual(job.spec["data"]["channels"], {"train": root, "validation": root})
        self.assertEqual(job.spec["metric_definitions"], [{"name": "acc", "regex": "acc=([0-9.]+)"}])

    def test_a_script_job_s_model_and_synced_checkpoints(self):
        d = tempfile.mkdtemp(prefix="kiln-sdk-ckpt-code-")
        self.addCleanup(shutil.rmtree, d, True)
        with open(os.path.join(d, "train.py"), "w") as f:
            f.write("import os\n"
                    "ck = os.path.join(os.environ['SM_CHECKPOINT_DIR'], 'checkpoint-3', 'rng')\n"
                    "os.makedirs(ck)\n"
                    "open(os.path.join(ck, 'state.bin'), 'w').write('seed 3')\n"
                    "open(os.path.join(os.environ['SM_MODEL_DIR'], 'weights.txt'), 'w').write('w')\n")
        job = self.client.submit({"name": "sdk-ckpt", "entry_point": "train.py", "source": self.client.upload_code(d)})
        self.assertEqual(job.checkpoints(), kiln.Checkpoints(files=[], attempt=0, synced_at=""), "nothing yet")
        job.wait(timeout=120, raise_on_failure=True)
        ck = job.checkpoints()
        self.assertIsInstance(ck, kiln.Checkpoints)
        self.assertEqual([(c.name, c.size, c.attempt) for c in ck.files], [("checkpoint-3/rng/state.bin", 6, 1)])
        import hashlib
        self.assertEqual(ck.files[0].sha256, hashlib.sha256(b"seed 3").hexdigest())
        self.assertTrue(ck.files[0].worker_id and ck.synced_at, ck)
        self.assertEqual(ck.attempt, 1)
        # the model directory's archive is the job's model_data
        model = job.model_data
        assert model is not None
        self.assertTrue(model.endswith("/artifacts/" + kiln.SCRIPT_MODEL_ARTIFACT), model)

    def test_hyperparameter_tuner(self):
        run = "sdk-tune-%d-%d" % (os.getpid(), int(time.time() * 1000))
        est = tiny_estimator(self.client, "sdk-trial")
        ranges = {"lr": kiln.ContinuousParameter(1e-3, 1e-2, "Logarithmic"), "warmup_steps": kiln.IntegerParameter(0, 5, "Linear")}
        # kilnd's validator answers a range the base job would refuse with the field
        with self.assertRaises(kiln.KilnError) as cm:
            kiln.HyperparameterTuner(est, "val_loss", {"warmup_steps": kiln.IntegerParameter(-5, 5)}).fit(wait=False)
        self.assertEqual(cm.exception.status, 400)
        self.assertIn("warmup_steps", cm.exception.field or "")
        tuner = kiln.HyperparameterTuner(est, "val_loss", ranges, objective_type="Minimize", max_jobs=2,
                                         max_parallel_jobs=2, random_seed=11, base_tuning_job_name=run)
        t = tuner.fit(wait=True, timeout=240)
        self.assertIs(tuner.latest_tuning_job, t)
        self.assertEqual(t.state, "COMPLETED", t.reason)
        trials = t.trials
        self.assertEqual(len(trials), 2)
        for tr in trials:
            self.assertEqual(tr.state, "COMPLETED")
            self.assertTrue(1e-3 <= tr.parameters["lr"] <= 1e-2, tr)
            self.assertIsNotNone(tr.objective)
            self.assertEqual(tr.steps, MAX_STEPS)
        # the best trial's job, its parameters in its spec, and its model
        best = tuner.best_training_job()
        want = min(trials, key=lambda tr: tr.objective if tr.objective is not None else float("inf"))
        self.assertEqual(best.id, want.job_id)
        self.assertEqual(best.spec["hyperparameters"]["lr"], want.parameters["lr"])
        self.assertEqual(best.spec["tags"]["tuning_job"], t.id)
        model = best.model_data
        assert model is not None
        self.assertTrue(model.endswith("/artifacts/" + kiln.MODEL_ARTIFACT), model)
        self.assertEqual(tuner.best_estimator().model_data, model)
        self.assertEqual(tuner.best_estimator().hyperparameters["lr"], want.parameters["lr"])
        # found again by id and by name, ranges and settings read back
        for ref in (t.id, run, t.id[:8].upper()):  # an id prefix in either case, as kiln describe's
            again = kiln.HyperparameterTuner.attach(ref, client=self.client)
            self.assertEqual(again.latest_tuning_job.id if again.latest_tuning_job else None, t.id)
            self.assertEqual(again.hyperparameter_ranges, ranges)
            self.assertEqual((again.objective_metric_name, again.random_seed, again.max_jobs), ("val_loss", 11, 2))
            # kilnd stores the base job normalised: what the estimator set is kept, defaults added
            hp = again.spec()["job"]["hyperparameters"]
            self.assertEqual({k: hp[k] for k in est.hyperparameters}, est.hyperparameters)
        self.assertIn(t.id, [x.id for x in self.client.tuning_jobs()])
        # a newer search (stopped at once) puts this one on the list's second page of one: the
        # pages together are the list, and a name is found past the first page
        newer = self.client.create_tuning_job(dict(tuner.spec(job_name=run + "-newer"), max_jobs=1,
                                                   max_parallel_jobs=1))
        try:
            self.client.stop_tuning_job(newer.id)
        except kiln.KilnError as e:  # its one small trial may have ended it already
            if e.status != 409:
                raise
        whole = [x.id for x in self.client.tuning_jobs()]
        self.assertEqual([x.id for x in self.client.tuning_jobs(page_size=1)], whole)
        self.assertEqual(len(set(whole)), len(whole))
        self.assertLess(whole.index(newer.id), whole.index(t.id))
        self.assertEqual([x.id for x in self.client.tuning_jobs(limit=1)], whole[:1])
        self.assertEqual(self.client.find_tuning_job(run, page_size=1).id, t.id)
        self.assertEqual(self.client.find_tuning_job(run + "-newer", page_size=1).id, newer.id)
        for size in (0, 501):  # kilnd's range, as kiln tune list --page-size refuses them
            with self.assertRaises(kiln.KilnError) as cm:
                self.client.tuning_jobs(page_size=size)
            self.assertEqual((cm.exception.status, cm.exception.field), (400, "page_size"))
        # SageMaker's analytics: a row per trial with its parameters
        rows = tuner.analytics().trial_rows()
        self.assertEqual([r["job_id"] for r in rows], [tr.job_id for tr in trials])
        self.assertTrue(set(kiln.TRIAL_COLUMNS) | {"lr", "warmup_steps"} <= set(rows[0]))
        self.assertEqual(list(t.dataframe()["objective"]), [tr.objective for tr in trials])
        self.assertEqual(tuner.describe()["id"], t.id)
        # a finished search stops no more
        with self.assertRaises(kiln.KilnError) as cm:
            tuner.stop_tuning_job()
        self.assertEqual(cm.exception.status, 409)
        with self.assertRaises(kiln.KilnError) as cm:
            self.client.find_tuning_job("no-such-tuning-job-" + run)
        self.assertEqual(cm.exception.status, 404)

    def test_workers(self):
        workers = self.client.workers()
        self.assertEqual(len(workers), 2)
        for w in workers:
            self.assertEqual(w["state"], "ALIVE")
            self.assertEqual(w["slot_type"], "cpu")
        self.assertTrue(self.client.health())


if __name__ == "__main__":
    unittest.main()
