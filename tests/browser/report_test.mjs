// `bench latency --report`'s page rendered in headless Chromium: every chart is drawn, with the
// data of the same run's --json. The marks' data attributes give the values the page printed;
// their rendered boxes must be visible and placed in the order of their values (a taller bar, a
// higher point), so a chart drawn with the wrong numbers or not at all fails.
//   REPORT_HTML, REPORT_JSON  the page and the JSON of one run (--ablation, several batch sizes)
//   REPORT_SCREENSHOT         where to write a PNG of the page
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import { chromium } from 'playwright-core';

const results = JSON.parse(readFileSync(process.env.REPORT_JSON, 'utf8'));
let browser, page;
const problems = [];

before(async () => {
  browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: ['--no-sandbox'] });
  page = await browser.newPage({ viewport: { width: 800, height: 1200 } });
  page.on('console', (m) => { if (m.type() === 'error') problems.push(`console: ${m.text()}`); });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  // Nothing but the page itself may load: it is meant to be self-contained.
  page.on('request', (r) => {
    if (r.url() !== pathToFileURL(process.env.REPORT_HTML).href) problems.push(`fetched ${r.url()}`);
  });
  await page.goto(pathToFileURL(process.env.REPORT_HTML).href);
});

after(async () => {
  if (page && process.env.REPORT_SCREENSHOT) {
    await page.screenshot({ path: process.env.REPORT_SCREENSHOT, fullPage: true });
  }
  await browser?.close();
});

// The marks of one chart as drawn: data attributes and the rendered box (screen pixels).
async function marks(chart, selector) {
  return page.$$eval(`svg[data-chart="${chart}"] ${selector}`, (elements) =>
    elements.map((e) => {
      const box = e.getBoundingClientRect();
      return {
        series: e.dataset.series, label: e.dataset.label, value: Number(e.dataset.value),
        x: box.x, y: box.y, width: box.width, height: box.height,
        visible: getComputedStyle(e).visibility !== 'hidden' && getComputedStyle(e).display !== 'none',
      };
    }));
}

function near(actual, expected, what) {
  assert.ok(Math.abs(actual - expected) <= 1e-3 * Math.max(1, Math.abs(expected)),
            `${what}: the page drew ${actual}, the run measured ${expected}`);
}

test('the page loads by itself, with no errors', () => {
  assert.deepEqual(problems, []);
});

test('the machine facts are those of the run', async () => {
  const fact = (name) => page.$eval(`dd[data-fact="${name}"]`, (e) => e.textContent);
  assert.equal(await fact('SIMD in use'), results.isa);
  assert.equal(await fact('weights'), results.weight_dtype);
  assert.match(await fact('read bandwidth'), new RegExp(`^${results.bandwidth_gbs.toFixed(1)} GB/s`));
  assert.match(await fact('f32 FMA peak'), new RegExp(`^${results.fma_peak_gflops.toFixed(1)} GFLOP/s`));
});

test('the ablation is a waterfall of the run\'s rows', async () => {
  const bars = await marks('ablation', 'rect.bar');
  const rows = results.ablation;
  assert.ok(rows.length >= 2, 'the run has an ablation');
  assert.equal(bars.length, rows.length + 2, 'everything on, one bar per optimization, the sum');
  const baseline = rows[0].tpot_ms / (1 + rows[0].change_pct / 100);
  near(bars[0].value, baseline, 'everything on');
  let sum = baseline;
  rows.forEach((row, i) => {
    const bar = bars[i + 1];
    assert.equal(bar.label, row.optimization.split(' ')[0]);
    near(bar.value, row.tpot_ms - baseline, row.optimization);
    assert.equal(bar.series, row.tpot_ms >= baseline ? 'cost' : 'gain');
    sum += row.tpot_ms - baseline;
  });
  near(bars.at(-1).value, sum, 'the sum');
  // Pixels per ms, from the tallest bar: a short one may be drawn at the 1 px minimum (under
  // load, one run of a tiny model can take 100 times the baseline's TPOT).
  const tallest = bars.reduce((a, b) => (Math.abs(b.value) > Math.abs(a.value) ? b : a));
  const scale = tallest.height / Math.abs(tallest.value);
  // Every bar inside the chart, also when the running sum goes below zero (turning
  // optimizations off made the tiny model faster: then the axis must reach below zero).
  const svg = await page.$eval('svg[data-chart="ablation"]', (e) => {
    const b = e.getBoundingClientRect();
    return { top: b.top, bottom: b.bottom };
  });
  for (const [i, bar] of bars.entries()) {
    assert.ok(bar.visible && bar.width > 0 && bar.height >= 1, `bar ${i} is drawn: ${JSON.stringify(bar)}`);
    assert.ok(bar.y >= svg.top - 0.5 && bar.y + bar.height <= svg.bottom + 0.5,
              `bar ${i} (${bar.label}) lies inside the chart: ${JSON.stringify(bar)}, ${JSON.stringify(svg)}`);
    // Each bar's height is its value on the chart's scale (a pixel at least).
    const want = Math.max(1, Math.abs(bar.value) * scale);
    assert.ok(Math.abs(bar.height - want) <= 1.5, `bar ${i} (${bar.label}) is ${bar.height} px high, its value makes ${want}`);
  }
  for (let i = 1; i < bars.length; ++i) assert.ok(bars[i].x > bars[i - 1].x, 'bars run left to right');
});

for (const [chart, key] of [['tpot', 'tpot_ms'], ['throughput', 'decode_tok_s']]) {
  test(`${chart}: one point per batch size, at its value`, async () => {
    const points = await marks(chart, 'circle.point');
    assert.equal(points.length, results.runs.length);
    points.forEach((p, i) => {
      assert.equal(p.label, String(results.runs[i].batch_size));
      near(p.value, results.runs[i][key], `${chart} at batch ${p.label}`);
      assert.ok(p.visible && p.width > 0 && p.height > 0, `point ${i} is drawn`);
    });
    // Higher values sit higher on the screen (smaller y), in proportion.
    const base = await page.$eval(`svg[data-chart="${chart}"]`, (s) => s.getBoundingClientRect().y);
    for (let i = 1; i < points.length; ++i) {
      const [a, b] = [points[i - 1], points[i]];
      // Points closer than a pixel may round to the same row: the order is checked a pixel apart.
      if (Math.abs(a.value - b.value) > 0.02 * Math.max(a.value, b.value)) {
        const [higher, lower] = a.value > b.value ? [a, b] : [b, a];
        assert.ok(higher.y <= lower.y + 0.5, `${chart}: batch ${a.label} vs ${b.label} drawn in the wrong order`);
      }
      assert.ok(a.x < b.x, 'batch sizes run left to right');
      assert.ok(a.y > base && b.y > base, 'inside the chart');
    }
  });
}

test('the roofline is a line at the run\'s roofline', async () => {
  const [line] = await marks('throughput', 'line[data-series="roofline"]');
  assert.ok(line, 'a roofline is drawn');
  near(line.value, results.runs[0].roofline_tok_s, 'roofline');
  assert.ok(line.width > 100 && line.visible, 'it spans the chart');
  // Placed against the points: above those below it, below those above it.
  for (const p of await marks('throughput', 'circle.point')) {
    const centre = p.y + p.height / 2;
    if (Math.abs(p.value - line.value) > 0.02 * line.value) {
      assert.equal(centre > line.y, p.value < line.value, `batch ${p.label} against the roofline`);
    }
  }
});
