// A table wider than the page's column scrolls sideways inside its box (stylesheets/extra.css). This marks the box
// while columns lie beyond an edge, kqv-more-right and kqv-more-left, which draw a shadow on that edge: the cue
// that there is more to see. Marked on load, on resize and as the table scrolls.
(function () {
  "use strict";

  function mark(table) {
    const box = table.closest(".md-typeset__table");
    if (!box) return;
    const hiddenRight = table.scrollWidth - table.clientWidth - table.scrollLeft;
    box.classList.toggle("kqv-more-right", hiddenRight > 1);
    box.classList.toggle("kqv-more-left", table.scrollLeft > 1);
  }

  function markAll() {
    document.querySelectorAll(".md-typeset__table > table").forEach(mark);
  }

  document.addEventListener(
    "scroll",
    (event) => {
      if (event.target instanceof HTMLTableElement) mark(event.target);
    },
    true,
  );
  window.addEventListener("resize", markAll);
  window.addEventListener("load", markAll);
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", markAll);
  else markAll();
})();
