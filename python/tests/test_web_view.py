"""The broker's web view in a real browser: Debian's chromium, headless, driven by
chromium-driver through selenium, against a real broker with real peers (a coordinator,
collectors, a learner, bus nodes). What the page shows is checked against what OPS reports
(rlbus-ctl --json), as tasks run and a worker is killed; its charts must get points, nothing
on it may log an error, and its token must be asked for. A screenshot of the page under load
is kept as a test artifact."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import urllib.error
import urllib.request
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

from conftest import BROKER, BUILD_DIR, Broker, collector_process, group_broker, wait_until
import rlbus

CTL = os.path.join(BUILD_DIR, "src", "rlbus-ctl")
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
TOKEN = "web-view-test-token-0123456789"
# Generous: the suite runs beside builds and CPU hogs. Every wait ends as soon as its
# condition holds.
WAIT = 30.0


def browser() -> Any:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("the web view's tests need python3-selenium (apt-get install "
                    "python3-selenium chromium chromium-driver)")
    if not os.path.exists(CHROMEDRIVER):
        pytest.fail("the web view's tests need chromium-driver (apt-get install chromium "
                    "chromium-driver)")
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1800"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def ctl(broker: Broker, *args: str) -> Dict[str, Any]:
    out = subprocess.run([CTL, "--broker", broker.router, "--json", *args], check=True,
                         capture_output=True, text=True, timeout=WAIT).stdout
    return json.loads(out)


def http(url: str, token: Optional[str] = None) -> Tuple[int, str]:
    req = urllib.request.Request(url)
    if token is not None:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=WAIT) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def rows(driver: Any, table: str, column: Optional[str] = None) -> Dict[str, str]:
    """The page's rows of ``table``: id -> the text of its cell ``column`` (or of the row)."""
    # Pairs, not an object: the driver need not keep an object's keys in the page's order.
    got = driver.execute_script(
        """const [table, column] = arguments;
        const out = [];
        for (const tr of document.querySelectorAll('#' + table + ' tbody tr')) {
          const cell = column ? tr.querySelector('td[data-col="' + column + '"]') : tr;
          out.push([tr.dataset.id, cell ? cell.textContent : null]);
        }
        return out;""", table, column)
    return {k: v for k, v in got}


def text(driver: Any, element_id: str) -> str:
    return str(driver.execute_script(
        "return document.getElementById(arguments[0]).textContent", element_id))


def severe(driver: Any) -> List[Dict[str, Any]]:
    return [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


class Fleet:
    """Real peers of one broker: a coordinator, in-process collectors and a learner whose
    tasks emit data until they are stopped (the learner publishing a new version of policy
    "pi" twice a second, the collectors' data naming the version they hold), a collector
    process that can be killed, and two bus nodes publishing."""

    def __init__(self, broker: Broker) -> None:
        self.endpoint = broker.router
        self.stop = threading.Event()
        self.version = 0
        self.coordinator = rlbus.Coordinator(self.endpoint, id="coord-web")
        self.workers: List[Any] = []
        for wid, role in (("col-a", "collector"), ("col-b", "collector"), ("learn-a", "learner")):
            w = rlbus.Worker(self.endpoint, role=role, id=wid, run=self._run, heartbeat=1.0)
            threading.Thread(target=w.run_forever, daemon=True).start()
            self.workers.append(w)
        # Killed by the test: its session expires within its 3 x 0.3 s liveness window.
        self.victim = collector_process(self.endpoint, "col-doomed", 0.3, 100000, 0.05)
        self.nodes = [rlbus.Bus(self.endpoint, id=f"node-{i}") for i in range(2)]
        self.nodes[1].subscribe("web.metrics")
        self._bus_thread = threading.Thread(target=self._publish, daemon=True)
        self._bus_thread.start()

    def _run(self, task: Any) -> None:
        i = 0
        while not task.wait_stop(0.05):
            if task.kind == "collector":
                task.emit_data(f"{task.id}-{i}", "buf", {"i": i})
            else:
                task.emit_learn_info("buf", {"i": i})
                if i % 10 == 0:
                    self.version += 1
                    task.publish_policy("pi", self.version, params=b"w")
            i += 1

    def _publish(self) -> None:
        i = 0
        while not self.stop.wait(0.05):
            try:
                self.nodes[0].publish("web.metrics", b"%d" % i, timeout=5.0)
                while self.nodes[1].recv(timeout=0) is not None:
                    pass
            except Exception:  # a test that ends closes the nodes under this thread
                return
            i += 1

    def close(self) -> None:
        self.stop.set()
        if self.victim.poll() is None:
            self.victim.kill()
        self.victim.wait()
        for n in self.nodes:
            n.close()
        self.coordinator.close()
        for w in self.workers:
            w.close()


@pytest.fixture
def token_file() -> Iterator[str]:
    with tempfile.NamedTemporaryFile("w", suffix=".token", delete=False) as f:
        f.write(TOKEN + "\n")
    yield f.name
    os.unlink(f.name)


def test_the_page_shows_what_ops_reports_as_tasks_run_and_a_worker_dies(
        token_file: str) -> None:
    port = rlbus.free_port()
    broker = Broker(["--metrics-port", str(port), "--metrics-token-file", token_file,
                     "--status-interval", "250"])
    fleet = Fleet(broker)
    driver = browser()
    try:
        for i in range(6):  # more collector tasks than collectors: some wait in the queue
            fleet.coordinator.submit(f"collect-{i}", "collector", {"episodes": 1},
                                     policy_id="pi")
        fleet.coordinator.submit("learn-0", "learner", {"iters": 1})
        assert wait_until(lambda: len(ctl(broker, "workers")["workers"]) == 4, WAIT)

        driver.get(f"http://127.0.0.1:{port}/?token={TOKEN}")
        # The token leaves the address bar at once (it stays in this tab only).
        assert wait_until(lambda: "token" not in driver.current_url, WAIT)

        def page_matches_ops() -> bool:
            workers = {w["id"]: w for w in ctl(broker, "workers")["workers"]}
            tasks = {t["id"]: t for t in ctl(broker, "tasks")["tasks"]}
            return (rows(driver, "workers", "task") == {i: w["task"] for i, w in workers.items()}
                    and rows(driver, "tasks", "state") == {i: t["state"]
                                                          for i, t in tasks.items()})

        assert wait_until(page_matches_ops, WAIT), (rows(driver, "workers", "task"),
                                                     rows(driver, "tasks", "state"))
        assert wait_until(lambda: text(driver, "count-collector") == "3", WAIT)
        assert text(driver, "count-learner") == "1"
        assert text(driver, "count-coordinator") == "1"
        assert wait_until(lambda: text(driver, "count-bus") == "2", WAIT)
        assert "coord-web" in rows(driver, "streams")
        assert wait_until(lambda: "web.metrics" in rows(driver, "topics"), WAIT)
        assert wait_until(lambda: {"node-0", "node-1"} <= set(rows(driver, "nodes")), WAIT)

        # A worker dies: its row goes, its task goes back to the queue, as OPS says.
        assert wait_until(lambda: bool(rows(driver, "workers", "task").get("col-doomed")), WAIT)
        fleet.victim.kill()
        assert wait_until(lambda: "col-doomed" not in rows(driver, "workers"), WAIT)
        assert wait_until(lambda: int(text(driver, "count-requeued")) >= 1, WAIT)
        assert text(driver, "count-collector") == "2"
        assert wait_until(page_matches_ops, WAIT)
        # ... and the attempt that ended is listed with why, as OPS lists it.
        ended = [e for e in ctl(broker, "tasks")["ended"] if e["worker"] == "col-doomed"]
        assert ended and ended[0]["how"] == "requeued"
        key = f'{ended[0]["id"]}/{ended[0]["attempt"]}/requeued'
        assert wait_until(lambda: key in rows(driver, "ended", "reason"), WAIT)
        assert "col-doomed" in rows(driver, "ended", "reason")[key]
        # Queued tasks need nothing in particular: they wait for a free collector.
        assert "a free collector with any" in text(driver, "queued-why")

        # The charts get points from the broker's series.
        def points(chart: str) -> int:
            return int(driver.execute_script(
                "const c = Chart.getChart(arguments[0]); return c ? c.data.labels.length : 0",
                chart))
        assert wait_until(lambda: all(points(c) >= 3 for c in (
            "chart-tasks", "chart-events", "chart-bus", "chart-memory", "chart-queue",
            "chart-policy")), WAIT)

        def dataset(chart: str, k: int) -> List[Optional[float]]:
            return list(driver.execute_script(
                "return Chart.getChart(arguments[0]).data.datasets[arguments[1]].data", chart, k))
        assert wait_until(lambda: max(dataset("chart-bus", 0)) > 0, WAIT)
        # Data items are counted one by one, and the collected data's lag has values: the
        # collectors' items name the policy's versions.
        assert wait_until(lambda: max(dataset("chart-events", 1)) > 0, WAIT)
        assert wait_until(lambda: any(v is not None for v in dataset("chart-policy", 0)), WAIT)
        assert wait_until(lambda: max(dataset("chart-policy", 1)) >= 2, WAIT)
        lag = ctl(broker, "status")["counters"]
        assert lag["data_lag_items"] > 0 and lag["data_items"] >= lag["data_lag_items"]

        artifacts = os.path.join(BUILD_DIR, "test-artifacts")
        os.makedirs(artifacts, exist_ok=True)
        assert driver.save_screenshot(os.path.join(artifacts, "web-view.png"))
        assert severe(driver) == []
    finally:
        driver.quit()
        fleet.close()
        broker.stop()


def test_a_large_fleet_comes_a_page_at_a_time() -> None:
    """120 worker sessions: the page shows 50 of them, says how many there are, and its next
    page holds the next 50 OPS lists, in OPS's order."""
    import zmq
    from rlbus import protocol as P

    port = rlbus.free_port()
    broker = Broker(["--metrics-port", str(port)])
    ctx = zmq.Context()
    socks = []
    driver = browser()
    try:
        for i in range(120):
            s = ctx.socket(zmq.DEALER)
            s.linger = 0
            s.connect(broker.router)
            s.send_multipart(list(P.encode("HELLO", {"role": "collector", "id": f"w-{i:03}",
                                                     "heartbeat_ms": 60000, "resources": {}})))
            socks.append(s)
        assert wait_until(lambda: ctl(broker, "workers")["total"] == 120, WAIT)
        order = [w["id"] for w in ctl(broker, "workers")["workers"]]
        driver.get(f"http://127.0.0.1:{port}/")
        assert wait_until(lambda: list(rows(driver, "workers")) == order[:50], WAIT)
        assert text(driver, "workers-page") == "1–50 of 120"
        driver.find_element("id", "workers-next").click()
        assert wait_until(lambda: list(rows(driver, "workers")) == order[50:100], WAIT)
        assert text(driver, "workers-page") == "51–100 of 120"
        driver.find_element("id", "workers-next").click()
        assert wait_until(lambda: list(rows(driver, "workers")) == order[100:], WAIT)
        assert driver.find_element("id", "workers-next").get_attribute("disabled")
        assert severe(driver) == []
    finally:
        driver.quit()
        for s in socks:
            s.close()
        ctx.term()
        broker.stop()


def test_the_view_asks_for_its_token(token_file: str) -> None:
    port = rlbus.free_port()
    broker = Broker(["--metrics-port", str(port), "--metrics-token-file", token_file])
    base = f"http://127.0.0.1:{port}"
    try:
        status, body = http(base + "/api/view")
        assert status == 401 and "token" in json.loads(body)["error"]
        assert http(base + "/api/view", "not-the-token")[0] == 401
        assert http(base + "/api/series", "not-the-token")[0] == 401
        assert http(base + "/")[0] == 401
        assert http(base + "/?token=" + TOKEN)[0] == 200
        status, body = http(base + "/api/view", TOKEN)
        assert status == 200 and json.loads(body)["status"]["peers"]["collector"] == 0
        assert http(base + "/api/series", TOKEN)[0] == 200
        assert http(base + "/metrics")[0] == 200  # not asked for there unless told
        status, body = http(base + "/api/view?workers_limit=many", TOKEN)
        assert status == 400 and "workers_limit" in json.loads(body)["error"]

        driver = browser()
        try:  # a page opened without the token says what it needs, and nothing errors
            driver.get(base + "/")
            assert "token" in driver.find_element("tag name", "body").text
        finally:
            driver.quit()
    finally:
        broker.stop()


def test_the_token_guards_metrics_when_told(token_file: str) -> None:
    port = rlbus.free_port()
    broker = Broker(["--metrics-port", str(port), "--metrics-token-file", token_file,
                     "--metrics-token-for-metrics"])
    try:
        assert http(f"http://127.0.0.1:{port}/metrics")[0] == 401
        status, body = http(f"http://127.0.0.1:{port}/metrics", TOKEN)
        assert status == 200 and "rlbus_peers" in body
        assert http(f"http://127.0.0.1:{port}/healthz")[0] == 200
    finally:
        broker.stop()


def test_beyond_loopback_without_a_token_the_view_is_off_and_says_why() -> None:
    port = rlbus.free_port()
    broker = Broker(["--insecure", "--metrics-port", str(port), "--metrics-address",
                     "0.0.0.0", "--log-level", "warn"])
    try:
        status, body = http(f"http://127.0.0.1:{port}/api/view")
        assert status == 403 and "metrics.token-file" in json.loads(body)["error"]
        assert http(f"http://127.0.0.1:{port}/")[0] == 403
        assert http(f"http://127.0.0.1:{port}/metrics")[0] == 200
        assert wait_until(lambda: any("the web view is off" in line for line in broker.lines),
                          WAIT)
    finally:
        broker.stop()


def test_a_token_file_that_cannot_serve_is_refused_at_start(tmp_path: Any) -> None:
    short = tmp_path / "short.token"
    short.write_text("abc\n")
    for path, says in ((str(short), "at least 16"), (str(tmp_path / "none"), "cannot read")):
        r = subprocess.run([BROKER, "--router", "tcp://127.0.0.1:0", "--events",
                            "tcp://127.0.0.1:0", "--metrics-port", str(rlbus.free_port()),
                            "--metrics-token-file", path],
                           capture_output=True, text=True, timeout=WAIT)
        assert r.returncode != 0 and says in r.stdout + r.stderr, r


def test_a_broker_of_a_group_shows_its_group_as_etcd_holds_it(etcd: str) -> None:
    """Two brokers of group "g" over a real etcd: the leader's page names the group, who leads
    and both members, itself marked; the standby's JSON names the same leader; once the
    leader is killed, the standby leads and its page shows that, and the dead member goes
    when etcd lets its key go."""
    a_port, b_port = rlbus.free_port(), rlbus.free_port()
    a_router, a = group_broker(etcd, extra=["--metrics-port", str(a_port)])
    b = None
    driver = browser()
    try:
        a.wait_for("rlbus-broker listening")
        b_router, b = group_broker(etcd, extra=["--metrics-port", str(b_port)])
        b.wait_for("leads group g")

        def roles() -> Dict[str, str]:
            return rows(driver, "members", "role")
        driver.get(f"http://127.0.0.1:{a_port}/")
        both = {a_router: "leader (this broker)", b_router: "standby"}
        assert wait_until(lambda: roles() == both, WAIT), roles()
        assert text(driver, "group-name") == "g"
        assert a_router in text(driver, "group-leader")
        assert driver.find_element("id", "group").is_displayed()
        # The standby, which serves no peer, says the same of the group.
        status, body = http(f"http://127.0.0.1:{b_port}/api/cluster")
        g = json.loads(body)
        assert status == 200 and g["me"] == b_router and g["leader"]["member"] == a_router

        driver.get("about:blank")  # a's page would log its failed requests once a is gone
        assert severe(driver) == []
        a.stop()  # SIGKILL: its lease runs out, and b (no journal to be behind on) leads
        b.wait_for("rlbus-broker listening")
        driver.get(f"http://127.0.0.1:{b_port}/")
        assert wait_until(lambda: roles().get(b_router) == "leader (this broker)", WAIT), roles()
        assert wait_until(lambda: a_router not in roles(), WAIT), roles()
        assert b_router in text(driver, "group-leader")
        assert severe(driver) == []
    finally:
        driver.quit()
        a.stop()
        if b is not None:
            b.stop()


def test_a_broker_alone_shows_no_group() -> None:
    port = rlbus.free_port()
    broker = Broker(["--metrics-port", str(port)])
    try:
        status, body = http(f"http://127.0.0.1:{port}/api/cluster")
        assert status == 200 and json.loads(body) == {"group": None}
    finally:
        broker.stop()
