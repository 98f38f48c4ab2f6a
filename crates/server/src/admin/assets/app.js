// Herald admin UI: talks to /admin/api/* with the session cookie and echoes the CSRF token
// that the login returned on every state-changing call. Polls the cluster overview once a
// second. No framework, no build step: this file is served as it is (see docs/admin.md).
const $ = (sel) => document.querySelector(sel);
const state = {
  csrf: null,
  view: 'overview',
  channel: null,
  history: null,
  historyCursor: null,
  // Names already shown in the history-only list: a broker may list a name again on a later page.
  historyShown: new Set(),
  user: null,
  timer: null,
};

async function call(method, path, body) {
  const headers = {};
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (method !== 'GET' && state.csrf) headers['X-Herald-CSRF'] = state.csrf;
  const r = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: 'same-origin',
  });
  const text = await r.text();
  let data = {};
  try {
    data = text ? JSON.parse(text) : {};
  } catch {
    data = { error: { message: text } };
  }
  if (r.status === 401 && path !== '/admin/login') {
    showLogin();
  }
  if (!r.ok) {
    const e = new Error(data.error ? data.error.message : `HTTP ${r.status}`);
    e.status = r.status;
    throw e;
  }
  return data;
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function row(cells) {
  const tr = document.createElement('tr');
  for (const c of cells) tr.append(c instanceof Node ? c : el('td', c));
  return tr;
}

function td(child, cls) {
  const cell = el('td', undefined, cls);
  cell.append(child);
  return cell;
}

function status(msg) {
  $('#status').textContent = msg || '';
}

// ---- login ----------------------------------------------------------------------------------

function showLogin() {
  state.csrf = null;
  clearInterval(state.timer);
  state.timer = null;
  $('#login').hidden = false;
  $('#tabs').hidden = true;
  $('#logout').hidden = true;
  for (const v of document.querySelectorAll('.view')) v.hidden = true;
}

function showApp(csrf) {
  state.csrf = csrf;
  $('#login').hidden = true;
  $('#tabs').hidden = false;
  $('#logout').hidden = false;
  show(state.view);
  if (!state.timer) state.timer = setInterval(tick, 1000);
  tick();
}

async function login(password) {
  const r = await call('POST', '/admin/login', { password });
  showApp(r.csrf);
}

$('#login-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  $('#login-error').textContent = '';
  try {
    await login($('#password').value);
    $('#password').value = '';
  } catch (e) {
    $('#login-error').textContent = e.message;
  }
});

$('#logout').addEventListener('click', async () => {
  await call('POST', '/admin/logout').catch(() => {});
  showLogin();
});

// ---- views ----------------------------------------------------------------------------------

function show(view) {
  state.view = view;
  for (const b of document.querySelectorAll('#tabs button')) b.classList.toggle('active', b.dataset.view === view);
  for (const v of document.querySelectorAll('.view')) v.hidden = v.id !== `view-${view}`;
  if (view === 'channels') {
    loadChannels();
    loadHistoryChannels(null);
  }
  if (view === 'config') loadConfig();
  if (view === 'audit') loadAudit();
  if (view === 'channel' && state.channel) loadChannel(state.channel, null);
}

for (const b of document.querySelectorAll('#tabs button')) b.addEventListener('click', () => show(b.dataset.view));

async function tick() {
  if (!state.csrf) return;
  // The channel list follows the cluster too (each node's snapshot is up to ~2 s old).
  if (state.view === 'channels') return loadChannels();
  if (state.view === 'audit') return loadAudit();
  if (state.view !== 'overview') return;
  try {
    const o = await call('GET', '/admin/api/overview');
    renderNodes(o);
    renderCharts(o.series);
    status('');
  } catch (e) {
    status(`overview: ${e.message}`);
  }
}

function fmtUptime(s) {
  const d = Math.floor(s / 86400);
  const h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  return d ? `${d}d ${h}h` : h ? `${h}h ${m}m` : `${m}m ${s % 60}s`;
}

function fmtBytes(b) {
  return b >= 1 << 30 ? `${(b / (1 << 30)).toFixed(1)} GiB` : `${(b / (1 << 20)).toFixed(1)} MiB`;
}

function renderNodes(o) {
  $('#node-label').textContent = `node ${o.node} · ${configVersion(o.config_version)}`;
  const body = $('#nodes tbody');
  body.replaceChildren();
  let conns = 0;
  let subs = 0;
  let live = 0;
  for (const n of o.nodes) {
    const lost = n.state === 'lost';
    if (!lost) {
      live += 1;
      conns += n.connections;
      subs += n.subscriptions;
    }
    const tr = row([
      el('td', n.name + (n.name === o.node ? ' (this node)' : '')),
      el('td', lost ? `lost since ${fmtTime(n.lost_since_ms)}` : 'live', 'state'),
      n.version,
      fmtUptime(n.uptime_s),
      el('td', n.connections, 'connections'),
      n.subscriptions,
      n.channels,
      n.publications_per_s,
      n.deliveries_per_s,
      `${n.cpu_percent.toFixed(1)} %`,
      fmtBytes(n.rss_bytes),
      el('td', `${n.broker} ${n.broker_ok ? 'ok' : 'unreachable'}`, n.broker_ok ? 'ok' : 'bad'),
    ]);
    tr.dataset.node = n.name;
    tr.dataset.state = n.state;
    if (lost) tr.className = 'lost';
    body.append(tr);
  }
  $('#total-connections').textContent = conns;
  $('#total-subscriptions').textContent = subs;
  const gone = o.nodes.length - live;
  $('#nodes-note').textContent = `${live} node${live === 1 ? '' : 's'}${gone ? `, ${gone} lost` : ''}`;
}

function fmtTime(ms) {
  return new Date(ms).toLocaleTimeString();
}

function fmtValue(v) {
  if (v >= 1e6) return `${(v / 1e6).toFixed(1)}M`;
  if (v >= 1e4) return `${(v / 1e3).toFixed(0)}k`;
  return Number.isInteger(v) ? String(v) : v.toFixed(v < 10 ? 2 : 0);
}

function svgText(svg, x, y, text, anchor) {
  const t = document.createElementNS(SVG, 'text');
  t.setAttribute('x', x);
  t.setAttribute('y', y);
  if (anchor) t.setAttribute('text-anchor', anchor);
  t.textContent = text;
  svg.append(t);
}

const SVG = 'http://www.w3.org/2000/svg';

const CHARTS = [
  'connections',
  'publications_per_s',
  'deliveries_per_s',
  'publish_ms',
  'errors_per_s',
  'slow_consumers_per_s',
  'rate_limited_per_s',
];

// The time axis spans the samples the server has (up to its 5 minutes), so a fresh cluster
// fills the chart from its first sample instead of drawing a short line at the right edge.
function renderCharts(series) {
  const t0 = series.length ? series[0].t : 0;
  const t1 = series.length ? series[series.length - 1].t : 0;
  const span = Math.max(1, t1 - t0);
  for (const key of CHARTS) {
    const svg = $(`#chart-${key}`);
    const values = series.map((s) => s[key] || 0);
    const top = Math.max(1, ...values);
    const max = top * 1.15;
    const left = 34; // room for the value axis
    const w = 400;
    const h = 108; // room below for the time axis
    const x = (t) => left + ((t - t0) / span) * (w - left - 2);
    const y = (v) => h - (v / max) * (h - 4);
    const points = series.map((s, i) => `${x(s.t)},${y(values[i])}`).join(' ');
    svg.replaceChildren();
    for (const v of [0, top / 2, top]) {
      const l = document.createElementNS(SVG, 'line');
      l.setAttribute('x1', left);
      l.setAttribute('x2', w);
      l.setAttribute('y1', y(v));
      l.setAttribute('y2', y(v));
      svg.append(l);
      svgText(svg, left - 3, y(v) + 3, fmtValue(v), 'end');
    }
    const line = document.createElementNS(SVG, 'polyline');
    line.setAttribute('points', points);
    svg.append(line);
    if (series.length) {
      svgText(svg, left, 119, fmtTime(t0), 'start');
      svgText(svg, w - 2, 119, fmtTime(t1), 'end');
    }
    const last = values.length ? values[values.length - 1] : 0;
    document.querySelector(`[data-last="${key}"]`).textContent = Number.isInteger(last) ? last : last.toFixed(2);
  }
}

async function loadChannels() {
  try {
    const q = encodeURIComponent($('#channels-q').value.trim());
    const r = await call('GET', `/admin/api/channels?limit=100&q=${q}`);
    const body = $('#channels tbody');
    body.replaceChildren();
    for (const c of r.channels) {
      const tr = row([c.channel, c.subscribers]);
      tr.className = 'link';
      tr.addEventListener('click', () => {
        state.channel = c.channel;
        $('#channel-name').value = c.channel;
        show('channel');
      });
      body.append(tr);
    }
  } catch (e) {
    status(`channels: ${e.message}`);
  }
}

// Channels that hold history but have no subscriber: a page of the broker's listing at a time
// (each page scans the broker, so it is loaded on demand, not polled).
async function loadHistoryChannels(cursor) {
  const body = $('#history-channels tbody');
  const note = $('#history-channels-note');
  try {
    const q = encodeURIComponent($('#channels-q').value.trim());
    const more = cursor ? `&cursor=${encodeURIComponent(cursor)}` : '';
    const r = await call('GET', `/admin/api/history_channels?limit=100&q=${q}${more}`);
    if (!cursor) {
      body.replaceChildren();
      state.historyShown = new Set();
    }
    for (const name of r.channels) {
      if (state.historyShown.has(name)) continue;
      state.historyShown.add(name);
      const tr = row([name, el('td', 'history only', 'mark')]);
      tr.className = 'link';
      tr.dataset.historyOnly = 'true';
      tr.addEventListener('click', () => {
        state.channel = name;
        $('#channel-name').value = name;
        show('channel');
      });
      body.append(tr);
    }
    state.historyCursor = r.cursor;
    $('#history-channels-more').disabled = !r.cursor;
    note.textContent = !r.available
      ? 'this broker cannot list channels by history'
      : r.cursor
        ? 'more may follow'
        : 'end of the list';
  } catch (e) {
    note.textContent = `failed: ${e.message}`;
  }
}

$('#channels-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  loadChannels();
  loadHistoryChannels(null);
});
$('#history-channels-more').addEventListener('click', () => {
  if (state.historyCursor) loadHistoryChannels(state.historyCursor);
});

async function loadChannel(name, before) {
  try {
    let path = `/admin/api/channel?name=${encodeURIComponent(name)}&limit=20`;
    if (before && state.history) path += `&before=${before}&epoch=${encodeURIComponent(state.history.epoch)}`;
    const r = await call('GET', path);
    $('#channel-body').textContent = `${r.channel}: ${r.subscribers} subscriber(s) on all nodes`;
    const pres = $('#presence tbody');
    pres.replaceChildren();
    if (!r.presence.available) pres.append(row(['presence is off in this namespace', '', '', '']));
    for (const c of r.presence.clients) {
      pres.append(row([c.client, c.user, c.node || '?', c.info ? JSON.stringify(c.info) : '']));
    }
    const hist = $('#history tbody');
    hist.replaceChildren();
    if (!r.history.available) {
      hist.append(row(['', '', '', 'this namespace keeps no history']));
      state.history = null;
      $('#history-remove').disabled = true;
    } else {
      const pubs = r.history.publications.slice().reverse();
      for (const p of pubs) {
        const at = p.time_ms ? new Date(p.time_ms).toLocaleString() : '?';
        hist.append(row([p.offset, at, r.history.epoch, td(JSON.stringify(p.data), 'data')]));
      }
      if (!pubs.length) hist.append(row(['', '', r.history.epoch, 'no publications here']));
      $('#history-remove').disabled = false;
      const oldest = pubs.length ? pubs[pubs.length - 1].offset : 0;
      state.history = { epoch: r.history.epoch, oldest };
      $('#history-older').disabled = oldest <= 1;
      $('#history-newer').disabled = !before;
    }
  } catch (e) {
    $('#channel-body').textContent = e.message;
  }
}

$('#channel-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  state.channel = $('#channel-name').value.trim();
  if (state.channel) loadChannel(state.channel, null);
});
$('#history-older').addEventListener('click', () => {
  if (state.channel && state.history) loadChannel(state.channel, state.history.oldest);
});
$('#history-newer').addEventListener('click', () => {
  if (state.channel) loadChannel(state.channel, null);
});
$('#history-remove').addEventListener('click', async () => {
  const channel = state.channel;
  if (!channel) return;
  const sure = window.confirm(
    `Remove every publication kept in the history of "${channel}", on every node? ` +
      'Clients can no longer recover them. This cannot be undone.',
  );
  if (!sure) return;
  const out = $('#history-remove-result');
  try {
    await call('POST', '/admin/api/history_remove', { channel });
    out.textContent = `removed the history of ${channel} (epoch and offsets kept)`;
    loadChannel(channel, null);
  } catch (e) {
    out.textContent = `failed: ${e.message}`;
  }
});

async function lookupUser(user) {
  state.user = user;
  $('#user-note').textContent = 'asking every node…';
  const r = await call('GET', `/admin/api/connections?user=${encodeURIComponent(user)}`);
  const body = $('#user-clients tbody');
  body.replaceChildren();
  let n = 0;
  for (const answer of r.nodes) {
    for (const c of answer.clients) {
      const b = el('button', 'Disconnect', 'danger');
      b.addEventListener('click', () => disconnect({ client: c }));
      const tr = row([answer.node, c, td(b)]);
      tr.dataset.node = answer.node;
      body.append(tr);
      n += 1;
    }
  }
  const missing = r.missing.length ? ` No answer in time from: ${r.missing.join(', ')}.` : '';
  $('#user-note').textContent = `${n} connection(s) on ${r.nodes.length} node(s).${missing}`;
  $('#disconnect-user').disabled = false;
}

async function disconnect(target) {
  try {
    await call('POST', '/admin/api/disconnect', target);
    $('#disconnect-result').textContent =
      `disconnected ${target.user !== undefined ? `user "${target.user}"` : `client ${target.client}`}`;
    setTimeout(() => state.user !== null && lookupUser(state.user).catch(() => {}), 500);
  } catch (e) {
    $('#disconnect-result').textContent = `failed: ${e.message}`;
  }
}

$('#user-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  lookupUser($('#user-input').value.trim()).catch((e) => status(e.message));
});
$('#disconnect-user').addEventListener('click', () => {
  if (state.user !== null) disconnect({ user: state.user });
});

$('#publish-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const out = $('#publish-result');
  let data;
  try {
    data = JSON.parse($('#publish-data').value);
  } catch (e) {
    out.textContent = `data is not JSON: ${e.message}`;
    return;
  }
  try {
    const r = await call('POST', '/admin/api/publish', { channel: $('#publish-channel').value.trim(), data });
    out.textContent = `published at offset ${r.offset} (epoch ${r.epoch})`;
  } catch (e) {
    out.textContent = `failed: ${e.message}`;
  }
});

$('#broadcast-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const out = $('#broadcast-result');
  const channels = $('#broadcast-channels')
    .value.split(/[\s,]+/)
    .filter((c) => c);
  let data;
  try {
    data = JSON.parse($('#broadcast-data').value);
  } catch (e) {
    out.textContent = `data is not JSON: ${e.message}`;
    return;
  }
  try {
    const r = await call('POST', '/admin/api/broadcast', { channels, data });
    const lines = r.results.map((x, i) =>
      x.error ? `${channels[i]}: failed: ${x.error.message}` : `${channels[i]}: offset ${x.offset} (epoch ${x.epoch})`,
    );
    out.textContent = `published to ${r.published}, failed ${r.failed}\n${lines.join('\n')}`;
  } catch (e) {
    out.textContent = `failed: ${e.message}`;
  }
});

async function userChannel(action) {
  const out = $('#uc-result');
  const user = $('#uc-user').value.trim();
  const channel = $('#uc-channel').value.trim();
  try {
    await call('POST', `/admin/api/${action}`, { user, channel });
    out.textContent = `${action}d user "${user}" ${action === 'subscribe' ? 'to' : 'from'} ${channel} on every node`;
  } catch (e) {
    out.textContent = `failed: ${e.message}`;
  }
}

$('#user-channel-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  userChannel('subscribe');
});
$('#uc-unsubscribe').addEventListener('click', () => userChannel('unsubscribe'));

async function loadAudit() {
  try {
    const r = await call('GET', '/admin/api/audit?limit=200');
    const body = $('#audit tbody');
    body.replaceChildren();
    for (const a of r.entries) {
      const tr = row([
        new Date(a.at_ms).toLocaleString(),
        a.who,
        a.source,
        a.action,
        a.target,
        el('td', a.ok ? 'ok' : 'failed', a.ok ? 'ok' : 'bad'),
      ]);
      tr.dataset.action = a.action;
      body.append(tr);
    }
    if (!r.entries.length) body.append(row(['no admin actions yet', '', '', '', '', '']));
  } catch (e) {
    status(`audit: ${e.message}`);
  }
}

// The loaded configuration's version: reload count, file hash, when.
function configVersion(v) {
  if (!v) return '';
  const at = new Date(v.loaded_at_ms).toLocaleTimeString();
  return `config v${v.number}${v.file_sha256 ? ` (${v.file_sha256})` : ''} loaded ${at}`;
}

$('#config-reload').addEventListener('click', async () => {
  const out = $('#reload-result');
  try {
    const r = await call('POST', '/admin/api/reload');
    const kept = r.not_applied.map((n) => `${n.key}: ${n.reason}`);
    out.textContent =
      `${configVersion(r.version)}\napplied: ${r.applied.join(', ') || 'nothing changed'}` +
      (kept.length ? `\nkept until a restart:\n  ${kept.join('\n  ')}` : '');
    loadConfig();
  } catch (e) {
    out.textContent = `refused: ${e.message}`;
  }
});

async function loadConfig() {
  try {
    $('#config').textContent = JSON.stringify(await call('GET', '/admin/api/config'), null, 2);
  } catch (e) {
    status(`config: ${e.message}`);
  }
}

// ---- start ----------------------------------------------------------------------------------

(async () => {
  try {
    const s = await call('GET', '/admin/session');
    $('#node-label').textContent = `node ${s.node}`;
    if (s.logged_in) showApp(s.csrf);
    else if (!s.password_required) await login('');
    else showLogin();
  } catch (e) {
    status(e.message);
    showLogin();
  }
})();
