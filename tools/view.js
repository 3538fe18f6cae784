// view.js -- the memsnap HTML viewer, embedded by `memsnap view`.
// Reads the global DATA = {files: [...]} written by cmd_view.c (the shape
// of one file is described at the top of tools/view_model.c) and draws on
// canvases, with no network access and no library:
//   - Active Memory Timeline: every allocation kept by the level of detail
//     as a band, stacked in allocation order (PyTorch memory_viz's view),
//     the others summed in one grey band; hover: size, lifetime, stack;
//   - Allocator State History: the trace entries (a virtual list; arrow
//     keys step) and the segments/blocks after the selected entry, rebuilt
//     from the nearest key frame;
//   - Active Cached Segment Timeline: segments as bands;
//   - Compare (two files): both timelines and the top sites side by side.
// Zoom: wheel on a timeline, drag to pan, brush in the overview, double
// click to reset.  OOM markers, record_function lanes and leak highlighting
// (the sites of `memsnap leaks`, growing step after step) are drawn on the
// timelines.
// Entries are numbered from 0 (device_traces[d][i]); state s is the state
// after entry s-1 (s = 0: before entry 0).
'use strict';
(function () {
  var ACTIONS = ['alloc', 'free_requested', 'free_completed', 'segment_alloc',
    'segment_free', 'segment_map', 'segment_unmap', 'snapshot', 'oom',
    'annotate', 'workspace_snapshot'];
  var STATES = ['inactive', 'active_allocated', 'active_pending_free', 'other'];
  var TAB10 = ['#4e79a7', '#f28e2c', '#e15759', '#76b7b2', '#59a14f',
    '#edc949', '#af7aa1', '#ff9da7', '#9c755f', '#bab0ab'];
  var REST = '#c9c9c9', LEAK = '#d62728', DIM = '#dedede';
  var $ = function (id) { return document.getElementById(id); };

  // ---- formatting -------------------------------------------------------
  function fmtBytes(v) {
    var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'], i = 0;
    while (Math.abs(v) >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (i === 0 ? v.toFixed(0) : v.toFixed(1)) + ' ' + u[i];
  }
  function fmtTick(v) {
    var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'], i = 0;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return String(Number(v.toFixed(2))) + ' ' + u[i];
  }
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
  function num(v) { return String(v).replace(/\B(?=(\d{3})+(?!\d))/g, ','); }
  function actionName(c) { return c < ACTIONS.length ? ACTIONS[c] : 'other'; }
  function esc(s) {
    return String(s).replace(/[&<>"]/g, function (c) {
      return {'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;'}[c];
    });
  }
  function swatch(color, label, style) {
    return '<span class="sw" style="background:' + color + (style || '') +
      '"></span>' + esc(label);
  }
  function stackColor(st) {
    if (!st) return '#7a8fa6';
    var h = 30 + (st * 137.508) % 360 * 300 / 360;
    return 'hsl(' + h.toFixed(0) + ',55%,' + (st % 2 ? 50 : 62) + '%)';
  }
  function oomText(req, free) {
    return 'OOM (requested ' + fmtBytes(req) + ', device has ' +
      fmtBytes(free) + ' free)';
  }
  function stateLabel(s) {
    // a device without trace entries has one state: the file's final one
    if (D && !D.n) return 'at the final state (no trace entries)';
    return s === 0 ? 'before entry 0 (start of the trace)' : 'after entry ' + num(s - 1);
  }

  // ---- state --------------------------------------------------------------
  var S = {fi: 0, di: 0, view: 'active', x0: 0, x1: 1, sel: 0,
    pinned: null, leaks: false};
  var F = null, D = null;   // the file and device shown
  var geo = null;           // geometry of the last timeline drawing

  function frames(node) {
    var out = [], nodes = F.nodes, guard = 0;
    while (node > 0 && guard++ < 100000) {
      out.push(nodes[2 * node - 1]);
      node = nodes[2 * node - 2];
    }
    return out;
  }

  // Per device, derived once: band ends, rows of the event list.
  function prep(d) {
    if (d.prep) return d.prep;
    var P = {};
    var ser = d.series;
    P.nb = ser.amax.length;
    // value of a series at state s (exact when w == 1)
    P.val = function (which, s) {
      if (s <= 0) return which === 'a' ? ser.a0 : ser.r0;
      var b = Math.min(P.nb - 1, Math.floor((s - 1) / ser.w));
      return which === 'a' ? ser.amax[b] : ser.rmax[b];
    };
    // rows of the event list: [entry] or [-1, from, to] for a gap
    var rows = [], last = 0;
    d.windows.forEach(function (w, wi) {
      if (w.first > last) rows.push([-1, last, w.first]);
      for (var i = 0; i < w.count; i++) rows.push([w.first + i, wi, i]);
      last = w.first + w.count;
    });
    if (last < d.n) rows.push([-1, last, d.n]);
    P.rows = rows;
    P.rowOf = function (entry) {   // first row with entry >= given
      var lo = 0, hi = rows.length;
      while (lo < hi) {
        var m = (lo + hi) >> 1, r = rows[m];
        var key = r[0] >= 0 ? r[0] : r[1];
        if (key < entry) lo = m + 1; else hi = m;
      }
      if (lo < rows.length && rows[lo][0] < 0 && rows[lo][1] > entry && lo > 0) lo--;
      return Math.min(lo, rows.length - 1);
    };
    P.embedded = 0;
    d.windows.forEach(function (w) { P.embedded += w.count; });
    P.oomAt = {};
    d.ooms.forEach(function (o, k) { P.oomAt[o[0]] = k; });
    // lanes of annotation ranges
    var rg = d.annotations.ranges, lanes = [], laneOf = [];
    var idx = [];
    for (var i = 0; i < rg.length / 3; i++) idx.push(i);
    idx.sort(function (x, y) { return rg[3 * x + 1] - rg[3 * y + 1] || rg[3 * y + 2] - rg[3 * x + 2]; });
    idx.forEach(function (k) {
      var s0 = rg[3 * k + 1], s1 = rg[3 * k + 2], l = 0;
      while (l < lanes.length && lanes[l] > s0) l++;
      if (l >= 8) l = 7;
      lanes[l] = Math.max(lanes[l] || 0, s1);
      laneOf[k] = l;
    });
    P.nlanes = Math.min(8, lanes.length);
    P.laneOf = laneOf;
    d.prep = P;
    return P;
  }

  function entryRec(d, i) {   // an embedded entry, or null
    for (var w = 0; w < d.windows.length; w++) {
      var W = d.windows[w];
      if (i >= W.first && i < W.first + W.count) {
        var k = i - W.first, ev = W.ev;
        return {i: i, a: ev.a[k], addr: ev.addr[k], size: ev.size[k],
          stack: ev.stack[k], t: ev.t[k], stream: ev.stream[k]};
      }
    }
    return null;
  }

  function entryText(e) {
    if (e.a === 8) return 'Entry ' + e.i + ': ' + oomText(e.size, e.addr);
    var s = 'Entry ' + e.i + ': ' + actionName(e.a) + ' ' + hex(e.addr) + ', ' +
      fmtBytes(e.size) + ' (' + num(e.size) + ' B)';
    if (e.stream) s += ', stream ' + e.stream;
    if (e.t !== null && e.t !== undefined) s += ', at +' + fmtDur(e.t);
    return s;
  }

  // ---- the page's frame ---------------------------------------------------
  function build() {
    var app = $('app');
    app.innerHTML =
      '<div id="bar"><select id="file"></select>' +
      '<button class="tab" data-v="active">Active Memory Timeline</button>' +
      '<button class="tab" data-v="history">Allocator State History</button>' +
      '<button class="tab" data-v="segments">Active Cached Segment Timeline</button>' +
      '<button class="tab" data-v="compare">Compare</button>' +
      '<select id="device"></select>' +
      '<label><input type="checkbox" id="leaktoggle"> highlight leaks</label>' +
      '<button id="reset">reset zoom</button></div>' +
      '<div id="pos"></div><div id="lodnote" class="warn"></div>' +
      '<div id="notrace" class="dim" style="display:none"></div>' +
      '<div id="main"><div id="left">' +
      '<div id="tl"><div id="tlegend" class="legend"></div>' +
      '<canvas id="plot"></canvas><canvas id="lanes"></canvas>' +
      '<canvas id="mini"></canvas><div id="zoominfo"></div></div>' +
      '<div id="hist"><div id="evlist" tabindex="0"><div id="evspace"></div></div>' +
      '<div id="layoutbox"><div id="layoutinfo" class="dim"></div>' +
      '<div id="blegend" class="legend"></div><canvas id="layout"></canvas></div></div>' +
      '<div id="cmp"><div id="clegend" class="legend"></div><canvas id="cmpplot"></canvas>' +
      '<h2>Figures</h2><table id="cmptable"></table>' +
      '<h2>Top allocation sites (live bytes at the end)</h2><table id="cmpsites"></table></div>' +
      '</div><div id="right"><div id="info" class="dim">Hover a band, a block or an ' +
      'entry to see its stack; click to keep it.</div>' +
      '<div id="oombox"></div><div id="leakbox"></div>' +
      '<div id="sitesbox"><h2>Top allocation sites <span class="dim" ' +
      'style="font-weight:normal">(live bytes at the end of the file)</span></h2>' +
      '<table id="sites"></table></div>' +
      '<div id="settingsbox"><h2>Allocator settings</h2><div id="settings"></div></div>' +
      '</div></div>';
    var fsel = $('file');
    DATA.files.forEach(function (f, i) {
      var o = document.createElement('option');
      o.value = String(i);
      o.textContent = f.file + ' (' + f.generation + ')';
      fsel.appendChild(o);
    });
    fsel.style.display = DATA.files.length > 1 ? '' : 'none';
    fsel.onchange = function () { showFile(Number(fsel.value)); };
    Array.prototype.forEach.call(document.querySelectorAll('button.tab'), function (b) {
      if (b.getAttribute('data-v') === 'compare' && DATA.files.length < 2)
        b.style.display = 'none';
      b.onclick = function () { setView(b.getAttribute('data-v')); };
    });
    $('device').onchange = function () { showDevice(Number($('device').value)); };
    $('leaktoggle').onchange = function () { S.leaks = $('leaktoggle').checked; redraw(); };
    $('reset').onclick = function () { S.x0 = 0; S.x1 = Math.max(1, D.n); redraw(); };
    document.addEventListener('keydown', onKey);
    window.addEventListener('resize', redraw);
    window.addEventListener('hashchange', fromHash);
    setupTimeline();
    setupHistory();
  }

  function setView(v) {
    S.view = v;
    Array.prototype.forEach.call(document.querySelectorAll('button.tab'), function (b) {
      b.className = 'tab' + (b.getAttribute('data-v') === v ? ' on' : '');
    });
    redraw();
  }

  function showFile(i) {
    S.fi = i;
    F = DATA.files[i];
    $('file').value = String(i);
    $('title').textContent = F.file + ' (format ' + F.generation + ')';
    // the tab's name: the file's base name, as a person finds it again
    document.title = F.file.replace(/^.*[\/\\]/, '') + ' \u2014 memsnap view';
    var sel = $('device');
    sel.innerHTML = '';
    var best = 0;
    F.devices.forEach(function (d, k) {
      var o = document.createElement('option');
      o.value = String(k);
      o.textContent = 'device ' + d.device + ' (' + num(d.n) + ' entries, ' +
        d.segments.length + ' segments)';
      sel.appendChild(o);
      if (d.n > F.devices[best].n) best = k;
    });
    sel.style.display = F.devices.length > 1 ? '' : 'none';
    if (F.settings && F.settings.length) {
      $('settings').innerHTML = F.settings.map(function (x) {
        return '<span>' + esc(x) + '</span>'; }).join(' ');
      $('settingsbox').style.display = '';
    } else $('settingsbox').style.display = 'none';
    if (!F.devices.length) {
      D = null;
      $('pos').textContent = 'The file holds no segments and no trace.';
      ['tl', 'hist', 'cmp', 'sitesbox'].forEach(function (x) { $(x).style.display = 'none'; });
      return;
    }
    showDevice(best);
  }

  function showDevice(k) {
    S.di = k;
    D = F.devices[k];
    $('device').value = String(k);
    prep(D);
    S.x0 = 0; S.x1 = Math.max(1, D.n); S.sel = D.n; S.pinned = null;
    var hasTrace = D.n > 0 && D.windows.length + D.series.amax.length > 0;
    var history = false;
    D.windows.forEach(function (w) {
      for (var i = 0; i < w.count && !history; i++) if (w.ev.a[i] <= 6) history = true;
    });
    if (!history && D.bands.total > D.bands.start.length) history = true;
    if (!history && D.windows.length === 0 && D.n > 0) history = true;
    var nt = $('notrace');
    if (!D.n) {
      nt.style.display = '';
      nt.textContent = 'This file holds no trace for this device: the ' +
        'timeline shows the final allocations, the layout is the final state.';
    } else if (!history) {
      nt.style.display = '';
      var names = [];
      D.windows.forEach(function (w) {
        for (var i = 0; i < w.count && names.length < 3; i++) names.push(actionName(w.ev.a[i]));
      });
      nt.textContent = 'This file holds no allocation history for this device (' +
        D.n + ' marker entr' + (D.n > 1 ? 'ies' : 'y') + ': ' + names.join(', ') +
        '): the layout is its final state.';
    } else nt.style.display = 'none';
    D.hasHistory = history && hasTrace;
    var P = D.prep;
    var note = [];
    if (D.n && P.embedded < D.n)
      note.push('Level of detail: ' + num(P.embedded) + ' of ' + num(D.n) +
        ' entries are in this page (marked in the overview); the series ' +
        (D.series.w > 1 ? 'shows the maximum of every ' + num(D.series.w) + ' entries' : 'is exact') + '.');
    if (D.bands.start.length < D.bands.total)
      note.push(num(D.bands.start.length) + ' of ' + num(D.bands.total) +
        ' allocations are drawn one by one; the others are summed in the grey band.');
    if (note.length) note.push('memsnap view --budget / --detail keep more.');
    $('lodnote').textContent = note.join(' ');
    sitesPanel();
    oomPanel();
    leakPanel();
    setView(S.view === 'compare' && DATA.files.length < 2 ? 'active' : S.view);
  }

  function redraw() {
    if (!D) return;
    var tl = S.view === 'active' || S.view === 'segments';
    var showTl = tl && (D.hasHistory || D.n === 0);
    $('tl').style.display = showTl ? '' : 'none';
    $('hist').style.display = S.view === 'history' || (tl && !showTl) ? 'flex' : 'none';
    $('cmp').style.display = S.view === 'compare' ? '' : 'none';
    $('reset').style.display = tl ? '' : 'none';
    if (showTl) drawTimeline();
    if (S.view === 'history' || (tl && !showTl)) drawHistory();
    if (S.view === 'compare') drawCompare();
    posText();
  }

  function posText() {
    if (!D) return;
    var s = S.sel;
    var txt = 'device ' + D.device + ', ' + (D.n ? stateLabel(s) + ' of ' +
      num(D.n) + ' entries (0..' + num(D.n - 1) + ')' : 'final state') + ': active ' +
      fmtBytes(D.prep.val('a', s)) + ', reserved ' + fmtBytes(D.prep.val('r', s));
    var e = s > 0 ? entryRec(D, s - 1) : null;
    if (e) txt += ' \u2014 last: ' + (e.a === 8 ? oomText(e.size, e.addr) :
      actionName(e.a) + ' ' + hex(e.addr) + ' ' + fmtBytes(e.size));
    $('pos').textContent = txt;
  }

  // ---- panels ---------------------------------------------------------------
  function sitesPanel() {
    var rows = (D.sites || []).map(function (x) {
      return '<tr><td class="n">' + fmtBytes(x[1]) + '</td><td class="n">' + x[2] +
        ' &times;</td><td class="site">' +
        esc(x[0]).replace(/([\/ ])/g, '$1<wbr>') + '</td></tr>';
    });
    $('sites').innerHTML = rows.join('');
    $('sitesbox').style.display = rows.length ? '' : 'none';
  }

  function oomPanel() {
    var box = $('oombox');
    if (!D.ooms.length) { box.innerHTML = ''; return; }
    box.innerHTML = '<h2 class="bad">Out of memory (' + D.ooms.length + ')</h2>' +
      D.ooms.map(function (o, k) {
        return '<div class="oom" data-k="' + k + '"><b>' + esc(oomText(o[1], o[2])) +
          '</b><br>entry ' + num(o[0]) + '; allocated ' + fmtBytes(o[4]) + ', reserved ' +
          fmtBytes(o[5]) + ' before it</div>';
      }).join('');
    Array.prototype.forEach.call(box.querySelectorAll('div.oom'), function (el) {
      el.onclick = function () { showOom(Number(el.getAttribute('data-k')), true); };
    });
  }

  function showOom(k, pin) {
    var o = D.ooms[k];
    if (pin) {
      S.sel = o[0] + 1;
      var span = Math.max(50, (S.x1 - S.x0) / 4);
      if (S.sel < S.x0 || S.sel > S.x1) {
        S.x0 = Math.max(0, S.sel - span / 2); S.x1 = Math.min(D.n, S.x0 + span);
      }
    }
    showStack(oomText(o[1], o[2]) + ' at entry ' + num(o[0]) + '; allocated ' +
      fmtBytes(o[4]) + ', reserved ' + fmtBytes(o[5]) +
      ' before it. The stack of the failing allocation:', o[3], false, pin);
    if (pin) redraw();
  }

  function leakPanel() {
    var box = $('leakbox');
    var st = D.steps;
    if (!st) {
      box.innerHTML = '<h2>Leaks across steps</h2><p class="dim">No steps: ' +
        esc(D.steps_why || 'no repeated record_function range') + '. Leak ' +
        'highlighting needs one range per step (e.g. ' +
        'torch.profiler.record_function("step") around each iteration; ' +
        'memsnap view --step NAME names it).</p>';
      $('leaktoggle').disabled = true;
      return;
    }
    $('leaktoggle').disabled = false;
    var n = st.ranges.length / 2;
    var html = '<h2>Leaks across steps</h2><p>' + n + ' steps "' + esc(st.name) +
      '"' + (st.from_device != null ? ' (taken from device ' + st.from_device +
      '\'s record_function annotations: none were recorded for this device)' : '') +
      '. ';
    if (!D.leaks.length) html += 'No site\'s live memory grows from step to step ' +
      '(the rule of memsnap leaks).</p>';
    else {
      // bands of each leak site: allocations summed into the grey rest
      // (level of detail) are not bands and cannot turn red
      var drawn = D.leaks.map(function () { return 0; });
      D.bands.site.forEach(function (k) { if (k >= 0) drawn[k]++; });
      html += 'Sites whose live memory at the end of each step grows step after step ' +
        '(the candidates of memsnap leaks; click to highlight their allocations)' +
        (D.leak_total > D.leaks.length ? ': ' + D.leaks.length + ' of ' +
          D.leak_total + ' sites (memsnap leaks --top 0 lists all)' : '') + ':</p>' +
        '<table><tr><th class="n">conf.</th><th class="n">growth</th>' +
        '<th class="n">per step</th><th class="n">grew/shrank</th>' +
        '<th class="n" title="allocations of the site drawn as bands / in the trace">' +
        'drawn</th><th>site</th></tr>' +
        D.leaks.map(function (x, k) {
          return '<tr class="clk" data-k="' + k + '"><td class="n">' + x[1].toFixed(3) +
            '</td><td class="n">' + fmtBytes(x[3] - x[2]) + '</td><td class="n">' +
            fmtBytes(Math.floor((x[3] - x[2]) / Math.max(1, n - 1))) +
            '</td><td class="n">' + x[4] + '/' + x[5] + ' of ' + (n - 1) +
            '</td><td class="n">' + drawn[k] + ' of ' + x[6] +
            '</td><td class="site">' + esc(x[0]) + '</td></tr>';
        }).join('') + '</table>';
    }
    box.innerHTML = html;
    Array.prototype.forEach.call(box.querySelectorAll('tr.clk'), function (el) {
      el.onclick = function () {
        S.leaks = true; $('leaktoggle').checked = true;
        if (S.view !== 'active') setView('active'); else redraw();
      };
    });
  }

  // Hover shows a thing's details; a click keeps them (S.pinned), shown
  // again when the pointer leaves.
  function showPinned() {
    var p = S.pinned;
    if (p) showStack(p.title, p.node, p.before, false);
  }

  function showStack(title, node, before, pin) {
    var html = '<b>' + esc(title) + '</b>';
    var fr = node ? frames(node) : [];
    if (!fr.length && before) {
      html += '<p class="dim">Allocated before the first entry of the trace ' +
        '(before recording began, or in entries the history ring buffer ' +
        'dropped): the file holds no stack for it.</p>';
    } else if (!fr.length) {
      html += '<p class="dim">No stack was recorded for this (history off, ' +
        'context below "alloc", or a 2.0 file without history).</p>';
    } else {
      var items = [], run = [];
      var flush = function () {
        if (run.length > 2)
          items.push('<li class="sys"><details><summary>' + run.length +
            ' native frames</summary><ol>' + run.join('') + '</ol></details></li>');
        else items = items.concat(run);
        run = [];
      };
      fr.forEach(function (f) {
        var R = F.frames[f], Fr = [F.strings[R[0]], F.strings[R[1]], R[2], R[3]];
        // Python: a .py file or a name in brackets (<stdin>, <string>,
        // <frozen ...>); user: memsnap's rule (cli_frame_is_user)
        var py = /\.py$/.test(Fr[1]) || /^</.test(Fr[1]);
        var user = Fr[3] === 1;
        var li = '<li class="' + (user ? 'user' : 'sys') + '">' + esc(Fr[0]) +
          ' <span class="dim">' + esc(Fr[1]) + ':' + Fr[2] + '</span></li>';
        if (py) { flush(); items.push(li); } else run.push(li);
      });
      flush();
      html += '<ol>' + items.join('') + '</ol>';
    }
    if (pin) S.pinned = {title: title, node: node, before: before};
    $('info').className = '';
    $('info').innerHTML = html;
  }

  // ---- timelines -------------------------------------------------------------
  var PL = {l: 72, r: 12, t: 10, b: 26};

  function fitCanvas(cv, h) {
    var w = cv.parentNode.clientWidth || 900;
    var dpr = window.devicePixelRatio || 1;
    cv.width = Math.round(w * dpr); cv.height = Math.round(h * dpr);
    cv.style.width = w + 'px'; cv.style.height = h + 'px';
    var g = cv.getContext('2d');
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    return {g: g, w: w, h: h};
  }

  // Bytes of the drawn bands live at state s, for every state of `qs`
  // (a band is live from its start to before its end; -1: to the end).
  function drawnAt(B, qs) {
    var ev = [], i, n = B.start.length;
    for (i = 0; i < n; i++) {
      ev.push([B.start[i], B.size[i]]);
      if (B.end[i] >= 0) ev.push([B.end[i], -B.size[i]]);
    }
    ev.sort(function (x, y) { return x[0] - y[0]; });
    var order = [], out = new Float64Array(qs.length);
    for (i = 0; i < qs.length; i++) order.push(i);
    order.sort(function (x, y) { return qs[x] - qs[y]; });
    var p = 0, sum = 0;
    order.forEach(function (k) {
      while (p < ev.length && ev[p][0] <= qs[k]) sum += ev[p++][1];
      out[k] = sum;
    });
    return out;
  }

  // The bytes of each bucket's maximum not drawn as bands (the grey
  // "other allocations, summed" band): the maximum less the drawn bands then.
  function restOf(d, seg) {
    var key = seg ? 'rrest' : 'arest';
    if (d.prep[key]) return d.prep[key];
    var ser = d.series, mx = seg ? ser.rmax : ser.amax, at = seg ? ser.rat : ser.aat;
    var drawn = drawnAt(seg ? d.segbands : d.bands, at), rest = new Float64Array(mx.length);
    for (var k = 0; k < mx.length; k++) rest[k] = Math.max(0, mx[k] - drawn[k]);
    d.prep[key] = rest;
    return rest;
  }

  function kindData() {
    var seg = S.view === 'segments', ser = D.series;
    return {seg: seg, B: seg ? D.segbands : D.bands,
      mx: seg ? ser.rmax : ser.amax, at: seg ? ser.rat : ser.aat,
      rest: restOf(D, seg), v0: seg ? ser.r0 : ser.a0};
  }

  // Sample state and undrawn bytes of each pixel column of [x0, x1].
  function columns(K, cols) {
    var w = D.series.w, nb = K.mx.length, span = S.x1 - S.x0;
    var cs = new Float64Array(cols), cr = new Float64Array(cols);
    for (var c = 0; c < cols; c++) {
      var a = S.x0 + span * c / cols, b = S.x0 + span * (c + 1) / cols;
      var lo = Math.ceil(a), hi = Math.ceil(b) - 1;
      if (hi < lo) { lo = hi = Math.min(D.n, Math.max(0, Math.floor(a))); }
      if (lo <= 0 && hi <= 0 || nb === 0) { cs[c] = 0; cr[c] = 0; if (nb === 0) cs[c] = D.n; continue; }
      var b0 = Math.max(0, Math.floor((Math.max(lo, 1) - 1) / w));
      var b1 = Math.min(nb - 1, Math.floor((hi - 1) / w));
      var best = b0;
      for (var k = b0 + 1; k <= b1; k++) if (K.mx[k] > K.mx[best]) best = k;
      if (w > 1 && hi - lo + 1 < w) { cs[c] = Math.round((lo + hi) / 2); }
      else cs[c] = K.at[best];
      if (lo === 0 && K.v0 > K.mx[best]) { cs[c] = 0; cr[c] = 0; continue; }
      cr[c] = K.rest[best];
    }
    return {s: cs, rest: cr};
  }

  function visibleMax(K) {
    var w = D.series.w, nb = K.mx.length, m = S.x0 <= 0 ? K.v0 : 0;
    var b0 = Math.max(0, Math.floor((Math.max(1, Math.floor(S.x0)) - 1) / w));
    var b1 = Math.min(nb - 1, Math.floor((Math.ceil(S.x1) - 1) / w));
    for (var k = b0; k <= b1; k++) m = Math.max(m, K.mx[k]);
    if (!K.seg) {   // the reserved line too
      var R = D.series.rmax;
      if (S.x0 <= 0) m = Math.max(m, D.series.r0);
      for (k = b0; k <= b1; k++) m = Math.max(m, R[k]);
    }
    if (nb === 0) {
      var B = K.B, sum = 0;
      for (k = 0; k < B.size.length; k++) sum += B.size[k];
      // no trace: room above the final state's flat reserved line, which
      // the plot's frame would hide at the top
      m = Math.max(m, sum) * 1.05;
    }
    return m || 1;
  }

  function bandColor(K, i) {
    if (S.leaks && !K.seg) return K.B.site[i] >= 0 ? LEAK : DIM;
    return TAB10[i % 10];
  }

  function drawTimeline() {
    var K = kindData(), B = K.B, N = B.start.length;
    var c = fitCanvas($('plot'), 330), g = c.g;
    var pw = Math.max(10, Math.floor(c.w - PL.l - PL.r)), ph = c.h - PL.t - PL.b;
    g.fillStyle = '#fff'; g.fillRect(0, 0, c.w, c.h);
    if (D.n === 0) { S.x0 = 0; S.x1 = 1; }
    var cols = pw, C = columns(K, cols);
    var ymax = visibleMax(K);
    var ystep = niceStep(ymax, true, 8); ymax = Math.ceil(ymax / ystep) * ystep;
    var Y = function (v) { return PL.t + ph - ph * v / ymax; };
    var X = function (s) { return PL.l + pw * (s - S.x0) / (S.x1 - S.x0); };
    g.font = '11px sans-serif'; g.textAlign = 'right'; g.fillStyle = '#555';
    for (var v = 0; v <= ymax; v += ystep) {
      g.strokeStyle = v ? '#eee' : '#999';
      g.beginPath(); g.moveTo(PL.l, Y(v)); g.lineTo(PL.l + pw, Y(v)); g.stroke();
      g.fillText(fmtTick(v), PL.l - 5, Y(v) + 4);
    }
    // bands, column by column (stacked in start order)
    var live = [], p = 0, end = B.end, start = B.start, size = B.size;
    for (var col = 0; col < cols; col++) {
      var s = C.s[col], x = PL.l + col;
      while (p < N && start[p] <= s) live.push(p++);
      var y = 0, k2 = 0, thinFrom = -1;
      for (var q = 0; q < live.length; q++) {
        var i = live[q];
        if (end[i] >= 0 && end[i] <= s) continue;
        live[k2++] = i;
        var y1 = y + size[i];
        var hpx = ph * size[i] / ymax;
        if (hpx >= 0.6) {
          if (thinFrom >= 0) { g.fillStyle = '#9aa9b8'; g.fillRect(x, Y(y), 1, Y(thinFrom) - Y(y)); thinFrom = -1; }
          g.fillStyle = bandColor(K, i);
          g.fillRect(x, Y(y1), 1, Math.max(0.6, Y(y) - Y(y1)));
        } else if (thinFrom < 0) thinFrom = y;
        y = y1;
      }
      live.length = k2;
      if (thinFrom >= 0) { g.fillStyle = '#9aa9b8'; g.fillRect(x, Y(y), 1, Y(thinFrom) - Y(y)); }
      if (C.rest[col] > 0) {
        g.fillStyle = REST;
        g.fillRect(x, Y(y + C.rest[col]), 1, Y(y) - Y(y + C.rest[col]));
      }
    }
    // reserved line in the active view
    if (!K.seg && D.series.amax.length) {
      g.strokeStyle = '#555'; g.lineWidth = 1.2; g.beginPath();
      for (col = 0; col < cols; col++) {
        var rv = D.prep.val('r', C.s[col]);
        if (col === 0) g.moveTo(PL.l, Y(rv)); else g.lineTo(PL.l + col, Y(rv));
      }
      g.stroke(); g.lineWidth = 1;
    } else if (!K.seg) {
      // no trace: the reserved bytes of the final state, a flat line
      g.strokeStyle = '#555'; g.lineWidth = 1.2; g.beginPath();
      g.moveTo(PL.l, Y(D.series.r0)); g.lineTo(PL.l + pw, Y(D.series.r0));
      g.stroke(); g.lineWidth = 1;
    }
    // x axis: ticks at entry k, drawn at state k+1 (after entry k)
    g.fillStyle = '#555'; g.textAlign = 'center'; g.strokeStyle = '#999';
    if (D.n > 0) {
      var span = S.x1 - S.x0, xstep = niceStep(span, false, Math.max(2, Math.floor(pw / 90)));
      for (var t = Math.ceil((S.x0 - 1) / xstep) * xstep; t <= S.x1 - 1; t += xstep) {
        if (t < 0) continue;
        var tx = X(t + 1);
        if (tx < PL.l - 1 || tx > PL.l + pw + 1) continue;
        g.beginPath(); g.moveTo(tx, PL.t + ph); g.lineTo(tx, PL.t + ph + 4); g.stroke();
        g.fillText(num(t), tx, PL.t + ph + 15);
      }
    }
    // selected state
    if (D.n > 0) {
      var sx = X(S.sel);
      if (sx >= PL.l && sx <= PL.l + pw) {
        g.strokeStyle = '#ff7f0e'; g.lineWidth = 2;
        g.beginPath(); g.moveTo(sx, PL.t); g.lineTo(sx, PL.t + ph); g.stroke(); g.lineWidth = 1;
      }
    }
    // OOM markers
    var P = D.prep;
    D.ooms.forEach(function (o) {
      var ox = X(o[0] + 1);
      if (ox < PL.l || ox > PL.l + pw) return;
      g.strokeStyle = '#c00'; g.lineWidth = 2;
      g.beginPath(); g.moveTo(ox, PL.t); g.lineTo(ox, PL.t + ph); g.stroke(); g.lineWidth = 1;
      g.fillStyle = '#c00'; g.beginPath();
      g.moveTo(ox - 6, PL.t); g.lineTo(ox + 6, PL.t); g.lineTo(ox, PL.t + 9); g.fill();
      g.font = 'bold 11px sans-serif';
      // the label right of the marker, or left of it near the right edge
      var right = ox + 7 + g.measureText('OOM').width <= PL.l + pw;
      g.textAlign = right ? 'left' : 'right';
      g.fillText('OOM', right ? ox + 7 : ox - 7, PL.t + 9);
      g.font = '11px sans-serif'; g.textAlign = 'left';
    });
    g.strokeStyle = '#999'; g.strokeRect(PL.l + 0.5, PL.t + 0.5, pw, ph);
    geo = {K: K, C: C, ymax: ymax, pw: pw, ph: ph, X: X, cols: cols};
    $('tlegend').innerHTML =
      (K.seg ? swatch(TAB10[0], 'segment (a band per segment_alloc .. segment_free)')
        : swatch(TAB10[0], 'allocation (a band per alloc .. free_completed, requested bytes)')) +
      swatch(REST, (K.seg ? 'other segments' : 'other allocations') + ', summed') +
      (K.seg ? '' : swatch('#555', 'reserved', ';height:2px;vertical-align:middle')) +
      (S.leaks ? swatch(LEAK, 'site grows step after step (leak)') : '') +
      (D.ooms.length ? swatch('#c00', 'OOM', ';width:3px') : '') +
      swatch('#ff7f0e', 'selected: ' + stateLabel(S.sel), ';width:2px');
    drawLanes();
    drawMini();
    var zoom = D.n ? (D.n / (S.x1 - S.x0)) : 1;
    $('zoominfo').textContent = D.n ? 'showing entries ' + num(Math.max(0, Math.floor(S.x0))) +
      '\u2013' + num(Math.max(0, Math.ceil(S.x1) - 1)) + ' of ' + num(D.n) +
      (zoom > 1.001 ? ' (zoom ' + zoom.toFixed(1) + 'x)' : '') +
      ' \u2014 wheel: zoom, drag: pan, overview: brush, double-click: reset, ' +
      '\u2190/\u2192: step the selected entry' :
      'no trace: the final allocations (allocated ' + fmtBytes(D.series.a0) +
      ', reserved ' + fmtBytes(D.series.r0) + ', no timeline)';
  }

  function laneColor(k) { return 'hsl(' + ((k * 67) % 360) + ',45%,62%)'; }

  // text cut to `room` pixels with an ellipsis (a band's label, a band
  // cut by the plot's right edge), whole when it fits
  function fitText(g, t, room) {
    if (g.measureText(t).width <= room) return t;
    var lo = 0, hi = t.length;
    while (lo < hi) {   // the longest prefix that fits with the ellipsis
      var mid = (lo + hi + 1) >> 1;
      if (g.measureText(t.slice(0, mid) + '\u2026').width <= room) lo = mid;
      else hi = mid - 1;
    }
    return lo ? t.slice(0, lo) + '\u2026' : '';
  }

  function drawLanes() {
    var P = D.prep, nl = P.nlanes, cv = $('lanes');
    if (!nl) { cv.style.display = 'none'; return; }
    cv.style.display = '';
    var c = fitCanvas(cv, nl * 15 + 4), g = c.g;
    g.fillStyle = '#fff'; g.fillRect(0, 0, c.w, c.h);
    g.font = '10px sans-serif'; g.textAlign = 'right'; g.fillStyle = '#555';
    g.fillText('annotations', PL.l - 5, 12);
    var rg = D.annotations.ranges, names = D.annotations.names, X = geo.X;
    var hits = [];
    for (var k = 0; k < rg.length / 3; k++) {
      var x0 = X(rg[3 * k + 1]), x1 = X(rg[3 * k + 2]);
      if (x1 < PL.l || x0 > PL.l + geo.pw) continue;
      x0 = Math.max(PL.l, x0); x1 = Math.min(PL.l + geo.pw, x1);
      var y = 2 + P.laneOf[k] * 15;
      g.fillStyle = laneColor(rg[3 * k]);
      g.fillRect(x0, y, Math.max(1, x1 - x0 - 1), 13);
      if (x1 - x0 > 30) {
        g.save(); g.beginPath(); g.rect(x0, y, x1 - x0, 13); g.clip();
        g.fillStyle = '#222'; g.textAlign = 'left';
        g.fillText(fitText(g, names[rg[3 * k]], x1 - x0 - 4), x0 + 2, y + 10);
        g.restore();
      }
      hits.push([x0, x1, y, k]);
    }
    geo.lanes = hits;
  }

  function drawMini() {
    var K = geo.K, c = fitCanvas($('mini'), 46), g = c.g, nb = K.mx.length;
    g.fillStyle = '#fff'; g.fillRect(0, 0, c.w, c.h);
    if (!nb) return;
    var m = K.v0;
    for (var k = 0; k < nb; k++) m = Math.max(m, K.mx[k]);
    m = m || 1;
    var pw = geo.pw, h = c.h - 6;
    var n = D.n, w = D.series.w;
    var MX = function (s) { return PL.l + pw * s / n; };
    g.fillStyle = TAB10[0]; g.beginPath(); g.moveTo(PL.l, 3 + h);
    for (var x = 0; x < pw; x++) {
      var b0 = Math.floor(x * nb / pw), b1 = Math.max(b0, Math.floor((x + 1) * nb / pw) - 1), v = 0;
      for (k = b0; k <= b1 && k < nb; k++) v = Math.max(v, K.mx[k]);
      g.lineTo(PL.l + x, 3 + h - h * v / m);
    }
    g.lineTo(PL.l + pw, 3 + h); g.closePath(); g.fill();
    // embedded runs of the trace
    if (D.prep.embedded < n) {
      g.fillStyle = '#2ca02c';
      D.windows.forEach(function (W) {
        g.fillRect(MX(W.first), c.h - 3, Math.max(1, MX(W.first + W.count) - MX(W.first)), 3);
      });
    }
    D.ooms.forEach(function (o) { g.fillStyle = '#c00'; g.fillRect(MX(o[0] + 1) - 1, 0, 2, c.h); });
    // the brush
    var bx0 = MX(S.x0), bx1 = MX(S.x1);
    g.fillStyle = 'rgba(255,127,14,0.18)'; g.fillRect(bx0, 0, bx1 - bx0, c.h);
    g.strokeStyle = '#ff7f0e'; g.strokeRect(bx0 + 0.5, 0.5, bx1 - bx0 - 1, c.h - 1);
    g.strokeStyle = '#999'; g.strokeRect(PL.l + 0.5, 0.5, pw, c.h - 1);
    g.fillStyle = '#555'; g.font = '10px sans-serif'; g.textAlign = 'right';
    g.fillText('overview', PL.l - 5, 14);
    void w;
  }

  // The band (or the summed rest) under a point of the plot.
  function bandAt(px, py) {
    if (!geo) return null;
    var col = Math.floor(px - PL.l);
    if (col < 0 || col >= geo.cols || py < PL.t || py > PL.t + geo.ph) return null;
    var s = geo.C.s[col], v = geo.ymax * (PL.t + geo.ph - py) / geo.ph;
    var B = geo.K.B, y = 0;
    for (var i = 0; i < B.start.length; i++) {
      if (B.start[i] > s) break;
      if (B.end[i] >= 0 && B.end[i] <= s) continue;
      if (v >= y && v < y + B.size[i]) return {i: i, s: s};
      y += B.size[i];
    }
    if (v >= y && v < y + geo.C.rest[col]) return {rest: geo.C.rest[col], s: s};
    return {s: s};
  }

  function bandText(K, i) {
    var B = K.B, st = B.start[i], en = B.end[i];
    var what = K.seg ? 'Segment ' : 'Allocation ';
    var t = what + hex(B.addr[i]) + ', ' + fmtBytes(B.size[i]) + ' (' + num(B.size[i]) +
      ' B' + (K.seg ? '' : ' requested') + '); ';
    t += B.pre[i] ? 'live before the trace began' : (K.seg ? 'segment_alloc' : 'alloc') +
      ' at entry ' + num(st - 1);
    t += en < 0 ? ', still live at the end of the file' : ', freed at entry ' + num(en - 1);
    if (B.dur[i] >= 0) t += ' (lived ' + fmtDur(B.dur[i]) + ')';
    if (!K.seg && B.site[i] >= 0) {
      var L = D.leaks[B.site[i]];
      t += '. LEAK SUSPECT: the live memory of this site grew in ' + L[4] + ' of ' +
        (D.steps.ranges.length / 2 - 1) + ' steps (confidence ' + L[1].toFixed(3) + ')';
    }
    return t;
  }

  function setupTimeline() {
    var plot = $('plot'), mini = $('mini'), lanes = $('lanes');
    var drag = null;
    function rel(ev, el) { var r = el.getBoundingClientRect(); return [ev.clientX - r.left, ev.clientY - r.top]; }
    function clampView() {
      var n = Math.max(1, D.n), w = S.x1 - S.x0;
      if (w > n) w = n;
      if (w < Math.min(n, 8)) w = Math.min(n, 8);
      var mid = (S.x0 + S.x1) / 2;
      S.x0 = Math.max(0, mid - w / 2); S.x1 = S.x0 + w;
      if (S.x1 > n) { S.x1 = n; S.x0 = n - w; }
    }
    plot.addEventListener('wheel', function (ev) {
      if (!D || !D.n) return;
      ev.preventDefault();
      var p = rel(ev, plot), f = ev.deltaY > 0 ? 1.25 : 0.8;
      var at = S.x0 + (S.x1 - S.x0) * Math.max(0, Math.min(1, (p[0] - PL.l) / geo.pw));
      S.x0 = at - (at - S.x0) * f; S.x1 = at + (S.x1 - at) * f;
      clampView(); drawTimeline();
    }, {passive: false});
    plot.addEventListener('mousedown', function (ev) {
      var p = rel(ev, plot);
      drag = {x: p[0], x0: S.x0, x1: S.x1, moved: false};
    });
    window.addEventListener('mousemove', function (ev) {
      if (drag && geo) {
        var p = rel(ev, plot), dx = p[0] - drag.x;
        if (Math.abs(dx) > 3) drag.moved = true;
        if (drag.moved) {
          var ds = -dx * (drag.x1 - drag.x0) / geo.pw;
          S.x0 = drag.x0 + ds; S.x1 = drag.x1 + ds; clampView(); drawTimeline();
        }
      }
      if (miniDrag) miniMove(ev);
    });
    window.addEventListener('mouseup', function (ev) {
      if (drag && !drag.moved && geo) {
        var p = rel(ev, plot), h = bandAt(p[0], p[1]);
        if (h) {
          S.sel = h.s;
          S.pinned = null;
          hoverBand(h, true);
          drawTimeline(); posText();
        }
      }
      drag = null;
      if (miniDrag) { miniDrag = null; }
    });
    plot.addEventListener('mousemove', function (ev) {
      if (drag && drag.moved) return;
      var p = rel(ev, plot);
      var k = nearOom(p[0]);
      if (k >= 0) { showOom(k, false); return; }
      var h = bandAt(p[0], p[1]);
      if (h) hoverBand(h, false);
    });
    [plot, lanes].forEach(function (el) { el.addEventListener('mouseleave', showPinned); });
    plot.addEventListener('dblclick', function () { S.x0 = 0; S.x1 = Math.max(1, D.n); drawTimeline(); });
    // overview brush
    var miniDrag = null;
    function miniState(ev) {
      var p = rel(ev, mini);
      return Math.max(0, Math.min(D.n, (p[0] - PL.l) / geo.pw * D.n));
    }
    function miniMove(ev) {
      var s = miniState(ev);
      if (miniDrag.move) {
        var w = miniDrag.x1 - miniDrag.x0, d = s - miniDrag.at;
        S.x0 = Math.max(0, Math.min(D.n - w, miniDrag.x0 + d)); S.x1 = S.x0 + w;
      } else {
        S.x0 = Math.min(miniDrag.at, s); S.x1 = Math.max(miniDrag.at, s);
        if (S.x1 - S.x0 < 1) return;
      }
      clampView(); drawTimeline();
    }
    mini.addEventListener('mousedown', function (ev) {
      if (!D || !D.n) return;
      ev.preventDefault();
      var s = miniState(ev);
      miniDrag = {at: s, x0: S.x0, x1: S.x1, move: s >= S.x0 && s <= S.x1 && S.x1 - S.x0 < D.n};
    });
    mini.addEventListener('dblclick', function () { S.x0 = 0; S.x1 = Math.max(1, D.n); drawTimeline(); });
    lanes.addEventListener('mousemove', function (ev) {
      var h = laneAt(ev);
      if (h < 0) return;
      var rg = D.annotations.ranges;
      showStack('record_function "' + D.annotations.names[rg[3 * h]] + '": entries ' +
        num(rg[3 * h + 1]) + ' to ' + num(rg[3 * h + 2] - 1) + ' (click to zoom to it)', 0, false, false);
    });
    lanes.addEventListener('click', function (ev) {
      var h = laneAt(ev);
      if (h < 0) return;
      var rg = D.annotations.ranges, pad = Math.max(2, (rg[3 * h + 2] - rg[3 * h + 1]) * 0.05);
      S.x0 = rg[3 * h + 1] - pad; S.x1 = rg[3 * h + 2] + pad; clampView(); drawTimeline();
    });
    function laneAt(ev) {
      if (!geo || !geo.lanes) return -1;
      var p = rel(ev, lanes);
      for (var i = geo.lanes.length - 1; i >= 0; i--) {
        var q = geo.lanes[i];
        if (p[0] >= q[0] && p[0] <= q[1] && p[1] >= q[2] && p[1] <= q[2] + 13) return q[3];
      }
      return -1;
    }
  }

  function nearOom(px) {
    for (var k = 0; k < D.ooms.length; k++)
      if (Math.abs(geo.X(D.ooms[k][0] + 1) - px) <= 4) return k;
    return -1;
  }

  function hoverBand(h, pin) {
    var K = geo.K;
    if (h.i !== undefined) {
      showStack(bandText(K, h.i), K.B.stack[h.i], K.B.pre[h.i], pin);
    } else if (h.rest) {
      var B = K.B;
      showStack(fmtBytes(h.rest) + ' in other ' + (K.seg ? 'segments' : 'allocations') +
        ' ' + stateLabel(h.s) + ', not drawn one by one (' + num(B.start.length) + ' of ' +
        num(B.total) + ' are; memsnap view --detail N draws more)', 0, false, pin);
      $('info').querySelector('p') && ($('info').querySelector('p').style.display = 'none');
    } else if (pin) {
      var e = h.s > 0 ? entryRec(D, h.s - 1) : null;
      if (e) showStack(entryText(e), e.stack, false, true);
    }
  }

  // ---- allocator state history ---------------------------------------------
  var ROWH = 18, cache = null, layoutRects = [], selBlock = null;

  function setupHistory() {
    var list = $('evlist');
    list.addEventListener('scroll', renderRows);
    list.addEventListener('click', function (ev) {
      var r = ev.target.closest ? ev.target.closest('div.row') : null;
      if (!r) return;
      var k = Number(r.getAttribute('data-r'));
      selectRow(k, true);
    });
    list.addEventListener('mouseover', function (ev) {
      var r = ev.target.closest ? ev.target.closest('div.row') : null;
      if (!r) return;
      var row = D.prep.rows[Number(r.getAttribute('data-r'))];
      if (row[0] >= 0) {
        var e = entryRec(D, row[0]);
        showStack(entryText(e), e.stack, false, false);
      }
    });
    list.addEventListener('mouseleave', showPinned);
    var lay = $('layout');
    lay.addEventListener('mouseleave', showPinned);
    lay.addEventListener('mousemove', function (ev) {
      var q = layoutHit(ev);
      if (q) showBlockInfo(q, false);
    });
    lay.addEventListener('click', function (ev) {
      var q = layoutHit(ev);
      if (q) { S.pinned = null; selBlock = q.b ? q.b.addr : null; showBlockInfo(q, true); drawLayout(); }
    });
  }

  function rowText(row) {
    if (row[0] < 0) return '\u2026 entries ' + num(row[1]) + '\u2013' + num(row[2] - 1) +
      ' (' + num(row[2] - row[1]) + ') are not in this page (level of detail) \u2026';
    var W = D.windows[row[1]], k = row[2], a = W.ev.a[k];
    var head = ('#' + row[0]);
    while (head.length < 8) head += ' ';
    if (a === 8) return head + oomText(W.ev.size[k], W.ev.addr[k]);
    var an = actionName(a);
    while (an.length < 15) an += ' ';
    var ad = hex(W.ev.addr[k]);
    while (ad.length < 16) ad += ' ';
    return head + an + ad + fmtBytes(W.ev.size[k]) +
      (W.ev.stream[k] ? '  (stream ' + W.ev.stream[k] + ')' : '');
  }

  function selRow() {
    if (S.sel <= 0) return -1;
    var P = D.prep, r = P.rowOf(S.sel - 1);
    return r;
  }

  function renderRows() {
    var list = $('evlist'), P = D.prep, rows = P.rows;
    $('evspace').style.height = (rows.length * ROWH) + 'px';
    var top = list.scrollTop, h = list.clientHeight || 400;
    var r0 = Math.max(0, Math.floor(top / ROWH) - 5), r1 = Math.min(rows.length, Math.ceil((top + h) / ROWH) + 5);
    var sr = selRow(), html = [];
    for (var r = r0; r < r1; r++) {
      var row = rows[r], cls = 'row';
      if (row[0] < 0) cls += ' gap';
      else {
        if (row[0] === S.sel - 1) cls += ' sel';
        if (D.windows[row[1]].ev.a[row[2]] === 8) cls += ' oom';
      }
      html.push('<div class="' + cls + '" data-r="' + r + '" style="top:' + (r * ROWH) + 'px">' +
        esc(rowText(row)) + '</div>');
    }
    void sr;
    var old = list.querySelectorAll('div.row');
    Array.prototype.forEach.call(old, function (x) { x.remove(); });
    list.insertAdjacentHTML('beforeend', html.join(''));
  }

  function selectRow(r, fromUser) {
    var rows = D.prep.rows;
    if (!rows.length) return; // no trace entries: nothing to select
    r = Math.max(0, Math.min(rows.length - 1, r));
    var row = rows[r];
    if (row[0] < 0) return;
    S.sel = row[0] + 1;
    S.pinned = null;
    selBlock = null;
    var e = entryRec(D, row[0]);
    if (fromUser !== false) showStack(entryText(e), e.stack, false, true);
    var list = $('evlist'), y = r * ROWH;
    if (y < list.scrollTop || y + ROWH > list.scrollTop + list.clientHeight)
      list.scrollTop = Math.max(0, y - list.clientHeight / 2);
    renderRows(); drawLayout(); posText();
  }

  function stepEntry(delta) {
    if (!D || !D.n) return;
    var rows = D.prep.rows, r = selRow();
    if (r < 0) r = delta > 0 ? -1 : 0;
    var k = r + delta;
    while (k >= 0 && k < rows.length && rows[k][0] < 0) k += delta > 0 ? 1 : -1;
    if (k < 0 || k >= rows.length) return;
    if (S.view === 'history') selectRow(k, true);
    else {
      S.sel = rows[k][0] + 1;
      var e = entryRec(D, rows[k][0]);
      S.pinned = null;
      showStack(entryText(e), e.stack, false, true);
      if (S.sel < S.x0 || S.sel > S.x1) {
        var w = S.x1 - S.x0; S.x0 = Math.max(0, S.sel - w / 2); S.x1 = Math.min(D.n, S.x0 + w);
      }
      drawTimeline(); posText();
    }
  }

  function onKey(ev) {
    if (!D) return;
    var t = ev.target && ev.target.tagName;
    if (t === 'SELECT' || t === 'INPUT') return;
    var map = {ArrowDown: 1, ArrowUp: -1, ArrowRight: 1, ArrowLeft: -1, PageDown: 20, PageUp: -20};
    if (ev.key in map) {
      var hist = S.view === 'history';
      if (hist !== (ev.key === 'ArrowDown' || ev.key === 'ArrowUp' || ev.key.indexOf('Page') === 0)) return;
      ev.preventDefault();
      stepEntry(map[ev.key]);
    } else if (ev.key === 'Home' && S.view === 'history') { ev.preventDefault(); selectRow(0, true); }
    else if (ev.key === 'End' && S.view === 'history') { ev.preventDefault(); selectRow(D.prep.rows.length - 1, true); }
  }

  function drawHistory() {
    renderRows();
    var r = selRow();
    if (r >= 0) {
      var list = $('evlist'), y = r * ROWH;
      if (y < list.scrollTop || y + ROWH > list.scrollTop + list.clientHeight) {
        list.scrollTop = Math.max(0, y - list.clientHeight / 2);
        renderRows();
      }
    }
    drawLayout();
  }

  // The segments and blocks at state s: the file's final state at the end,
  // else replayed from the key frame of the run holding entry s-1.
  function layoutAt(s) {
    var i, segs = [];
    if (s >= D.n) {
      for (i = 0; i < D.segments.length; i++) {
        var sg = D.segments[i];
        segs.push({addr: sg[0], size: sg[1], stream: sg[2], blocks: sg[3].map(function (b) {
          return {addr: b[0], size: b[1], state: b[2], req: b[3], stack: b[4],
            entry: b[5] >= 0 ? b[5] : undefined, before: b[5] === -2};
        })});
      }
      return {segs: segs, exact: true};
    }
    var wi = -1;
    for (i = 0; i < D.windows.length; i++) {
      var W = D.windows[i];
      if (s >= W.first && s <= W.first + W.count) { wi = i; break; }
    }
    if (wi < 0) return null;
    W = D.windows[wi];
    var st;
    if (cache && cache.d === D && cache.w === wi && cache.s <= s) st = cache;
    else {
      st = {d: D, w: wi, s: W.first, seg: new Map(), blk: new Map()};
      var kf = W.kf;
      for (i = 0; i < kf.segs.length; i += 3) st.seg.set(kf.segs[i], [kf.segs[i + 1], kf.segs[i + 2]]);
      for (i = 0; i < kf.blocks.length; i += 5)
        st.blk.set(kf.blocks[i], {addr: kf.blocks[i], size: kf.blocks[i + 1], req: kf.blocks[i + 1],
          state: kf.blocks[i + 2] ? 2 : 1, stack: kf.blocks[i + 3],
          entry: kf.blocks[i + 4] >= 0 ? kf.blocks[i + 4] : undefined, before: kf.blocks[i + 4] < 0});
    }
    var ev = W.ev;
    for (var k = st.s; k < s; k++) {
      var j = k - W.first, c = ev.a[j], a = ev.addr[j];
      if (c === 0) st.blk.set(a, {addr: a, size: ev.size[j], req: ev.size[j], state: 1,
        stack: ev.stack[j], entry: k});
      else if (c === 1) { var b = st.blk.get(a); if (b) b.state = 2; }
      else if (c === 2) st.blk.delete(a);
      else if (c === 3 || c === 5) st.seg.set(a, [ev.size[j], ev.stream[j]]);
      else if (c === 4 || c === 6) st.seg.delete(a);
    }
    st.s = s;
    cache = st;
    var addrs = Array.from(st.seg.keys()).sort(function (x, y) { return x - y; });
    var blocks = Array.from(st.blk.values()).sort(function (x, y) { return x.addr - y.addr; });
    var bi = 0;
    addrs.forEach(function (a) {
      var g = st.seg.get(a), o = {addr: a, size: g[0], stream: g[1], blocks: []};
      while (bi < blocks.length && blocks[bi].addr < a) bi++;
      while (bi < blocks.length && blocks[bi].addr < a + g[0]) o.blocks.push(blocks[bi++]);
      segs.push(o);
    });
    return {segs: segs, exact: false};
  }

  function drawLayout() {
    var L = layoutAt(S.sel), cv = $('layout');
    layoutRects = [];
    if (!L) {
      var c0 = fitCanvas(cv, 40);
      c0.g.fillStyle = '#fff'; c0.g.fillRect(0, 0, c0.w, c0.h);
      $('layoutinfo').textContent = 'The state ' + stateLabel(S.sel) + ' is not in this ' +
        'page (level of detail): pick an entry of the list, or run memsnap view ' +
        'with a larger --budget.';
      $('blegend').innerHTML = '';
      return;
    }
    var segs = L.segs, rowH = 16, gap = 3, n = segs.length;
    if (n * (rowH + gap) > 30000) { rowH = Math.max(2, Math.floor(30000 / n) - 1); gap = 1; }
    var c = fitCanvas(cv, Math.max(40, n * (rowH + gap) + 10)), g = c.g;
    g.fillStyle = '#fff'; g.fillRect(0, 0, c.w, c.h);
    var maxSize = 1, used = 0, reserved = 0;
    segs.forEach(function (s) { maxSize = Math.max(maxSize, s.size); });
    var left = 190, avail = Math.max(60, c.w - left - 50);
    g.font = '11px monospace'; g.textAlign = 'right';
    segs.forEach(function (s, r) {
      var y = 5 + r * (rowH + gap);
      var w = Math.max(40, avail * Math.sqrt(s.size / maxSize)), su = 0;
      reserved += s.size;
      g.fillStyle = '#444';
      if (rowH >= 10) g.fillText(hex(s.addr) + ' ' + fmtBytes(s.size), left - 6, y + 12);
      g.fillStyle = '#f4f4f4'; g.fillRect(left, y, w, rowH);
      layoutRects.push({x: left, y: y, w: w, h: rowH, seg: s});
      s.blocks.forEach(function (b) {
        if (b.state === 0) return;
        var x0 = left + w * (b.addr - s.addr) / s.size;
        var bw = Math.max(1, w * b.size / s.size);
        var rw = Math.max(1, w * b.req / s.size);
        su += b.req;
        g.fillStyle = b.state === 2 ? '#d62728' : stackColor(b.stack);
        g.fillRect(x0, y + 1, Math.min(bw, rw), rowH - 2);
        if (bw > rw + 1) { g.fillStyle = '#f2a0a0'; g.fillRect(x0 + rw, y + 1, bw - rw, rowH - 2); }
        layoutRects.push({x: x0, y: y, w: bw, h: rowH, b: b, seg: s});
        if (b.addr === selBlock) {
          g.strokeStyle = '#000'; g.lineWidth = 2;
          g.strokeRect(x0 - 1, y - 1, bw + 2, rowH + 2); g.lineWidth = 1;
        }
      });
      used += su;
      s.used = su;
      g.strokeStyle = '#999'; g.strokeRect(left + 0.5, y + 0.5, w, rowH);
      if (rowH >= 10) {
        g.fillStyle = '#666'; g.textAlign = 'left';
        g.fillText(Math.round(100 * su / s.size) + '%', left + w + 5, y + 12);
        g.textAlign = 'right';
      }
    });
    $('layoutinfo').textContent = n + (n === 1 ? ' segment ' : ' segments ') + stateLabel(S.sel) + ': ' +
      fmtBytes(used) + ' allocated (requested) / ' + fmtBytes(reserved) + ' reserved' +
      (L.exact ? ' (the final state of the file)' :
        ' (rebuilt from the trace: block sizes are the requested sizes)') +
      '; bar width grows with the square root of the segment size, % = bytes in use';
    $('blegend').innerHTML = swatch('hsl(200,55%,55%)', 'allocated (hue = stack)') +
      swatch('#f2a0a0', 'rounding (block size - requested)') +
      swatch('#d62728', 'freed, pending (stream use)') +
      swatch('#f4f4f4', 'free (cached)', ';border:1px solid #999');
  }

  function layoutHit(ev) {
    var r = $('layout').getBoundingClientRect(), x = ev.clientX - r.left, y = ev.clientY - r.top;
    for (var i = layoutRects.length - 1; i >= 0; i--) {
      var q = layoutRects[i];
      if (x >= q.x && x <= q.x + q.w + 1 && y >= q.y && y <= q.y + q.h) return q;
    }
    return null;
  }

  function showBlockInfo(q, pin) {
    if (q.b) {
      var b = q.b;
      showStack('Block ' + hex(b.addr) + ', ' + fmtBytes(b.size) + ' (requested ' +
        fmtBytes(b.req) + '), ' + STATES[b.state] + ' (stream ' + q.seg.stream + ')' +
        (b.entry !== undefined ? ', allocated at entry ' + num(b.entry) : ''),
        b.stack, b.before, pin);
    } else {
      var s = q.seg;
      showStack('Segment ' + hex(s.addr) + ', ' + fmtBytes(s.size) + ': ' +
        fmtBytes(s.used || 0) + ' in use, ' + fmtBytes(s.size - (s.used || 0)) +
        ' free (stream ' + s.stream + ')', 0, false, pin);
      $('info').querySelector('p') && ($('info').querySelector('p').style.display = 'none');
    }
  }

  // ---- compare two files ---------------------------------------------------------
  function mainDevice(f) {
    var best = 0;
    f.devices.forEach(function (d, k) { if (d.n > f.devices[best].n) best = k; });
    return f.devices[best];
  }

  function drawCompare() {
    var A = DATA.files[0], Bf = DATA.files[1];
    if (!Bf) return;
    var da = mainDevice(A), db = mainDevice(Bf), cols = ['#1f77b4', '#d62728'];
    var c = fitCanvas($('cmpplot'), 260), g = c.g, pw = c.w - PL.l - PL.r, ph = c.h - PL.t - PL.b;
    g.fillStyle = '#fff'; g.fillRect(0, 0, c.w, c.h);
    var m = 1;
    [da, db].forEach(function (d) {
      if (!d) return;
      m = Math.max(m, d.series.a0, d.series.r0);
      d.series.amax.forEach(function (v) { m = Math.max(m, v); });
      d.series.rmax.forEach(function (v) { m = Math.max(m, v); });
    });
    var ys = niceStep(m, true, 6), ym = Math.ceil(m / ys) * ys;
    var Y = function (v) { return PL.t + ph - ph * v / ym; };
    g.font = '11px sans-serif'; g.textAlign = 'right'; g.fillStyle = '#555';
    for (var v = 0; v <= ym; v += ys) {
      g.strokeStyle = v ? '#eee' : '#999'; g.beginPath(); g.moveTo(PL.l, Y(v));
      g.lineTo(PL.l + pw, Y(v)); g.stroke(); g.fillText(fmtTick(v), PL.l - 5, Y(v) + 4);
    }
    g.textAlign = 'center';
    for (var t = 0; t <= 10; t += 2) g.fillText(t * 10 + '%', PL.l + pw * t / 10, PL.t + ph + 15);
    [da, db].forEach(function (d, k) {
      if (!d || !d.series.amax.length) return;
      ['amax', 'rmax'].forEach(function (key, r) {
        var arr = d.series[key], nb = arr.length;
        g.strokeStyle = cols[k]; g.lineWidth = r ? 1 : 2; g.setLineDash(r ? [4, 3] : []);
        g.beginPath();
        for (var x = 0; x < pw; x++) {
          var b0 = Math.floor(x * nb / pw), b1 = Math.max(b0, Math.floor((x + 1) * nb / pw) - 1), mv = 0;
          for (var q = b0; q <= b1 && q < nb; q++) mv = Math.max(mv, arr[q]);
          if (x === 0) g.moveTo(PL.l, Y(mv)); else g.lineTo(PL.l + x, Y(mv));
        }
        g.stroke(); g.setLineDash([]); g.lineWidth = 1;
      });
    });
    $('clegend').innerHTML = swatch(cols[0], 'A: ' + A.file) + swatch(cols[1], 'B: ' + Bf.file) +
      ' &mdash; solid: active, dashed: reserved; x: fraction of each trace';
    function peak(d, key, v0) { var p = v0; d.series[key].forEach(function (x) { p = Math.max(p, x); }); return p; }
    function finalAlloc(d) {
      var s = 0;
      d.segments.forEach(function (g2) { g2[3].forEach(function (b) { if (b[2] === 1) s += b[1]; }); });
      return s;
    }
    function fig(name, fa, fb, bytes) {
      var d = fb - fa;
      return '<tr><td>' + name + '</td><td class="n">' + (bytes ? fmtBytes(fa) : num(fa)) +
        '</td><td class="n">' + (bytes ? fmtBytes(fb) : num(fb)) + '</td><td class="n">' +
        (d > 0 ? '+' : d < 0 ? '-' : '') + (bytes ? fmtBytes(Math.abs(d)) : num(Math.abs(d))) + '</td></tr>';
    }
    var rows = '<tr><th></th><th class="n">A</th><th class="n">B</th><th class="n">B - A</th></tr>';
    if (da && db) {
      rows += fig('trace entries', da.n, db.n, false) +
        fig('peak active', peak(da, 'amax', da.series.a0), peak(db, 'amax', db.series.a0), true) +
        fig('peak reserved', peak(da, 'rmax', da.series.r0), peak(db, 'rmax', db.series.r0), true) +
        fig('allocated at the end', finalAlloc(da), finalAlloc(db), true) +
        fig('segments at the end', da.segments.length, db.segments.length, false) +
        fig('OOMs', da.ooms.length, db.ooms.length, false) +
        fig('leak sites', da.leaks.length, db.leaks.length, false);
    }
    $('cmptable').innerHTML = rows;
    var sites = {};
    (da ? da.sites : []).forEach(function (x) { sites[x[0]] = [x[1], 0]; });
    (db ? db.sites : []).forEach(function (x) { (sites[x[0]] = sites[x[0]] || [0, 0])[1] = x[1]; });
    var list = Object.keys(sites).map(function (k) { return [k, sites[k][0], sites[k][1]]; });
    list.sort(function (x, y) { return Math.abs(y[2] - y[1]) - Math.abs(x[2] - x[1]); });
    $('cmpsites').innerHTML = '<tr><th class="n">A</th><th class="n">B</th><th class="n">B - A</th><th>site</th></tr>' +
      list.map(function (x) {
        var d = x[2] - x[1];
        return '<tr><td class="n">' + fmtBytes(x[1]) + '</td><td class="n">' + fmtBytes(x[2]) +
          '</td><td class="n">' + (d > 0 ? '+' : d < 0 ? '-' : '') + fmtBytes(Math.abs(d)) +
          '</td><td class="site">' + esc(x[0]) + '</td></tr>';
      }).join('');
  }

  // ---- links: #file=K&device=D&entry=N&block=0xADDR&view=V -----------------------
  function fromHash() {
    var h = {};
    location.hash.replace(/^#/, '').split('&').forEach(function (kv) {
      var p = kv.split('='); if (p.length === 2) h[p[0]] = decodeURIComponent(p[1]);
    });
    if (h.file !== undefined && /^[0-9]+$/.test(h.file) && Number(h.file) < DATA.files.length)
      showFile(Number(h.file));
    if (h.device !== undefined && F)
      for (var i = 0; i < F.devices.length; i++)
        if (String(F.devices[i].device) === h.device) showDevice(i);
    if (!D) return;
    if (h.view && /^(active|history|segments|compare)$/.test(h.view)) setView(h.view);
    else if (h.entry !== undefined || h.block) setView('history');
    if (h.entry !== undefined && /^[0-9]+$/.test(h.entry) && D.n) {
      var en = Math.min(Number(h.entry), D.n - 1);
      S.sel = en + 1;
      var e = entryRec(D, en);
      S.pinned = null;
      redraw();
      if (e) showStack(entryText(e), e.stack, false, true);
    }
    if (h.block) {
      var a = parseInt(h.block, 16);
      for (var k = 0; k < layoutRects.length; k++)
        if (layoutRects[k].b && layoutRects[k].b.addr === a) {
          selBlock = a; S.pinned = null; showBlockInfo(layoutRects[k], true); drawLayout(); break;
        }
    }
  }

  function init() {
    build();
    if (!DATA.files.length) return;
    showFile(0);
    fromHash();
    window.memsnapViewReady = (window.performance ? performance.now() : 0);
    document.body.setAttribute('data-ready', '1');
  }
  init();
})();
