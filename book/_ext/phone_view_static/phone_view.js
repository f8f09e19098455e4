/* The site on a phone: make the sidebar buttons work (book/_ext/phone_view.py adds this file).
 *
 * pydata-sphinx-theme 0.17 opens its narrow-screen sidebar dialogs from the FIRST element with
 * class .primary-toggle / .secondary-toggle (document.querySelector). sphinx-book-theme 1.3 adds a
 * second pair in the article header, and those are the buttons a reader sees and taps: they have
 * no handler, so on a phone the table of contents could not be opened at all.
 * Upstream: pydata/pydata-sphinx-theme#2451 (open, unfixed in every release up to 0.24; and
 * sphinx-book-theme 1.3.0 pins pydata-sphinx-theme==0.17.1). Remove this file when it is fixed.
 *
 * Fix: a click on any later toggle is handed to the first one of its kind, which carries the
 * themes' handlers (the dialog on narrow screens, sphinx-book-theme's collapse on wide ones).
 * It runs in the capture phase and stops the event, so a theme that one day binds the visible
 * button itself does not open the dialog twice. On wide screens this also brings back
 * sphinx-book-theme's sidebar collapse, which is bound to the same (hidden) first button.
 */
(function () {
  "use strict";
  function forward(selector) {
    var toggles = document.querySelectorAll(selector);
    for (var i = 1; i < toggles.length; i++) {
      toggles[i].addEventListener("click", function (event) {
        event.preventDefault();
        event.stopImmediatePropagation();
        toggles[0].click();
        // Wide screens collapse the sidebar instead of opening a dialog: drop the focus, or
        // the button's tooltip stays up (what sphinx-book-theme does for the first button).
        if (!document.querySelector("dialog[open]")) { event.currentTarget.blur(); }
      }, true);
    }
  }
  function setup() {
    forward(".primary-toggle");
    forward(".secondary-toggle");
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", setup);
  } else {
    setup();
  }
})();

/* Wide display equations on a narrow screen: scale an equation that is wider than its box down
 * (MathJax's CommonHTML output scales with the font size), to no less than 60%, instead of
 * leaving it clipped behind a scroll bar. Runs once MathJax has typeset the page, and again when
 * the window is resized (a phone turned sideways). MathJax 3 has no automatic line breaking;
 * equations too wide even at 60% are rewritten on two lines in the chapters. */
(function () {
  "use strict";
  var MIN_SCALE = 0.6;
  function fit() {
    var boxes = document.querySelectorAll('.bd-article mjx-container[display="true"]');
    boxes.forEach(function (box) {
      box.style.fontSize = "";
      var room = box.clientWidth, need = box.scrollWidth;
      if (room > 0 && need > room + 1) {
        box.style.fontSize = Math.max(MIN_SCALE, (room - 2) / need) * 100 + "%";
      }
    });
  }
  function whenTypeset() {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      MathJax.startup.promise.then(fit);
    } else { setTimeout(whenTypeset, 100); }
  }
  window.addEventListener("load", whenTypeset);
  window.addEventListener("resize", fit);
})();
