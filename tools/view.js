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
  // Axis labels: the largest binary unit, no trailing zeros.
  function fmtTick(v) {
    var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], i = 0;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return String(Number(v.toFixed(2))) + ' ' + u[i];
  }
  // A round step (1, 2, 5 x 10^k; bytes: of a binary unit) giving at
  // most `most` intervals from 0 to max (as cli_nice_step).
  function niceStep(max, bytes, most) {
    var unit = 1;
    if (bytes) while (max / unit >= 1024) unit *= 1024;
    for (var p = 1; p < 1e18; p *= 10)
      for (var k = 0; k < 3; k++) {
        var st = [1, 2, 5][k] * p * unit;
        if (max / st <= most) return st;
      }
    return max || 1;
  }
  function fmtDur(us) {
    var a = Math.abs(us), sg = us < 0 ? '-' : '';
    if (a < 1000) return sg + a.toFixed(0) + ' us';
    if (a < 1e6) return sg + Number((a / 1e3).toPrecision(3)) + ' ms';
    if (a < 60e6) return sg + Number((a / 1e6).toPrecision(3)) + ' s';
    return sg + Math.floor(a / 60e6) + ' min ' + Math.floor(a / 1e6 % 60) + ' s';
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
    // Golden-angle hues, kept away from red (pending free) and alternating
    // in lightness, so neighbouring stack ids look different.
    var h = 30 + (st * 137.508) % 360 * 300 / 360;
    return 'hsl(' + h.toFixed(0) + ',55%,' + (st % 2 ? 50 : 62) + '%)';
  }

  var dev = null;        // the device record shown
  var series = null;     // {act: [], res: []}
  var sel = 0;           // entries applied (0..events.length)
  var layoutRects = [];  // clickable rectangles of the layout canvas
  var selBlock = null;   // address of the block whose stack is shown

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

  var TL = {l: 70, r: 14, t: 8, b: 36};
  function swatch(color, label, style) {
    return '<span class="sw" style="background:' + color + (style || '') +
      '"></span>' + esc(label);
  }
  function drawTimeline() {
    var c = fitCanvas($('timeline'), 260), g = c.g;
    g.fillStyle = '#fff'; g.fillRect(0, 0, c.w, c.h);
    var n = series.act.length, top = 1, i, peak = 0;
    for (i = 0; i < n; i++) {
      top = Math.max(top, series.act[i], series.res[i]);
      if (series.act[i] > series.act[peak]) peak = i;
    }
    var ystep = niceStep(top, true, 9), ymax = Math.ceil(top / ystep) * ystep;
    var pw = c.w - TL.l - TL.r, ph = c.h - TL.t - TL.b;
    var X = function (k) { return TL.l + (n > 1 ? pw * k / (n - 1) : pw / 2); };
    var Y = function (v) { return TL.t + ph - ph * v / ymax; };
    g.fillStyle = '#555'; g.font = '11px sans-serif';
    g.textAlign = 'right';
    for (var v = 0; v <= ymax; v += ystep) {
      var y = Y(v);
      g.strokeStyle = v ? '#e6e6e6' : '#999';
      g.beginPath(); g.moveTo(TL.l, y); g.lineTo(c.w - TL.r, y); g.stroke();
      g.fillText(fmtTick(v), TL.l - 5, y + 4);
    }
    g.textAlign = 'center'; g.strokeStyle = '#999';
    if (n > 1) {
      var xstep = niceStep(n - 1, false, Math.max(2, Math.floor(pw / 90)));
      for (var k = 0; k <= n - 1; k += xstep) {
        g.beginPath(); g.moveTo(X(k), TL.t + ph); g.lineTo(X(k), TL.t + ph + 4);
        g.stroke();
        g.fillText(String(k), X(k), TL.t + ph + 15);
      }
    }
    var ev = dev.events, span = '';
    if (ev.length > 1 && ev[0][4] !== null && ev[ev.length - 1][4] !== null)
      span = ' over ' + fmtDur(ev[ev.length - 1][4] - ev[0][4]);
    g.fillStyle = '#444';
    g.fillText('trace entry (' + (n - 1) + ' entries' + span + ')',
      TL.l + pw / 2, c.h - 4);
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
      g.fillText(anns[i][1].slice(0, 40), ax + 2, TL.t + 10 + 11 * (shown % 3));
      shown++;
    }
    path(series.act, true, 'rgba(31,119,180,0.55)');
    path(series.act, false, '#1f77b4');
    path(series.res, false, '#666');
    g.fillStyle = '#d62728';
    g.beginPath(); g.arc(X(peak), Y(series.act[peak]), 3.5, 0, 2 * Math.PI); g.fill();
    g.strokeStyle = '#ff7f0e'; g.lineWidth = 2;
    g.beginPath(); g.moveTo(X(sel), TL.t); g.lineTo(X(sel), TL.t + ph); g.stroke();
    g.lineWidth = 1;
    $('tlegend').innerHTML =
      swatch('rgba(31,119,180,0.55)', 'active (requested bytes of live allocations)') +
      swatch('#666', 'reserved (segments)', ';height:2px;vertical-align:middle') +
      (shown ? swatch('#9467bd', 'record_function', ';width:2px') : '') +
      swatch('#d62728', 'peak active ' + fmtBytes(series.act[peak]) +
        ' at entry ' + peak, ';border-radius:5px;width:8px;height:8px') +
      swatch('#ff7f0e', 'selected entry ' + sel, ';width:2px');
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
          return {addr: b[0], size: b[1], state: b[2], req: b[3], stack: b[4],
            entry: b[5] >= 0 ? b[5] : undefined, before: b[5] === -2};
        })});
      }
      return {segs: segs, exact: true};
    }
    var seg = {}, blk = {};
    dev.start.segments.forEach(function (s) { seg[s[0]] = s[1]; });
    dev.start.blocks.forEach(function (b) {
      blk[b[0]] = {addr: b[0], size: b[1], state: 1, req: b[2], stack: b[3],
        before: true};
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
    var left = 200, avail = c.w - left - 60;
    g.font = '11px monospace'; g.textAlign = 'right';
    segs.forEach(function (s, r) {
      var y = 5 + r * (rowH + gap);
      var w = Math.max(60, avail * Math.sqrt(s.size / maxSize));
      g.fillStyle = '#444';
      if (rowH >= 10) g.fillText(hex(s.addr) + ' ' + fmtBytes(s.size), left - 6, y + 12);
      g.fillStyle = '#eeeeee'; g.fillRect(left, y, w, rowH);
      var used = 0;
      s.blocks.forEach(function (b) {
        var x0 = left + w * (b.addr - s.addr) / s.size;
        var bw = Math.max(1, w * b.size / s.size);
        if (b.state === 0) return;
        used += b.size;
        g.fillStyle = b.state === 2 ? '#d62728' : stackColor(b.stack);
        g.fillRect(x0, y + 1, bw, rowH - 2);
        layoutRects.push({x: x0, y: y, w: bw, h: rowH, b: b});
        if (b.addr === selBlock) {
          g.strokeStyle = '#000'; g.lineWidth = 2;
          g.strokeRect(x0 - 1, y - 1, bw + 2, rowH + 2); g.lineWidth = 1;
        }
      });
      g.strokeStyle = '#999'; g.strokeRect(left + 0.5, y + 0.5, w, rowH);
      if (rowH >= 10) {
        g.fillStyle = '#666'; g.textAlign = 'left';
        g.fillText(Math.round(100 * used / s.size) + '%', left + w + 5, y + 12);
        g.textAlign = 'right';
      }
    });
    $('layoutinfo').textContent = n + (dev.events.length ? ' after entry ' + sel : '') +
      (L.exact ? ' (final state of the file)' :
        ' (rebuilt from the trace; block sizes rounded to 512 B)') +
      '; bar width grows with the square root of the segment size, ' +
      '% = bytes in use';
    $('blegend').innerHTML = swatch('hsl(200,55%,55%)', 'allocated (hue = stack; click for it)') +
      swatch('#7a8fa6', 'allocated, no stack') + swatch('#d62728', 'freed, pending (stream use)') +
      swatch('#eeeeee', 'free (cached)', ';border:1px solid #999');
    $('layout').onclick = function (ev) {
      var rect = $('layout').getBoundingClientRect();
      var x = ev.clientX - rect.left, y = ev.clientY - rect.top;
      for (var i = 0; i < layoutRects.length; i++) {
        var q = layoutRects[i];
        if (x >= q.x && x <= q.x + q.w + 1 && y >= q.y && y <= q.y + q.h) {
          showBlock(q.b);
          return;
        }
      }
    };
  }

  function showBlock(b) {
    selBlock = b.addr;
    drawLayout();
    showStack('Block ' + hex(b.addr) + ', ' + fmtBytes(b.size) +
      ' (requested ' + fmtBytes(b.req) + '), ' + STATES[b.state] +
      (b.entry !== undefined ? ', allocated at entry ' + b.entry : ''),
      b.stack, b.before);
  }

  function showStack(title, st, before) {
    var html = '<b>' + esc(title) + '</b>';
    var fr = st ? DATA.stacks[st] : null;
    if ((!fr || !fr.length) && before) {
      html += '<p class="dim">Allocated before the first entry of the ' +
        'trace (before recording began, or in entries the history ring ' +
        'buffer dropped): the file holds no stack for it.</p>';
    } else if (!fr || !fr.length) {
      html += '<p class="dim">No stack was recorded for this ' +
        '(history off, context below "alloc", or a 2.0 file without history).</p>';
    } else {
      // Innermost first; runs of native (C/C++) frames fold into one
      // line that opens on click, so the Python frames stand out.
      var items = [], run = [];
      var flush = function () {
        if (run.length > 2)
          items.push('<li class="sys"><details><summary>' + run.length +
            ' native frames</summary><ol>' + run.join('') + '</ol></details></li>');
        else items = items.concat(run);
        run = [];
      };
      fr.forEach(function (f) {
        var F = DATA.frames[f];
        var py = /\.py$/.test(F[1]);
        var user = py && !/(^|\/)torch(_npu)?\//.test(F[1]) &&
          !/\/lib\/python3[^/]*\/(?!site-packages|dist-packages)/.test(F[1]);
        var li = '<li class="' + (user ? 'user' : 'sys') + '">' + esc(F[0]) +
          ' <span class="dim">' + esc(F[1]) + ':' + F[2] + '</span></li>';
        if (py) { flush(); items.push(li); } else run.push(li);
      });
      flush();
      html += '<ol>' + items.join('') + '</ol>';
    }
    $('stack').innerHTML = html;
  }

  function select(k, fromClick) {
    sel = k;
    if (fromClick) selBlock = null;
    $('slider').value = String(k);
    var e = k > 0 ? dev.events[k - 1] : null;
    var txt = (dev.events.length ? 'after entry ' + k + ' of ' + dev.events.length
      : 'final state') + ': active ' +
      fmtBytes(series.act[k]) + ', reserved ' + fmtBytes(series.res[k]);
    var t0 = dev.events.length ? dev.events[0][4] : null;
    if (e) txt += ' \u2014 last: ' + actionName(e[0]) + ' ' + hex(e[1]) + ' ' +
      fmtBytes(e[2]) + (e[4] !== null && t0 !== null ? ' at +' + fmtDur(e[4] - t0) : '');
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
    // Only marker entries (snapshot, oom...: a 2.0 file's trace): no
    // history to draw.
    var history = dev.events.some(function (e) { return e[0] <= 6; });
    $('notrace').style.display = history ? 'none' : 'block';
    if (dev.events.length && !history)
      $('notrace').textContent = 'This file holds no allocation history for ' +
        'this device (' + dev.events.length + ' marker entr' +
        (dev.events.length > 1 ? 'ies' : 'y') + ': ' +
        dev.events.map(function (e) { return actionName(e[0]); }).slice(0, 3).join(', ') +
        '): the layout is its final state.';
    $('timeline').style.display = $('slider').style.display =
      $('tlegend').style.display = history ? '' : 'none';
    var rows = (dev.sites || []).map(function (x) {
      return '<tr><td class="n">' + fmtBytes(x[1]) + '</td><td class="n">' + x[2] +
        ' &times;</td><td class="site">' +
        esc(x[0]).replace(/([\/ ])/g, '$1<wbr>') + '</td></tr>';
    });
    $('sites').innerHTML = rows.join('');
    $('sitesbox').style.display = rows.length ? '' : 'none';
    select(dev.events.length, false);
  }

  // Links: #device=D&entry=N&block=0xADDR select a device, an entry (its
  // stack is shown) and a block of the layout at that entry.
  function fromHash() {
    var h = {};
    location.hash.replace(/^#/, '').split('&').forEach(function (kv) {
      var p = kv.split('='); if (p.length === 2) h[p[0]] = decodeURIComponent(p[1]);
    });
    if (h.device !== undefined) {
      for (var i = 0; i < DATA.devices.length; i++)
        if (String(DATA.devices[i].device) === h.device) {
          $('device').value = String(i); showDevice(i);
        }
    }
    if (h.entry !== undefined && /^[0-9]+$/.test(h.entry))
      select(Math.min(Number(h.entry), dev.events.length), true);
    if (h.block) {
      var a = parseInt(h.block, 16);
      for (var k = 0; k < layoutRects.length; k++)
        if (layoutRects[k].b.addr === a) { showBlock(layoutRects[k].b); break; }
    }
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
    if (DATA.settings && DATA.settings.length)
      $('settings').innerHTML = DATA.settings.map(function (x) {
        return '<span>' + esc(x) + '</span>'; }).join(' ');
    else $('settingsbox').style.display = 'none';
    if (!DATA.devices.length) { $('pos').textContent = 'The file holds no segments.'; return; }
    showDevice(best);
    fromHash();
    window.addEventListener('hashchange', fromHash);
    window.addEventListener('resize', function () { drawTimeline(); drawLayout(); });
  }
  init();
})();
