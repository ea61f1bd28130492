// Line charts drawn as SVG, without a library: a few series of (time, value) points over a time
// window, y from zero to a rounded maximum. Points with a null value leave a gap.

const SVG_NS = "http://www.w3.org/2000/svg";
const PAD = { left: 52, right: 12, top: 22, bottom: 22 };

function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs)) el.setAttribute(name, value);
  for (const child of children) el.append(child);
  return el;
}

/** 1, 2 or 5 times a power of ten, at least `value` (and at least `floor`). */
export function niceMax(value, floor = 1) {
  const target = Math.max(value, floor);
  const power = 10 ** Math.floor(Math.log10(target));
  for (const step of [1, 2, 5, 10]) {
    if (step * power >= target) return step * power;
  }
  return 10 * power;
}

function format(value) {
  if (value === null || value === undefined) return "-";
  if (value >= 100) return value.toFixed(0);
  if (value >= 10) return value.toFixed(1);
  return value.toFixed(2);
}

/**
 * A <figure> with the chart: `series` = [{label, cls, points: [[t, v|null], ...]}], times in
 * seconds, `span` the seconds shown (ending at the latest point), `unit` for the axis.
 */
export function lineChart({ title, unit, series, span, testid, width = 560, height = 190 }) {
  const latest = Math.max(0, ...series.flatMap((s) => s.points.map(([t]) => t)));
  const start = latest - span;
  const values = series.flatMap((s) => s.points.map(([, v]) => v)).filter((v) => v !== null);
  const top = niceMax(Math.max(0, ...values), unit === "ms" ? 1 : 5);
  const plotW = width - PAD.left - PAD.right;
  const plotH = height - PAD.top - PAD.bottom;
  const x = (t) => PAD.left + ((t - start) / span) * plotW;
  const y = (v) => PAD.top + plotH - (v / top) * plotH;

  const chart = svg("svg", {
    viewBox: `0 0 ${width} ${height}`,
    class: "chart",
    role: "img",
    "aria-label": title,
  });
  for (const fraction of [0, 0.5, 1]) {
    const value = top * fraction;
    chart.append(
      svg("line", { x1: PAD.left, x2: width - PAD.right, y1: y(value), y2: y(value), class: "grid" }),
      svg("text", { x: PAD.left - 6, y: y(value) + 4, class: "tick", "text-anchor": "end" },
        `${format(value)}`),
    );
  }
  chart.append(
    svg("text", { x: PAD.left, y: height - 6, class: "tick" }, `-${span} s`),
    svg("text", { x: width - PAD.right, y: height - 6, class: "tick", "text-anchor": "end" }, "now"),
    svg("text", { x: PAD.left - 6, y: 11, class: "tick unit", "text-anchor": "end" }, unit),
  );
  for (const s of series) {
    let d = "";
    let pen = "M";
    for (const [t, v] of s.points) {
      if (t < start) continue;
      if (v === null) {
        pen = "M";
        continue;
      }
      d += `${pen}${x(t).toFixed(1)},${y(v).toFixed(1)} `;
      pen = "L";
    }
    if (d) chart.append(svg("path", { d: d.trim(), class: `line ${s.cls}` }));
    for (const [t, v] of s.points) {
      // A dot for each value: a lone one between gaps has no line to show it.
      if (t >= start && v !== null) {
        chart.append(svg("circle", { cx: x(t).toFixed(1), cy: y(v).toFixed(1), r: 2.5, class: `dot ${s.cls}` }));
      }
    }
  }
  const figure = document.createElement("figure");
  figure.className = "chart-box";
  if (testid) figure.dataset.testid = testid;
  const caption = document.createElement("figcaption");
  caption.append(title);
  for (const s of series) {
    const last = s.points.length ? s.points[s.points.length - 1][1] : null;
    const key = document.createElement("span");
    key.className = `key ${s.cls}`;
    key.append(`${s.label}: ${format(last)} ${unit}`);
    caption.append(" ", key);
  }
  figure.append(caption, chart);
  return figure;
}
