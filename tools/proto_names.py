#!/usr/bin/env python3
"""proto_names.py - checks that proto/kiln.proto and api/openapi.yaml name their fields alike.

protoc parses the .proto (a descriptor set); PyYAML reads the spec. Each pair below is the same
thing on the two sides (a REST schema, response body, request body or query and a proto
message); their field names must be the same sets, except for the few listed with the reason
each side has it alone. Nested objects are followed into their message types. Exit 0 when they
agree; otherwise one line per disagreement.
Usage: python3 tools/proto_names.py proto/kiln.proto api/openapi.yaml
"""
import os
import subprocess
import sys
import tempfile

import yaml
from google.protobuf import descriptor_pb2

# (where in the spec, proto message). Paths: "schema:Name", "response:METHOD PATH STATUS",
# "body:METHOD PATH", "query:METHOD PATH" (query and path parameters together).
PAIRS = [
    ("schema:JobSpec", "JobSpec"),
    ("schema:Job", "Job"),
    ("schema:JobEvent", "JobEvent"),
    ("schema:Worker", "Worker"),
    ("schema:LogLine", "LogLine"),
    ("schema:MetricSeries", "MetricSeries"),
    ("schema:User", "User"),
    ("schema:Token", "Token"),
    ("schema:Project", "Project"),
    ("schema:Member", "Member"),
    ("schema:WhoAmI", "WhoAmIResponse"),
    ("response:get /v1/jobs 200", "ListJobsResponse"),
    ("response:get /v1/jobs/{id}/events 200", "ListJobEventsResponse"),
    ("response:get /v1/jobs/{id}/metrics 200", "GetMetricsResponse"),
    ("response:get /v1/workers 200", "ListWorkersResponse"),
    ("response:get /v1/users 200", "ListUsersResponse"),
    ("response:get /v1/users/{name}/tokens 200", "ListTokensResponse"),
    ("response:post /v1/users/{name}/tokens 201", "CreateTokenResponse"),
    ("response:get /v1/projects 200", "ListProjectsResponse"),
    ("response:get /v1/projects/{project}/members 200", "ListMembersResponse"),
    ("body:post /v1/users", "CreateUserRequest"),
    ("body:post /v1/users/{name}/tokens", "CreateTokenRequest"),
    ("body:post /v1/projects", "CreateProjectRequest"),
    ("body:patch /v1/projects/{project}", "UpdateProjectRequest"),
    ("body:put /v1/projects/{project}/members/{user}", "SetMemberRequest"),
    ("body:post /v1/jobs/{id}:stop", "StopJobRequest"),
    # GET /v1/jobs lists and searches; gRPC's ListJobs is the search without filter, order_by
    # and columns, so both REST forms pair with SearchJobsRequest
    ("query:get /v1/jobs", "SearchJobsRequest"),
    ("body:post /v1/jobs:search", "SearchJobsRequest"),
    ("response:post /v1/jobs:search 200", "ListJobsResponse"),
    ("schema:MetricSummary", "MetricSummary"),
    ("schema:Artifact", "Artifact"),
    ("response:get /v1/jobs/{id}/artifacts 200", "ListArtifactsResponse"),
    ("query:get /v1/jobs/{id}/artifacts", "ListArtifactsRequest"),
    ("schema:CheckpointFile", "CheckpointFile"),
    ("response:get /v1/jobs/{id}/checkpoints 200", "ListCheckpointsResponse"),
    ("query:get /v1/jobs/{id}/checkpoints", "ListCheckpointsRequest"),
    ("response:delete /v1/jobs/{id} 200", "DeleteJobResponse"),
    ("query:delete /v1/jobs/{id}", "DeleteJobRequest"),
    ("query:get /v1/jobs/{id}", "GetJobRequest"),
    ("query:get /v1/jobs/{id}/events", "ListJobEventsRequest"),
    ("query:get /v1/jobs/{id}/logs", "StreamLogsRequest"),
    ("query:get /v1/jobs/{id}/metrics", "GetMetricsRequest"),
    ("query:get /v1/users/{name}/tokens", "ListTokensRequest"),
    ("query:delete /v1/tokens/{id}", "RevokeTokenRequest"),
    ("query:get /v1/projects/{project}/members", "ListMembersRequest"),
    ("query:delete /v1/projects/{project}/members/{user}", "RemoveMemberRequest"),
    ("response:post /v1/code 201", "UploadCodeResponse"),
    ("query:post /v1/code", "UploadCodeRequest"),
    ("query:get /v1/code/{digest}", "DownloadCodeRequest"),
    ("schema:JoinToken", "JoinToken"),
    ("schema:WorkerBan", "WorkerBan"),
    ("response:get /v1/join-tokens 200", "ListJoinTokensResponse"),
    ("response:post /v1/join-tokens 201", "CreateJoinTokenResponse"),
    ("body:post /v1/join-tokens", "CreateJoinTokenRequest"),
    ("query:delete /v1/join-tokens/{id}", "RevokeJoinTokenRequest"),
    ("query:post /v1/workers/{id}:approve", "ApproveWorkerRequest"),
    ("query:delete /v1/workers/{id}", "RemoveWorkerRequest"),
    ("response:delete /v1/workers/{id} 200", "RemoveWorkerResponse"),
    ("response:get /v1/worker-bans 200", "ListWorkerBansResponse"),
    ("query:delete /v1/worker-bans/{id}", "DeleteWorkerBanRequest"),
    ("schema:Queue", "Queue"),
    ("schema:TuningJob", "TuningJob"),
    ("schema:TuningJobSpec", "TuningJobSpec"),
    ("schema:TuningParameter", "TuningParameter"),
]

# Names one side has alone, and why. Keyed by proto message.
REST_ONLY = {
    # RFC 3339 renderings beside proto's Unix microseconds (REST carries both)
    "LogLine": {"time"},
    "MetricPoint": {"time"},
    # the path names the user
    "CreateTokenRequest": set(),
    # REST pages and resumes plain log reads; gRPC streams them
    "StreamLogsRequest": {"after_seq", "limit", "Last-Event-ID"},
    # SageMaker's capitalised spelling, read as name and regex
    "MetricDefinition": {"Name", "Regex"},
    # free-form values proto carries as JSON text (parameters_json, values_json)
    "Trial": {"parameters"},
    "TuningBest": {"parameters"},
    "TuningParameter": {"values"},
    # REST downloads in byte ranges of HTTP's own
    "DownloadCodeRequest": {"Range", "If-Range", "If-None-Match"},
}
PROTO_ONLY = {
    # REST's path says which job; the event carries it on gRPC streams
    "JobEvent": {"job_id"},
    # proto3 cannot tell an unset rank from rank 0; REST leaves the parameter out
    "StreamLogsRequest": {"has_rank"},
    # REST takes the user from the path parameter {name}
    "CreateTokenRequest": {"user"},
    "ListTokensRequest": {"user"},
    # REST's series carries the name once; an agent's MetricBatch carries it with every point
    "MetricPoint": {"name"},
    # a script job's free-form hyperparameters: REST carries the object as "hyperparameters"
    "JobSpec": {"hyperparameters_json"},
    # REST uploads in one streamed body; gRPC in resumable pieces
    "UploadCodeRequest": {"upload_id", "offset", "data", "finish"},
    "UploadCodeResponse": {"upload_id", "offset"},
    # REST downloads ranges with the Range header
    "DownloadCodeRequest": {"offset", "length"},
    # REST's "quota": null; proto3 has no null map
    "Queue": {"unlimited_quota"},
    # free-form values: REST carries the object, proto its JSON text
    "Trial": {"parameters_json"},
    "TuningBest": {"parameters_json"},
    "TuningParameter": {"values_json"},
}
# REST path parameter names that stand for a proto field of another name
PATH_ALIASES = {"name": "user"}


def load_proto(proto_file):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "kiln.desc")
        inc = os.path.dirname(os.path.abspath(proto_file))
        subprocess.run(["protoc", "-I", inc, "--descriptor_set_out=" + out, os.path.abspath(proto_file)],
                       check=True)
        fds = descriptor_pb2.FileDescriptorSet()
        with open(out, "rb") as f:
            fds.ParseFromString(f.read())
    msgs = {}
    for fd in fds.file:
        for m in fd.message_type:
            msgs[m.name] = m
            for n in m.nested_type:
                msgs[m.name + "." + n.name] = n
    return msgs


def main():
    proto_file, spec_file = sys.argv[1], sys.argv[2]
    msgs = load_proto(proto_file)
    with open(spec_file) as f:
        spec = yaml.safe_load(f)
    problems = []

    def node_ref(ref):
        return [p.replace("~1", "/").replace("~0", "~") for p in ref.lstrip("#/").split("/")]

    def resolve(node):
        for _ in range(10):
            if isinstance(node, dict) and "$ref" in node:
                target = spec
                for part in node_ref(node["$ref"]):
                    target = target[part]
                node = target
            else:
                return node
        return node

    def compare(where, schema, msg_name, seen):
        if (where, msg_name) in seen:
            return
        seen.add((where, msg_name))
        schema = resolve(schema)
        msg = msgs.get(msg_name)
        if msg is None:
            problems.append(f"{where}: proto has no message {msg_name}")
            return
        props = schema.get("properties", {}) if isinstance(schema, dict) else {}
        rest = set(props)
        proto = {f.name for f in msg.field}
        short = msg_name.split(".")[-1]
        for name in sorted(rest - proto - REST_ONLY.get(short, set())):
            problems.append(f"{where}: field \"{name}\" is in api/openapi.yaml but not in proto message {msg_name}")
        for name in sorted(proto - rest - PROTO_ONLY.get(short, set())):
            problems.append(f"{where}: field \"{name}\" of proto message {msg_name} is not in api/openapi.yaml")
        for f in msg.field:
            if f.name not in props or f.type != descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE:
                continue
            sub = resolve(props[f.name])
            # a message or null (REST's null is proto's unset): the message's branch
            branches = [resolve(b) for b in sub.get("oneOf", [])] if isinstance(sub, dict) else []
            branches = [b for b in branches if b.get("type") != "null"]
            if len(branches) == 1:
                sub = branches[0]
            type_name = f.type_name.lstrip(".").split(".", 1)[-1]  # "kiln.Job" -> "Job"
            if type_name.endswith("Entry") and type_name in msgs:
                continue  # a map<>: REST's object with additionalProperties
            if sub.get("type") == "array" or "array" in (sub.get("type") or []):
                sub = resolve(sub.get("items", {}))
            if isinstance(sub, dict) and "properties" in sub:
                compare(f"{where}.{f.name}", sub, type_name, seen)
            elif isinstance(sub, dict) and sub.get("anyOf"):
                continue
            elif f.type_name and type_name in msgs and msgs[type_name].field and not sub.get("properties"):
                if sub.get("type") not in ("object", ["object", "null"]):
                    problems.append(f"{where}.{f.name}: proto says message {type_name}; api/openapi.yaml says {sub.get('type')}")

    seen = set()
    for where, msg in PAIRS:
        kind, rest = where.split(":", 1)
        try:
            if kind == "schema":
                compare(where, spec["components"]["schemas"][rest], msg, seen)
                continue
            method, path, *status = rest.split(" ")
            op = spec["paths"][path][method]
            if kind == "response":
                media = resolve(op["responses"][status[0]])["content"]["application/json"]
                compare(where, media["schema"], msg, seen)
            elif kind == "body":
                schema = resolve(op["requestBody"]["content"]["application/json"]["schema"])
                params = [resolve(p) for p in spec["paths"][path].get("parameters", []) + op.get("parameters", [])]
                names = {PATH_ALIASES.get(p["name"], p["name"]) for p in params if p["in"] == "path"}
                fake = {"properties": dict(schema.get("properties", {}), **{n: {} for n in names})}
                compare(where, fake, msg, seen)
            elif kind == "query":
                params = [resolve(p) for p in spec["paths"][path].get("parameters", []) + op.get("parameters", [])]
                names = {PATH_ALIASES.get(p["name"], p["name"]) if p["in"] == "path" else p["name"]
                         for p in params if p["in"] in ("query", "path", "header") and p["name"] != "Idempotency-Key"}
                compare(where, {"properties": {n: {} for n in names}}, msg, seen)
        except KeyError as e:
            problems.append(f"{where}: not found in api/openapi.yaml ({e})")
    # The metric point is a nested inline schema of MetricSeries.
    ms = resolve(spec["components"]["schemas"]["MetricSeries"])
    compare("schema:MetricSeries.points", resolve(ms["properties"]["points"]["items"]), "MetricPoint", seen)

    if problems:
        print(f"proto_names: {len(problems)} disagreement(s) between {proto_file} and {spec_file}:")
        for p in problems:
            print("  - " + p)
        return 1
    print(f"proto_names: {len(PAIRS) + 1} pairs of proto messages and OpenAPI objects name their fields alike")
    return 0


if __name__ == "__main__":
    sys.exit(main())
