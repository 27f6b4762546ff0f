"""Tests of the kiln Python SDK (sdk/python/kiln).

The offline cases (SSE parsing, error decoding, spec building, an unreachable server) run
anywhere. The live cases need a real kilnd with two ALIVE cpu agents at $KILN_URL: the
end-to-end suite (tests/e2e) starts them and runs this file with KILN_SDK_REQUIRE_SERVER=1,
which turns "no server" into a failure instead of a skip.

    /usr/bin/python3 -m unittest discover -s tests/sdk
"""

import contextlib
import io
import os
import socket
import sys
import time
import unittest

ROOT = os.environ.get("KILN_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "sdk", "python"))

import kiln  # noqa: E402

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

    def test_workers(self):
        workers = self.client.workers()
        self.assertEqual(len(workers), 2)
        for w in workers:
            self.assertEqual(w["state"], "ALIVE")
            self.assertEqual(w["slot_type"], "cpu")
        self.assertTrue(self.client.health())


if __name__ == "__main__":
    unittest.main()
