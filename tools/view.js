// view.js -- the memsnap HTML viewer (embedded by `memsnap view`).
// Reads the global DATA written by cmd_view.c and draws, with plain canvas
// 2D calls and no network access:
//   - the active-memory timeline (active = requested bytes of live
//     allocations, reserved = segments) over the trace entry index;
//   - the segment/block layout at the chosen entry (slider or click on
//     the timeline), rebuilt by replaying the trace forward from the start
//     state (the final state exactly at the last entry);
//   - the stack of a clicked block or of the chosen trace entry.
'use strict';
(function () {
  var ACTIONS = ['alloc', 'free_requested', 'free_completed', 'segment_alloc',
    'segment_free', 'segment_map', 'segment_unmap', 'snapshot', 'oom',
    'annotate', 'workspace_snapshot'];
  var STATES = ['inactive', 'active_allocated', 'active_pending_free', 'other'];
  var $ = function (id) { return document.getElementById(id); };

  function fmtBytes(v) {
    var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], i = 0;
    while (Math.abs(v) >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (i === 0 ? v.toFixed(0) : v.toFixed(2)) + ' ' + u[i];
  }
  function hex(v) { return '0x' + v.toString(16); }
  function actionName(c) { return c < ACTIONS.length ? ACTIONS[c] : 'other'; }
  function esc(s) {
    return String(s).replace(/[&<>"]/g, function (c) {
      return {'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;'}[c];
    });
  }
  function stackColor(st) {
    if (!st) return '#7a8fa6';
    var h = (st * 2654435761) % 360;
    return 'hsl(' + h + ',55%,55%)';
  }

  var dev = null;        // the device record shown
  var series = null;     // {act: [], res: []}
  var sel = 0;           // entries applied (0..events.length)
  var layoutRects = [];  // clickable rectangles of the layout canvas

  function computeSeries(d) {
    var a = 0, r = 0, i;
    for (i = 0; i < d.start.blocks.length; i++) a += d.start.blocks[i][2];
    for (i = 0; i < d.start.segments.length; i++) r += d.start.segments[i][1];
    var act = [a], res = [r];
    for (i = 0; i < d.events.length; i++) {
      var e = d.events[i], c = e[0];
      if (c === 0) a += e[2];
      else if (c === 2) a = Math.max(0, a - e[2]);
      else if (c === 3 || c === 5) r += e[2];
      else if (c === 4 || c === 6) r = Math.max(0, r - e[2]);
      act.push(a); res.push(r);
    }
    return {act: act, res: res};
  }

  function fitCanvas(cv, h) {
    var w = cv.parentNode.clientWidth || 900;
    var dpr = window.devicePixelRatio || 1;
    cv.width = w * dpr; cv.height = h * dpr;
    cv.style.width = w + 'px'; cv.style.height = h + 'px';
    var g = cv.getContext('2d');
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    return {g: g, w: w, h: h};
  }

  var TL = {l: 80, r: 10, t: 10, b: 28};
  function drawTimeline() {
    var c = fitCanvas($('timeline'), 260), g = c.g;
    g.fillStyle = '#fff'; g.fillRect(0, 0, c.w, c.h);
    var n = series.act.length, ymax = 1, i;
    for (i = 0; i < n; i++) ymax = Math.max(ymax, series.act[i], series.res[i]);
    var pw = c.w - TL.l - TL.r, ph = c.h - TL.t - TL.b;
    var X = function (k) { return TL.l + (n > 1 ? pw * k / (n - 1) : pw / 2); };
    var Y = function (v) { return TL.t + ph - ph * v / ymax; };
    g.strokeStyle = '#e3e3e3'; g.fillStyle = '#555'; g.font = '11px sans-serif';
    g.textAlign = 'right';
    for (i = 0; i <= 4; i++) {
      var y = TL.t + ph - ph * i / 4;
      g.beginPath(); g.moveTo(TL.l, y); g.lineTo(c.w - TL.r, y); g.stroke();
      g.fillText(fmtBytes(ymax * i / 4), TL.l - 4, y + 4);
    }
    g.textAlign = 'center';
    g.fillText('trace entry (0 .. ' + (n - 1) + ')', TL.l + pw / 2, c.h - 8);
    // Bucketed (max per pixel column) so peaks survive on long traces.
    function path(v, fill, color) {
      var cols = Math.max(1, Math.min(n, Math.floor(pw)));
      g.beginPath();
      if (fill) g.moveTo(X(0), Y(0));
      for (var k = 0; k < cols; k++) {
        var lo = Math.floor(k * n / cols), hi = Math.floor((k + 1) * n / cols);
        var m = 0;
        for (var j = lo; j < Math.max(hi, lo + 1) && j < n; j++) m = Math.max(m, v[j]);
        var x = X(cols > 1 ? k * (n - 1) / (cols - 1) : 0);
        if (k === 0 && !fill) g.moveTo(x, Y(m)); else g.lineTo(x, Y(m));
      }
      if (fill) {
        g.lineTo(X(n - 1), Y(0)); g.closePath();
        g.fillStyle = color; g.fill();
      } else {
        g.strokeStyle = color; g.lineWidth = 1.5; g.stroke(); g.lineWidth = 1;
      }
    }
    // record_function ranges (external_annotations), START markers.
    var anns = dev.annotations || [], shown = 0;
    g.font = '10px sans-serif'; g.textAlign = 'left';
    for (i = 0; i < anns.length && shown < 60; i++) {
      if (!anns[i][2]) continue;
      var ax = X(anns[i][0]);
      g.strokeStyle = 'rgba(148,103,189,0.6)'; g.setLineDash([3, 3]);
      g.beginPath(); g.moveTo(ax, TL.t); g.lineTo(ax, TL.t + ph); g.stroke();
      g.setLineDash([]);
      g.fillStyle = '#9467bd';
      g.fillText(anns[i][1], ax + 2, TL.t + 26 + 11 * (shown % 4));
      shown++;
    }
    path(series.act, true, 'rgba(31,119,180,0.55)');
    path(series.res, false, '#888');
    g.strokeStyle = '#d62728';
    g.beginPath(); g.moveTo(X(sel), TL.t); g.lineTo(X(sel), TL.t + ph); g.stroke();
    g.textAlign = 'left'; g.fillStyle = '#1f77b4';
    g.fillText('active (requested bytes)', TL.l + 8, TL.t + 14);
    g.fillStyle = '#777'; g.fillText('reserved', TL.l + 170, TL.t + 14);
    $('timeline').onclick = function (ev) {
      var rect = $('timeline').getBoundingClientRect();
      var x = ev.clientX - rect.left;
      var k = Math.round((x - TL.l) / pw * (n - 1));
      select(Math.max(0, Math.min(n - 1, k)), true);
    };
  }

  // Layout after `upto` entries.  At the end: the file's final segments.
  function layoutAt(upto) {
    var segs = [], i;
    if (upto >= dev.events.length) {
      for (i = 0; i < dev.segments.length; i++) {
        var s = dev.segments[i];
        segs.push({addr: s[0], size: s[1], blocks: s[3].map(function (b) {
          return {addr: b[0], size: b[1], state: b[2], req: b[3], stack: b[4]};
        })});
      }
      return {segs: segs, exact: true};
    }
    var seg = {}, blk = {};
    dev.start.segments.forEach(function (s) { seg[s[0]] = s[1]; });
    dev.start.blocks.forEach(function (b) {
      blk[b[0]] = {addr: b[0], size: b[1], state: 1, req: b[2], stack: b[3]};
    });
    for (i = 0; i < upto; i++) {
      var e = dev.events[i], c = e[0];
      if (c === 0) blk[e[1]] = {addr: e[1], size: Math.max(512, Math.ceil(e[2] / 512) * 512),
        state: 1, req: e[2], stack: e[3], entry: i};
      else if (c === 1 && blk[e[1]]) blk[e[1]].state = 2;
      else if (c === 2) delete blk[e[1]];
      else if (c === 3 || c === 5) seg[e[1]] = e[2];
      else if (c === 4 || c === 6) delete seg[e[1]];
    }
    var addrs = Object.keys(seg).map(Number).sort(function (a, b) { return a - b; });
    var baddrs = Object.keys(blk).map(Number).sort(function (a, b) { return a - b; });
    var bi = 0;
    addrs.forEach(function (a) {
      var s = {addr: a, size: seg[a], blocks: []};
      while (bi < baddrs.length && baddrs[bi] < a) bi++;
      while (bi < baddrs.length && baddrs[bi] < a + seg[a]) s.blocks.push(blk[baddrs[bi++]]);
      segs.push(s);
    });
    return {segs: segs, exact: false};
  }

  function drawLayout() {
    var L = layoutAt(sel), segs = L.segs;
    var rowH = 16, gap = 3, n = segs.length;
    // Canvases taller than ~32k pixels fail: thin rows for many segments.
    if (n * (rowH + gap) > 30000) {
      rowH = Math.max(2, Math.floor(30000 / n) - 1); gap = 1;
    }
    var c = fitCanvas($('layout'), Math.max(40, n * (rowH + gap) + 10));
    var g = c.g;
    g.fillStyle = '#fff'; g.fillRect(0, 0, c.w, c.h);
    layoutRects = [];
    var maxSize = 1;
    segs.forEach(function (s) { maxSize = Math.max(maxSize, s.size); });
    var left = 200, avail = c.w - left - 10;
    g.font = '11px monospace'; g.textAlign = 'right';
    segs.forEach(function (s, r) {
      var y = 5 + r * (rowH + gap);
      var w = Math.max(60, avail * Math.sqrt(s.size / maxSize));
      g.fillStyle = '#444';
      if (rowH >= 10) g.fillText(hex(s.addr) + ' ' + fmtBytes(s.size), left - 6, y + 12);
      g.fillStyle = '#eeeeee'; g.fillRect(left, y, w, rowH);
      s.blocks.forEach(function (b) {
        var x0 = left + w * (b.addr - s.addr) / s.size;
        var bw = Math.max(1, w * b.size / s.size);
        if (b.state === 0) return;
        g.fillStyle = b.state === 2 ? '#d62728' : stackColor(b.stack);
        g.fillRect(x0, y + 1, bw, rowH - 2);
        layoutRects.push({x: x0, y: y, w: bw, h: rowH, b: b});
      });
      g.strokeStyle = '#999'; g.strokeRect(left + 0.5, y + 0.5, w, rowH);
    });
    $('layoutinfo').textContent = n + ' segments after entry ' + sel +
      (L.exact ? ' (final state of the file)' :
        ' (rebuilt from the trace; block sizes rounded to 512 B)');
    $('layout').onclick = function (ev) {
      var rect = $('layout').getBoundingClientRect();
      var x = ev.clientX - rect.left, y = ev.clientY - rect.top;
      for (var i = 0; i < layoutRects.length; i++) {
        var q = layoutRects[i];
        if (x >= q.x && x <= q.x + q.w + 1 && y >= q.y && y <= q.y + q.h) {
          var b = q.b;
          showStack('Block ' + hex(b.addr) + ', ' + fmtBytes(b.size) +
            ' (requested ' + b.req + ' B), ' + STATES[b.state] +
            (b.entry !== undefined ? ', allocated at entry ' + b.entry : ''),
            b.stack);
          return;
        }
      }
    };
  }

  function showStack(title, st) {
    var html = '<b>' + esc(title) + '</b>';
    var fr = st ? DATA.stacks[st] : null;
    if (!fr || !fr.length) {
      html += '<p class="dim">No stack was recorded for this ' +
        '(history off, context below "alloc", or a 2.0 file without history).</p>';
    } else {
      html += '<ol>';
      fr.forEach(function (f) {
        var F = DATA.frames[f];
        var user = /\.py$/.test(F[1]) && !/(^|\/)torch(_npu)?\//.test(F[1]);
        html += '<li class="' + (user ? 'user' : 'sys') + '">' + esc(F[0]) +
          ' <span class="dim">' + esc(F[1]) + ':' + F[2] + '</span></li>';
      });
      html += '</ol>';
    }
    $('stack').innerHTML = html;
  }

  function select(k, fromClick) {
    sel = k;
    $('slider').value = String(k);
    var e = k > 0 ? dev.events[k - 1] : null;
    var txt = 'after entry ' + k + ' of ' + dev.events.length + ': active ' +
      fmtBytes(series.act[k]) + ', reserved ' + fmtBytes(series.res[k]);
    if (e) txt += ' \u2014 last: ' + actionName(e[0]) + ' ' + hex(e[1]) + ' ' + e[2] + ' B' +
      (e[4] !== null ? ' at ' + new Date(e[4] / 1000).toISOString() : '');
    $('pos').textContent = txt;
    drawTimeline();
    drawLayout();
    if (e && fromClick) showStack('Entry ' + (k - 1) + ': ' + actionName(e[0]) + ' ' +
      hex(e[1]) + ', ' + e[2] + ' B', e[3]);
  }

  function showDevice(i) {
    dev = DATA.devices[i];
    series = computeSeries(dev);
    $('slider').max = String(dev.events.length);
    $('notrace').style.display = dev.events.length ? 'none' : 'block';
    select(dev.events.length, false);
  }

  function init() {
    $('title').textContent = DATA.file + ' (format ' + DATA.generation + ')';
    var sel0 = $('device');
    var best = 0;
    DATA.devices.forEach(function (d, i) {
      var o = document.createElement('option');
      o.value = String(i); o.textContent = 'device ' + d.device +
        ' (' + d.events.length + ' entries, ' + d.segments.length + ' segments)';
      sel0.appendChild(o);
      if (d.events.length > DATA.devices[best].events.length) best = i;
    });
    sel0.value = String(best);
    sel0.onchange = function () { showDevice(Number(sel0.value)); };
    $('slider').oninput = function () { select(Number($('slider').value), true); };
    if (DATA.settings) $('settings').textContent = JSON.stringify(DATA.settings, null, 1);
    if (!DATA.devices.length) { $('pos').textContent = 'The file holds no segments.'; return; }
    showDevice(best);
    window.addEventListener('resize', function () { drawTimeline(); drawLayout(); });
  }
  init();
})();
