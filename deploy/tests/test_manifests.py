"""The deployment files agree with each other and with the broker they deploy.

Kubernetes: every manifest parses; the broker's config (the ConfigMap) is one the real
binary takes, and binds the ports its container, its Service and its NetworkPolicy name;
the probes ask the paths the broker serves, on the port it serves them on; selectors select
the pods they mean; workers reach the broker by its Service; the KEDA ScaledObject scales a
Deployment that exists, on metrics the real broker exposes. systemd: the unit passes
`systemd-analyze verify` and its config file is one the binary takes.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parent.parent
BROKER = os.environ.get("RLBUS_BROKER_BIN", str(DEPLOY.parent / "build/src/rlbus-broker"))
sys.path.insert(0, str(DEPLOY.parent / "python"))
# Ports below the kernel's ephemeral range: one found free there can be taken, before its
# server binds it, by any socket that connects meanwhile (the brokers' and etcd's own).
from rlbus import free_port  # noqa: E402


def load(name):
    with open(DEPLOY / "k8s" / name) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


# Variants: curve.yaml replaces broker.yaml's ConfigMap; group.yaml (with etcd.yaml) replaces
# broker.yaml.
VARIANTS = {"curve.yaml", "group.yaml", "etcd.yaml"}


def manifests(group=False):
    """The manifests of a plain deployment, or (`group`) of a group of brokers beside etcd."""
    docs = {}
    names = sorted(p.name for p in (DEPLOY / "k8s").glob("*.yaml")
                   if p.name not in VARIANTS and not (group and p.name == "broker.yaml"))
    for name in names + (["group.yaml", "etcd.yaml"] if group else []):
        for d in load(name):
            docs[(d["kind"], d["metadata"]["name"])] = d
    return docs


def effective_config(toml_text, env=None):
    """What the real broker makes of a config file (it must take it), with `env` added to
    its environment: the printed TOML."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "broker.toml"
        path.write_text(toml_text)
        run = subprocess.run([BROKER, "--config", str(path), "--print-config"],
                             capture_output=True, text=True, timeout=30,
                             env={**os.environ, **(env or {})})
        assert run.returncode == 0, run.stderr
        return tomllib.loads(run.stdout)


def port_of(endpoint):
    return int(endpoint.rsplit(":", 1)[1])


def labels_match(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.fixture(scope="module")
def docs():
    return manifests()


@pytest.fixture(scope="module")
def broker_config(docs):
    return effective_config(docs[("ConfigMap", "rlbus-broker")]["data"]["broker.toml"])


def broker_container(docs):
    pod = docs[("StatefulSet", "rlbus-broker")]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    return pod, container


def test_every_manifest_names_its_kind_and_api(docs):
    assert len(docs) >= 7
    for (kind, name), d in docs.items():
        assert d.get("apiVersion"), (kind, name)
        assert d["metadata"].get("labels", {}).get("app.kubernetes.io/name"), (kind, name)


def test_the_broker_binds_the_ports_its_container_declares(docs, broker_config):
    _, container = broker_container(docs)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert port_of(broker_config["router"]) == ports["router"]
    assert port_of(broker_config["events"]) == ports["events"]
    assert broker_config["metrics"]["port"] == ports["metrics"]
    # The kubelet probes from outside the pod: the endpoint must not be loopback only.
    assert broker_config["metrics"]["address"] == "0.0.0.0"
    assert broker_config["router"].startswith("tcp://0.0.0.0:")


def test_the_config_and_the_journal_are_mounted_where_the_broker_looks(docs, broker_config):
    pod, container = broker_container(docs)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    args = container["args"]
    config_path = Path(args[args.index("--config") + 1])
    assert str(config_path.parent) == mounts["config"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "rlbus-broker"
    assert config_path.name in docs[("ConfigMap", "rlbus-broker")]["data"]
    journal = broker_config["durability"]["journal"]
    assert journal.startswith(mounts["journal"] + "/")
    claims = docs[("StatefulSet", "rlbus-broker")]["spec"]["volumeClaimTemplates"]
    assert [c["metadata"]["name"] for c in claims] == ["journal"]
    assert docs[("StatefulSet", "rlbus-broker")]["spec"]["replicas"] == 1


def test_the_probes_ask_what_the_broker_serves(docs):
    _, container = broker_container(docs)
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    pod, _ = broker_container(docs)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(ports["metrics"])
    assert pod["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"
    # A drain (drain-ms) fits in the grace period before the kubelet kills the pod.
    drain_ms = effective_config(
        docs[("ConfigMap", "rlbus-broker")]["data"]["broker.toml"])["drain-ms"]
    assert pod["spec"]["terminationGracePeriodSeconds"] * 1000 > drain_ms


def test_the_service_and_the_policy_select_the_broker_and_its_ports(docs):
    pod, container = broker_container(docs)
    labels = pod["metadata"]["labels"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    service = docs[("Service", "rlbus-broker")]
    assert labels_match(service["spec"]["selector"], labels)
    assert docs[("StatefulSet", "rlbus-broker")]["spec"]["serviceName"] == "rlbus-broker"
    assert labels_match(docs[("StatefulSet", "rlbus-broker")]["spec"]["selector"]["matchLabels"],
                        labels)
    for p in service["spec"]["ports"]:
        assert p["targetPort"] in ports
        assert p["port"] == ports[p["targetPort"]]
    policy = docs[("NetworkPolicy", "rlbus-broker")]
    assert labels_match(policy["spec"]["podSelector"]["matchLabels"], labels)
    peer_rule = policy["spec"]["ingress"][0]
    assert {p["port"] for p in peer_rule["ports"]} == {ports["router"], ports["events"]}


def test_workers_reach_the_broker_by_its_service_and_may_pass_the_policy(docs):
    service = docs[("Service", "rlbus-broker")]
    router_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "router")
    allowed = docs[("NetworkPolicy", "rlbus-broker")]["spec"]["ingress"][0]["from"][0]
    workers = [d for (kind, _), d in docs.items()
               if kind == "Deployment"]
    assert {d["metadata"]["name"] for d in workers} >= {"rlbus-collector", "rlbus-learner"}
    for d in workers:
        pod = d["spec"]["template"]
        assert labels_match(d["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
        assert labels_match(allowed["podSelector"]["matchLabels"], pod["metadata"]["labels"])
        (container,) = pod["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["RLBUS_ENDPOINT"] == f"tcp://{service['metadata']['name']}:{router_port}"
        assert "RLBUS_WORKER_ID" in env


def exposed_metrics():
    """The metric families the real broker's /metrics declares."""
    port = free_port()
    broker = subprocess.Popen(
        [BROKER, "--router", "tcp://127.0.0.1:0", "--events", "tcp://127.0.0.1:0",
         "--metrics-port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
                break
            except OSError:
                assert broker.poll() is None, "the broker exited"
                assert time.monotonic() < deadline, "no /metrics within 10 s"
                time.sleep(0.05)
    finally:
        broker.terminate()
        broker.wait(timeout=20)
    return set(re.findall(r"^# TYPE (\w+) ", text, re.M))


def test_keda_scales_a_deployment_on_metrics_the_broker_exposes(docs):
    scaled = docs[("ScaledObject", "rlbus-collector")]
    target = scaled["spec"]["scaleTargetRef"]["name"]
    assert ("Deployment", target) in docs
    names = exposed_metrics()
    assert "rlbus_queue_depth" in names
    for trigger in scaled["spec"]["triggers"]:
        assert trigger["type"] == "prometheus"
        used = set(re.findall(r"\brlbus_\w+", trigger["metadata"]["query"]))
        assert used, trigger
        assert used <= names, used - names
        assert float(trigger["metadata"]["threshold"]) > 0


def test_the_grafana_dashboard_queries_metrics_the_broker_exposes():
    dash = json.loads((DEPLOY / "grafana" / "rlbus.json").read_text())
    panels = dash["panels"]
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    assert len(exprs) >= 30
    names = exposed_metrics()
    for expr in exprs:
        # A histogram's family is named without its _bucket, _sum and _count series.
        used = {re.sub(r"_(bucket|sum|count)$", "", m) for m in re.findall(r"\brlbus_\w+", expr)}
        assert used, expr
        assert used <= names, (expr, used - names)
        assert 'instance=~"$instance"' in expr, expr  # the broker picked at the top
    ids = [p["id"] for p in panels]
    assert len(set(ids)) == len(ids)
    for p in panels:
        grid = p["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, p["title"]
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
    assert {v["name"] for v in dash["templating"]["list"]} == {"datasource", "instance"}


def test_the_systemd_unit_verifies_and_its_config_is_taken(tmp_path):
    unit = (DEPLOY / "systemd" / "rlbus-broker.service").read_text()
    exec_start = re.search(r"^ExecStart=(\S+) --config (\S+)$", unit, re.M)
    assert exec_start, "ExecStart runs the broker with --config"
    assert exec_start.group(2) == "/etc/rlbus/broker.toml"
    assert "install -m 0640 -g rlbus deploy/systemd/broker.toml /etc/rlbus/" in unit
    config = effective_config((DEPLOY / "systemd" / "broker.toml").read_text())
    state = re.search(r"^StateDirectory=(\S+)$", unit, re.M).group(1)
    assert config["durability"]["journal"].startswith(f"/var/lib/{state}/")
    assert config["metrics"]["address"] == "127.0.0.1"
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    # Verified with the paths of this machine's build, so the binary it names exists.
    local = tmp_path / "rlbus-broker.service"
    local.write_text(unit.replace(exec_start.group(1), BROKER).replace(
        exec_start.group(2), str(DEPLOY / "systemd" / "broker.toml")))
    run = subprocess.run(["systemd-analyze", "verify", str(local)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stderr.strip() == "", run.stderr


def test_the_image_builds_targets_the_build_defines():
    docker = (DEPLOY / "docker" / "Dockerfile").read_text()
    built = re.search(r"ninja -C /build ((?:src/\S+ ?)+)", docker).group(1).split()
    copied = re.search(r"^COPY --from=build (.+) /usr/local/bin/$", docker, re.M).group(1).split()
    assert {c.replace("/build/", "") for c in copied} == set(built)
    entry = re.search(r'^ENTRYPOINT \["(\S+)"\]', docker, re.M).group(1)
    assert entry == "/usr/local/bin/rlbus-broker"
    # The targets exist in this tree's build (the build directory holds the broker).
    build_dir = Path(BROKER).resolve().parent.parent
    targets = subprocess.run(["ninja", "-C", str(build_dir), "-t", "targets", "all"],
                             capture_output=True, text=True, check=True).stdout
    names = {line.split(":")[0] for line in targets.splitlines()}
    assert set(built) <= names, set(built) - names


def test_curve_reads_its_keys_where_the_init_container_puts_them(docs):
    curve = {(d["kind"], d["metadata"]["name"]): d for d in load("curve.yaml")}
    config = effective_config(curve[("ConfigMap", "rlbus-broker")]["data"]["broker.toml"])
    plain = effective_config(docs[("ConfigMap", "rlbus-broker")]["data"]["broker.toml"])
    assert config["security"]["insecure"] is False
    # The same broker otherwise: ports, journal and metrics as broker.yaml's.
    for key in ("router", "events", "drain-ms", "durability", "metrics", "tasks"):
        assert config[key] == plain[key], key
    pod, container = broker_container(docs)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    (init,) = pod["spec"]["initContainers"]
    init_mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    assert init_mounts["keys"] == mounts["keys"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["secret"]["secret"]["secretName"] == "rlbus-keys"
    assert volumes["secret"]["secret"]["optional"] is True  # plain mode needs no Secret
    assert "emptyDir" in volumes["keys"]
    # The init container copies from the Secret's mount into the keys' mount, as 0600.
    script = init["command"][-1]
    assert init_mounts["secret"] in script and mounts["keys"] in script and "0600" in script
    comment = (DEPLOY / "k8s" / "curve.yaml").read_text()
    for path in (config["security"]["curve-key"], config["security"]["allowlist"]):
        assert str(Path(path).parent) == mounts["keys"], path
        assert f"--from-file={Path(path).name}=" in comment, path  # the Secret holds it


# ---- a group of brokers (group.yaml beside etcd.yaml) ----

@pytest.fixture(scope="module")
def group_docs():
    return manifests(group=True)


def pod_env(container, pod_name):
    """The container's environment as the kubelet makes it for pod `pod_name`: $(VAR)
    references to earlier variables expanded."""
    env = {}
    for e in container["env"]:
        if "valueFrom" in e:
            assert e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
            env[e["name"]] = pod_name
        else:
            env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], e["value"])
    return env


def test_each_broker_of_the_group_joins_it_under_its_own_name(group_docs):
    pod, container = broker_container(group_docs)
    sts = group_docs[("StatefulSet", "rlbus-broker")]
    assert sts["spec"]["replicas"] >= 3  # a leader and two standbys
    toml = group_docs[("ConfigMap", "rlbus-broker")]["data"]["broker.toml"]
    seen = set()
    for k in range(sts["spec"]["replicas"]):
        name = f"rlbus-broker-{k}"
        config = effective_config(toml, pod_env(container, name))
        cluster = config["cluster"]
        assert cluster["member"] == name
        # It advertises its name under the headless Service, on its router's port.
        members = group_docs[("Service", sts["spec"]["serviceName"])]
        assert members["spec"]["clusterIP"] == "None"
        assert members["spec"]["publishNotReadyAddresses"] is True  # standbys by name too
        host, port = cluster["advertise"].removeprefix("tcp://").rsplit(":", 1)
        assert host == f"{name}.{members['metadata']['name']}"
        assert int(port) == port_of(config["router"])
        seen.add(cluster["advertise"])
        # The journal the standbys copy, and the fixed port they copy it from.
        assert config["durability"]["journal"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert port_of(cluster["replication"]) == ports["replication"]
        assert ports["replication"] in {p["port"] for p in members["spec"]["ports"]}
    assert len(seen) == sts["spec"]["replicas"]


def test_the_group_reaches_every_member_of_its_etcd(group_docs):
    _, broker = broker_container(group_docs)
    config = effective_config(group_docs[("ConfigMap", "rlbus-broker")]["data"]["broker.toml"],
                              pod_env(broker, "rlbus-broker-0"))
    etcd = group_docs[("StatefulSet", "rlbus-etcd")]
    service = group_docs[("Service", etcd["spec"]["serviceName"])]
    client = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "client")
    expected = {f"http://rlbus-etcd-{k}.{service['metadata']['name']}:{client}"
                for k in range(etcd["spec"]["replicas"])}
    assert set(config["cluster"]["etcd"].split(",")) == expected
    assert etcd["spec"]["replicas"] % 2 == 1  # a majority survives one lost member
    (container,) = etcd["spec"]["template"]["spec"]["containers"]
    flags = dict(a.split("=", 1) for a in container["command"][1:])
    initial = dict(m.split("=", 1) for m in flags["--initial-cluster"].split(","))
    assert set(initial) == {f"rlbus-etcd-{k}" for k in range(etcd["spec"]["replicas"])}
    assert labels_match(service["spec"]["selector"], etcd["spec"]["template"]["metadata"]["labels"])


def test_only_the_leader_is_behind_the_service_peers_use(group_docs):
    pod, container = broker_container(group_docs)
    # Readiness is the leader's alone (/readyz is 503 on a standby), and the Service peers
    # connect to is not one that publishes pods that are not ready.
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    service = group_docs[("Service", "rlbus-broker")]
    assert not service["spec"].get("publishNotReadyAddresses", False)
    assert labels_match(service["spec"]["selector"], pod["metadata"]["labels"])
    # The brokers may reach each other's replication endpoint through the policy.
    policy = group_docs[("NetworkPolicy", "rlbus-broker")]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    from_brokers = [r for r in policy["spec"]["ingress"]
                    if any(labels_match(f.get("podSelector", {}).get("matchLabels", {}),
                                        pod["metadata"]["labels"]) for f in r.get("from", []))]
    assert from_brokers and ports["replication"] in {p["port"] for p in from_brokers[0]["ports"]}
    # A voluntary eviction takes one broker at a time.
    assert group_docs[("PodDisruptionBudget", "rlbus-broker")]["spec"]["maxUnavailable"] == 1


def wait_until_true(what, timeout):
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def test_the_standby_readyz_says_it_is_not_ready(tmp_path):
    """The probe the Service relies on, on the real binary: a broker of a group that stands
    by answers /readyz 503 and /healthz 200, and /metrics says which role each has."""
    etcd = shutil.which("etcd")
    if etcd is None:
        pytest.skip("etcd is not installed (apt-get install etcd-server)")
    client, peer = free_port(), free_port()
    url = f"http://127.0.0.1:{client}"
    procs = [subprocess.Popen(
        [etcd, "--data-dir", str(tmp_path / "etcd"), "--listen-client-urls", url,
         "--advertise-client-urls", url, "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"default=http://127.0.0.1:{peer}"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "etcd.log", "w"))]

    def logs():
        """The end of what etcd and each broker said, for a failure's message."""
        return "".join(f"\n--- {log.name}:\n" + "".join(log.read_text().splitlines(True)[-15:])
                       for log in sorted(tmp_path.glob("*.log")))
    try:
        # A group's broker refuses to start while its etcd does not answer.
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                assert procs[0].poll() is None, "etcd exited" + logs()
                assert time.monotonic() < deadline, "etcd did not answer in 60 s" + logs()
                time.sleep(0.05)
        metrics = {}
        for name in ("a", "b"):
            router = f"tcp://127.0.0.1:{free_port()}"
            metrics[name] = free_port()
            procs.append(subprocess.Popen(
                [BROKER, "--router", router, "--events", "tcp://127.0.0.1:0", "--advertise",
                 router, "--cluster-etcd", url, "--cluster-name", "probe", "--cluster-member",
                 name, "--metrics-port", str(metrics[name]),
                 "--journal", str(tmp_path / f"{name}.journal")],
                stdout=open(tmp_path / f"{name}.log", "w"), stderr=subprocess.STDOUT))

        def status(name, path):
            try:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{metrics[name]}{path}", timeout=2) as r:
                    return r.status
            except urllib.error.HTTPError as e:
                return e.code
            except OSError:
                return None

        deadline = time.monotonic() + 60
        while sorted([status("a", "/readyz"), status("b", "/readyz")],
                     key=str) != [200, 503]:
            for p in procs:
                assert p.poll() is None, "etcd or a broker exited" + logs()
            assert time.monotonic() < deadline, "no leader and standby ready in 60 s" + logs()
            time.sleep(0.1)
        assert status("a", "/healthz") == 200 and status("b", "/healthz") == 200
        # /metrics by role: the standby says it stands by; the leader, that it waits for the
        # standby, which copies its journal.
        leader, standby = ("a", "b") if status("a", "/readyz") == 200 else ("b", "a")

        def metrics_of(name):
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics[name]}/metrics",
                                        timeout=2) as r:
                return r.read().decode()
        assert re.search(r"^rlbus_standby 1$", metrics_of(standby), re.M)
        assert re.search(r"^rlbus_standby 0$", metrics_of(leader), re.M)
        in_sync = f'rlbus_replication_in_sync{{member="{standby}"}} 1'
        assert wait_until_true(lambda: in_sync in metrics_of(leader), 60), (
            metrics_of(leader) + logs())
        assert f'rlbus_replication_lag_bytes{{member="{standby}"}}' in metrics_of(leader)
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(timeout=30)


def test_the_systemd_group_config_is_taken_on_each_machine():
    unit = (DEPLOY / "systemd" / "rlbus-broker.service").read_text()
    env_file = re.search(r"^EnvironmentFile=-(\S+)$", unit, re.M).group(1)
    env = dict(line.split("=", 1) for line in
               (DEPLOY / "systemd" / "broker-group.env").read_text().splitlines()
               if line and not line.startswith("#"))
    assert env_file == "/etc/rlbus/broker.env"
    config = effective_config((DEPLOY / "systemd" / "broker-group.toml").read_text(), env)
    cluster = config["cluster"]
    assert cluster["member"] == env["RLBUS_BROKER_CLUSTER_MEMBER"]
    assert cluster["advertise"] == env["RLBUS_BROKER_ADVERTISE"]
    assert port_of(cluster["advertise"]) == port_of(config["router"])
    assert len(cluster["etcd"].split(",")) == 3
    assert port_of(cluster["replication"]) not in {port_of(config["router"]),
                                                   port_of(config["events"])}
    state = re.search(r"^StateDirectory=(\S+)$", unit, re.M).group(1)
    assert config["durability"]["journal"].startswith(f"/var/lib/{state}/")
