// A table or code block wider than its box scrolls sideways; mark it so the page says so (docs/css/zoo.css shows the
// hint), at load and whenever the window's width changes (a phone turned sideways).
(() => {
  const mark = () => {
    document.querySelectorAll("article .md-typeset__scrollwrap, article pre").forEach((box) => {
      const inner = box.matches("pre") ? box.querySelector("code") : box;
      box.classList.toggle("zoo-overflows", !!inner && inner.scrollWidth > inner.clientWidth + 1);
    });
  };
  document.addEventListener("DOMContentLoaded", mark);
  window.addEventListener("resize", mark);
})();
