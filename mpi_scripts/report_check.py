#!/usr/bin/env python3
"""Opens a report page (mpi_scripts/report_page.py's index.html) in headless Chromium and checks
what a reader would see (issue 60):

    report_check.py PAGE.html SCREENSHOT.png [--chromium /usr/bin/chromium]

Fails (exit 1, one line per problem) on
  - an image that did not load (<img> not complete or naturalWidth 0; an inline <svg> with no
    drawn element),
  - an empty table (no <td> in it),
  - a script error (Runtime.exceptionThrown, or a console error from a failed load),
  - a link to a file that is not there (every href that is not a #fragment, resolved beside the
    page; http(s) links are refused: the page must work with no network),
  - a page with no section (no <section> with an <h2>),
  - with report.json beside the page: an image or a table it lists that the page does not show (the
    page's <img alt> is the image's path, a table's <caption> its caption; page_tables lists every
    table the page was written with, the first section's and the machine table included), so that
    an image or a table removed from the page fails even though nothing left on it is broken;
and saves a screenshot of the whole page. Exit 0 prints what was checked (images, tables, links).

Chromium is driven over its DevTools protocol on a pipe (--remote-debugging-pipe: messages are
JSON terminated by a NUL byte, ours on fd 3, its answers on fd 4), so nothing listens on a port and
no package beyond Debian's chromium is needed. It is started with the flags that keep it off the
network (no first run, no background networking, no component update, no sync) and a fresh profile.
"""
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--remote-debugging-pipe"]

# Run in the page once it has loaded: what the DOM holds (the links are checked in Python, beside
# the file).
PROBE = r"""
(() => {
  const imgs = [...document.images].map((i, k) => ({
    what: i.alt || i.getAttribute('src').slice(0, 60) || ('image ' + k),
    ok: i.complete && i.naturalWidth > 0}));
  const svgs = [...document.querySelectorAll('svg')].map((s, k) => ({
    what: s.getAttribute('aria-label') || ('svg ' + k),
    ok: s.querySelectorAll('rect,path,line,polyline,circle,text').length > 0 &&
        s.getBoundingClientRect().width > 0}));
  const tables = [...document.querySelectorAll('table')].map((t, k) => ({
    what: (t.caption && t.caption.textContent) || t.id || ('table ' + k),
    cells: t.querySelectorAll('td').length}));
  const links = [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href'));
  const sections = [...document.querySelectorAll('section')].filter(s => s.querySelector('h2'))
    .map(s => s.querySelector('h2').textContent);
  return JSON.stringify({imgs, svgs, tables, links, sections,
                         height: document.documentElement.scrollHeight});
})()
"""


class Pipe:
    """The DevTools protocol over Chromium's pipe."""

    def __init__(self, chromium, profile):
        r_ours, w_theirs = os.pipe()   # Chromium writes to fd 4
        r_theirs, w_ours = os.pipe()   # Chromium reads fd 3

        def fds():
            os.dup2(r_theirs, 3)
            os.dup2(w_theirs, 4)
        self.proc = subprocess.Popen([chromium, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                     # (3 and 4 kept: the fds closed after preexec_fn are all the others)
                                     preexec_fn=fds, pass_fds=(3, 4),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(r_theirs)
        os.close(w_theirs)
        self.r, self.w = os.fdopen(r_ours, "rb", buffering=0), os.fdopen(w_ours, "wb", buffering=0)
        self.buf, self.next_id, self.events = b"", 0, []

    def send(self, method, params=None, session=None, timeout=60):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.w.write(json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            m = self.read(deadline)
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error'].get('message')}")
                return m.get("result", {})
            self.events.append(m)

    def read(self, deadline):
        while b"\0" not in self.buf:
            if time.time() > deadline:
                raise TimeoutError("Chromium did not answer in time")
            chunk = self.r.read(1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed its pipe (did it start?)")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def wait_event(self, method, session, timeout=60):
        deadline = time.time() + timeout
        for m in self.events:
            if m.get("method") == method and m.get("sessionId") == session:
                return m
        while True:
            m = self.read(deadline)
            self.events.append(m)
            if m.get("method") == method and m.get("sessionId") == session:
                return m

    def close(self):
        try:
            self.send("Browser.close", timeout=10)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def link_problem(page, href):
    """None when the link is fine, else why not."""
    if href.startswith("#"):
        return None
    u = urllib.parse.urlparse(href)
    if u.scheme in ("http", "https"):
        return f"a link leaves the machine ({href}): the page must work with no network"
    if u.scheme not in ("", "file"):
        return None if u.scheme in ("data", "mailto") else f"a link with scheme {u.scheme}: ({href})"
    path = urllib.parse.unquote(u.path)
    target = path if os.path.isabs(path) else os.path.join(os.path.dirname(os.path.abspath(page)), path)
    return None if os.path.exists(target) else f"a link to a file that is not there: {href}"


def check(page, screenshot, chromium="/usr/bin/chromium"):
    """Returns (problems, summary)."""
    if not os.path.exists(page):
        return [f"no page at {page}"], {}
    profile = tempfile.mkdtemp(prefix="pwm-report-chromium-")
    problems = []
    b = Pipe(chromium, profile)
    try:
        target = b.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        s = b.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            b.send(f"{domain}.enable", session=s)
        b.send("Page.navigate", {"url": "file://" + os.path.abspath(page)}, session=s)
        b.wait_event("Page.loadEventFired", s)
        info = json.loads(b.send("Runtime.evaluate", {"expression": PROBE, "returnByValue": True},
                                 session=s)["result"]["value"])
        # The whole page in one image: the viewport as tall as the page (capped: Chromium's limit).
        height = min(max(int(info["height"]), 600), 16000)
        b.send("Emulation.setDeviceMetricsOverride",
               {"width": 1280, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=s)
        shot = b.send("Page.captureScreenshot", {"format": "png"}, session=s)["data"]
        with open(screenshot, "wb") as f:
            f.write(base64.b64decode(shot))
        for m in b.events:
            if m.get("sessionId") != s:
                continue
            if m.get("method") == "Runtime.exceptionThrown":
                d = m["params"]["exceptionDetails"]
                text = d.get("exception", {}).get("description") or d.get("text")
                problems.append(f"a script error: {text.splitlines()[0] if text else '?'}")
            elif m.get("method") == "Log.entryAdded" and m["params"]["entry"]["level"] == "error":
                problems.append(f"a console error: {m['params']['entry'].get('text', '')[:200]}")
    finally:
        b.close()
        shutil.rmtree(profile, ignore_errors=True)
    for i in info["imgs"]:
        if not i["ok"]:
            problems.append(f"an image that did not load: {i['what']}")
    for i in info["svgs"]:
        if not i["ok"]:
            problems.append(f"an inline SVG with nothing drawn: {i['what']}")
    for t in info["tables"]:
        if t["cells"] == 0:
            problems.append(f"an empty table: {t['what']}")
    for href in info["links"]:
        p = link_problem(page, href)
        if p:
            problems.append(p)
    if not info["sections"]:
        problems.append("the page has no section")
    doc = None
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(page)), "report.json")) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        pass
    if doc:
        shown_imgs = {i["what"] for i in info["imgs"] if i["ok"]}
        shown_tables = [t["what"] for t in info["tables"] if t["cells"] > 0]
        for s in doc.get("studies", []):
            for img in s.get("images", []):
                if img not in shown_imgs:
                    problems.append(f"an image of report.json missing from the page: {img}")
            for t in s.get("tables", []):
                if t["caption"] not in shown_tables:
                    problems.append(f"a table of report.json missing from the page: {s['name']}: {t['caption'][:80]}")
        listed = {t["caption"] for s in doc.get("studies", []) for t in s.get("tables", [])}
        for caption in doc.get("page_tables", []):  # (the first section's and the machine table too)
            if caption not in shown_tables and caption not in listed:
                problems.append(f"a table of the page (report.json's page_tables) missing from it: {caption[:80]}")
    summary = {"images": len(info["imgs"]), "svgs": len(info["svgs"]), "tables": len(info["tables"]),
               "links": len(info["links"]), "sections": info["sections"]}
    return problems, summary


def main(argv):
    args = [a for a in argv if not a.startswith("--chromium")]
    chromium = next((a.split("=", 1)[1] for a in argv if a.startswith("--chromium=")), "/usr/bin/chromium")
    if len(args) != 2:
        sys.exit("usage: report_check.py PAGE.html SCREENSHOT.png [--chromium=PATH]")
    if not os.access(chromium, os.X_OK):
        sys.exit(f"report_check.py: error: no Chromium at {chromium} (env.sh's pwm_install_report_tools installs it)")
    problems, summary = check(args[0], args[1], chromium)
    for p in problems:
        print(f"report_check.py: {p}")
    if problems:
        print(f"report_check.py: {args[0]}: {len(problems)} problem(s); screenshot {args[1]}")
        return 1
    print(f"report_check.py: {args[0]} passed: {summary['sections'].__len__()} sections, {summary['tables']} tables, "
          f"{summary['images']} images, {summary['svgs']} inline SVGs, {summary['links']} links; screenshot {args[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
