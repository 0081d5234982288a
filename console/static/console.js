// llmq console: refreshes the parts of a page marked data-fragment by
// fetching ?fragment=NAME of the same page every data-refresh ms, while the
// tab is visible. No framework, no build step.
(function () {
  "use strict";
  var body = document.body;
  var every = parseInt(body.getAttribute("data-refresh") || "0", 10);
  var parts = document.querySelectorAll("[data-fragment]");
  if (!every || parts.length === 0) {
    return;
  }
  var busy = false;
  function refresh() {
    if (busy || document.hidden) {
      return;
    }
    busy = true;
    var pending = [];
    parts.forEach(function (el) {
      var url = new URL(window.location.href);
      url.searchParams.delete("flash");
      url.searchParams.set("fragment", el.getAttribute("data-fragment"));
      pending.push(fetch(url.toString(), { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (res) {
          if (!res.ok) {
            throw new Error("HTTP " + res.status);
          }
          return res.text();
        })
        .then(function (html) {
          el.innerHTML = html;
          el.removeAttribute("data-stale");
          el.setAttribute("data-refreshed", String(Date.now()));
        })
        .catch(function () {
          el.setAttribute("data-stale", "true");
        }));
    });
    Promise.all(pending).then(function () { busy = false; });
  }
  window.setInterval(refresh, every);
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden) {
      refresh();
    }
  });
})();
