"""The operator console in a real headless Chromium (Debian's chromium + chromium-driver, driven
by selenium) against a real node: the token is asked for and kept for the tab only; the
overview's numbers equal the API's after known traffic; Kick on a client's page disconnects it;
the searches, the retained previews, publishing and "explain this decision" work from the pages.

With CONSOLE_SCREENSHOTS=<dir> every page is saved as <dir>/console-<page>.png (docs/images
holds the ones docs/operations.md shows)."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select

from bridge.mqtt.packets import Publish
from tests.integration.console_node import ACL_RULES, USER, connect_as_user
from tests.integration.console_node import admin_node as admin_node  # the fixture
from tests.support.admin_http import TOKEN, AdminHttp
from tests.support.browser import Console, headless_chromium
from tests.support.clients import RawClient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PAGE_FIGURES = ("connections", "sessions", "subscriptions", "retained")


@pytest.fixture(scope="module")
def chromium() -> Iterator[webdriver.Chrome]:
    with headless_chromium() as driver:
        yield driver


@pytest.fixture
def console(chromium: webdriver.Chrome, api: AdminHttp) -> Iterator[Console]:
    # Each test's node listens on its own port: a new origin, so nothing stored carries over.
    yield Console(chromium, api.port)
    chromium.get("about:blank")


def test_the_token_is_asked_for_kept_for_the_tab_only_and_never_put_in_a_url(
    console: Console,
) -> None:
    console.open("#/clients")
    console.find("token").send_keys("not-the-token", Keys.ENTER)
    assert "refused" in console.wait_text("login-error", bool, "a refusal")
    assert console.session_storage() == {}
    console.find("token").send_keys(TOKEN, Keys.ENTER)
    console.find("client-results")  # the page the URL named, shown once the token is accepted
    assert console.session_storage() == {"mqtt-bridge.admin-token": TOKEN}
    assert console.local_storage() == {}
    # The page may be drawn before its first search has finished: wait for the request.
    requested = console.until(
        lambda d: (
            (
                urls := d.execute_script(
                    "return performance.getEntriesByType('resource').map(e => e.name)"
                )
            )
            and any("/api/v1/search/clients" in url for url in urls)
            and urls
        ),
        "the clients page never searched",
    )
    assert not [url for url in [*requested, console.driver.current_url] if TOKEN in url]
    # A reload keeps the tab's token; forgetting it asks again.
    console.open("#/overview")
    console.page_loaded("overview")
    console.find("forget").click()
    console.find("token")
    assert console.session_storage() == {}


def test_the_overview_shows_the_same_numbers_as_the_api_after_known_traffic(
    console: Console, api: AdminHttp, mqtt_port: int
) -> None:
    # 3 connected clients with 2 subscriptions each, 1 offline persistent session with 1.
    for index in range(3):
        client = RawClient(mqtt_port)
        client.connect(f"dev-{index}")
        assert client.subscribe(f"console/dev-{index}/#", 1) == [1]
        assert client.subscribe("console/alerts", 0, packet_id=2) == [0]
    offline = RawClient(mqtt_port)
    offline.connect("dev-offline", clean_session=False)
    assert offline.subscribe("console/dev-offline/#", 1) == [1]
    offline.disconnect()
    publisher = RawClient(mqtt_port)
    publisher.connect("publisher")
    for index in range(2):
        publisher.publish(f"console/state/{index}", b"on", qos=1, packet_id=index + 1, retain=True)
    for packet_id in range(3, 8):
        publisher.publish("console/alerts", b"alarm", qos=1, packet_id=packet_id)
    expected = {"connections": 4, "sessions": 5, "subscriptions": 7, "retained": 2}
    stats = api.wait_for("/stats", lambda d: _figures(d["totals"]) == expected)

    console.log_in(TOKEN)
    console.page_loaded("overview")
    on_page = {name: int(console.text_of(name)) for name in PAGE_FIGURES}
    assert on_page == _figures(stats["totals"]) == expected
    # ... and the node-local endpoints agree.
    assert on_page["connections"] == api.get("/connections/count")[1]["node"]
    assert on_page["sessions"] == len(api.get("/clients")[1]["items"])
    assert on_page["subscriptions"] == len(api.get("/subscriptions")[1]["items"])
    assert on_page["retained"] == len(api.get("/retained?filter=%23")[1]["items"])  # not $SYS
    rows = console.all("node-row")
    assert len(rows) == 1 and "this node" in rows[0].text
    assert console.text_of("nodes-alive") == "1 / 1"
    # The charts draw a line once two answers give a rate: traffic between refreshes.
    packet_ids = iter(range(8, 100))
    for batch in range(4):
        refreshed = _refreshes(console)
        for _ in range(5 * (batch + 1)):
            publisher.publish("console/alerts", b"alarm", qos=1, packet_id=next(packet_ids))
        console.until(
            lambda _, before=refreshed: _refreshes(console) > before, "the overview did not refresh"
        )
    chart = console.find("chart-messages")
    assert chart.find_elements(By.CSS_SELECTOR, "path.line.in")
    assert console.find("chart-latency").find_elements(By.CSS_SELECTOR, "svg.chart")
    console.screenshot("console-overview")


def test_kick_on_the_client_page_disconnects_the_client(
    console: Console, api: AdminHttp, mqtt_port: int
) -> None:
    client_id = "line 1/press 3"
    victim = connect_as_user(mqtt_port, client_id, clean_session=False)
    assert victim.subscribe("meters/press3/#", 1) == [1]
    victim.publish("meters/line1/power", b"1.5kW", qos=1, packet_id=2)
    console.log_in(TOKEN)
    console.page_loaded("overview")
    console.open("#/clients/" + quote(client_id, safe=""))
    console.page_loaded("clients")
    assert console.text_of("client-id") == client_id
    assert console.text_of("client-state") == "connected"
    facts = console.driver.find_element(By.CSS_SELECTOR, "dl.facts").text
    assert "MQTT 3.1.1" in facts and "60 s" in facts and USER in facts
    assert [row.text for row in console.all("client-subscription")] == ["meters/press3/# 1"]
    assert console.text_of("client-queued") == "0"
    assert "in 1 5 B" in console.text_of("metering")  # messages, payload bytes
    console.screenshot("console-client")

    console.find("kick").click()
    console.find("kick-confirm").click()
    assert "Kicked" in console.wait_text("kick-result", bool, "an answer")
    victim.expect_closed()
    console.wait_text("client-state", lambda text: text == "offline", "offline after the kick")
    assert api.client(client_id)[1]["connected"] is False


def test_search_subscribers_retained_previews_publish_and_explain_from_the_pages(
    console: Console, api: AdminHttp, mqtt_port: int
) -> None:
    alice = connect_as_user(mqtt_port, "meter-7")
    assert alice.subscribe("meters/+/power", 1) == [1]
    for client_id, topic_filter in (
        ("meter-8", "meters/+/power"),
        ("meter-9", "$share/g/meters/+/power"),
    ):
        other = RawClient(mqtt_port)
        other.connect(client_id)
        assert other.subscribe(topic_filter, 1) == [1]
    listener = RawClient(mqtt_port)
    listener.connect("listener")
    assert listener.subscribe("console/test", 1) == [1]
    api.post("/publish", {"topic": "meters/7/state", "payload": '{"kw": 3.5}', "retain": True})
    api.post("/publish", {"topic": "meters/7/log", "payload": "x" * 1000, "retain": True})

    console.log_in(TOKEN)
    console.page_loaded("overview")
    console.go("#/clients")
    console.until(lambda _: len(console.all("client-row")) == 4, "all four clients listed")
    search = console.find("client-search")
    search.send_keys("meter-", Keys.ENTER)
    console.until(lambda _: _row_ids(console, "client-row") == ["meter-7", "meter-8", "meter-9"],
                  "the ClientId prefix search")  # fmt: skip
    Select(console.find("search-by")).select_by_value("username")
    search.clear()
    search.send_keys(USER, Keys.ENTER)
    console.until(lambda _: _row_ids(console, "client-row") == ["meter-7"], "the user search")
    console.screenshot("console-clients")

    console.go("#/topics")
    console.find("sub-filter").send_keys("meters/+/power", Keys.ENTER)
    console.until(
        lambda _: _row_ids(console, "sub-row") == ["meter-7", "meter-8", "meter-9"],
        "who subscribes to meters/+/power",
    )
    previews = console.until(
        lambda _: (
            len(rows := console.all("retained-row")) == 2
            and {row.get_attribute("data-topic"): row for row in rows}
        ),
        "two retained messages",
    )
    assert previews["meters/7/state"].find_element(By.TAG_NAME, "pre").text == '{"kw": 3.5}'
    long_preview = previews["meters/7/log"].find_element(By.TAG_NAME, "pre").text
    assert long_preview.startswith("x" * 256) and "744 more bytes" in long_preview
    console.find("publish-topic").send_keys("console/test")
    console.find("publish-payload").send_keys("from the console")
    Select(console.find("publish-qos")).select_by_value("1")
    console.find("publish-send").click()
    assert "Published" in console.wait_text("publish-result", bool, "an answer")
    delivered = listener.recv()
    assert isinstance(delivered, Publish)
    assert (delivered.topic, delivered.payload) == ("console/test", b"from the console")
    console.screenshot("console-topics")

    console.go("#/access")
    console.until(lambda _: len(console.all("rule-row")) == ACL_RULES, "the ACL rules")
    console.until(
        lambda _: [row.text.split()[0] for row in console.all("user-row")] == [USER], "the users"
    )
    console.find("explain-client").send_keys("meter-8")
    console.find("explain-topic").send_keys("secret/plans")
    Select(console.find("explain-action")).select_by_value("subscribe")
    console.find("explain-go").click()
    verdict = console.wait_text("explain-verdict", lambda t: "DENIED" in t, "a denial")
    assert "rule 2" in verdict and "deny all subscribe secret/#" in verdict
    steps = [row.text for row in console.all("explain-step")]
    assert len(steps) == ACL_RULES and "decides" in steps[1] and "not this client" in steps[0]
    console.screenshot("console-access")


def _figures(totals: dict[str, int]) -> dict[str, int]:
    return {name: totals[name] for name in PAGE_FIGURES}


def _refreshes(console: Console) -> int:
    overview = console.driver.find_element(By.CSS_SELECTOR, "[data-page=overview]")
    return int(overview.get_attribute("data-refreshes") or 0)


def _row_ids(console: Console, testid: str) -> list[str]:
    return [row.get_attribute("data-clientid") for row in console.all(testid)]
