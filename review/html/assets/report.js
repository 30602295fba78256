/* agentload report: interactive time-series charts drawn as SVG from the data embedded in the
 * page. Drag across a panel to zoom the time axis (all panels of a chart follow), double-click or
 * press "reset zoom" to return; hover shows the nearest point's run and value; the legend toggles
 * an arm. No network, no library: the page must work offline and from a file. */
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var M = { l: 58, r: 14, t: 10, b: 30 };
  var PANEL_H = 190;

  function el(tag, attrs, parent) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) {
      if (Object.prototype.hasOwnProperty.call(attrs, k)) e.setAttribute(k, attrs[k]);
    }
    if (parent) parent.appendChild(e);
    return e;
  }

  function niceTicks(lo, hi, n) {
    var span = hi - lo;
    if (!(span > 0)) return [lo];
    var step = Math.pow(10, Math.floor(Math.log10(span / n)));
    var err = (n * step) / span;
    if (err <= 0.15) step *= 10;
    else if (err <= 0.35) step *= 5;
    else if (err <= 0.75) step *= 2;
    var out = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + 1e-9 * span; v += step) out.push(Math.abs(v) < 1e-12 ? 0 : v);
    return out;
  }

  function tickFmt(ticks) {
    var step = ticks.length > 1 ? Math.abs(ticks[1] - ticks[0]) : 1;
    var dec = step > 0 ? Math.max(0, Math.min(6, -Math.floor(Math.log10(step) + 1e-9))) : 0;
    return function (v) { return v.toFixed(dec); };
  }

  function fmt(v) {
    if (v === null || v === undefined || isNaN(v)) return "-";
    var a = Math.abs(v);
    if (a >= 1000) return v.toFixed(0);
    if (a >= 10) return v.toFixed(1);
    if (a >= 1) return v.toFixed(2);
    return v.toFixed(3);
  }

  function Chart(root, spec) {
    this.root = root;
    this.spec = spec;
    this.hidden = {};
    this.x0 = spec.xmin;
    this.x1 = spec.xmax;
    this.build();
  }

  Chart.prototype.build = function () {
    var self = this;
    var legend = document.createElement("div");
    legend.className = "legend";
    var groups = [];
    this.spec.series.forEach(function (s) {
      if (groups.indexOf(s.group) < 0) groups.push(s.group);
    });
    groups.forEach(function (g) {
      var s = self.spec.series.filter(function (x) { return x.group === g; })[0];
      var lab = document.createElement("label");
      var cb = document.createElement("input");
      cb.type = "checkbox";
      cb.checked = true;
      cb.addEventListener("change", function () {
        self.hidden[g] = !cb.checked;
        self.draw();
      });
      var sw = document.createElement("span");
      sw.className = "swatch";
      sw.style.borderTop = "3px " + (s.dash ? "dashed " : "solid ") + s.color;
      lab.appendChild(cb);
      lab.appendChild(sw);
      lab.appendChild(document.createTextNode(g));
      legend.appendChild(lab);
    });
    var reset = document.createElement("button");
    reset.type = "button";
    reset.textContent = "reset zoom";
    reset.addEventListener("click", function () { self.zoom(self.spec.xmin, self.spec.xmax); });
    legend.appendChild(reset);
    this.root.appendChild(legend);
    this.svg = el("svg", { "class": "chart-svg", role: "img", "aria-label": this.spec.title || "chart" }, this.root);
    this.tip = document.createElement("div");
    this.tip.className = "tip";
    this.tip.style.display = "none";
    this.root.appendChild(this.tip);
    window.addEventListener("resize", function () { self.draw(); });
    this.draw();
  };

  Chart.prototype.zoom = function (a, b) {
    if (b - a < 1e-9) return;
    this.x0 = Math.max(this.spec.xmin, a);
    this.x1 = Math.min(this.spec.xmax, b);
    this.draw();
  };

  Chart.prototype.draw = function () {
    var self = this;
    var svg = this.svg;
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    var W = Math.max(320, this.root.clientWidth || 640);
    var panels = this.spec.panels;
    var H = panels.length * PANEL_H;
    svg.setAttribute("width", W);
    svg.setAttribute("height", H);
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    var pw = W - M.l - M.r;
    var ph = PANEL_H - M.t - M.b;
    var x0 = this.x0, x1 = this.x1;
    function sx(x) { return M.l + ((x - x0) / (x1 - x0)) * pw; }
    this.geo = [];
    panels.forEach(function (p, pi) {
      var top = pi * PANEL_H + M.t;
      var ylo = p.ymin, yhi = p.ymax;
      var log = !!p.ylog;
      var ly = function (v) { return log ? Math.log10(Math.max(v, p.yfloor || 0.8)) : v; };
      var L0 = ly(ylo), L1 = ly(yhi);
      function sy(v) { return top + ph - ((ly(v) - L0) / (L1 - L0)) * ph; }
      var g = el("g", { "class": "panel" }, svg);
      var clipId = self.root.id + "-clip-" + pi;
      var defs = el("defs", {}, g);
      var cp = el("clipPath", { id: clipId }, defs);
      el("rect", { x: M.l, y: top, width: pw, height: ph }, cp);
      el("rect", { x: M.l, y: top, width: pw, height: ph, "class": "plot-bg" }, g);
      var plot = el("g", { "clip-path": "url(#" + clipId + ")" }, g);
      (self.spec.bands || []).forEach(function (b) {
        var a = sx(b.x0), c = sx(b.x1);
        el("rect", { x: Math.min(a, c), y: top, width: Math.abs(c - a), height: ph, "class": "band" }, plot);
      });
      (self.spec.vlines || []).forEach(function (v) {
        el("line", { x1: sx(v.x), x2: sx(v.x), y1: top, y2: top + ph, "class": "vline" }, plot);
      });
      var yt = log ? [] : niceTicks(ylo, yhi, 5);
      if (log) {
        for (var d = Math.floor(L0); d <= Math.ceil(L1); d++) {
          if (d >= L0 - 1e-9 && d <= L1 + 1e-9) yt.push(Math.pow(10, d));
        }
      }
      var yf = tickFmt(yt);
      yt.forEach(function (v) {
        var y = sy(v);
        el("line", { x1: M.l, x2: M.l + pw, y1: y, y2: y, "class": "grid" }, g);
        var t = el("text", { x: M.l - 6, y: y + 4, "class": "tick", "text-anchor": "end" }, g);
        t.textContent = log ? String(v) : yf(v);
      });
      var xt = niceTicks(x0, x1, Math.max(3, Math.floor(pw / 90)));
      var xf = tickFmt(xt);
      xt.forEach(function (v) {
        var x = sx(v);
        el("line", { x1: x, x2: x, y1: top + ph, y2: top + ph + 4, "class": "axis" }, g);
        var t = el("text", { x: x, y: top + ph + 16, "class": "tick", "text-anchor": "middle" }, g);
        t.textContent = xf(v);
      });
      var yl = el("text", { x: 14, y: top + ph / 2, "class": "label", "text-anchor": "middle",
        transform: "rotate(-90 14 " + (top + ph / 2) + ")" }, g);
      yl.textContent = p.ylabel;
      if (pi === panels.length - 1) {
        var xl = el("text", { x: M.l + pw / 2, y: top + ph + 28, "class": "label", "text-anchor": "middle" }, g);
        xl.textContent = self.spec.xlabel;
      }
      var pts = [];
      self.spec.series.forEach(function (s) {
        if (s.panel !== pi || self.hidden[s.group]) return;
        var d = [];
        for (var i = 0; i < s.x.length; i++) {
          var v = s.y[i];
          if (v === null || isNaN(v)) continue;
          if (s.x[i] < x0 - (x1 - x0) * 0.02 || s.x[i] > x1 + (x1 - x0) * 0.02) continue;
          var X = sx(s.x[i]), Y = sy(Math.min(Math.max(v, ylo), yhi));
          d.push((d.length ? "L" : "M") + X.toFixed(1) + "," + Y.toFixed(1));
          pts.push({ X: X, Y: Y, x: s.x[i], v: v, s: s });
        }
        if (d.length) {
          el("path", { d: d.join(""), stroke: s.color, "stroke-dasharray": s.dash ? "5,3" : "none", "class": "line" }, plot);
        }
      });
      el("rect", { x: M.l, y: top, width: pw, height: ph, "class": "frame" }, g);
      var sel = el("rect", { x: 0, y: top, width: 0, height: ph, "class": "selection", visibility: "hidden" }, g);
      var dot = el("circle", { r: 4, "class": "dot", visibility: "hidden" }, g);
      var hit = el("rect", { x: M.l, y: top, width: pw, height: ph, "class": "hit" }, g);
      self.geo.push({ top: top, ph: ph });
      self.bind(hit, sel, dot, pts, sx, pw);
    });
  };

  Chart.prototype.bind = function (hit, sel, dot, pts, sx, pw) {
    var self = this;
    var start = null;
    function px(ev) {
      var r = self.svg.getBoundingClientRect();
      return { x: ev.clientX - r.left, y: ev.clientY - r.top };
    }
    function inv(X) { return self.x0 + ((X - M.l) / pw) * (self.x1 - self.x0); }
    hit.addEventListener("mousedown", function (ev) {
      start = px(ev).x;
      ev.preventDefault();
    });
    hit.addEventListener("mousemove", function (ev) {
      var p = px(ev);
      if (start !== null) {
        sel.setAttribute("visibility", "visible");
        sel.setAttribute("x", Math.min(start, p.x));
        sel.setAttribute("width", Math.abs(p.x - start));
      }
      var best = null, bd = 1e18;
      for (var i = 0; i < pts.length; i++) {
        var dx = pts[i].X - p.x, dy = pts[i].Y - p.y, dd = dx * dx + dy * dy;
        if (dd < bd) { bd = dd; best = pts[i]; }
      }
      if (best && bd < 900) {
        dot.setAttribute("cx", best.X);
        dot.setAttribute("cy", best.Y);
        dot.setAttribute("fill", best.s.color);
        dot.setAttribute("visibility", "visible");
        self.tip.style.display = "block";
        self.tip.textContent = best.s.label + " · t = " + best.x.toFixed(0) + " s · " + best.s.what + " = " + fmt(best.v);
        self.tip.style.left = Math.min(p.x + 12, self.root.clientWidth - 260) + "px";
        self.tip.style.top = p.y + 12 + "px";
      } else {
        dot.setAttribute("visibility", "hidden");
        self.tip.style.display = "none";
      }
    });
    hit.addEventListener("mouseleave", function () {
      dot.setAttribute("visibility", "hidden");
      self.tip.style.display = "none";
      sel.setAttribute("visibility", "hidden");
      start = null;
    });
    hit.addEventListener("mouseup", function (ev) {
      if (start === null) return;
      var end = px(ev).x;
      sel.setAttribute("visibility", "hidden");
      if (Math.abs(end - start) > 5) {
        var a = inv(Math.min(start, end)), b = inv(Math.max(start, end));
        start = null;
        self.zoom(a, b);
      }
      start = null;
    });
    hit.addEventListener("dblclick", function () { self.zoom(self.spec.xmin, self.spec.xmax); });
  };

  function init() {
    var charts = document.querySelectorAll("[data-chart]");
    for (var i = 0; i < charts.length; i++) {
      var root = charts[i];
      var src = document.getElementById(root.getAttribute("data-chart"));
      if (!src) continue;
      var spec = JSON.parse(src.textContent);
      root.classList.add("live");
      root.chart = new Chart(root, spec);
    }
    var rows = document.querySelectorAll("tr[data-run]");
    for (var j = 0; j < rows.length; j++) {
      rows[j].addEventListener("click", function () {
        var d = document.getElementById("cond-" + this.getAttribute("data-run"));
        if (d) { d.open = true; d.scrollIntoView({ block: "nearest" }); }
      });
    }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
