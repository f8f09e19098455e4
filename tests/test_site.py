"""The built site in a real browser: headless Chromium (Debian's package) driven by selenium.

Needs the built book (``./dev book`` writes it to ``_build/html``; ``BOOK_HTML`` overrides the
folder) and Chromium with its driver (``apt-get install -y chromium chromium-driver``). Neither
missing piece is skipped silently: the test fails and says how to get it, because a site that
was never opened in a browser is not tested.

Checks every page of the TOC: it loads, MathJax typeset it (``mjx-container`` present, no raw
TeX delimiters outside code), every image decoded (naturalWidth > 0), a page whose notebook
draws figures shows them, every internal link and
anchor resolves, no SEVERE console message, and no request left 127.0.0.1 (the site must work
offline). Plays the animation and answers the quiz. Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import threading
import time
import urllib.request
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urldefrag, urlparse

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
HTML = Path(os.environ.get("BOOK_HTML", ROOT / "_build" / "html"))
ARTIFACTS = ROOT / "test-artifacts"
INSTALL_HINT = (
    "the browser test needs Chromium and its driver: apt-get install -y chromium chromium-driver "
    "(Debian/Ubuntu), and selenium from the test extra"
)


def toc_pages() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = [toc["root"]]
    for part in toc["parts"]:
        pages += [c["file"] for c in part["chapters"]]
    return [f"{p}.html" for p in pages]


PAGES = toc_pages()


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path == "/favicon.ico":  # the browser asks for it; the site has none
            self.send_response(204)
            self.end_headers()
            return
        super().do_GET()


@pytest.fixture(scope="module")
def site():
    if not (HTML / "index.html").is_file():
        pytest.fail(f"no built book at {HTML}: run ./dev book first (or set BOOK_HTML)")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(HTML)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is not installed; " + INSTALL_HINT)
    chrome = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                   if shutil.which(n)), None)
    driver_path = shutil.which("chromedriver")
    if not chrome or not driver_path:
        pytest.fail("Chromium or chromedriver not found; " + INSTALL_HINT)
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1280,1600",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
                 # Offline for real: any host but 127.0.0.1 fails to resolve.
                 "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    ARTIFACTS.mkdir(exist_ok=True)
    yield driver
    driver.quit()


def open_page(driver, url: str) -> None:
    driver.get(url)
    driver.execute_async_script(
        """const done = arguments[arguments.length - 1];
        const wait = () => {
          if (document.readyState !== 'complete') { return setTimeout(wait, 50); }
          if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
            MathJax.startup.promise.then(() => done(true), () => done(false));
          } else { done(true); }
        };
        wait();"""
    )


TEXT_OUTSIDE_CODE = """
const clone = document.querySelector('main, article, body').cloneNode(true);
clone.querySelectorAll('pre, code, script, style, mjx-container, .cell_input').forEach(e => e.remove());
return clone.innerText;
"""


def test_site_static_files_have_no_external_scripts_or_fonts():
    if not (HTML / "index.html").is_file():
        pytest.fail(f"no built book at {HTML}: run ./dev book first (or set BOOK_HTML)")
    assert (HTML / "_static" / "mathjax" / "tex-mml-chtml.js").is_file(), "local MathJax missing"
    external = re.compile(r"<(script|link)[^>]+(src|href)=\"(https?:)?//", re.I)
    for page in HTML.rglob("*.html"):
        for m in external.finditer(page.read_text(errors="replace")):
            tag = page.read_text()[m.start(): m.start() + 200]
            # <link> to other sites is fine only as a plain hyperlink relation, never a stylesheet/script.
            assert m.group(1).lower() == "link" and "stylesheet" not in tag and "preload" not in tag, (
                f"{page.relative_to(HTML)} loads {tag!r}"
            )


def figures_drawn(page: str) -> int:
    """How many times the page's notebook calls plt.show() in its code cells."""
    import json

    nb = json.loads((ROOT / "book" / page.replace(".html", ".ipynb")).read_text())
    return sum("".join(c["source"]).count("plt.show()") for c in nb["cells"]
               if c["cell_type"] == "code")


def test_site_every_toc_page_in_the_browser(site, browser):
    internal_links: set[str] = set()
    failures = []
    for page in PAGES:
        url = site + page
        open_page(browser, url)
        state = browser.execute_script(
            """return {
              title: document.title,
              h1: document.querySelectorAll('h1').length,
              mathSource: document.querySelectorAll('.math, span.math, div.math').length,
              mjx: document.querySelectorAll('mjx-container').length,
              badImages: [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src),
              images: document.images.length,
              figures: [...document.images].filter(i => i.src.includes('/_images/')).length,
              links: [...document.querySelectorAll('a[href]')].map(a => a.href),
              resources: performance.getEntriesByType('resource').map(r => r.name),
            };"""
        )
        text = browser.execute_script(TEXT_OUTSIDE_CODE)
        logs = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        if state["h1"] < 1 or "404" in state["title"]:
            failures.append(f"{page}: did not load ({state['title']!r})")
        if state["mathSource"] and not state["mjx"]:
            failures.append(f"{page}: math present but MathJax typeset nothing")
        for raw in ("$$", "\\(", "\\[", "\\frac"):
            if raw in text:
                failures.append(f"{page}: raw TeX {raw!r} visible")
        if figures_drawn(page) and not state["figures"]:
            failures.append(f"{page}: the notebook draws {figures_drawn(page)} figure(s) but the "
                            "page shows none (was the book built with a non-inline matplotlib "
                            "backend?)")
        if state["badImages"]:
            failures.append(f"{page}: images not loaded: {state['badImages']}")
        if logs:
            failures.append(f"{page}: console errors: {[e['message'] for e in logs]}")
        offsite = [r for r in state["resources"] if not r.startswith(site)]
        if offsite:
            failures.append(f"{page}: fetched from outside the site: {offsite}")
        internal_links.update(h for h in state["links"] if h.startswith(site))
    assert not failures, "\n".join(failures)

    # Every internal link resolves, and its #anchor exists on the target page.
    html_cache: dict[str, str] = {}
    broken = []
    for link in sorted(internal_links):
        target, fragment = urldefrag(link)
        if target not in html_cache:
            try:
                with urllib.request.urlopen(target) as r:
                    html_cache[target] = r.read().decode(errors="replace")
            except Exception as e:  # noqa: BLE001 (report every broken link at once)
                broken.append(f"{link}: {e}")
                continue
        if fragment and urlparse(target).path.endswith(".html"):
            if f'id="{fragment}"' not in html_cache[target]:
                broken.append(f"{link}: no element with id {fragment!r}")
    assert not broken, "\n".join(broken)
    assert len(internal_links) > len(PAGES)


def test_site_animation_plays(site, browser):
    from selenium.webdriver.common.by import By

    open_page(browser, site + "chapters/animation.html")
    root = browser.find_element(By.ID, "fa-anim")
    frame = root.find_element(By.CLASS_NAME, "fa-frame")
    first = frame.text
    assert first.startswith("step 1 / "), first
    total = int(first.split("/")[1])
    counter = lambda: int(root.find_element(By.CLASS_NAME, "fa-counter").text)  # noqa: E731
    c0 = counter()
    nxt = root.find_element(By.CSS_SELECTOR, "[data-act=next]")
    for _ in range(5):
        nxt.click()
    assert frame.text == f"step 6 / {total}"
    assert counter() > c0, "the IO counter must rise as tiles are loaded"
    assert root.find_elements(By.CSS_SELECTOR, "svg rect"), "the SVG drew no tiles"
    browser.save_screenshot(str(ARTIFACTS / "animation_step6.png"))
    root.find_element(By.CSS_SELECTOR, "[data-act=reset]").click()
    root.find_element(By.CSS_SELECTOR, "[data-act=play]").click()
    time.sleep(2.2)
    playing_at = int(frame.text.split()[1])
    assert playing_at >= 2, "play did not advance the animation"
    root.find_element(By.CSS_SELECTOR, "[data-act=play]").click()  # pause
    for _ in range(total + 2):
        nxt.click()
    assert frame.text == f"step {total} / {total}"
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def test_site_quiz_checks_answers(site, browser):
    from selenium.webdriver.common.by import By

    open_page(browser, site + "chapters/07_interview_questions.html")
    cards = browser.find_elements(By.CSS_SELECTOR, "#fa-quiz .fq-card")
    assert len(cards) == 10
    q1 = cards[0]
    q1.find_elements(By.TAG_NAME, "input")[1].click()  # B: less HBM traffic (right)
    q1.find_element(By.TAG_NAME, "button").click()
    assert "fq-ok" in q1.find_element(By.CLASS_NAME, "fq-fb").get_attribute("class")
    q10 = cards[9]
    q10.find_elements(By.TAG_NAME, "input")[2].click()  # C: wrong
    q10.find_element(By.TAG_NAME, "button").click()
    feedback = q10.find_element(By.CLASS_NAME, "fq-fb")
    assert "fq-bad" in feedback.get_attribute("class")
    assert "80%" in feedback.text  # the corrected saving, computed by the page's cell
    score = browser.find_element(By.CSS_SELECTOR, "#fa-quiz .fq-score").text
    assert score.startswith("Score: 1 / 10 (2 answered)"), score
    browser.execute_script("arguments[0].scrollIntoView()", q10)
    browser.save_screenshot(str(ARTIFACTS / "quiz.png"))
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


@pytest.mark.parametrize("page", ["intro.html", "chapters/01_memory_hierarchy.html",
                                  "chapters/04_online_softmax.html", "appendix/errata.html"])
def test_site_screenshots(site, browser, page):
    open_page(browser, site + page)
    path = ARTIFACTS / (page.replace("/", "_").replace(".html", ".png"))
    assert browser.save_screenshot(str(path))
    assert path.stat().st_size > 10_000


def test_site_every_notebook_page_has_a_colab_button():
    if not (HTML / "index.html").is_file():
        pytest.fail(f"no built book at {HTML}: run ./dev book first (or set BOOK_HTML)")
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    repo = config["repository"]["url"].removeprefix("https://github.com/")
    for page in PAGES:
        source = ROOT / "book" / page.replace(".html", ".ipynb")
        if not source.is_file():
            continue  # Markdown placeholders have no notebook to launch
        # The button opens the build's Colab copy, published with the site (book/_ext/colab_copies.py).
        expected = f"https://colab.research.google.com/github/{repo}/blob/gh-pages/_colab/{page.replace('.html', '.ipynb')}"
        assert expected in (HTML / page).read_text(), f"{page}: no Colab launch button ({expected})"
