// Draws each figure from its JSON spec, and wires the copy buttons and the sortable tables.
// window.blueprintingReady resolves once every figure is drawn (the browser tests wait on it).
(function () {
  "use strict";
  var drawn = [];
  document.querySelectorAll("div.plotly-figure").forEach(function (el) {
    var spec = JSON.parse(document.getElementById(el.id + "-spec").textContent);
    drawn.push(Plotly.newPlot(el, spec.data, spec.layout, { displaylogo: false, responsive: true }));
  });
  window.blueprintingReady = Promise.all(drawn);

  function copyFallback(text) {
    var area = document.createElement("textarea");
    area.value = text;
    document.body.appendChild(area);
    area.select();
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    document.body.removeChild(area);
    return ok;
  }
  document.querySelectorAll("button.copy").forEach(function (button) {
    button.addEventListener("click", function () {
      var text = document.getElementById(button.dataset.copyTarget).textContent;
      var done = function (ok) { button.textContent = ok ? "Copied" : "Select and copy"; };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(function () { done(true); },
          function () { done(copyFallback(text)); });
      } else {
        done(copyFallback(text));
      }
    });
  });

  document.querySelectorAll("table.sortable").forEach(function (table) {
    var headers = table.querySelectorAll("thead th");
    headers.forEach(function (th, column) {
      th.addEventListener("click", function () {
        var ascending = th.getAttribute("aria-sort") !== "ascending";
        headers.forEach(function (other) { other.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
        var numeric = th.dataset.sort === "number";
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = a.cells[column].dataset.value, y = b.cells[column].dataset.value;
          if (numeric) {
            var p = parseFloat(x), q = parseFloat(y);
            // An empty cell (no value in the JSON) goes last whichever way the column sorts.
            if (isNaN(p) || isNaN(q)) { return isNaN(p) - isNaN(q); }
            return ascending ? p - q : q - p;
          }
          var order = x.localeCompare(y);
          return ascending ? order : -order;
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  });
})();
