"""The built site in a real browser: headless Chromium (Debian's package) driven by selenium.

Needs the built book (``./dev book`` writes it to ``_build/html``; ``BOOK_HTML`` overrides the
folder) and Chromium with its driver (``apt-get install -y chromium chromium-driver``). Neither
missing piece is skipped silently: the test fails and says how to get it, because a site that
was never opened in a browser is not tested.

Checks every page of the TOC: it loads, MathJax typeset it (``mjx-container`` present, no raw
TeX delimiters outside code), every image decoded (naturalWidth > 0), a page whose notebook
draws figures shows them, every internal link and
anchor resolves, no SEVERE console message, no request the server answered with an error (a
404: a favicon, a MathJax component), and no request left 127.0.0.1 (the site must work
offline). Plays the animation and answers the quiz. On a phone (375 px, Chrome's mobile
emulation): no page is wider than the screen, the menu buttons open the sidebars (and collapse
the sidebar on a wide screen), the animation
draws readable text. MathJax's accessibility components load when a reader turns them on.
Screenshots go to ``test-artifacts/``.
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


PHONE = {"width": 375, "height": 812, "deviceScaleFactor": 2, "mobile": True}  # an iPhone X/11 Pro
SERVER_ERRORS: list[str] = []  # "404 /path" for every request the test server could not answer


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def send_error(self, code, *args, **kwargs):  # a missing file: recorded, and a test fails
        SERVER_ERRORS.append(f"{int(code)} {self.path}")
        super().send_error(code, *args, **kwargs)


@pytest.fixture(scope="module")
def site():
    if not (HTML / "index.html").is_file():
        pytest.fail(f"no built book at {HTML}: run ./dev book first (or set BOOK_HTML)")
    server = ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(HTML))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def _chromium(tmp_path_factory):
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is not installed; " + INSTALL_HINT)
    chrome = next(
        (
            shutil.which(n)
            for n in ("chromium", "chromium-browser", "google-chrome")
            if shutil.which(n)
        ),
        None,
    )
    driver_path = shutil.which("chromedriver")
    if not chrome or not driver_path:
        pytest.fail("Chromium or chromedriver not found; " + INSTALL_HINT)
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1280,1600",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
        # Offline for real: any host but 127.0.0.1 fails to resolve.
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    ):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    ARTIFACTS.mkdir(exist_ok=True)
    return driver


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = _chromium(tmp_path_factory)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def phone(tmp_path_factory):
    """Chromium emulating a 375 px wide phone (a headless window cannot be narrower than 500)."""
    driver = _chromium(tmp_path_factory)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", PHONE)
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
# $x$ left as text: inline math MathJax never saw (e.g. Markdown glued without the :myst format).
RAW_INLINE_MATH = re.compile(r"\$[^$\s][^$\n]{0,80}\$")


def test_site_static_files_have_no_external_scripts_or_fonts():
    if not (HTML / "index.html").is_file():
        pytest.fail(f"no built book at {HTML}: run ./dev book first (or set BOOK_HTML)")
    assert (HTML / "_static" / "mathjax" / "tex-mml-chtml.js").is_file(), "local MathJax missing"
    external = re.compile(r"<(script|link)[^>]+(src|href)=\"(https?:)?//", re.I)
    for page in HTML.rglob("*.html"):
        for m in external.finditer(page.read_text(errors="replace")):
            tag = page.read_text()[m.start() : m.start() + 200]
            # <link> to other sites is fine only as a plain hyperlink relation, never a stylesheet/script.
            assert (
                m.group(1).lower() == "link" and "stylesheet" not in tag and "preload" not in tag
            ), f"{page.relative_to(HTML)} loads {tag!r}"


def figures_drawn(page: str) -> int:
    """How many times the page's notebook calls plt.show() in its code cells."""
    import json

    nb = json.loads((ROOT / "book" / page.replace(".html", ".ipynb")).read_text())
    return sum(
        "".join(c["source"]).count("plt.show()") for c in nb["cells"] if c["cell_type"] == "code"
    )


def _page_failures(browser, site, page, state) -> list[str]:
    """What is wrong with one loaded page: math, images, console, off-site fetches."""
    failures = []
    text = browser.execute_script(TEXT_OUTSIDE_CODE)
    logs = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    if state["h1"] < 1 or "404" in state["title"]:
        failures.append(f"{page}: did not load ({state['title']!r})")
    if state["mathSource"] and not state["mjx"]:
        failures.append(f"{page}: math present but MathJax typeset nothing")
    for raw in ("$$", "\\(", "\\[", "\\frac"):
        if raw in text:
            failures.append(f"{page}: raw TeX {raw!r} visible")
    for raw in RAW_INLINE_MATH.findall(text):
        failures.append(f"{page}: raw inline math {raw!r} visible")
    if figures_drawn(page) and not state["figures"]:
        failures.append(
            f"{page}: the notebook draws {figures_drawn(page)} figure(s) but the "
            "page shows none (was the book built with a non-inline matplotlib "
            "backend?)"
        )
    if state["badImages"]:
        failures.append(f"{page}: images not loaded: {state['badImages']}")
    if logs:
        failures.append(f"{page}: console errors: {[e['message'] for e in logs]}")
    offsite = [r for r in state["resources"] if not r.startswith(site)]
    if offsite:
        failures.append(f"{page}: fetched from outside the site: {offsite}")
    if SERVER_ERRORS:
        failures.append(f"{page}: the server could not answer {SERVER_ERRORS}")
        SERVER_ERRORS.clear()
    return failures


def _broken_links(internal_links) -> list[str]:
    """Internal links that do not resolve, or whose #anchor is missing on the target page."""
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
        has_anchor = f'id="{fragment}"' in html_cache[target]
        if fragment and urlparse(target).path.endswith(".html") and not has_anchor:
            broken.append(f"{link}: no element with id {fragment!r}")
    return broken


def test_site_every_toc_page_in_the_browser(site, browser):
    internal_links: set[str] = set()
    failures = []
    SERVER_ERRORS.clear()
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
        failures += _page_failures(browser, site, page, state)
        internal_links.update(h for h in state["links"] if h.startswith(site))
    assert not failures, "\n".join(failures)

    # Every internal link resolves, and its #anchor exists on the target page.
    broken = _broken_links(internal_links)
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


@pytest.mark.parametrize(
    "page",
    [
        "intro.html",
        "chapters/01_memory_hierarchy.html",
        "chapters/04_online_softmax.html",
        "appendix/errata.html",
    ],
)
def test_site_screenshots(site, browser, page):
    open_page(browser, site + page)
    path = ARTIFACTS / (page.replace("/", "_").replace(".html", ".png"))
    assert browser.save_screenshot(str(path))
    assert path.stat().st_size > 10_000


def test_site_every_notebook_page_has_a_colab_button():
    if not (HTML / "index.html").is_file():
        pytest.fail(f"no built book at {HTML}: run ./dev book first (or set BOOK_HTML)")
    from course_kernels.colab import REPOSITORY_URL

    repo = REPOSITORY_URL.removeprefix("https://github.com/")
    for page in PAGES:
        source = ROOT / "book" / page.replace(".html", ".ipynb")
        if not source.is_file():
            continue  # Markdown placeholders have no notebook to launch
        # The button opens the build's Colab copy, published with the site (book/_ext/colab_copies.py).
        expected = f"https://colab.research.google.com/github/{repo}/blob/gh-pages/_colab/{page.replace('.html', '.ipynb')}"
        assert expected in (HTML / page).read_text(), f"{page}: no Colab launch button ({expected})"


WIDER_THAN_SCREEN = """
const vw = document.documentElement.clientWidth;
// Elements sticking out past the right edge, unless an ancestor clips or scrolls them (a wide
// code block scrolling inside its own box is fine); outermost offenders only.
const clipped = e => {
  for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
    if (getComputedStyle(a).overflowX !== 'visible') { return true; }
  }
  return false;
};
const wide = [...document.querySelectorAll('body *')].filter(e => {
  const b = e.getBoundingClientRect();
  return b.width > 0 && b.right > vw + 1 && !clipped(e) && !e.closest('dialog, .bd-sidebar-secondary, .skip-link');
});
return {
  viewport: vw,
  document: document.documentElement.scrollWidth,
  culprits: wide.filter(e => !wide.includes(e.parentElement)).slice(0, 5)
    .map(e => `<${e.tagName.toLowerCase()} class="${e.className}"> ${(e.textContent || '').trim().slice(0, 60)}`),
};
"""


def test_site_on_a_phone_no_page_scrolls_sideways(site, phone):
    """At 375 px no page is wider than the screen, and no page logs an error or a 404."""
    failures = []
    SERVER_ERRORS.clear()
    for page in PAGES:
        open_page(phone, site + page)
        width = phone.execute_script(WIDER_THAN_SCREEN)
        assert width["viewport"] == PHONE["width"], width  # the emulation is on
        if width["document"] > width["viewport"]:
            failures.append(
                f"{page}: {width['document']} px wide on a {width['viewport']} px "
                f"screen; sticking out: {width['culprits']}"
            )
        logs = [e["message"] for e in phone.get_log("browser") if e["level"] == "SEVERE"]
        if logs:
            failures.append(f"{page}: console errors: {logs}")
        if SERVER_ERRORS:
            failures.append(f"{page}: the server could not answer {SERVER_ERRORS}")
            SERVER_ERRORS.clear()
    assert not failures, "\n".join(failures)


def _visible_toggle(driver, selector):
    from selenium.webdriver.common.by import By

    shown = [b for b in driver.find_elements(By.CSS_SELECTOR, selector) if b.is_displayed()]
    assert shown, f"no visible {selector} button on this page"
    return shown[0]


def test_site_on_a_phone_menu_buttons_open_the_sidebars(site, phone):
    """The buttons a phone shows open the table of contents and the page's contents."""
    from selenium.webdriver.common.keys import Keys

    open_page(phone, site + "chapters/03_tiling.html")
    primary = phone.execute_script("return document.getElementById('pst-primary-sidebar-modal')")
    assert not phone.execute_script("return arguments[0].open", primary)
    _visible_toggle(phone, ".primary-toggle").click()
    time.sleep(0.5)  # the dialog is opened by the click handler; give the paint a moment
    state = phone.execute_script(
        """const d = arguments[0], r = d.getBoundingClientRect();
        const links = [...d.querySelectorAll('a')].filter(a => a.getBoundingClientRect().width > 0);
        return {open: d.open, width: r.width, left: r.left, links: links.map(a => a.textContent.trim())};""",
        primary,
    )
    phone.save_screenshot(str(ARTIFACTS / "phone_sidebar_open.png"))
    assert state["open"], "the menu button did not open the sidebar (pydata-sphinx-theme#2451)"
    assert state["width"] > 200 and state["left"] >= 0, state
    assert any("Tiling" in t for t in state["links"]), state["links"]
    assert len(state["links"]) >= len(PAGES) - 1, state["links"]  # the whole table of contents
    phone.switch_to.active_element.send_keys(Keys.ESCAPE)
    time.sleep(0.3)
    assert not phone.execute_script("return arguments[0].open", primary), "Escape did not close it"

    secondary = phone.execute_script(
        "return document.getElementById('pst-secondary-sidebar-modal')"
    )
    _visible_toggle(phone, ".secondary-toggle").click()
    time.sleep(0.5)
    assert phone.execute_script("return arguments[0].open", secondary), (
        "the 'contents' button did not open the page's table of contents"
    )
    headings = phone.execute_script(
        "return [...arguments[0].querySelectorAll('a')].map(a => a.textContent.trim())", secondary
    )
    assert headings, "the page's table of contents is empty"
    phone.switch_to.active_element.send_keys(Keys.ESCAPE)
    assert not [e for e in phone.get_log("browser") if e["level"] == "SEVERE"]


def test_site_on_a_phone_animation_is_readable(site, phone):
    """The animation fits the screen and its smallest text is drawn at least 10 px tall."""
    from selenium.webdriver.common.by import By

    open_page(phone, site + "chapters/animation.html")
    root = phone.find_element(By.ID, "fa-anim")
    nxt = root.find_element(By.CSS_SELECTOR, "[data-act=next]")
    for _ in range(2):  # step 3: a score tile, the running statistics and the accumulator
        nxt.click()
    phone.execute_script("arguments[0].scrollIntoView()", root)
    geo = phone.execute_script(
        """const r = arguments[0], s = r.querySelector('svg').getBoundingClientRect();
        const texts = [...r.querySelectorAll('svg text')].filter(t => t.textContent.trim());
        const h = texts.map(t => t.getBoundingClientRect().height);
        const glyph = parseFloat(getComputedStyle(texts[0]).fontSize);
        // font size on screen = font size in SVG units * (drawn width / viewBox width)
        return {left: s.left, right: s.right, vw: document.documentElement.clientWidth,
                px: glyph * s.width / r.querySelector('svg').viewBox.baseVal.width,
                texts: texts.length, minHeight: Math.min(...h)};""",
        root,
    )
    phone.save_screenshot(str(ARTIFACTS / "phone_animation.png"))
    assert geo["texts"] > 20, geo
    assert geo["left"] >= 0 and geo["right"] <= geo["vw"], f"the animation sticks out: {geo}"
    assert geo["px"] >= 10, f"the animation's text is {geo['px']:.1f} px on a phone: {geo}"
    assert root.find_element(By.CLASS_NAME, "fa-frame").text.startswith("step 3 / ")


def test_site_mathjax_accessibility_components_load(site, browser):
    """A reader who turns on MathJax's explorer and speech (its menu stores that in
    localStorage) gets them, not a 404 for a11y/sre.js and the speech rules."""
    SERVER_ERRORS.clear()
    page = site + "chapters/04_online_softmax.html"
    open_page(browser, page)
    browser.execute_script(
        "localStorage.setItem('MathJax-Menu-Settings', JSON.stringify("
        "{explorer: true, speech: true, braille: true}))"
    )
    try:
        open_page(browser, page)
        spoken = 0
        for _ in range(300):  # the speech rule engine loads after the first typesetting (<= 30 s)
            spoken = browser.execute_script(
                "return document.querySelectorAll('mjx-container [data-semantic-speech], "
                "mjx-container[aria-label]').length"
            )
            if spoken:
                break
            time.sleep(0.1)
        errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        browser.execute_script("localStorage.removeItem('MathJax-Menu-Settings')")
    assert not SERVER_ERRORS, f"missing MathJax components: {SERVER_ERRORS}"
    assert not errors, errors
    assert spoken, "MathJax's speech never labelled the math"


def test_site_wide_screen_menu_button_collapses_the_sidebar(site, browser):
    """On a wide screen the same button hides the table of contents and brings it back."""
    open_page(browser, site + "chapters/03_tiling.html")
    hidden = "return document.getElementById('pst-primary-sidebar').classList.contains('pst-sidebar-hidden')"
    assert not browser.execute_script(hidden)
    _visible_toggle(browser, ".primary-toggle").click()
    assert browser.execute_script(hidden), "the menu button did not collapse the sidebar"
    assert not browser.execute_script(
        "return document.getElementById('pst-primary-sidebar-modal').open"
    )
    _visible_toggle(browser, ".primary-toggle").click()
    assert not browser.execute_script(hidden), "the menu button did not bring the sidebar back"


PHONE_390 = {"width": 390, "height": 844, "deviceScaleFactor": 3, "mobile": True}  # iPhone 12-14
PHONE_390_PAGES = [
    "chapters/03_tiling.html",
    "chapters/05_io_complexity.html",
    "part2/hopper.html",
    "part2/below_triton.html",
    "part2/performance.html",
    "part2/beyond_one_gpu.html",
    "chapters/backward_pass.html",
    "chapters/execution_model.html",
    # every other page with a multi-panel figure (tests/test_panels.py: cells tagged "panels")
    "chapters/04_online_softmax.html",
    "part2/backward_and_recomputation.html",
    "part2/tuning.html",
    "part2/applications.html",
]
OVERFLOWING = """
const out = [];
document.querySelectorAll('.bd-article mjx-container[display="true"]').forEach(m => {
  if (m.scrollWidth > m.clientWidth + 1) {
    out.push(`equation ${m.scrollWidth} px in ${m.clientWidth}: ${(m.textContent || '').slice(0, 40)}`);
  }
});
document.querySelectorAll('.bd-article .cell_output img').forEach(i => {
  const box = i.closest('.cell_output').getBoundingClientRect(), b = i.getBoundingClientRect();
  if (b.right > box.right + 1 || b.left < box.left - 1) { out.push(`figure ${i.src.slice(-40)}`); }
  if (i.closest('.tag_panels') && b.width < 0.9 * box.width) {
    out.push(`panel not stacked: ${Math.round(b.width)} of ${Math.round(box.width)} px`);
  }
});
return out;
"""


@pytest.fixture(scope="module")
def phone390(tmp_path_factory):
    driver = _chromium(tmp_path_factory)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", PHONE_390)
    yield driver
    driver.quit()


def test_site_at_390_px_equations_and_figures_fit(site, phone390):
    """At 390 px no display equation or figure is wider than its box (equations scale down or
    are written on two lines; multi-panel figures come one panel per image, stacked)."""
    failures = []
    for page in PHONE_390_PAGES:
        open_page(phone390, site + page)
        time.sleep(0.3)  # phone_view.js scales wide equations once MathJax is done
        failures += [f"{page}: {x}" for x in phone390.execute_script(OVERFLOWING)]
        phone390.save_screenshot(str(ARTIFACTS / f"phone390_{page.replace('/', '_')}.png"))
    assert not failures, "\n".join(failures)


def test_site_at_390_px_wide_table_keeps_first_column_and_header(site, phone390):
    """The performance page's wide tables scroll in their box; the first column stays in view."""
    open_page(phone390, site + "part2/performance.html")
    state = phone390.execute_script(
        """const wraps = [...document.querySelectorAll('.bd-article .pst-scrollable-table-container')]
             .filter(w => w.scrollWidth > w.clientWidth + 1);
           if (!wraps.length) { return null; }
           const w = wraps[0], cell = w.querySelector('tbody tr td'), head = w.querySelector('thead th');
           w.scrollIntoView();
           const before = cell.getBoundingClientRect().left;
           w.scrollLeft = w.scrollWidth;
           const after = cell.getBoundingClientRect(), box = w.getBoundingClientRect();
           return {before, after: after.left, boxLeft: box.left, scrolled: w.scrollLeft,
                   wide: w.scrollWidth, room: w.clientWidth,
                   sticky: getComputedStyle(head).position};"""
    )
    assert state is not None, "no table wider than a 390 px screen on the performance page"
    phone390.save_screenshot(str(ARTIFACTS / "phone390_performance_table_scrolled.png"))
    assert state["scrolled"] > 0, state
    assert abs(state["after"] - state["boxLeft"]) <= 2, f"first column scrolled away: {state}"
    assert state["sticky"] == "sticky", state
