//! The dashboard page's style sheet and script, inline: no build step, no CDN, so the page
//! works offline.

/// The style sheet.
pub(super) const STYLE: &str = "
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.5em}
table{border-collapse:collapse;margin:.5em 0;background:#fff}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;font-size:13px}
th{background:#f0f0f0}.muted{color:#777}
.badge{border-radius:3px;padding:1px 6px;color:#fff;font-size:12px}
.ok{background:#2e7d32}.bad{background:#c62828}
#feed{list-style:none;padding:0;max-height:24em;overflow:auto;font-family:monospace;font-size:12px}
#feed li{border-bottom:1px solid #eee;padding:2px 0}
#conn{font-size:12px}.live{color:#2e7d32}.down{color:#c62828}
#admin input{margin-right:.5em}
";

/// The script: follows the page's one stream (the sections' snapshots and every served
/// project's events: one connection, however many projects, so the browser's few connections
/// per host stay free for the admin actions) and sends admin actions with the token from the
/// page.
pub(super) const SCRIPT: &str = r#"
(function () {
  'use strict';
  var feed = document.getElementById('feed');
  var conn = document.getElementById('conn');
  function setConn(text, ok) { conn.textContent = text; conn.className = ok ? 'live' : 'down'; }
  function add(text) {
    var li = document.createElement('li');
    li.textContent = text;
    feed.insertBefore(li, feed.firstChild);
    while (feed.children.length > 200) { feed.removeChild(feed.lastChild); }
  }
  function connect() {
    var dash = new EventSource('/v1/dashboard/stream');
    dash.addEventListener('snapshot', function (e) {
      var s = JSON.parse(e.data);
      document.getElementById('status').innerHTML = s.status;
      document.getElementById('dead-letters').innerHTML = s.dead_letters;
      document.getElementById('audit').innerHTML = s.audit;
      setConn('live', true);
    });
    dash.addEventListener('snapshot-error', function (e) { setConn('database: ' + JSON.parse(e.data).error, false); });
    dash.addEventListener('task:deleted', function (e) {
      var ev = JSON.parse(e.data);
      add('#' + ev.sequence + ' ' + ev.project_id + ' task ' + ev.task_id + ' deleted at ' +
          ev.deleted_at + ' by ' + ev.writer_process_id);
    });
    dash.addEventListener('reconcile', function (e) {
      var r = JSON.parse(e.data);
      add('reconcile ' + r.project_id + ' at head ' + r.head_sequence + ': ' +
          r.live_task_ids.length + ' live tasks');
    });
    dash.addEventListener('lagged', function (e) {
      add('feed of ' + JSON.parse(e.data).project_id + ' fell behind; continuing');
    });
    dash.addEventListener('retired', function (e) {
      var r = JSON.parse(e.data);
      add('retired ' + r.project_id + ': consumer ' + r.consumer_id + ' no longer served here');
    });
    // EventSource retries a dropped stream itself, but not a refused one (503 past
    // --max-clients, say).
    dash.onerror = function () {
      setConn('reconnecting…', false);
      if (dash.readyState === EventSource.CLOSED) { setTimeout(connect, 5000); }
    };
  }
  connect();
  var admin = document.getElementById('admin');
  if (!admin) { return; }
  var result = document.getElementById('admin-result');
  function token() { return document.getElementById('token').value; }
  function act(action, body) {
    fetch('/v1/admin/' + action, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', 'Authorization': 'Bearer ' + token() },
      body: JSON.stringify(body)
    }).then(function (r) {
      return r.text().then(function (t) { result.textContent = r.status + ' ' + t; });
    }).catch(function (e) { result.textContent = String(e); });
  }
  document.addEventListener('click', function (e) {
    var b = e.target;
    if (!b.classList || !b.classList.contains('act')) { return; }
    var body = { project: b.dataset.project, consumer_id: b.dataset.consumer, event_id: b.dataset.event };
    if (b.dataset.action === 'resolve') {
      var reason = window.prompt('Reason for resolving ' + body.event_id + ':');
      if (!reason) { return; }
      body.reason = reason;
    }
    act(b.dataset.action, body);
  });
  document.getElementById('retire').addEventListener('submit', function (e) {
    e.preventDefault();
    var f = e.target;
    act('retire', { project: f.project.value, consumer_id: f.consumer.value, reason: f.reason.value });
  });
})();
"#;
