"""examples/k8s: every manifest validated against the Kubernetes schemas (kubernetes-validate,
strict: unknown fields are errors) for the oldest version the examples need (1.28, for the
StatefulSet pod-index label) and the newest one the package knows; the PaddleJob custom resource
has no schema there, so its pod templates are validated as core PodTemplates and the rest is
checked structurally. Then the manifests are read the way aps will read them in a pod: the
environment each container gets (plus what Kubernetes or the operator adds) gives the right
role, index and pserver list, and each command line parses."""

from __future__ import annotations

from typing import Any

import pytest

from aps.cli.server import build_parser as server_parser
from aps.cli.server import config_from_args
from aps.cli.trainer import build_parser as trainer_parser
from aps.cluster import cluster_from_env
from tests.conftest import ROOT

kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the test extra: pip install -e '.[test]'")
yaml = pytest.importorskip("yaml")

K8S = ROOT / "examples" / "k8s"
VERSIONS = ["1.28.0", kv.latest_version()]


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def by_kind(name: str, kind: str) -> dict[str, Any]:
    (doc,) = [d for d in documents(name) if d["kind"] == kind]
    return doc


def container_env(container: dict[str, Any], **injected: str) -> dict[str, str]:
    """The container's literal env values plus what the cluster fills in (downward API, secrets)."""
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    refs = {e["name"] for e in container.get("env", []) if "valueFrom" in e}
    missing = refs - set(injected)
    assert not missing or missing <= {"APS_TOKEN", "CPU_NUM"}, missing
    return {**env, **injected}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", ["pserver.yaml", "trainer-job.yaml"])
def test_core_manifests_match_the_schemas(name: str, version: str) -> None:
    kinds = []
    for doc in documents(name):
        kv.validate(doc, version, strict=True)
        kinds.append(doc["kind"])
    assert kinds == {"pserver.yaml": ["Service", "StatefulSet"], "trainer-job.yaml": ["Job"]}[name]


def test_validation_catches_a_misspelled_field() -> None:
    job = by_kind("trainer-job.yaml", "Job")
    job["spec"]["completionsMode"] = job["spec"].pop("completionMode")
    with pytest.raises(kv.ValidationError, match="completionsMode"):
        kv.validate(job, VERSIONS[0], strict=True)


@pytest.mark.parametrize("version", VERSIONS)
def test_paddlejob_templates_match_the_schemas_and_the_rest_its_shape(version: str) -> None:
    (job,) = documents("paddlejob.yaml")
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PaddleJob")
    assert set(job) == {"apiVersion", "kind", "metadata", "spec"} and job["metadata"]["name"]
    specs = job["spec"]["paddleReplicaSpecs"]
    assert set(specs) == {"Master", "Worker"}
    for replica in specs.values():
        assert set(replica) == {"replicas", "restartPolicy", "template"}
        assert isinstance(replica["replicas"], int) and replica["replicas"] >= 1
        assert replica["restartPolicy"] in {"Always", "OnFailure", "Never", "ExitCode"}
        kv.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                     "template": replica["template"]}, version, strict=True)
        assert [c["name"] for c in replica["template"]["spec"]["containers"]] == ["paddle"]
    ports = specs["Master"]["template"]["spec"]["containers"][0]["ports"]
    assert [p["name"] for p in ports] == ["master"]


def test_statefulset_dns_names_are_the_pserver_list(monkeypatch: pytest.MonkeyPatch) -> None:
    service, sts = by_kind("pserver.yaml", "Service"), by_kind("pserver.yaml", "StatefulSet")
    job = by_kind("trainer-job.yaml", "Job")
    assert service["spec"]["clusterIP"] == "None" and sts["spec"]["serviceName"] == service["metadata"]["name"]
    port = service["spec"]["ports"][0]["port"]
    names = [f"{sts['metadata']['name']}-{k}.{service['metadata']['name']}:{port}" for k in range(sts["spec"]["replicas"])]
    (server,) = sts["spec"]["template"]["spec"]["containers"]
    (trainer,) = job["spec"]["template"]["spec"]["containers"]
    (waiter,) = job["spec"]["template"]["spec"]["initContainers"]
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == job["spec"]["parallelism"]

    for k in range(sts["spec"]["replicas"]):  # each StatefulSet pod: its ordinal from the pod-index label
        env = container_env(server, APS_SERVER_INDEX=str(k), APS_TOKEN="t")
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        config = config_from_args(server_parser().parse_args(server["command"][1:]))
        assert (config.host, config.port, config.server_index, config.num_servers) == ("0.0.0.0", port, k, len(names))
        assert config.num_trainers == job["spec"]["completions"] and not config.exit_when_done
    for k in range(job["spec"]["completions"]):  # each Job pod: Kubernetes sets JOB_COMPLETION_INDEX
        spec, own = cluster_from_env(container_env(trainer, JOB_COMPLETION_INDEX=str(k), APS_TOKEN="t", CPU_NUM="4"))
        assert spec.pservers == names and spec.num_trainers == job["spec"]["completions"]
        assert own["role"] == "trainer" and own["trainer_id"] == k
    trainer_parser().parse_args(trainer["command"][1:])
    assert container_env(waiter)["PADDLE_PSERVERS_IP_PORT_LIST"] == ",".join(names)


def test_paddlejob_replica_names_are_the_pserver_list(monkeypatch: pytest.MonkeyPatch) -> None:
    (job,) = documents("paddlejob.yaml")
    specs, name = job["spec"]["paddleReplicaSpecs"], job["metadata"]["name"]
    (server,) = specs["Master"]["template"]["spec"]["containers"]
    (trainer,) = specs["Worker"]["template"]["spec"]["containers"]
    port = server["ports"][0]["containerPort"]
    names = [f"{name}-master-{k}:{port}" for k in range(specs["Master"]["replicas"])]  # the operator's Services
    # what the operator adds to every pod; aps must not be misled by it
    operator = {"PADDLE_MASTER": f"{name}-master-0:{port}", "PADDLE_NNODES": "4", "PADDLE_JOB_ID": name}
    for k in range(specs["Master"]["replicas"]):
        env = container_env(server, APS_SERVER_INDEX=str(k), APS_TOKEN="t", PADDLE_SERVER_NUM="1", **operator)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        config = config_from_args(server_parser().parse_args(server["command"][1:]))
        assert (config.server_index, config.num_servers, config.port, config.num_trainers) == \
            (k, len(names), port, specs["Worker"]["replicas"])
        assert config.exit_when_done  # pservers exit 0 after the trainers: the PaddleJob completes
    for k in range(specs["Worker"]["replicas"]):
        spec, own = cluster_from_env(container_env(trainer, PADDLE_TRAINER_ID=str(k), APS_TOKEN="t",
                                                   PADDLE_TRAINER_NUM="1", **operator))
        assert spec.pservers == names and spec.num_trainers == specs["Worker"]["replicas"]
        assert own["role"] == "trainer" and own["trainer_id"] == k
    trainer_parser().parse_args(trainer["command"][1:])


def test_dockerfile_installs_the_project_into_a_slim_python() -> None:
    lines = [line.split() for line in (K8S / "Dockerfile").read_text().splitlines() if line and not line.startswith("#")]
    assert lines[0][0] == "FROM" and lines[0][1].startswith("python:3.11-slim")
    copied = {line[1] for line in lines if line[0] == "COPY"}
    assert {"pyproject.toml", "aps", "bin"} <= copied and all((ROOT / p).exists() for p in copied)
    assert ["RUN", "pip", "install", "."] == lines[[w[0] for w in lines].index("RUN")][:4]
    assert any(line[:2] == ["USER", "10001"] for line in lines)
