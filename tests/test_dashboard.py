"""Issue 15: the web dashboard in a real headless browser (Debian's chromium + chromedriver, driven
by Selenium) against a live API server on a temporary store: the GPU grid by domain and host (free /
busy / yours / drained / degraded), the queue with deferral reasons, recent batches with predicted
bandwidth, fragmentation over time, and a bad token's error."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time

import pytest

from bandpilot import queue as q
from bandpilot import scheduling as sched
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.fabric.emulator import make_fabric

from test_queue import domain_spec, new_store  # pytest puts tests/ on sys.path
from bandpilot.scheduling.profile import SchedulerProfile

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                                reason="chromium/chromedriver not installed (`make test` installs Debian's packages unless APT=no)")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def live(tmp_path):
    import uvicorn

    from bandpilot.api import create_app

    store = new_store(f"sqlite:///{tmp_path / 'queue.db'}", domain_spec(2))
    admin, _ = q.create_token(store, "ops", admin=True)
    alice, _ = q.create_token(store, "alice")
    q.submit(store, [{"id": "a-train", "k": 8, "tenant": "alice"}, {"id": "b-eval", "k": 4, "tenant": "bob"}])
    sched.run_batch(store, Dispatcher(make_fabric(store.spec)), SchedulerProfile("test", queue_sort="fifo"))
    q.drain(store, "h100-3:7", "fan")
    q.apply_verdicts(store, {"h100-2": {"status": "degraded", "gpus": ["h100-2:1"], "links": [], "ratio": 0.6}}, "test")
    q.submit(store, [{"id": "a-big", "k": 24, "tenant": "alice"}])
    sched.run_batch(store, Dispatcher(make_fabric(store.spec)), SchedulerProfile("test", queue_sort="fifo"))  # a-big is deferred: not enough GPUs
    # submitted after the last batch, and nothing pending fits: no batch runs, so no batch gave it a reason
    q.submit(store, [{"id": "a-huge", "k": 30, "tenant": "alice"}])
    port = _port()
    server = uvicorn.Server(uvicorn.Config(create_app(store, sample_s=None), host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    yield {"url": f"http://127.0.0.1:{port}/", "admin": admin, "alice": alice, "store": store}
    server.should_exit = True
    t.join(10)
    store.close()


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1000",
              f"--user-data-dir={tmp_path / 'chrome'}"):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    yield drv
    drv.quit()


def _connect(browser, url: str, token: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(url)
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.ID, "connect").click()
    WebDriverWait(browser, 20).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded")
                                     or d.find_element(By.ID, "error").text)
    # hold the page still while the test reads it: the 5 s refresh re-renders every panel, and on a busy
    # machine a check can span one (stale element references)
    browser.execute_script("for (let i = 1; i < 10000; i++) clearInterval(i);")


@pytest.mark.slow
def test_dashboard_shows_grid_queue_batches_and_fragmentation(live, browser, tmp_path):
    from selenium.webdriver.common.by import By

    _connect(browser, live["url"], live["alice"])
    assert browser.find_element(By.ID, "error").text == ""
    assert browser.find_element(By.ID, "who").text == "alice"
    cells = browser.find_elements(By.CSS_SELECTOR, "#grid .gpu")
    assert len(cells) == 32
    domains = browser.find_elements(By.CSS_SELECTOR, "#grid .domain")
    assert [d.get_attribute("data-domain") for d in domains] == ["h100-d0", "h100-d1"]
    assert len(domains[0].find_elements(By.CSS_SELECTOR, ".host")) == 2
    by_gpu = {c.get_attribute("data-gpu"): c for c in cells}
    mine = [g for g, c in by_gpu.items() if "mine" in c.get_attribute("class").split()]
    busy = [g for g, c in by_gpu.items() if "busy" in c.get_attribute("class").split()]
    assert len(mine) == 8 and len(busy) == 4  # alice's job, bob's job (id hidden from alice)
    assert all(by_gpu[g].get_attribute("data-job") == "a-train" for g in mine)
    assert all(by_gpu[g].get_attribute("data-job") == "" for g in busy)
    assert "drained" in by_gpu["h100-3:7"].get_attribute("class") and "fan" in by_gpu["h100-3:7"].get_attribute("title")
    assert "degraded" in by_gpu["h100-2:0"].get_attribute("class")  # the host's verdict outlines every GPU
    g21 = next(g for g in q.gpu_grid(live["store"]) if g["id"] == "h100-2:1")  # the suspect GPU leaves the pool:
    want = "pending-drain" if g21["state"] == "busy" else "drained"  # now, or when its job ends
    assert want in by_gpu["h100-2:1"].get_attribute("class").split()
    rows = {r.get_attribute("data-request"): r.text for r in browser.find_elements(By.CSS_SELECTOR, "#queue tbody tr")}
    assert set(rows) == {"a-train", "a-big", "a-huge"}  # bob's request is not alice's to see
    assert "insufficient_gpus" in rows["a-big"] and "pending" in rows["a-big"]
    # this server runs no batch loop (dispatch_s=None): the page says who assigns instead
    loop = browser.find_element(By.ID, "loop").text
    assert "This API runs no batches" in loop and "bandpilot dispatch assigns the queue" in loop, loop
    n_free = sum(g["state"] == "free" for g in q.gpu_grid(live["store"]))
    assert f"needs 30 GPUs, {n_free} free" in rows["a-huge"], rows["a-huge"]
    batches = browser.find_elements(By.CSS_SELECTOR, "#batches tbody tr")
    assert len(batches) == 2 and any(ch.isdigit() for ch in batches[-1].find_elements(By.TAG_NAME, "td")[4].text)
    svg = browser.find_element(By.ID, "frag")
    assert svg.get_attribute("data-samples") == "2" and len(svg.find_elements(By.TAG_NAME, "polyline")) == 3
    assert "stranded" in browser.find_element(By.ID, "fragnow").text
    _chart_is_readable(browser, svg)
    browser.save_screenshot(str(tmp_path / "dashboard.png"))
    if os.environ.get("BANDPILOT_KEEP_SCREENSHOT"):
        shutil.copy(tmp_path / "dashboard.png", os.environ["BANDPILOT_KEEP_SCREENSHOT"])
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000


def _chart_is_readable(browser, svg) -> None:
    """Issue 26: ticks on both axes, clock times (not ISO stamps) on x, an axis label clear of the lines,
    a sans-serif font, text at its real size, and series that stay distinguishable when equal."""
    import re

    from selenium.webdriver.common.by import By

    yticks = [t.text for t in svg.find_elements(By.CSS_SELECTOR, "text.ytick")]
    assert len(yticks) >= 3 and yticks[0] == "0" and all(t.isdigit() for t in yticks), yticks
    xticks = [t.text for t in svg.find_elements(By.CSS_SELECTOR, "text.xtick")]
    assert len(xticks) >= 2 and all(re.fullmatch(r"\d{1,2}:\d{2}:\d{2}", t) for t in xticks), xticks
    assert not any("T" in t or "-" in t for t in xticks)
    view_w = float(svg.get_dom_attribute("viewBox").split()[2])
    assert abs(view_w - svg.size["width"]) <= 2, "the chart is stretched"  # text would be distorted
    fonts = {browser.execute_script("return getComputedStyle(arguments[0]).fontFamily", t)
             for t in svg.find_elements(By.TAG_NAME, "text")}
    assert fonts and all("sans-serif" in f for f in fonts), fonts
    label = next(t for t in svg.find_elements(By.TAG_NAME, "text") if t.text == "GPUs")
    plot_left = min(float(p.split(",")[0]) for line in svg.find_elements(By.TAG_NAME, "polyline")
                    for p in line.get_attribute("points").split())
    box = browser.execute_script("const b = arguments[0].getBBox(); return [b.x, b.y, b.width, b.height]", label)
    assert box[1] + box[3] <= plot_left or box[0] + box[2] <= plot_left  # rotated, left of every line
    styles = {(p.get_attribute("stroke"), p.get_attribute("stroke-dasharray"), p.get_attribute("stroke-width"))
              for p in svg.find_elements(By.TAG_NAME, "polyline")}
    assert len({s[0] for s in styles}) == 3 and len({s[1] for s in styles}) == 3 and len({s[2] for s in styles}) == 3
    legend = browser.find_element(By.ID, "fraglegend").text
    assert "free GPUs" in legend and "stranded GPUs" in legend and "largest single-host gang" in legend


@pytest.mark.slow
def test_before_a_token_the_page_says_what_to_do_and_has_an_icon(live, browser):
    import urllib.request

    from selenium.webdriver.common.by import By

    browser.get(live["url"])
    hint = browser.find_element(By.ID, "hint")
    assert hint.is_displayed() and "bandpilot tokens create --tenant" in hint.text
    for panel in ("grid", "queue", "batches", "frag"):
        assert "connect with a token" in browser.find_element(By.ID, panel).text, panel
    if os.environ.get("BANDPILOT_KEEP_SCREENSHOT"):
        browser.save_screenshot(os.environ["BANDPILOT_KEEP_SCREENSHOT"].removesuffix(".png") + "-before-token.png")
    with urllib.request.urlopen(live["url"] + "favicon.ico", timeout=10) as r:
        assert r.status == 200 and r.headers["content-type"].startswith("image/svg+xml")
    errors = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
    assert not errors, errors  # e.g. a 404 for favicon.ico
    _connect(browser, live["url"], live["alice"])
    assert not browser.find_element(By.ID, "hint").is_displayed()


@pytest.mark.slow
def test_dashboard_admin_sees_every_job_and_a_bad_token_sees_nothing(live, browser):
    from selenium.webdriver.common.by import By

    _connect(browser, live["url"], live["admin"])
    jobs = {c.get_attribute("data-job") for c in browser.find_elements(By.CSS_SELECTOR, "#grid .gpu[data-state=busy]")}
    assert jobs == {"a-train", "b-eval"}
    assert browser.find_element(By.ID, "who").text == "ops (admin)"

    browser.execute_script("sessionStorage.clear()")
    _connect(browser, live["url"], live["alice"][:-3] + "xyz")
    assert "revoked bearer token" in browser.find_element(By.ID, "error").text
    assert browser.find_elements(By.CSS_SELECTOR, "#grid .gpu") == []
