"""deploy/grafana against real servers: Debian's Prometheus scrapes a 3-node cluster (the
session's Redis and RocketMQ, HAProxy in front) through a bounded load, and every query of the
Grafana dashboard and every alert rule is asked through Prometheus' HTTP API. A panel on a
metric or label the bridge does not export, or a rule Prometheus cannot evaluate, fails here.

One cluster and one Prometheus serve the whole module (each costs seconds to start); the test
that kills a node comes last. The nodes keep /metrics behind the admin token
(metrics_public=false), so the scrape uses the bearer credentials file the example
configuration documents.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bridge.mqtt.packets import ConnackCode, Publish
from tests.support.admin_http import AdminHttp
from tests.support.clients import PahoClient, RawClient, paho_client
from tests.support.cluster import ClusterLauncher
from tests.support.haproxy import LocalHAProxy
from tests.support.processes import (
    REPO,
    BridgeProcess,
    bridge_nodes,
    free_port,
    terminate,
    wait_for_port,
)
from tests.support.redis import LocalRedis
from tests.support.rocketmq import ExternalRocketMQ, LocalRocketMQ
from tests.support.waiting import poll_until, wait_until

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(180)]

GRAFANA = REPO / "deploy" / "grafana"
DASHBOARD = GRAFANA / "mqtt-bridge-dashboard.json"
ALERTS = GRAFANA / "alerts.yml"
JOB = "mqtt-bridge"  # the job name alerts.yml's MqttBridgeNodeDown selects
ROWS = ["Overview", "Per node", "RocketMQ path", "Clients and limits"]
TOKEN = secrets.token_hex(16)
BANNED = "grafana-banned-device"
MAX_QUEUED = 100
"""max_queued_messages of the nodes: small, so that one subscriber that stops reading holds its
publisher back within a few hundred messages (the backpressure panels and alerts need an
episode), and far above what the load's own subscribers lag on a busy machine."""
LOAD_SECONDS = 6.0
SETTLE_TIMEOUT = 25.0
"""How long Prometheus may take to have every series the queries need (scraped each second; a
rate needs two samples of a series)."""


def _prometheus_binary() -> str:
    found = shutil.which("prometheus") or shutil.which("prometheus", path="/usr/bin:/usr/sbin")
    if found is None:
        pytest.fail("Debian's prometheus is not installed (make test-deps installs it)")
    return found


class PrometheusProcess:
    """Debian's `prometheus` on a free loopback port, scraping `targets` every second with the
    bearer token in `token_file` and evaluating `rule_files` every second; data, config and log
    in `work_dir`. Stopped by PID."""

    def __init__(
        self, work_dir: Path, targets: list[str], token_file: Path, rule_files: list[Path]
    ) -> None:
        self.work_dir = work_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # JSON is YAML: Prometheus reads it, and the test needs no YAML writer (PyYAML is no
        # dependency of the project).
        self.config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [
                {
                    "job_name": JOB,
                    "metrics_path": "/api/v1/metrics",
                    "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
                    "static_configs": [{"targets": targets}],
                }
            ],
        }
        self.log_path = work_dir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> PrometheusProcess:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        config = self.work_dir / "prometheus.yml"
        config.write_text(json.dumps(self.config, indent=2))
        args = [
            _prometheus_binary(),
            f"--config.file={config}",
            f"--storage.tsdb.path={self.work_dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        wait_for_port(self.port, timeout=30, proc=self.proc)
        wait_until(self._ready, 30, "Prometheus to be ready", retrying=(OSError,))
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as answer:
                return bool(answer.status == 200)
        except urllib.error.HTTPError as starting:  # 503 until its storage is open
            # The error holds the answer's socket: closed here, not by the garbage collector
            # in some later test (an unclosed socket warning fails that test).
            starting.close()
            return False

    def stop(self) -> None:
        """SIGTERM (Prometheus closes its TSDB), SIGKILL after 10 s."""
        terminate(self.proc)

    def api(self, path: str, **params: str) -> Any:
        """The `data` of a successful answer of /api/v1/PATH."""
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as answer:
                body = json.load(answer)
        except urllib.error.HTTPError as refused:  # a query Prometheus cannot parse: say why
            with refused:
                why = refused.read().decode()
            raise AssertionError(f"{path} {params}: {why}") from None
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The series of an instant query now ([] when none)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])


@dataclass
class Stack:
    """The module's servers: nodes by id, their admin addresses (Prometheus' `instance`)."""

    nodes: dict[str, BridgeProcess]
    instances: dict[str, str]
    prometheus: PrometheusProcess
    clients: ExitStack
    """The load's MQTT clients, disconnected when it closes."""
    load_started: float = field(default_factory=time.monotonic)

    def window(self) -> str:
        """A range covering the whole load: panels are asked what Grafana would show for the
        last minutes, whenever in the module a test runs."""
        return f"{int(time.monotonic() - self.load_started) + 10}s"


@pytest.fixture(scope="module")
def module_bridges(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., BridgeProcess]]:
    """`bridge_factory` (tests/conftest.py) for the module: nodes killed after its last test,
    and a traceback in any node's log fails it."""
    with bridge_nodes(tmp_path_factory.mktemp("grafana-nodes")) as factory:
        yield factory


@pytest.fixture(scope="module")
def stack(
    module_bridges: Callable[..., BridgeProcess],
    rocketmq: LocalRocketMQ | ExternalRocketMQ,
    redis_server: LocalRedis,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    """Three linked nodes behind HAProxy, Prometheus scraping them, and the load put through:
    its subscribers stay connected until the module ends, so the gauges have values."""
    work = tmp_path_factory.mktemp("grafana")
    launcher = ClusterLauncher(
        module_bridges, rocketmq.namesrv_addr, tuple(redis_server.bridge_settings())
    )
    admin_ports = {node_id: free_port() for node_id in ("a", "b", "c")}
    for node_id, admin_port in admin_ports.items():
        launcher.start(
            node_id,
            f"admin_listen=127.0.0.1:{admin_port}",
            f"admin_token={TOKEN}",
            "metrics_public=false",
            "max_connections=1000",  # the dashboard's max_connections usage needs a limit
            f"max_queued_messages={MAX_QUEUED}",
        )
    launcher.wait_linked()
    token_file = work / "admin-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    instances = {node_id: f"127.0.0.1:{port}" for node_id, port in admin_ports.items()}
    nodes = dict(launcher.nodes)
    lb = LocalHAProxy(work / "haproxy", None, [f"127.0.0.1:{n.port}" for n in nodes.values()])
    prometheus = PrometheusProcess(
        work / "prometheus", list(instances.values()), token_file, [ALERTS]
    )
    with ExitStack() as servers:
        servers.callback(launcher.stop_all)
        lb.start()
        servers.callback(lb.stop)
        prometheus.start()
        servers.callback(prometheus.stop)
        wait_until(
            lambda: len(prometheus.query(f'up{{job="{JOB}"}} == 1')) == 3,
            20,
            "Prometheus to scrape the three nodes with the token",
        )
        clients = servers.enter_context(ExitStack())
        stack = Stack(nodes, instances, prometheus, clients)
        _put_load(clients, nodes, lb.frontend_port, admin_ports["a"])
        yield stack


def _put_load(
    clients: ExitStack, nodes: dict[str, BridgeProcess], lb_port: int, admin_port: int
) -> None:
    """QoS 0/1 publishers on every node and through HAProxy, subscribers on two nodes and
    through HAProxy (kept open in `clients`), a banned ClientId refused on every node, and one
    subscriber that stops reading and so slows its publisher down. Bounded by LOAD_SECONDS."""
    subscribers: list[PahoClient] = []
    for port, qos in ((nodes["b"].port, 1), (nodes["c"].port, 0), (lb_port, 1)):
        subscriber = clients.enter_context(paho_client(port))
        subscriber.client.subscribe("load/#", qos)
        subscribers.append(subscriber)
    publishers = [clients.enter_context(paho_client(n.port)) for n in nodes.values()]
    publishers.append(clients.enter_context(paho_client(lb_port)))

    status, ban = AdminHttp(admin_port, TOKEN).post(
        "/banned", {"clientid": BANNED, "seconds": 600, "reason": "grafana test"}
    )
    assert status == 201, ban
    refused_ports = [n.port for n in nodes.values()]

    deadline = time.monotonic() + LOAD_SECONDS
    tick = 0
    last = None
    while time.monotonic() < deadline:
        for number, publisher in enumerate(publishers):
            last = publisher.client.publish(f"load/{number}/{tick % 10}", b"x" * 64, qos=tick % 2)
        if tick % 25 == 0:  # a refused CONNECT every half second, each node in turn
            _connect_banned(refused_ports[(tick // 25) % len(refused_ports)])
        tick += 1
        time.sleep(0.02)
    assert last is not None
    last.wait_for_publish(10)
    for subscriber in subscribers:
        wait_until(lambda s=subscriber: not s.messages.empty(), 10, "the load to be delivered")
    _slow_down_a_publisher(nodes["a"])


def _connect_banned(port: int) -> None:
    client = RawClient(port)
    try:
        connack = client.connect(BANNED)
        # The ban reaches every node through Redis at once; the first attempts may beat it.
        assert connack.return_code in (ConnackCode.NOT_AUTHORIZED, ConnackCode.ACCEPTED)
    finally:
        client.close()


def _slow_down_a_publisher(node: BridgeProcess) -> None:
    """A subscriber that reads nothing while a publisher on its node sends more QoS 1 messages
    than max_inflight + max_queued_messages: the node holds the publisher's PUBACKs (one
    `subscribers_behind` and one `publishers_slowed`), until the subscriber leaves."""
    reader = RawClient(node.port)
    reader.connect("grafana-slow-reader")
    assert reader.subscribe("slow/#", 1) == [1]
    writer = RawClient(node.port)
    writer.connect("grafana-slow-writer")
    try:
        for packet_id in range(1, 32 + 2 * MAX_QUEUED):  # 32: the default max_inflight
            writer.send(Publish("slow/x", b"y" * 64, 1, packet_id=packet_id))
        node.wait_for_log("messages behind (max_queued_messages", timeout=15)
    finally:
        reader.close()
        writer.close()


# --- the dashboard and the rules, as files -------------------------------------------------


@dataclass(frozen=True)
class Target:
    panel: str
    expr: str
    legend: str

    def legend_labels(self) -> list[str]:
        return re.findall(r"\{\{\s*(\w+)\s*\}\}", self.legend)


def _dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def _targets() -> list[Target]:
    return [
        Target(panel["title"], target["expr"], target.get("legendFormat", ""))
        for panel in _dashboard()["panels"]
        for target in panel.get("targets", [])
    ]


def _as_prometheus_query(expr: str, window: str) -> str:
    """A panel's PromQL as Grafana sends it with every node selected: each variable replaced
    (an unknown one fails), the interval variables by `window`."""
    values = {"job": JOB, "node": ".+", "__rate_interval": window, "__interval": window}
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], expr)


def _metric_names(expr: str) -> set[str]:
    """The metrics a query reads (the bridge's and Prometheus' own `up`)."""
    return set(re.findall(r"(?<![\w\"])(mqtt_bridge_\w+|up)(?=\s*[{\[)]|\s|$)", expr))


def _alert_names_in_file() -> list[str]:
    return re.findall(r"^\s*- alert: (\w+)\s*$", ALERTS.read_text(), flags=re.MULTILINE)


def test_the_dashboard_is_importable_with_a_prometheus_input_node_variable_and_four_rows() -> None:
    dashboard = _dashboard()
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
    assert 36 <= dashboard["schemaVersion"] <= 41  # Grafana 10 and 11
    assert dashboard["id"] is None and dashboard["uid"]
    assert [p["title"] for p in dashboard["panels"] if p["type"] == "row"] == ROWS
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["node"]["definition"].startswith("label_values(")
    assert variables["node"]["multi"] and variables["node"]["includeAll"]
    source = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels:
        assert panel["datasource"] == source, panel["title"]
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{panel['title']}: no unit"
        assert panel["targets"], panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == source, panel["title"]
            assert '"$job"' in target["expr"], f"{panel['title']}: not limited to $job"


def test_promtool_accepts_the_alert_rules_and_the_example_scrape_config() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian's prometheus package) is not installed"
    rules = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert f"SUCCESS: {len(_alert_names_in_file())} rules found" in rules.stdout
    # The example loads alerts.yml relative to itself, so this checks both files together.
    config = subprocess.run(
        [promtool, "check", "config", "prometheus.yml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=GRAFANA,
    )
    assert config.returncode == 0, config.stdout + config.stderr


def test_every_runbook_points_at_a_section_of_docs_operations() -> None:
    headings = re.findall(r"^#+ (.+)$", (REPO / "docs" / "operations.md").read_text(), re.M)
    # GitHub's anchors: lower case, punctuation dropped, spaces made hyphens.
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}
    runbooks = re.findall(r"^\s*runbook: \"(.+)\"$", ALERTS.read_text(), re.M)
    assert len(runbooks) == len(_alert_names_in_file())
    for runbook in runbooks:
        assert runbook.startswith("docs/operations.md#"), runbook
        for anchor in re.findall(r"#([\w-]+)", runbook):
            assert anchor in anchors, f"{runbook}: no section #{anchor} in docs/operations.md"


# --- against the cluster ---------------------------------------------------------------------


def _answers(stack: Stack, targets: list[Target]) -> dict[Target, list[dict[str, Any]]]:
    window = stack.window()
    return {t: stack.prometheus.query(_as_prometheus_query(t.expr, window)) for t in targets}


def test_every_dashboard_query_returns_series_with_the_labels_its_legend_names(
    stack: Stack,
) -> None:
    targets = _targets()
    answers: dict[Target, list[dict[str, Any]]] = {}

    def all_answered() -> bool:
        answers.update(_answers(stack, targets))
        return all(answers.values())

    poll_until(all_answered, SETTLE_TIMEOUT)
    empty = [f"{t.panel}: {t.expr}" for t, series in answers.items() if not series]
    assert not empty, "queries without data:\n" + "\n".join(empty)
    for target, series in answers.items():
        for one in series:
            missing = [name for name in target.legend_labels() if name not in one["metric"]]
            assert not missing, f"{target.panel}: {target.expr} has no {missing}: {one}"


def test_the_node_variable_lists_every_node_by_its_scraped_address(stack: Stack) -> None:
    definition = {v["name"]: v for v in _dashboard()["templating"]["list"]}["node"]["definition"]
    parsed = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", definition)
    assert parsed, definition
    metric, label = parsed.groups()
    series = stack.prometheus.query(f"group by ({label}) ({_as_prometheus_query(metric, '1m')})")
    assert {s["metric"][label] for s in series} == set(stack.instances.values())


def test_the_load_shows_on_the_traffic_store_and_refusal_panels(stack: Stack) -> None:
    """Not only series: the panels an operator reads first show what the load did."""
    lively = {
        "Messages in", "Messages out", "Store latency p99", "Messages made durable",
        "Refused CONNECTs per node", "Client traffic", "Connected clients",
    }  # fmt: skip
    targets = [t for t in _targets() if t.panel in lively]
    assert {t.panel for t in targets} == lively
    for target, series in _answers(stack, targets).items():
        values = [float(s["value"][1]) for s in series]
        assert any(v > 0 for v in values), f"{target.panel}: {target.expr} -> {values}"


def test_every_metric_the_dashboard_and_the_alerts_read_is_exported_by_the_cluster(
    stack: Stack,
) -> None:
    rules = [r for g in stack.prometheus.api("rules")["groups"] for r in g["rules"]]
    names = set().union(*(_metric_names(t.expr) for t in _targets()))
    names |= set().union(*(_metric_names(r["query"]) for r in rules))
    # Counters only the load moves (exported at 0 from the start, and named by the alerts).
    assert {"mqtt_bridge_publishers_slowed_total", "mqtt_bridge_connections_refused_total"} <= names
    missing: list[str] = []

    def all_exported() -> bool:
        missing[:] = [n for n in sorted(names) if not stack.prometheus.query(f"count({n})")]
        return not missing

    poll_until(all_exported, SETTLE_TIMEOUT)
    assert not missing, f"no series in Prometheus for {missing}"


def test_prometheus_loads_every_alert_rule_and_evaluates_it_without_error(stack: Stack) -> None:
    def rules() -> list[dict[str, Any]]:
        groups = stack.prometheus.api("rules", type="alert")["groups"]
        return [rule for group in groups for rule in group["rules"]]

    poll_until(lambda: all(r["health"] == "ok" for r in rules()), SETTLE_TIMEOUT)
    loaded = rules()
    assert sorted(r["name"] for r in loaded) == sorted(_alert_names_in_file())
    for rule in loaded:
        assert rule["health"] == "ok" and not rule.get("lastError"), rule
        assert rule["labels"].get("severity") in ("critical", "warning", "info"), rule["name"]
        for annotation in ("summary", "description", "runbook"):
            assert rule["annotations"].get(annotation), f"{rule['name']}: no {annotation}"
        assert "docs/operations.md" in rule["annotations"]["runbook"], rule["name"]


def test_a_nodes_first_backpressure_episode_makes_the_slowed_and_behind_alerts_pending(
    stack: Stack,
) -> None:
    """The bridge exports these counters at 0 from its start, so increase() over the rules'
    window sees the node's first episode (a series that appeared at 1 would show none)."""
    node_a = stack.instances["a"]
    for counter in ("publishers_slowed", "subscribers_behind"):
        query = f'mqtt_bridge_{counter}_total{{instance="{node_a}"}} >= 1'
        # The series is there at 0 from the node's start; the episode shows at a later scrape.
        wait_until(lambda q=query: stack.prometheus.query(q), SETTLE_TIMEOUT, f"{counter} >= 1")
    names = {"MqttBridgePublishersSlowed", "MqttBridgeSubscribersBehind"}

    def backpressure_alerts() -> dict[str, dict[str, Any]] | None:
        found = {
            a["labels"]["alertname"]: a
            for a in stack.prometheus.api("alerts")["alerts"]
            if a["labels"]["alertname"] in names and a["labels"].get("instance") == node_a
        }
        return found if set(found) == names else None

    found = wait_until(backpressure_alerts, SETTLE_TIMEOUT, "the backpressure alerts of node a")
    for alert in found.values():
        assert alert["state"] in ("pending", "firing"), alert


def test_killing_a_node_makes_the_node_down_alert_pending_for_that_node(stack: Stack) -> None:
    """Last in the module: the cluster has one node fewer afterwards. The rule's `for: 1m` is
    not waited out; pending shows its expression caught the dead node, with its labels.

    The load's clients leave first: a paho client whose node died keeps reconnecting, and the
    socket of an attempt cut short by the module's end would be reported unclosed in whichever
    later test collects it."""
    stack.clients.close()
    stack.nodes["c"].kill()

    def node_down_alert() -> dict[str, Any] | None:
        for alert in stack.prometheus.api("alerts")["alerts"]:
            if alert["labels"]["alertname"] == "MqttBridgeNodeDown":
                return dict(alert)
        return None

    alert = wait_until(node_down_alert, 20, "MqttBridgeNodeDown to be pending")
    assert alert["state"] in ("pending", "firing"), alert
    assert alert["labels"]["instance"] == stack.instances["c"]
    assert alert["labels"]["severity"] == "critical"
    assert stack.instances["c"] in alert["annotations"]["summary"]
