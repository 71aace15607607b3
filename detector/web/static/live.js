// Refresh an open incident's page in place: ask for the page body every 5 s and swap it only
// when its data-version changed (no reload, no flicker). Without JavaScript the page is a
// static render of the same content.
(function () {
  "use strict";
  var PERIOD_MS = 5000;
  function current() { return document.getElementById("incident"); }
  function refresh() {
    var node = current();
    if (!node || node.dataset.live !== "on" || document.hidden) { return; }
    var url = new URL(window.location.href);
    url.searchParams.set("partial", "1");
    fetch(url.toString(), { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) { return; }
        var doc = new DOMParser().parseFromString(html, "text/html");
        var next = doc.getElementById("incident");
        var now = current();
        if (next && now && next.dataset.version !== now.dataset.version) {
          now.replaceWith(document.importNode(next, true));
        }
      })
      .catch(function () { /* offline for a moment: try again at the next tick */ });
  }
  window.setInterval(refresh, PERIOD_MS);
})();
