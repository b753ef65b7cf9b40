'use strict';
// The chat page of llama-hdd-server: plain script, no dependency. It talks to the server the
// page came from, under the same path prefix.
(() => {
  const base = location.pathname.replace(/\/+$/, '');
  const $ = (id) => document.getElementById(id);
  const KEY_STORE = 'llama-hdd.api-key';
  const SAMPLES = 60;
  const POLL_MS = 3000;

  const state = {
    key: localStorage.getItem(KEY_STORE) || '',
    messages: [],
    conversationId: null,
    models: [],
    controller: null,
    samples: [],
    conversations: [],
  };

  // ---------------------------------------------------------------------------------------
  // Calls to the server.

  class Unauthorized extends Error {}

  async function api(path, options = {}) {
    const headers = {};
    if (state.key) headers.Authorization = 'Bearer ' + state.key;
    let body;
    if (options.json !== undefined) {
      headers['Content-Type'] = 'application/json';
      body = JSON.stringify(options.json);
    }
    const response = await fetch(base + path, {
      method: options.method || 'GET', headers, body, signal: options.signal,
    });
    if (response.status === 401) {
      askKey('The server refused the call without a valid API key.');
      throw new Unauthorized('401');
    }
    return response;
  }

  // With several models (router mode), the calls that name no model in a body name the chosen
  // one in the query, without loading it.
  function routed(path) {
    const model = state.models.length > 1 && $('model').value;
    if (!model) return path;
    return path + (path.includes('?') ? '&' : '?') + 'model=' + encodeURIComponent(model) + '&autoload=false';
  }

  // Whether the chosen model runs (always, with one model).
  function chosenLoaded() {
    if (state.models.length < 2) return true;
    const m = state.models.find((x) => modelId(x) === $('model').value);
    return !m || !m.status || m.status.value === 'loaded';
  }

  function modelId(m) { return m.id || m.model || m.name; }

  async function errorText(response) {
    try {
      const v = await response.json();
      return (v.error && (v.error.message || v.error)) || JSON.stringify(v);
    } catch (_) {
      return response.status + ' ' + response.statusText;
    }
  }

  // ---------------------------------------------------------------------------------------
  // A small markdown renderer: the text is escaped first, then only our own tags are added,
  // so nothing the model writes becomes markup.

  function escapeHtml(s) {
    return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;')
      .replace(/"/g, '&quot;').replace(/'/g, '&#39;');
  }

  function inline(text) {
    const codes = [];
    let s = text.replace(/`([^`\n]+)`/g, (_, c) => {
      codes.push('<code>' + c + '</code>');
      return '\u0000' + (codes.length - 1) + '\u0000';
    });
    s = s.replace(/\[([^\]\n]+)\]\(([^)\s]+)\)/g, (whole, label, url) => {
      const plain = url.replace(/&amp;/g, '&');
      if (!/^(https?:\/\/|mailto:)/i.test(plain)) return label;
      return '<a href="' + url + '" target="_blank" rel="noopener noreferrer">' + label + '</a>';
    });
    s = s.replace(/\*\*([^*\n]+)\*\*/g, '<strong>$1</strong>')
      .replace(/__([^_\n]+)__/g, '<strong>$1</strong>')
      .replace(/(^|[^*\w])\*([^*\n]+)\*(?!\w)/g, '$1<em>$2</em>')
      .replace(/(^|[^_\w])_([^_\n]+)_(?!\w)/g, '$1<em>$2</em>')
      .replace(/~~([^~\n]+)~~/g, '<del>$1</del>');
    return s.replace(/\u0000(\d+)\u0000/g, (_, i) => codes[Number(i)]);
  }

  function tableRow(line, cell) {
    const cells = line.trim().replace(/^\||\|$/g, '').split('|');
    return '<tr>' + cells.map((c) => '<' + cell + '>' + inline(c.trim()) + '</' + cell + '>').join('') + '</tr>';
  }

  function markdown(source) {
    const lines = escapeHtml(source.replace(/\u0000/g, '')).split('\n');
    const out = [];
    let i = 0;
    const isBlockStart = (l) => /^(```|#{1,6}\s|&gt;|\s*([-*+]|\d+[.)])\s|\s*(---|\*\*\*)\s*$)/.test(l);
    while (i < lines.length) {
      const line = lines[i];
      const fence = line.match(/^```\s*([\w+#.-]*)/);
      if (fence) {
        const code = [];
        i += 1;
        while (i < lines.length && !/^```\s*$/.test(lines[i])) code.push(lines[i++]);
        i += 1;
        const lang = fence[1] ? ' class="language-' + fence[1] + '"' : '';
        out.push('<pre><code' + lang + '>' + code.join('\n') + '</code></pre>');
        continue;
      }
      const heading = line.match(/^(#{1,6})\s+(.*)$/);
      if (heading) {
        const level = Math.min(6, heading[1].length + 2);
        out.push('<h' + level + '>' + inline(heading[2]) + '</h' + level + '>');
        i += 1;
        continue;
      }
      if (/^\s*(---|\*\*\*|___)\s*$/.test(line)) {
        out.push('<hr>');
        i += 1;
        continue;
      }
      if (/^&gt;/.test(line)) {
        const quote = [];
        while (i < lines.length && /^&gt;/.test(lines[i])) quote.push(lines[i++].replace(/^&gt;\s?/, ''));
        out.push('<blockquote>' + markdownOfEscaped(quote) + '</blockquote>');
        continue;
      }
      const item = line.match(/^\s*([-*+]|\d+[.)])\s+/);
      if (item) {
        const ordered = /\d/.test(item[1]);
        const items = [];
        while (i < lines.length) {
          const m = lines[i].match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
          if (m && /\d/.test(m[1]) === ordered) items.push(m[2]);
          else if (lines[i].trim() && /^\s{2,}/.test(lines[i]) && items.length) items[items.length - 1] += ' ' + lines[i].trim();
          else break;
          i += 1;
        }
        const tag = ordered ? 'ol' : 'ul';
        out.push('<' + tag + '>' + items.map((t) => '<li>' + inline(t) + '</li>').join('') + '</' + tag + '>');
        continue;
      }
      if (/^\s*\|.*\|\s*$/.test(line) && i + 1 < lines.length && /^\s*\|?[\s:|-]+\|?\s*$/.test(lines[i + 1]) && lines[i + 1].includes('-')) {
        const rows = [tableRow(line, 'th')];
        i += 2;
        while (i < lines.length && /^\s*\|.*\|\s*$/.test(lines[i])) rows.push(tableRow(lines[i++], 'td'));
        out.push('<table>' + rows.join('') + '</table>');
        continue;
      }
      if (!line.trim()) {
        i += 1;
        continue;
      }
      const para = [];
      while (i < lines.length && lines[i].trim() && !isBlockStart(lines[i])) para.push(lines[i++]);
      if (!para.length) para.push(lines[i++]);
      out.push('<p>' + para.map(inline).join('<br>') + '</p>');
    }
    return out.join('');
  }

  // A blockquote's lines are escaped already: render them without escaping again.
  function markdownOfEscaped(lines) {
    const decoded = lines.join('\n').replace(/&lt;/g, '<').replace(/&gt;/g, '>')
      .replace(/&quot;/g, '"').replace(/&#39;/g, "'").replace(/&amp;/g, '&');
    return markdown(decoded);
  }

  function addCopyButtons(root) {
    for (const pre of root.querySelectorAll('pre')) {
      const button = document.createElement('button');
      button.type = 'button';
      button.className = 'copy';
      button.textContent = 'Copy';
      button.setAttribute('aria-label', 'Copy the code');
      button.addEventListener('click', async () => {
        try {
          await navigator.clipboard.writeText(pre.querySelector('code').textContent);
          button.textContent = 'Copied';
        } catch (_) {
          button.textContent = 'Copy failed';
        }
        setTimeout(() => { button.textContent = 'Copy'; }, 1500);
      });
      pre.appendChild(button);
    }
  }

  // ---------------------------------------------------------------------------------------
  // Formatting.

  function bytes(n) {
    if (n === null || n === undefined) return '–';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let u = 0;
    let v = n;
    while (v >= 1024 && u < units.length - 1) { v /= 1024; u += 1; }
    return (u ? v.toFixed(v < 10 ? 1 : 0) : v) + ' ' + units[u];
  }

  function count(n) { return (n ?? 0).toLocaleString('en-US'); }

  function ago(unix) {
    const s = Math.max(0, Date.now() / 1000 - unix);
    if (s < 60) return 'just now';
    if (s < 3600) return Math.floor(s / 60) + ' min ago';
    if (s < 86400) return Math.floor(s / 3600) + ' h ago';
    return new Date(unix * 1000).toLocaleDateString();
  }

  function statsText(t) {
    const cached = t.cache_n || 0;
    const total = cached + (t.prompt_n || 0);
    const share = total ? Math.round((100 * cached) / total) : 0;
    const rate = t.predicted_ms > 0 ? ((t.predicted_n * 1000) / t.predicted_ms).toFixed(1) : '–';
    return 'prompt ' + count(total) + ' tokens: ' + count(cached) + ' from the cache (' + share + '%), '
      + count(t.prompt_n) + ' evaluated, ready in ' + Math.round(t.prompt_ms || 0) + ' ms · '
      + count(t.predicted_n) + ' tokens generated at ' + rate + ' tokens/s';
  }

  // ---------------------------------------------------------------------------------------
  // The conversation on screen.

  function messageText(m) {
    if (typeof m.content === 'string') return m.content;
    if (Array.isArray(m.content)) return m.content.map((p) => p.text || '').join('');
    return '';
  }

  function addMessage(role, text) {
    $('empty').hidden = true;
    const el = document.createElement('article');
    el.className = 'message ' + role;
    const who = document.createElement('div');
    who.className = 'who';
    who.textContent = role === 'user' ? 'You' : role === 'assistant' ? 'Assistant' : role;
    const body = document.createElement('div');
    body.className = 'body';
    el.append(who, body);
    setBody(body, role, text);
    $('messages').appendChild(el);
    el.scrollIntoView({ block: 'end' });
    return el;
  }

  function setBody(body, role, text, reasoning) {
    if (role === 'user') {
      body.textContent = text;
      return;
    }
    body.innerHTML = (reasoning ? '<div class="reasoning">' + markdown(reasoning) + '</div>' : '') + markdown(text);
    addCopyButtons(body);
  }

  function showConversation(messages) {
    const box = $('messages');
    for (const el of box.querySelectorAll('.message')) el.remove();
    $('empty').hidden = messages.length > 0;
    for (const m of messages) {
      if (m.role === 'system') continue;
      addMessage(m.role, messageText(m));
    }
  }

  function newChat() {
    stop();
    state.messages = [];
    state.conversationId = null;
    showConversation([]);
    $('chat-info').textContent = '';
    renderList();
    $('prompt').focus();
  }

  function busy(on) {
    $('send').hidden = on;
    $('stop').hidden = !on;
    $('send').disabled = on;
  }

  function stop() {
    if (state.controller) state.controller.abort();
  }

  async function send(text) {
    const system = $('system').value.trim();
    const history = state.messages.filter((m) => m.role !== 'system');
    const messages = (system ? [{ role: 'system', content: system }] : []).concat(history);
    messages.push({ role: 'user', content: text });
    state.messages = messages;
    addMessage('user', text);
    const el = addMessage('assistant', '');
    const body = el.querySelector('.body');
    body.setAttribute('aria-live', 'polite');
    body.setAttribute('aria-busy', 'true');
    const request = {
      messages, stream: true,
      max_tokens: Number($('max-tokens').value) || undefined,
      temperature: Number($('temperature').value),
    };
    const model = $('model').value;
    if (state.models.length > 1 && model) request.model = model;
    const controller = new AbortController();
    state.controller = controller;
    busy(true);
    let content = '';
    let reasoning = '';
    let timings = null;
    let failed = null;
    let frame = 0;
    const paint = () => {
      frame = 0;
      setBody(body, 'assistant', content, reasoning);
      el.scrollIntoView({ block: 'end' });
    };
    try {
      const response = await api('/v1/chat/completions', { method: 'POST', json: request, signal: controller.signal });
      if (!response.ok) throw new Error(await errorText(response));
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buffer.indexOf('\n\n')) >= 0) {
          const event = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          for (const line of event.split('\n')) {
            if (!line.startsWith('data:')) continue;
            const data = line.slice(5).trim();
            if (data === '[DONE]') continue;
            const chunk = JSON.parse(data);
            if (chunk.error) throw new Error(chunk.error.message || JSON.stringify(chunk.error));
            const delta = (chunk.choices && chunk.choices[0] && chunk.choices[0].delta) || {};
            if (delta.content) content += delta.content;
            if (delta.reasoning_content) reasoning += delta.reasoning_content;
            if (chunk.timings) timings = chunk.timings;
          }
          if (!frame) frame = requestAnimationFrame(paint);
        }
      }
    } catch (e) {
      failed = e;
    }
    if (frame) cancelAnimationFrame(frame);
    paint();
    state.controller = null;
    busy(false);
    body.setAttribute('aria-busy', 'false');
    const stats = document.createElement('div');
    stats.className = 'stats';
    if (failed && failed.name === 'AbortError') {
      stats.textContent = 'Stopped.';
    } else if (failed) {
      stats.classList.add('error');
      stats.setAttribute('role', 'alert');
      stats.textContent = failed instanceof Unauthorized ? 'Not sent: an API key is needed.' : 'Failed: ' + failed.message;
    } else if (timings) {
      stats.textContent = statsText(timings);
      stats.dataset.cacheN = timings.cache_n;
      stats.dataset.promptN = timings.prompt_n;
      if (timings.cache_n > 0) stats.classList.add('cached');
    }
    el.appendChild(stats);
    el.scrollIntoView({ block: 'end' });
    if (content || !failed) {
      state.messages.push({ role: 'assistant', content });
    } else {
      state.messages.pop();
    }
    if (!failed) {
      if (state.models.length > 1) await loadModels();
      await loadConversations(true);
    }
  }

  // ---------------------------------------------------------------------------------------
  // The server's conversations.

  async function loadConversations(followNewest) {
    if (!chosenLoaded()) {
      state.conversations = [];
      renderList();
      $('list-status').textContent = 'The conversations of ' + $('model').value + ' are listed once it is loaded (send it a message).';
      return;
    }
    try {
      const response = await api(routed('/cache/conversations'));
      if (!response.ok) {
        $('list-status').textContent = 'The list is not available: ' + await errorText(response);
        return;
      }
      const v = await response.json();
      state.conversations = v.conversations || [];
      $('list-status').textContent = state.conversations.length ? '' : 'No conversation yet.';
      if (followNewest) {
        const same = (a, b) => a.length === b.length
          && a.every((m, i) => m.role === b[i].role && messageText(m).trim() === messageText(b[i]).trim());
        const hit = state.conversations.find((c) => same(c.messages, state.messages));
        if (hit) state.conversationId = hit.id;
      }
      renderList();
    } catch (e) {
      if (!(e instanceof Unauthorized)) $('list-status').textContent = 'The list could not be read: ' + e.message;
    }
  }

  function renderList() {
    const list = $('conversations');
    list.replaceChildren();
    for (const c of state.conversations) {
      const li = document.createElement('li');
      li.className = 'conversation' + (c.id === state.conversationId ? ' active' : '');
      const open = document.createElement('button');
      open.type = 'button';
      open.className = 'open';
      open.dataset.id = c.id;
      if (c.id === state.conversationId) open.setAttribute('aria-current', 'true');
      const title = document.createElement('span');
      title.className = 'title';
      title.textContent = c.title || '(no text)';
      const meta = document.createElement('span');
      meta.className = 'meta';
      const turns = c.messages.filter((m) => m.role === 'user').length;
      meta.textContent = turns + (turns === 1 ? ' turn · ' : ' turns · ') + count(c.tokens) + ' tokens · '
        + bytes(c.bytes) + ' · ' + ago(c.last_used_unix);
      open.append(title, meta);
      open.addEventListener('click', () => openConversation(c));
      const forget = document.createElement('button');
      forget.type = 'button';
      forget.className = 'forget';
      forget.textContent = '×';
      forget.setAttribute('aria-label', 'Take "' + (c.title || 'this conversation') + '" off the list');
      forget.addEventListener('click', () => forgetConversation(c));
      li.append(open, forget);
      list.appendChild(li);
    }
  }

  function openConversation(c) {
    stop();
    state.conversationId = c.id;
    state.messages = c.messages.map((m) => ({ role: m.role, content: messageText(m) }));
    const system = state.messages.find((m) => m.role === 'system');
    $('system').value = system ? system.content : '';
    showConversation(state.messages);
    $('chat-info').textContent = count(c.tokens) + ' tokens, ' + bytes(c.bytes) + ' of KV in the cache, last used '
      + ago(c.last_used_unix) + '. Continuing it starts from the cache.';
    renderList();
    closePanels();
    $('prompt').focus();
  }

  async function forgetConversation(c) {
    try {
      const response = await api(routed('/cache/conversations/' + encodeURIComponent(c.id)), { method: 'DELETE' });
      if (!response.ok) $('list-status').textContent = await errorText(response);
      if (c.id === state.conversationId) state.conversationId = null;
    } catch (_) { /* said by the key dialog */ }
    await loadConversations(false);
  }

  // ---------------------------------------------------------------------------------------
  // Models: a picker when the server serves several.

  async function loadModels() {
    try {
      const response = await api('/models');
      if (!response.ok) return;
      const v = await response.json();
      state.models = v.data || v.models || [];
    } catch (_) {
      return;
    }
    const select = $('model');
    const chosen = select.value;
    select.replaceChildren();
    for (const m of state.models) {
      const option = document.createElement('option');
      option.value = modelId(m);
      const status = m.status && m.status.value;
      option.textContent = option.value + (status ? ' (' + status + ')' : '');
      select.appendChild(option);
    }
    if (chosen) select.value = chosen;
    $('model-pick').hidden = state.models.length < 2;
    $('model-name').textContent = state.models.length === 1 ? (state.models[0].id || '') : '';
  }

  // ---------------------------------------------------------------------------------------
  // The cache panel: /cache sampled every few seconds, a chart of the hit rate.

  async function sampleCache() {
    if (document.hidden) return;
    if (!chosenLoaded()) {
      $('cache-status').textContent = $('model').value + ' is not loaded: its cache is shown once it is.';
      return;
    }
    let v;
    try {
      const response = await api(routed('/cache'));
      if (!response.ok) {
        $('cache-status').textContent = await errorText(response);
        return;
      }
      v = await response.json();
    } catch (e) {
      if (!(e instanceof Unauthorized)) $('cache-status').textContent = 'The cache could not be read: ' + e.message;
      return;
    }
    $('cache-status').textContent = '';
    const p = v.prompt_tokens || {};
    const cached = (p.from_ram || 0) + (p.from_store || 0);
    const previous = state.samples[state.samples.length - 1];
    const sample = { total: p.total || 0, cached, rate: null, overall: p.total ? cached / p.total : null };
    if (previous && sample.total > previous.total) {
      sample.rate = (sample.cached - previous.cached) / (sample.total - previous.total);
    }
    state.samples.push(sample);
    if (state.samples.length > SAMPLES) state.samples.shift();
    showFigures(v, p);
    drawChart();
  }

  function showFigures(v, p) {
    const rows = [];
    const add = (name, value) => rows.push([name, value]);
    add('Hit rate since start', p.total ? Math.round((100 * ((p.from_ram || 0) + (p.from_store || 0))) / p.total) + '%' : '–');
    add('Prompt tokens', count(p.total));
    add('… from RAM', count(p.from_ram));
    add('… from disk', count(p.from_store));
    add('… evaluated', count(p.computed));
    if (v.ram) add('In RAM', bytes(v.ram.bytes) + ' (' + count(v.ram.blocks) + ' blocks)');
    if (v.disk) {
      add('On disk', bytes(v.disk.bytes) + ' (' + count(v.disk.blocks) + ' blocks)');
      add('Disk budget', v.disk.budget ? bytes(v.disk.budget) : 'none');
    } else {
      add('On disk', 'no cache (--no-cache)');
    }
    if (v.remote) {
      add('Remote tier', v.remote.up ? 'up' : 'down');
      add('… written', bytes(v.remote.bytes_written));
      add('… read', bytes(v.remote.bytes_read));
    } else {
      add('Remote tier', 'none');
    }
    if (v.evictions) {
      add('Evicted from RAM', count(v.evictions.ram_blocks) + ' blocks');
      add('Collected on disk', count(v.evictions.disk_blocks) + ' blocks');
    }
    if (v.hits) add('Block hits / misses', count(v.hits.ram + v.hits.disk) + ' / ' + count(v.hits.misses));
    const dl = $('cache-figures');
    dl.replaceChildren();
    for (const [name, value] of rows) {
      const dt = document.createElement('dt');
      dt.textContent = name;
      const dd = document.createElement('dd');
      dd.textContent = value;
      dl.append(dt, dd);
    }
  }

  function drawChart() {
    const svg = $('chart');
    const W = 300;
    const H = 120;
    const pad = 18;
    const n = SAMPLES - 1;
    const x = (i) => pad + ((W - pad - 4) * i) / n;
    const y = (r) => H - 12 - (H - 22) * r;
    const offset = SAMPLES - state.samples.length;
    const line = (key) => {
      const segments = [];
      let current = [];
      state.samples.forEach((s, i) => {
        if (s[key] === null) {
          if (current.length) segments.push(current);
          current = [];
        } else {
          current.push(x(i + offset).toFixed(1) + ',' + y(s[key]).toFixed(1));
        }
      });
      if (current.length) segments.push(current);
      return segments.map((pts) => (pts.length === 1 ? [pts[0], pts[0].replace(/^[\d.]+/, (v) => (Number(v) + 2).toFixed(1))] : pts));
    };
    const ns = 'http://www.w3.org/2000/svg';
    const el = (tag, attrs) => {
      const e = document.createElementNS(ns, tag);
      for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
      return e;
    };
    const title = svg.querySelector('title');
    svg.replaceChildren(title);
    for (const r of [0, 0.5, 1]) {
      svg.append(el('line', { x1: pad, x2: W - 4, y1: y(r), y2: y(r), stroke: 'currentColor', 'stroke-opacity': 0.15 }));
      const label = el('text', { x: 2, y: y(r) + 3, 'font-size': 8, fill: 'currentColor', 'fill-opacity': 0.6 });
      label.textContent = Math.round(r * 100) + '%';
      svg.append(label);
    }
    for (const [key, color] of [['overall', 'var(--total)'], ['rate', 'var(--rate)']]) {
      for (const pts of line(key)) {
        svg.append(el('polyline', { points: pts.join(' '), fill: 'none', stroke: color, 'stroke-width': 2, 'stroke-linejoin': 'round' }));
      }
    }
    state.samples.forEach((s, i) => {
      if (s.rate !== null) svg.append(el('circle', { cx: x(i + offset), cy: y(s.rate), r: 2.5, fill: 'var(--rate)' }));
    });
    const last = state.samples[state.samples.length - 1];
    const overall = last && last.overall !== null ? Math.round(last.overall * 100) + '%' : 'no prompt yet';
    title.textContent = 'Cache hit rate over the last ' + state.samples.length + ' samples; since start: ' + overall;
  }

  // ---------------------------------------------------------------------------------------
  // The API key.

  function askKey(why) {
    const dialog = $('key-dialog');
    if (dialog.open) return;
    $('key-input').value = state.key;
    dialog.querySelector('p').textContent = (why ? why + ' ' : '')
      + 'The key is kept in this browser only and sent as Authorization: Bearer.';
    dialog.showModal();
    $('key-input').focus();
  }

  function setKey(key) {
    state.key = key;
    if (key) localStorage.setItem(KEY_STORE, key);
    else localStorage.removeItem(KEY_STORE);
    $('key-dialog').close();
    loadConversations(false);
    sampleCache();
  }

  // ---------------------------------------------------------------------------------------
  // Panels on narrow screens.

  function togglePanel(button, panel) {
    const open = !panel.classList.contains('open');
    closePanels();
    panel.classList.toggle('open', open);
    button.setAttribute('aria-expanded', String(open));
    if (open) panel.querySelector('h2').focus?.();
  }

  function closePanels() {
    for (const [b, p] of [['toggle-list', 'list-panel'], ['toggle-cache', 'cache-panel']]) {
      $(p).classList.remove('open');
      $(b).setAttribute('aria-expanded', 'false');
    }
  }

  // ---------------------------------------------------------------------------------------
  // Wiring.

  $('composer').addEventListener('submit', (e) => {
    e.preventDefault();
    const text = $('prompt').value.trim();
    if (!text || state.controller) return;
    $('prompt').value = '';
    send(text);
  });
  $('prompt').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $('composer').requestSubmit();
    }
  });
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Escape' && state.controller) stop();
    else if (e.key === 'Escape') closePanels();
  });
  $('stop').addEventListener('click', stop);
  $('model').addEventListener('change', () => {
    state.samples = [];
    loadConversations(false);
    sampleCache();
  });
  $('new-chat').addEventListener('click', newChat);
  $('key-button').addEventListener('click', () => askKey(''));
  $('key-form').addEventListener('submit', (e) => {
    e.preventDefault();
    setKey($('key-input').value.trim());
  });
  $('key-cancel').addEventListener('click', () => $('key-dialog').close());
  $('key-forget').addEventListener('click', () => setKey(''));
  $('toggle-list').addEventListener('click', () => togglePanel($('toggle-list'), $('list-panel')));
  $('toggle-cache').addEventListener('click', () => togglePanel($('toggle-cache'), $('cache-panel')));
  document.addEventListener('visibilitychange', () => { if (!document.hidden) sampleCache(); });

  loadModels().then(() => {
    loadConversations(false);
    sampleCache();
  });
  setInterval(sampleCache, POLL_MS);
  setInterval(() => { if (!document.hidden) loadModels(); }, 5 * POLL_MS);
})();
