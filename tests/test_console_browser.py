"""The console in a real headless Chromium (Debian's chromium and chromium-driver, driven
by selenium): log in, find the unknown receipt, resolve it, see the queue shrink.

Without /usr/bin/chromedriver the test is skipped with a loud reason, except under CI=true
where a missing browser is a failure (.ci/run installs it)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from orch8_py import apikeys
from tests.test_console import charge_output, charge_sequence, fail_with_unknown_receipt, receipt
from web import create_app

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
IN_CI = os.environ.get("CI", "").lower() == "true"


def _unavailable(reason: str):
    message = (
        f"!!! BROWSER TEST NOT RUN: {reason}. "
        "Install it with: apt-get install -y chromium chromium-driver (and pip selenium)"
    )
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def browser(tmp_path):
    if not CHROMEDRIVER.exists() or not CHROMIUM.exists():
        _unavailable(f"{CHROMEDRIVER} or {CHROMIUM} is missing")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _unavailable("the selenium package is not installed")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,1000",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(15)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def server(db_url):
    """The operator service on 127.0.0.1, a free port, waitress on a daemon thread."""
    import waitress

    app = create_app(db_url, secret_key="browser-test-secret")
    srv = waitress.create_server(app, host="127.0.0.1", port=0, threads=4)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.effective_port}"
    finally:
        srv.close()
        thread.join(timeout=5)
        app.extensions["orch8.pool"].close()


@pytest.mark.timeout(90)
def test_operator_resolves_an_unknown_receipt_in_a_real_browser(browser, server, conn, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    instance, effect_id = fail_with_unknown_receipt(conn, charge_sequence(conn))
    _, secret = apikeys.create(conn, "t1", "operator", "alice")
    wait = WebDriverWait(browser, 10)

    # log in: / leads to the console, the console to its login page
    browser.get(server + "/")
    wait.until(ec.presence_of_element_located((By.ID, "api_key"))).send_keys(secret)
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    wait.until(ec.presence_of_element_located((By.ID, "queue-depth")))
    assert browser.find_element(By.ID, "queue-depth").text == "1"
    assert "alice" in browser.find_element(By.CSS_SELECTOR, "header .who").text
    browser.save_screenshot(str(tmp_path / "dashboard.png"))

    # the queue: one receipt, with what the provider needs to be asked
    browser.find_element(By.CSS_SELECTOR, "nav a[href$='/console/effects/unresolved']").click()
    count = wait.until(ec.presence_of_element_located((By.ID, "queue-count")))
    assert count.get_attribute("data-count") == "1"
    assert count.text == "1 unresolved receipt"
    items = browser.find_elements(By.CSS_SELECTOR, ".queue-item")
    assert len(items) == 1
    assert items[0].find_element(By.CSS_SELECTOR, ".effect-id").text == str(effect_id)
    assert items[0].find_element(By.CSS_SELECTOR, ".idempotency-key").text == "order-7"
    assert str(instance) in items[0].text
    assert items[0].get_attribute("data-blocking") == "true"
    assert "Blocks its instance" in items[0].find_element(By.CSS_SELECTOR, ".queue-status").text
    browser.save_screenshot(str(tmp_path / "queue-before.png"))

    # open it and resolve it: committed, with the provider's receipt id and evidence
    items[0].find_element(By.CSS_SELECTOR, "a.resolve-link").click()
    form = wait.until(ec.presence_of_element_located((By.ID, "resolve-form")))
    expected = form.find_element(By.CSS_SELECTOR, "input[name=expected_state]")
    assert expected.get_attribute("type") == "hidden"
    assert expected.get_attribute("value") == "unknown"  # the state this page showed
    offered = [
        o.get_attribute("value") for o in form.find_elements(By.CSS_SELECTOR, "#state option")
    ]
    assert offered == ["", "committed", "verified", "compensated", "abandoned"]
    Select(form.find_element(By.ID, "state")).select_by_value("committed")
    form.find_element(By.ID, "provider_receipt_id").send_keys("ch_3LkP")
    form.find_element(By.ID, "evidence").send_keys(
        '{"checked": "pay.example dashboard by idempotency key", "found": "ch_3LkP"}'
    )
    form.find_element(By.ID, "output").send_keys('{"receipt_id": "ch_3LkP", "amount": 1250}')
    form.find_element(By.ID, "note").send_keys("provider shows the charge")
    browser.save_screenshot(str(tmp_path / "resolve-form.png"))
    form.find_element(By.ID, "resolve").click()
    flash = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".flash.ok")))
    assert f"Receipt {effect_id} is now committed." in flash.text
    assert browser.find_elements(By.ID, "retry"), "the next step, retry, is offered"
    browser.save_screenshot(str(tmp_path / "resolved.png"))

    # the queue has shrunk
    browser.find_element(By.CSS_SELECTOR, "nav a[href$='/console/effects/unresolved']").click()
    count = wait.until(ec.presence_of_element_located((By.ID, "queue-count")))
    assert count.get_attribute("data-count") == "0"
    assert browser.find_elements(By.CSS_SELECTOR, ".queue-item") == []
    assert "Nothing to resolve." in browser.page_source
    shot = tmp_path / "queue-after.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 0

    state, provider_receipt_id, evidence = receipt(conn, effect_id)
    assert (state, provider_receipt_id) == ("committed", "ch_3LkP")
    assert evidence["resolution"]["actor"] == "key:alice"
    assert evidence["resolution"]["output"] == {"receipt_id": "ch_3LkP", "amount": 1250}

    # step 5 of the procedure: retry the instance; the charge is not sent again
    browser.get(f"{server}/console/instances/{instance}")
    wait.until(ec.element_to_be_clickable((By.ID, "retry"))).click()
    flash = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".flash.ok")))
    assert "completed_from_evidence" in flash.text
    assert "scheduled" in browser.find_element(By.ID, "instance-state").text
    # the step completed with the output the resolution carried
    assert charge_output(conn, instance) == {"receipt_id": "ch_3LkP", "amount": 1250}
    browser.save_screenshot(str(tmp_path / "instance-after-retry.png"))


@pytest.mark.timeout(90)
def test_admin_switches_tenant_from_the_header_in_a_real_browser(browser, server, conn, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    theirs, their_effect = fail_with_unknown_receipt(
        conn, charge_sequence(conn, tenant="acme"), tenant="acme"
    )
    _, secret = apikeys.create(conn, "t1", "admin", "root")
    wait = WebDriverWait(browser, 10)
    browser.get(server + "/console/login")
    wait.until(ec.presence_of_element_located((By.ID, "api_key"))).send_keys(secret)
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    wait.until(ec.presence_of_element_located((By.ID, "queue-depth")))
    assert browser.find_element(By.ID, "acting-tenant").text == "t1"
    assert browser.find_element(By.ID, "queue-depth").text == "0"
    # the datalist offers the tenants that exist; type one and switch
    options = browser.find_elements(By.CSS_SELECTOR, "datalist#known-tenants option")
    assert "acme" in {o.get_attribute("value") for o in options}
    field = browser.find_element(By.ID, "switch-tenant")
    assert field.is_displayed()
    field.send_keys("acme")
    browser.find_element(By.CSS_SELECTOR, "#tenant-switch button[type=submit]").click()
    flash = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".flash.ok")))
    assert "Now acting for tenant acme." in flash.text
    assert browser.find_element(By.ID, "acting-tenant").text == "acme"
    assert browser.find_element(By.ID, "queue-depth").text == "1"
    browser.save_screenshot(str(tmp_path / "admin-acting.png"))
    browser.find_element(By.CSS_SELECTOR, "nav a[href$='/console/effects/unresolved']").click()
    count = wait.until(ec.presence_of_element_located((By.ID, "queue-count")))
    assert count.get_attribute("data-count") == "1"
    assert str(their_effect) in browser.page_source and str(theirs) in browser.page_source
    # and back to the key's own tenant with one click
    browser.find_element(By.CSS_SELECTOR, "#tenant-home button").click()
    flash = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".flash.ok")))
    assert "Back in your key's own tenant t1." in flash.text
    assert browser.find_element(By.ID, "acting-tenant").text == "t1"
    assert browser.find_elements(By.ID, "tenant-home") == []


@pytest.mark.timeout(90)
def test_the_instance_page_draws_the_execution_tree(browser, server, db_url, conn, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    import tests.test_workflows  # noqa: F401  (registers wf.unsure and wf.record)
    from tests.runner_helpers import make_sequence, running, start, wait_for

    seq = make_sequence(
        conn,
        [
            {
                "type": "parallel",
                "id": "fan",
                "branches": [
                    [{"type": "step", "id": "unsure", "handler": "wf.unsure"}],
                    [{"type": "step", "id": "sure", "handler": "wf.record"}],
                ],
            }
        ],
    )
    with running(db_url):
        instance = start(conn, seq)
        assert wait_for(conn, [instance])[instance][0] == "failed"
    _, secret = apikeys.create(conn, "t1", "operator", "alice")
    wait = WebDriverWait(browser, 10)
    browser.get(server + "/console/login")
    wait.until(ec.presence_of_element_located((By.ID, "api_key"))).send_keys(secret)
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    wait.until(ec.presence_of_element_located((By.ID, "queue-depth")))
    browser.get(f"{server}/console/instances/{instance}")
    tree = wait.until(ec.presence_of_element_located((By.ID, "execution-tree")))

    def node(path: str):
        return tree.find_element(By.CSS_SELECTOR, f"li[data-path='{path}']")

    # nested as the execution ran: the parallel, its branches, their steps
    blocked = node("fan").find_element(
        By.CSS_SELECTOR, "li[data-path='fan#0'] li[data-path='fan#0/unsure']"
    )
    assert "blocked" in blocked.text and "attempt 0" in blocked.text
    assert "unknown" in blocked.text  # its receipt, linked for the operator
    assert blocked.find_element(By.CSS_SELECTOR, "a[href*='/console/effects/']")
    done = node("fan#1/sure")
    assert (
        "completed" in done.text and done.find_element(By.CSS_SELECTOR, ".node code").text == "sure"
    )
    assert node("fan#0").find_element(By.CSS_SELECTOR, ".node code").text == "#0"
    assert browser.find_elements(By.ID, "retry"), "the blocked branch can be retried"
    shot = tmp_path / "execution-tree.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 0


@pytest.mark.timeout(120)
def test_waiting_schedules_and_a_deferred_step_in_a_real_browser(
    browser, server, db_url, conn, tmp_path
):
    """The console's Waiting page says what each instance waits for and until when, and an
    operator answers a question there; the Schedules page pauses and resumes a schedule;
    the instance page says a step is deferred by a rate limit."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    from orch8_py import sqlapi
    from tests.runner_helpers import make_sequence, running, start, wait_for
    from tests.test_waits import approval_sequence, waiting_input

    asking = start(conn, approval_sequence(conn), {"amount": 5, "who": "Ann"})
    sleeper = start(conn, make_sequence(conn, [{"type": "sleep", "id": "nap", "duration": "1h"}]))
    conn.execute("SELECT orch8.set_rate_limit('t1', 'partner', 1, '1h')")
    limited = make_sequence(
        conn, [{"type": "step", "id": "call", "handler": "noop", "rate_limit_key": "partner"}]
    )
    calls = [start(conn, limited), start(conn, limited)]
    sqlapi.sequences.create_sequence(
        conn,
        tenant_id="t1",
        namespace="default",
        name="job",
        definition={"blocks": [{"type": "step", "id": "a", "handler": "noop"}]},
    )
    sqlapi.schedules.create_schedule(
        conn, tenant_id="t1", name="nightly", sequence_name="job", cron="30 2 * * *"
    )
    _, secret = apikeys.create(conn, "t1", "operator", "alice")
    wait = WebDriverWait(browser, 15)
    with running(db_url):
        waiting_input(conn, asking)
        wait_for(conn, [sleeper], ("waiting",))
        browser.get(server + "/console/login")
        wait.until(ec.presence_of_element_located((By.ID, "api_key"))).send_keys(secret)
        browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
        wait.until(ec.presence_of_element_located((By.ID, "queue-depth")))

        browser.find_element(By.CSS_SELECTOR, "nav a[href$='/console/waiting']").click()
        count = wait.until(ec.presence_of_element_located((By.ID, "waiting-count")))
        assert count.get_attribute("data-count") == "2", browser.page_source
        items = {
            a.get_attribute("data-waiting-for"): a
            for a in browser.find_elements(By.CSS_SELECTOR, "article.waiting")
        }
        assert items["input"].find_element(By.CSS_SELECTOR, ".prompt").text == "Refund 5 to Ann?"
        assert items["time"].get_attribute("data-instance") == str(sleeper)
        assert "Sleeps until" in items["time"].text
        assert items["time"].find_element(By.CSS_SELECTOR, "time.until").get_attribute("datetime")
        browser.save_screenshot(str(tmp_path / "waiting.png"))
        items["input"].find_element(By.CSS_SELECTOR, "input[name=comment]").send_keys("ok by me")
        items["input"].find_element(By.CSS_SELECTOR, "button.answer[value=approve]").click()
        flash = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".flash.ok")))
        assert "Answered approve: approve." in flash.text
        assert wait_for(conn, [asking])[asking][0] == "completed"
        answered = sqlapi.instances.waiting_nodes(conn, tenant_id="t1", instance_id=asking)
        assert answered == []

        deferred = None
        for _ in range(200):  # one call takes the bucket's token, the other is deferred
            deferred = conn.execute(
                "SELECT instance_id FROM orch8.execution_nodes WHERE instance_id = ANY(%s)"
                " AND deferred_by = 'rate_limit'",
                (calls,),
            ).fetchone()
            if deferred:
                break
            time.sleep(0.05)
        assert deferred, "no call was deferred"
        deferred = deferred[0]
        browser.get(f"{server}/console/instances/{deferred}")
        tree = wait.until(ec.presence_of_element_located((By.ID, "execution-tree")))
        call = tree.find_element(By.CSS_SELECTOR, "li[data-path='call']")
        assert "deferred by rate limit partner until" in call.text, call.text

    browser.find_element(By.CSS_SELECTOR, "nav a[href$='/console/schedules']").click()
    pause = wait.until(ec.presence_of_element_located((By.ID, "pause-nightly")))
    assert "30 2 * * *" in browser.page_source
    pause.click()
    flash = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".flash.ok")))
    assert "Paused: no fire until it is resumed." in flash.text
    state = "SELECT state FROM orch8.schedules WHERE tenant_id = 't1' AND name = 'nightly'"
    assert conn.execute(state).fetchone() == ("paused",)
    wait.until(ec.presence_of_element_located((By.ID, "resume-nightly"))).click()
    wait.until(ec.presence_of_element_located((By.ID, "pause-nightly")))
    assert "Resumed: the next fire is counted from now" in browser.page_source
    assert conn.execute(state).fetchone() == ("active",)
    browser.save_screenshot(str(tmp_path / "schedules.png"))
