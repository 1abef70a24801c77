// Live parts: the content of an element with data-live="URL" is replaced every two seconds by
// that of the element with the same id in a fresh render of URL. Nothing else needs script.
"use strict";
(function () {
  const every = 2000;
  async function refresh(element) {
    const url = element.dataset.live;
    try {
      const response = await fetch(url, { credentials: "same-origin" });
      if (!response.ok) return;
      const html = await response.text();
      const next = new DOMParser().parseFromString(html, "text/html").getElementById(element.id);
      if (next) element.replaceChildren(...next.childNodes);
    } catch (error) {
      // The server is restarting or the network blinked: the next refresh tries again.
    }
  }
  function start() {
    for (const element of document.querySelectorAll("[data-live]")) {
      setInterval(() => refresh(element), every);
    }
  }
  document.addEventListener("DOMContentLoaded", start);
})();
