"""The console in a real browser (Playwright driving Debian's /usr/bin/chromium, headless).

Started by tests/clients/console.rs, which runs three consoles and passes them here:
  PGQC_ADMIN_URL, PGQC_ADMIN_DSN        a console as a superuser, and the database it shows
  PGQC_READONLY_URL                     a console as a role with only pg_monitor
  PGQC_STANDBY_URL, PGQC_STANDBY_DSN    a console on a streaming standby of that database
  PGQC_FORCED_URL                       a console of the admin's database started with --read-only
  PGQC_LOGIN_URL, PGQC_LOGIN_PASSWORD, PGQC_LOGIN_TOKEN
                                        a console (of the admin's database) that requires a login
  PGQC_SCREENSHOTS                      where the docs' screenshots go (default docs/images)
Each test makes queues of its own, so they do not depend on each other's order.
"""

import json
import os
import pathlib
import secrets
import time

import psycopg
import pytest
from playwright.sync_api import sync_playwright

ADMIN_URL = os.environ["PGQC_ADMIN_URL"].rstrip("/")
ADMIN_DSN = os.environ["PGQC_ADMIN_DSN"]
READONLY_URL = os.environ.get("PGQC_READONLY_URL", "").rstrip("/")
STANDBY_URL = os.environ.get("PGQC_STANDBY_URL", "").rstrip("/")
STANDBY_DSN = os.environ.get("PGQC_STANDBY_DSN", "")
FORCED_URL = os.environ.get("PGQC_FORCED_URL", "").rstrip("/")
LOGIN_URL = os.environ.get("PGQC_LOGIN_URL", "").rstrip("/")
LOGIN_PASSWORD = os.environ.get("PGQC_LOGIN_PASSWORD", "")
LOGIN_TOKEN = os.environ.get("PGQC_LOGIN_TOKEN", "")
SCREENSHOTS = pathlib.Path(
    os.environ.get("PGQC_SCREENSHOTS", pathlib.Path(__file__).resolve().parents[2] / "docs" / "images")
)

XSS_SCRIPT = "<script>window.pwned=1</script>"
XSS_IMG = '<img src=x onerror="window.pwned=1">'


# --- fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def browser():
    with sync_playwright() as p:
        # Debian's Chromium: Playwright downloads no browser of its own.
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    pg = context.new_page()
    yield pg
    context.close()


@pytest.fixture
def db():
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        yield conn


def one(db, sql, *args):
    row = db.execute(sql, args).fetchone()
    return None if row is None else row[0]


def new_queue(db, prefix):
    name = f"{prefix}_{secrets.token_hex(4)}"
    db.execute("SELECT pgqueue.pgq_create_queue(%s, lease => '1 hour', max_attempts => 3)", (name,))
    return name


def send(db, queue, payload, **kw):
    args = ", ".join(f"{k} => %s" for k in kw)
    sql = f"SELECT pgqueue.pgq_send(%s, %s::jsonb{', ' + args if args else ''})"
    return one(db, sql, queue, json.dumps(payload), *kw.values())


def claim(db, queue, consumer="test-worker"):
    return db.execute(
        "SELECT msg_id, claim_token FROM pgqueue.pgq_claim(%s, consumer => %s)", (queue, consumer)
    ).fetchone()


def dead_letter(db, queue, payload, error="boom"):
    """A message sent, claimed and failed: a dead letter of `queue` (sent at the highest
    priority, so the claim takes it whatever else waits)."""
    sent = send(db, queue, payload, priority="1000")
    msg_id, token = claim(db, queue)
    assert msg_id == sent
    db.execute("SELECT pgqueue.pgq_fail(%s::bigint, %s::uuid, %s)", (msg_id, token, error))
    return msg_id


def state(db, msg_id):
    return one(db, "SELECT state FROM pgqueue.jobs WHERE msg_id = %s ORDER BY finished_at NULLS FIRST LIMIT 1", msg_id)


def paused(db, queue):
    return one(db, "SELECT paused FROM pgqueue.queues WHERE queue = %s", queue)


def csrf_cookie(page):
    return next(c["value"] for c in page.context.cookies() if c["name"] == "pgqc_csrf")


def forged_post(page, url, form, headers=None):
    """A POST from the page's context (its cookies), not through a form of the page."""
    return page.request.post(url, form=form, headers=headers or {}, max_redirects=0)


def action_forms(page):
    return page.locator("main form[method=post]").count()


# --- screenshots for docs/console.md (first: the overview shows only these queues) ----------


def demo_queue(db, name):
    db.execute("SELECT pgqueue.pgq_create_queue(%s, lease => '5 min', if_not_exists => true)", (name,))
    return name


def test_screenshots_for_the_docs(page, db):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    emails, webhooks, reports = demo_queue(db, "emails"), demo_queue(db, "webhooks"), demo_queue(db, "reports")
    dead = dead_letter(db, emails, {"to": "bounce@example.com", "template": "welcome"}, error="SMTP 550: mailbox unavailable")
    dead_letter(db, emails, {"to": "nobody@example.invalid", "template": "reset"}, error="DNS: no MX record for example.invalid")
    for n in range(12):
        send(db, emails, {"to": f"user{n}@example.com", "template": "welcome"})
    send(db, emails, {"to": "later@example.com", "template": "digest"}, delay="30 minutes")
    claim(db, emails, consumer="mailer-1")
    claim(db, emails, consumer="mailer-2")
    for n in range(4):
        send(db, webhooks, {"event": "order.paid", "order": 1000 + n})
    db.execute("SELECT pgqueue.pgq_pause_queue(%s)", (webhooks,))
    send(db, reports, {"report": "daily"}, delay="2 hours")
    # The last hour's rollups, as the worker would have written them had the server been up
    # for an hour (it is seconds old): a test fixture, written as the superuser.
    db.execute(
        """INSERT INTO pgqueue.queue_minutes (queue, minute, sent, completed, dead, retried, ready, delayed, claimed)
           SELECT q, date_trunc('minute', now()) - make_interval(mins => g),
                  w * (40 + (20 * sin(g / 6.0))::int), w * (38 + (20 * sin(g / 6.0 + 0.4))::int),
                  CASE WHEN g %% 17 = 3 THEN 1 ELSE 0 END, (g %% 5 = 0)::int * w,
                  w * (12 + (8 * cos(g / 9.0))::int), w, 2 * w
             FROM generate_series(1, 59) g, (VALUES (%s, 1), (%s, 3)) v(q, w)
           ON CONFLICT DO NOTHING""",
        (emails, webhooks),
    )
    deadline = time.monotonic() + 30
    while not one(db, "SELECT ticks > 0 FROM pgqueue.worker_stats"):
        assert time.monotonic() < deadline, "the worker did not tick"
        time.sleep(0.1)
    page.goto(ADMIN_URL + "/")
    assert page.locator("#worker-health").inner_text() == "ticking"
    page.screenshot(path=str(SCREENSHOTS / "console-overview.png"), full_page=True)
    page.goto(f"{ADMIN_URL}/queues/{emails}")
    page.screenshot(path=str(SCREENSHOTS / "console-queue.png"), full_page=True)
    page.goto(f"{ADMIN_URL}/jobs/{dead}")
    page.screenshot(path=str(SCREENSHOTS / "console-job.png"), full_page=True)
    page.goto(f"{ADMIN_URL}/dead?queue={emails}")
    page.screenshot(path=str(SCREENSHOTS / "console-dead-letters.png"), full_page=True)
    for name in ("overview", "queue", "job", "dead-letters"):
        assert (SCREENSHOTS / f"console-{name}.png").stat().st_size > 10_000
    # Rendered charts, not escaped markup.
    page.goto(f"{ADMIN_URL}/queues/{emails}")
    assert page.locator("main svg.chart").count() == 2
    assert "<svg" not in page.locator("main").inner_text()


# --- the admin's console --------------------------------------------------------------------


def test_overview_counts_equal_the_database(page, db):
    q = new_queue(db, "overview")
    for n in range(3):
        send(db, q, {"n": n})
    send(db, q, {"later": True}, delay="1 hour")
    claim(db, q)
    dead_letter(db, q, {"doomed": True})
    stats_sql = "SELECT queue, ready, delayed, claimed, dead FROM pgqueue.queue_stats ORDER BY queue"
    before = db.execute(stats_sql).fetchall()
    page.goto(ADMIN_URL + "/")
    after = db.execute(stats_sql).fetchall()
    assert before == after, "the queues changed while the page loaded"
    rows = page.locator("#queues tbody tr")
    assert rows.count() == len(before)
    for queue, ready, delayed, claimed, dead in before:
        row = page.locator(f'#queues tr[data-queue="{queue}"]')
        shown = [row.locator(f'[data-col="{c}"]').inner_text().strip() for c in ("ready", "delayed", "claimed", "dead")]
        assert shown == [str(ready), str(delayed), str(claimed), str(dead)], queue
    mine = page.locator(f'#queues tr[data-queue="{q}"]')
    assert [mine.locator(f'[data-col="{c}"]').inner_text() for c in ("ready", "delayed", "claimed", "dead")] == [
        "2",
        "1",
        "1",
        "1",
    ]
    assert page.locator("#worker-health").count() == 1


def test_a_dead_letter_redriven_from_the_page_is_ready(page, db):
    q = new_queue(db, "redrive")
    msg_id = dead_letter(db, q, {"redrive": "me"}, error="upstream timeout")
    assert state(db, msg_id) == "dead"
    page.goto(f"{ADMIN_URL}/dead?queue={q}")
    row = page.locator(f'#dead tr[data-msg-id="{msg_id}"]')
    assert "upstream timeout" in row.inner_text()
    row.locator("button.redrive-one").click()
    page.wait_for_load_state()
    assert "1 dead letters redriven" in page.locator("#flash").inner_text()
    assert state(db, msg_id) == "ready"
    assert one(db, "SELECT state FROM pgqueue.messages WHERE msg_id = %s", msg_id) == "ready"


def test_pause_from_the_page_pauses_the_queue(page, db):
    q = new_queue(db, "pause")
    page.goto(f"{ADMIN_URL}/queues/{q}")
    assert paused(db, q) is False
    page.click("#pause")
    page.wait_for_load_state()
    assert paused(db, q) is True
    assert "paused" in page.locator('[data-col="paused"]').first.inner_text()
    page.click("#resume")
    page.wait_for_load_state()
    assert paused(db, q) is False


def test_search_finds_a_job_by_a_payload_field(page, db):
    q = new_queue(db, "search")
    wanted = send(db, q, {"order": 4242, "customer": f"zed-{q}"})
    send(db, q, {"order": 1, "customer": "someone else"})
    page.goto(ADMIN_URL + "/jobs")
    page.fill('input[name="payload"]', json.dumps({"customer": f"zed-{q}"}))
    page.click('#search button[type="submit"]')
    page.wait_for_load_state()
    ids = page.locator("#jobs tbody tr").evaluate_all("rows => rows.map(r => r.dataset.msgId)")
    assert ids == [str(wanted)]
    # By unique key, with and without its queue.
    keyed = send(db, q, {"invoice": 42}, dedup_key=f"invoice-42-{q}")
    for query in (f"key=invoice-42-{q}&queue={q}", f"key=invoice-42-{q}"):
        page.goto(f"{ADMIN_URL}/jobs?{query}")
        assert page.locator("#jobs tbody tr").evaluate_all("rows => rows.map(r => r.dataset.msgId)") == [str(keyed)]
    # By id, and from there the job's page.
    page.goto(f"{ADMIN_URL}/jobs?id={wanted}")
    # The link carries the job's queue: only that queue's history is read.
    page.click(f'#jobs a[href="/jobs/{wanted}?queue={q}"]')
    page.wait_for_load_state()
    assert json.loads(page.locator("#payload").inner_text()) == {"order": 4242, "customer": f"zed-{q}"}


def test_bulk_redrive_asks_first(page, db):
    q = new_queue(db, "bulk")
    ids = [dead_letter(db, q, {"n": n}) for n in range(3)]
    page.goto(f"{ADMIN_URL}/dead?queue={q}")
    for msg_id in ids:
        page.check(f'input[name="ids"][value="{q}:{msg_id}"]')
    page.click("#redrive-selected")
    page.wait_for_load_state()
    assert page.locator("#confirm").is_visible()
    assert "3 dead letters" in page.locator("#confirm").inner_text()
    # Nothing has changed yet.
    assert [state(db, i) for i in ids] == ["dead"] * 3
    page.click("#confirm-yes")
    page.wait_for_load_state()
    assert "3 dead letters redriven" in page.locator("#flash").inner_text()
    assert [state(db, i) for i in ids] == ["ready"] * 3


def test_deleting_a_dead_letter_asks_first(page, db):
    q = new_queue(db, "delete")
    msg_id = dead_letter(db, q, {"delete": "me"})
    page.goto(f"{ADMIN_URL}/dead?queue={q}")
    page.check(f'input[name="ids"][value="{q}:{msg_id}"]')
    page.click("#delete-selected")
    page.wait_for_load_state()
    assert page.locator("#confirm").is_visible()
    assert state(db, msg_id) == "dead"
    page.click("#confirm-yes")
    page.wait_for_load_state()
    assert "1 dead letters deleted" in page.locator("#flash").inner_text()
    assert state(db, msg_id) is None


def test_a_payload_with_markup_is_shown_as_text_and_runs_nothing(page, db):
    q = new_queue(db, "xss")
    payload = {"html": XSS_SCRIPT, "img": XSS_IMG}
    msg_id = dead_letter(db, q, payload, error=XSS_SCRIPT + XSS_IMG)
    db.execute("SELECT pgqueue.pgq_send(%s, %s::jsonb, headers => %s::jsonb)", (q, json.dumps(payload), json.dumps(payload)))
    for path in (f"/jobs/{msg_id}", f"/dead?queue={q}", f"/jobs?queue={q}"):
        page.goto(ADMIN_URL + path)
        page.wait_for_load_state("load")
        assert page.evaluate("typeof window.pwned") == "undefined", path
        assert page.locator("main img").count() == 0, path
        assert page.locator("main script").count() == 0, path
        assert XSS_SCRIPT in page.locator("main").inner_text(), path
    page.goto(f"{ADMIN_URL}/jobs/{msg_id}")
    assert json.loads(page.locator("#payload").inner_text()) == payload
    assert XSS_IMG in page.locator("#last-error").inner_text()


def test_security_headers_and_no_policy_violations(page, db):
    q = new_queue(db, "headers")
    response = page.goto(ADMIN_URL + "/")
    h = response.headers
    assert "default-src 'none'" in h["content-security-policy"]
    assert "frame-ancestors 'none'" in h["content-security-policy"]
    assert h["x-content-type-options"] == "nosniff"
    assert h["referrer-policy"] == "no-referrer"
    # The pages keep to their own policy: no inline style or script for it to block.
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    for path in ("/", "/jobs", "/dead", "/schedules", "/audit", "/settings"):
        page.goto(ADMIN_URL + path)
    page.goto(f"{ADMIN_URL}/queues/{q}")
    assert errors == []


def test_a_post_without_the_csrf_token_is_refused(page, db):
    q = new_queue(db, "csrf")
    url = f"{ADMIN_URL}/queues/{q}/pause"
    page.goto(f"{ADMIN_URL}/queues/{q}")
    token = csrf_cookie(page)
    assert forged_post(page, url, {}).status == 403
    assert forged_post(page, url, {"csrf": "0" * 64}).status == 403
    foreign = forged_post(page, url, {"csrf": token}, headers={"Origin": "http://evil.example"})
    assert foreign.status == 403
    assert paused(db, q) is False
    assert one(db, "SELECT count(*) FROM pgqueue.audit_log WHERE target = %s", f"queue:{q}") == 0
    # The same request with the token goes through: the refusals above were the token's.
    assert forged_post(page, url, {"csrf": token}).status == 303
    assert paused(db, q) is True


def test_the_audit_log_shows_the_actions_done(page, db):
    q = new_queue(db, "audited")
    msg_id = dead_letter(db, q, {"audit": True})
    page.goto(f"{ADMIN_URL}/queues/{q}")
    page.click("#pause")
    page.wait_for_load_state()
    page.goto(f"{ADMIN_URL}/dead?queue={q}")
    page.locator(f'#dead tr[data-msg-id="{msg_id}"] button.redrive-one').click()
    page.wait_for_load_state()
    page.goto(ADMIN_URL + "/audit")
    rows = page.locator("#audit tbody tr").filter(has_text=f"queue:{q}")
    assert rows.count() == 2
    actions = [rows.nth(i).locator('[data-col="action"]').inner_text() for i in range(2)]
    assert actions == ["redrive", "pause_queue"]
    assert str(msg_id) in rows.nth(0).inner_text()
    logged = db.execute(
        "SELECT action, detail->'msg_ids' FROM pgqueue.audit_log WHERE target = %s ORDER BY action_id", (f"queue:{q}",)
    ).fetchall()
    assert logged == [("pause_queue", None), ("redrive", [msg_id])]


def test_schedules_show_their_zone_and_run_now(page, db):
    q = new_queue(db, "sched")
    name = f"nightly-{q}"
    db.execute(
        "SELECT pgqueue.pgq_schedule(%s, %s, '0 3 * * *', time_zone => 'Europe/Berlin')", (name, q)
    )
    page.goto(ADMIN_URL + "/schedules")
    row = page.locator(f'#schedules tr[data-schedule="{name}"]')
    assert "03:00:00 Europe/Berlin" in row.inner_text()
    row.get_by_role("button", name="Run now").click()
    page.wait_for_load_state()
    assert "run_schedule" in page.locator("#flash").inner_text()
    assert one(db, "SELECT count(*) FROM pgqueue.jobs WHERE queue = %s", q) == 1
    page.locator(f'#schedules tr[data-schedule="{name}"]').get_by_role("button", name="Pause").click()
    page.wait_for_load_state()
    assert one(db, "SELECT paused FROM pgqueue.schedule_stats WHERE name = %s", name) is True


def test_settings_page_shows_pgqueue_settings(page):
    page.goto(ADMIN_URL + "/settings")
    assert "pgqueue.tick_interval" in page.locator("#settings").inner_text()
    assert page.locator("#shared-state").count() == 1


# --- a console that requires a login -----------------------------------------------------------

needs_login = pytest.mark.skipif(not LOGIN_URL, reason="no console with a login given")


@needs_login
def test_the_login_form_lets_in_and_the_audit_log_names_the_user(page, db):
    q = new_queue(db, "login")
    page.goto(f"{LOGIN_URL}/queues/{q}")
    assert page.url == LOGIN_URL + "/login"
    page.fill('input[name="secret"]', "wrong")
    page.click('button[type="submit"]')
    page.wait_for_load_state()
    assert "wrong password or token" in page.locator("main").inner_text()
    page.fill('input[name="name"]', "alice")
    page.fill('input[name="secret"]', LOGIN_PASSWORD)
    page.click('button[type="submit"]')
    page.wait_for_load_state()
    assert page.url == LOGIN_URL + "/"
    page.goto(f"{LOGIN_URL}/queues/{q}")
    page.click("#pause")
    page.wait_for_load_state()
    assert paused(db, q) is True
    assert db.execute(
        "SELECT console_user, db_role FROM pgqueue.audit_log WHERE target = %s", (f"queue:{q}",)
    ).fetchall() == [("alice", "postgres")]
    page.click('header button:has-text("log out")')
    page.wait_for_load_state()
    assert page.url == LOGIN_URL + "/login"
    page.goto(LOGIN_URL + "/")
    assert page.url == LOGIN_URL + "/login"


@needs_login
def test_without_a_session_nothing_is_shown_or_done(page, db):
    q = new_queue(db, "nologin")
    for path in ("/", f"/queues/{q}", "/jobs", "/dead", "/audit", "/settings"):
        response = page.request.get(LOGIN_URL + path, max_redirects=0)
        assert response.status == 303 and response.headers["location"] == "/login", path
    page.goto(LOGIN_URL + "/login")
    refused = forged_post(page, f"{LOGIN_URL}/queues/{q}/pause", {"csrf": csrf_cookie(page)})
    assert refused.status == 401
    assert paused(db, q) is False


@needs_login
def test_a_bearer_token_is_accepted_in_place_of_a_session(page, db):
    q = new_queue(db, "bearer")
    auth = {"Authorization": f"Bearer {LOGIN_TOKEN}"}
    assert page.request.get(f"{LOGIN_URL}/queues/{q}", headers=auth, max_redirects=0).status == 200
    wrong = {"Authorization": "Bearer not-the-token-at-all"}
    assert page.request.get(f"{LOGIN_URL}/queues/{q}", headers=wrong, max_redirects=0).status == 303
    # No browser sends a bearer header by itself, so no CSRF token is needed with one.
    assert page.request.post(f"{LOGIN_URL}/queues/{q}/pause", headers=auth, max_redirects=0).status == 303
    assert paused(db, q) is True
    assert one(db, "SELECT console_user FROM pgqueue.audit_log WHERE target = %s", f"queue:{q}") == "token"


# --- read-only consoles ---------------------------------------------------------------------


def read_only_console(page, db, url, reason):
    q = new_queue(db, "ro")
    msg_id = dead_letter(db, q, {"read": "only"})
    wait_until_visible(url, q)
    for path in ("/", f"/queues/{q}", "/dead", "/schedules", f"/jobs/{msg_id}"):
        page.goto(url + path)
        assert reason in page.locator("#read-only").inner_text(), path
        assert action_forms(page) == 0, path
    page.goto(f"{url}/queues/{q}")
    token = csrf_cookie(page)
    # A well-formed POST with the token: the console tries, the database refuses.
    refused = forged_post(page, f"{url}/queues/{q}/pause", {"csrf": token})
    assert refused.status == 403, refused.text()
    refused_redrive = forged_post(page, f"{url}/dead/redrive", {"csrf": token, "one": f"{q}:{msg_id}"})
    assert refused_redrive.status == 403
    assert paused(db, q) is False
    assert state(db, msg_id) == "dead"
    assert one(db, "SELECT count(*) FROM pgqueue.audit_log WHERE target = %s", f"queue:{q}") == 0
    return refused.text()


def wait_until_visible(url, queue):
    """Until the console at `url` shows `queue` (a standby replays it a little later)."""
    if url != STANDBY_URL:
        return
    deadline = time.monotonic() + 30
    with psycopg.connect(STANDBY_DSN, autocommit=True) as s:
        while one(s, "SELECT count(*) FROM pgqueue.queues WHERE queue = %s", queue) == 0:
            assert time.monotonic() < deadline, "the standby did not replay the queue"
            time.sleep(0.1)
        while one(s, "SELECT count(*) FROM pgqueue.jobs WHERE queue = %s AND state = 'dead'", queue) == 0:
            assert time.monotonic() < deadline, "the standby did not replay the dead letter"
            time.sleep(0.1)


@pytest.mark.skipif(not READONLY_URL, reason="no read-only console given")
def test_a_read_only_role_sees_no_actions_and_the_database_refuses_them(page, db):
    text = read_only_console(page, db, READONLY_URL, "read-only: role")
    assert "permission denied" in text


@pytest.mark.skipif(not STANDBY_URL, reason="no standby console given")
def test_the_console_on_a_standby_is_read_only(page, db):
    text = read_only_console(page, db, STANDBY_URL, "read-only: standby")
    assert "read-only transaction" in text


@pytest.mark.skipif(not FORCED_URL, reason="no --read-only console given")
def test_read_only_by_flag_hides_actions_and_the_database_refuses_them(page, db):
    # A superuser's console: only --read-only keeps it from acting, by a READ ONLY transaction.
    text = read_only_console(page, db, FORCED_URL, "read-only: started with --read-only")
    assert "read-only transaction" in text

